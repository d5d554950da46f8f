/**
 * Confinement of user-given paths to a root directory: no `..`, no symlink that leads
 * out. The check resolves the deepest existing ancestor with realpath, so a path that
 * does not exist yet (DiskOrCreate) is checked too.
 *
 * @module
 */

import * as path from "node:path";

/** Why a path is refused. */
export class PathEscapeError extends Error {
  /** Creates the error with the detail. */
  constructor(detail: string) {
    super(detail);
    this.name = "PathEscapeError";
  }
}

function isInside(root: string, candidate: string): boolean {
  return candidate === root || candidate.startsWith(root.endsWith("/") ? root : `${root}/`);
}

/**
 * The real path `target` would have, checked to stay inside `root`. `target` is absolute,
 * or relative to `root`. Throws {@linkcode PathEscapeError}.
 */
export async function confinePath(root: string, target: string): Promise<string> {
  if (target.split("/").includes("..")) {
    throw new PathEscapeError(`"${target}" contains ".."`);
  }
  if (target.includes("\0")) throw new PathEscapeError(`"${target}" contains a NUL byte`);
  const realRoot = await Deno.realPath(root);
  const lexical = path.resolve(root, target);
  if (!isInside(path.resolve(root), lexical) && !isInside(realRoot, lexical)) {
    throw new PathEscapeError(`"${target}" is outside "${root}"`);
  }
  // Walk up to the deepest existing ancestor, resolve it, re-append the rest.
  let existing = lexical;
  const rest: string[] = [];
  while (true) {
    try {
      const real = await Deno.realPath(existing);
      const resolved = path.join(real, ...rest);
      if (!isInside(realRoot, resolved)) {
        throw new PathEscapeError(`"${target}" resolves to "${resolved}", outside "${root}"`);
      }
      return resolved;
    } catch (error) {
      if (!(error instanceof Deno.errors.NotFound)) throw error;
      // A dangling symlink is NotFound for realPath but exists as a link: refuse it.
      try {
        const info = await Deno.lstat(existing);
        if (info.isSymlink) {
          throw new PathEscapeError(`"${existing}" is a dangling symbolic link`);
        }
      } catch (lstatError) {
        if (!(lstatError instanceof Deno.errors.NotFound)) throw lstatError;
      }
      const parent = path.dirname(existing);
      if (parent === existing) throw error;
      rest.unshift(path.basename(existing));
      existing = parent;
    }
  }
}

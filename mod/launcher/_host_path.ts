/**
 * Confinement of user-given paths to a root directory: no `..`, no symlink that leads
 * out. The check resolves the deepest existing ancestor with realpath, so a path that
 * does not exist yet (DiskOrCreate) is checked too. Host disks are confined further, to
 * their namespace's folder of the root.
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

/**
 * The folder of the host disk root that namespace `namespace`'s VMIs may use,
 * `<root>/<namespace>`: the root holds every tenant's volumes.
 */
export function namespaceRoot(root: string, namespace: string): string {
  return path.join(root, namespace);
}

/**
 * Like {@linkcode confinePath}, but to `namespace`'s folder of `root`
 * ({@linkcode namespaceRoot}), which need not exist yet: the real path must lie beneath it,
 * so neither a path nor a symlink leads into another namespace's folder.
 */
export async function confineToNamespace(
  root: string,
  namespace: string,
  target: string,
): Promise<string> {
  if (!/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(namespace)) {
    throw new PathEscapeError(`the namespace "${namespace}" is not a namespace name`);
  }
  const real = await confinePath(root, target);
  const allowed = namespaceRoot(await Deno.realPath(root), namespace);
  if (real === allowed || !isInside(allowed, real)) {
    throw new PathEscapeError(
      real === path.resolve(root, target)
        ? `"${target}" is not beneath "${namespaceRoot(root, namespace)}"`
        : `"${target}" resolves to "${real}", not beneath "${namespaceRoot(root, namespace)}"`,
    );
  }
  return real;
}

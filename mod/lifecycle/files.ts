/**
 * Cleanup of paths that may already be gone: the one place that decides which error of a
 * removal means "nothing to do".
 *
 * @module
 */

/**
 * Removes `path` (with `options` as {@linkcode Deno.remove} takes them) and reports whether
 * it was there. Only {@linkcode Deno.errors.NotFound} means "already gone" and resolves to
 * `false`; every other failure (permission denied, busy, a directory that is not empty
 * without `recursive`...) rejects, because it means the path is still there.
 */
export async function removeIfPresent(
  path: string,
  options?: Deno.RemoveOptions,
): Promise<boolean> {
  try {
    await Deno.remove(path, options);
    return true;
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return false;
    throw error;
  }
}

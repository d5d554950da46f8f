/**
 * Namespaces of the calling thread: entering one (`setns(2)`) and leaving what it shares
 * (`unshare(2)`), with the namespace types; entering a process's mount namespace; and
 * which mount namespace a process is in. `setns` and `unshare` move the thread that calls
 * them: the agent calls them only on threads and processes kept for that (`netns.ts`'s
 * worker, `runInMountNamespace`'s child), never on its own. Failures throw
 * {@linkcode ErrnoError}.
 *
 * @module
 */

import { c, check } from "./_libc.ts";
import { close, O_CLOEXEC, O_RDONLY, open } from "./files.ts";

/** Namespace types for `setns(2)` / `unshare(2)`. */
export const CLONE_NEWNS = 0x00020000;
/** `unshare(2)`: stop sharing filesystem attributes (root, cwd) with other threads. */
export const CLONE_FS = 0x00000200;
/** `setns(2)`: network namespace. */
export const CLONE_NEWNET = 0x40000000;

/**
 * `setns(2)` on the calling thread. Entering a mount namespace this way moves the thread
 * that calls it; in the agent use {@linkcode runInMountNamespace} instead.
 */
export function setns(fd: number, nstype: number): void {
  check(c().setns(fd, nstype), `Cannot enter namespace (fd ${fd}, type 0x${nstype.toString(16)})`);
}

/** `unshare(2)` on the calling thread. */
export function unshare(flags: number): void {
  check(c().unshare(flags), `Cannot unshare (flags 0x${flags.toString(16)})`);
}

/**
 * Moves the calling thread into the mount namespace of `pid` (via `/proc/<pid>/ns/mnt`).
 * It first stops sharing filesystem attributes with the process's other threads
 * (`unshare(CLONE_FS)`), which a multi-threaded process must do before `setns`. Meant
 * for the child that {@linkcode runInMountNamespace} spawns.
 */
export function enterMountNamespace(pid: number | "self"): void {
  const path = `/proc/${pid}/ns/mnt`;
  const fd = open(path, O_RDONLY | O_CLOEXEC);
  try {
    unshare(CLONE_FS);
    check(c().setns(fd, CLONE_NEWNS), `Cannot enter mount namespace "${path}"`);
  } finally {
    close(fd);
  }
}

/** Returns the mount namespace identity of a process, e.g. `mnt:[4026531841]`. */
export function mountNamespaceOf(pid: number | "self" | "thread-self" = "self"): string {
  return Deno.readLinkSync(`/proc/${pid}/ns/mnt`);
}

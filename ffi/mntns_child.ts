/**
 * Child-process entry of `runInMountNamespace`: enters the mount namespace of a process
 * with its main thread, performs the actions with synchronous calls only (they run on
 * that thread), prints one JSON line and exits. Private to `ffi/`.
 *
 * Usage: `deno run --allow-all ffi/mntns_child.ts '{"pid":123,"actions":[...]}'`, or
 * `'{"bind":{...}}'` for `bindContainerFile` (which moves between namespaces itself).
 *
 * @module
 */

import { ErrnoError, errorText } from "./errors.ts";
import { close, openRoot } from "./files.ts";
import { enterMountNamespace } from "./namespaces.ts";
import { bindContainerFile, type ContainerFileBind, detachMountBeneath } from "./mounts.ts";
import type { MountNamespaceAction, MountNamespaceReply } from "./mntns.ts";

function perform(action: MountNamespaceAction, rootFd: number): string | null {
  switch (action.op) {
    case "unmountFile":
      return detachMountBeneath(rootFd, action.dir, action.name) ? "unmounted" : "none";
    case "mountinfo":
      // thread-self: this thread is the one that entered the namespace.
      return Deno.readTextFileSync("/proc/thread-self/mountinfo");
    case "readTextFile":
      return Deno.readTextFileSync(action.path);
    default:
      // Only these: a request naming anything else (a mount made on a path) is refused.
      throw new Error(
        `Unknown mount namespace action ${JSON.stringify((action as { op: unknown }).op)}`,
      );
  }
}

/** Performs one request (`{"pid":…,"actions":[…]}`) and returns the reply to print. */
export function mountNamespaceChild(arg: string | undefined): MountNamespaceReply {
  try {
    const request = JSON.parse(arg ?? "") as
      | { pid: number; actions: MountNamespaceAction[] }
      | { bind: ContainerFileBind };
    if ("bind" in request) {
      return { ok: true, results: [bindContainerFile(request.bind) ? "mounted" : "already"] };
    }
    // The process's own root (a container's), opened before its namespace is entered.
    const rootFd = openRoot(`/proc/${request.pid}/root`);
    try {
      enterMountNamespace(request.pid);
      return { ok: true, results: request.actions.map((a) => perform(a, rootFd)) };
    } finally {
      close(rootFd);
    }
  } catch (error) {
    if (error instanceof ErrnoError) {
      return {
        ok: false,
        error: {
          message: error.message,
          action: error.action,
          errno: error.errno,
          description: error.description,
        },
      };
    }
    return {
      ok: false,
      error: { message: errorText(error) },
    };
  }
}

if (import.meta.main) {
  console.log(JSON.stringify(mountNamespaceChild(Deno.args[0])));
}

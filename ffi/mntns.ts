/**
 * Work inside another process's mount namespace without moving any thread of the agent's
 * own, as `netns.ts` does for network namespaces: {@linkcode runInMountNamespace} and
 * {@linkcode bindContainerFileInChild} start a child process (`mntns_child.ts`, or a
 * compiled virtnode's hidden {@linkcode MNTNS_CHILD_SUBCOMMAND}) whose main thread enters
 * the namespace, performs the request with synchronous calls and prints one JSON line,
 * the {@linkcode MountNamespaceReply}.
 *
 * @module
 */

import { ErrnoError } from "./errors.ts";
import type { ContainerFileBind } from "./mounts.ts";

/** One action {@linkcode runInMountNamespace} can perform inside the namespace. */
export type MountNamespaceAction =
  /** Lazily unmounts `<dir>/<name>` in the namespace when it is a mount; gives `unmounted` or `none`. */
  | { op: "unmountFile"; dir: string; name: string }
  /** The namespace's `mountinfo`, as the thread that entered it sees it. */
  | { op: "mountinfo" }
  /** A file's text as the namespace sees it. */
  | { op: "readTextFile"; path: string };

/** Options of {@linkcode runInMountNamespace}. */
export interface RunInMountNamespaceOptions {
  /**
   * The command that starts the child, before its JSON argument. Unless told:
   * `deno run --allow-all <ffi/mntns_child.ts>` with this process's Deno (a compiled
   * binary will pass its own hidden subcommand here).
   */
  command?: string[];
  /** Kill the child after this many milliseconds; 10,000 unless told. */
  timeoutMs?: number;
}

/**
 * The hidden subcommand of a compiled virtnode that runs {@linkcode runInMountNamespace}'s
 * child (`virtnode __mntns-child '<json>'`); `main.ts` registers it.
 */
export const MNTNS_CHILD_SUBCOMMAND = "__mntns-child";

/**
 * Runs `actions` in the mount namespace of `pid`, in a child process, and returns each
 * action's result (`mountinfo` and `readTextFile` give text, `unmountFile` gives `unmounted`
 * or `none`). The agent's own threads never change namespace. A failed action rejects with
 * the child's {@linkcode ErrnoError} (or `Error`).
 */
export function runInMountNamespace(
  pid: number,
  actions: MountNamespaceAction[],
  options: RunInMountNamespaceOptions = {},
): Promise<(string | null)[]> {
  return runMntnsChild({ pid, actions }, `run actions in the mount namespace of ${pid}`, options);
}

async function runMntnsChild(
  request: unknown,
  what: string,
  options: RunInMountNamespaceOptions,
): Promise<(string | null)[]> {
  const command = options.command ?? (Deno.build.standalone
    // A compiled virtnode has no deno to run a script with: it runs itself.
    ? [Deno.execPath(), MNTNS_CHILD_SUBCOMMAND]
    : [
      Deno.execPath(),
      "run",
      "--allow-all",
      "--no-lock",
      // The child imports only ffi/: no configuration, so no npm package is looked for.
      "--no-config",
      new URL("./mntns_child.ts", import.meta.url).href,
    ]);
  const [cmd, ...args] = command;
  const child = new Deno.Command(cmd, {
    args: [...args, JSON.stringify(request)],
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(options.timeoutMs ?? 10_000),
  });
  const out = await child.output();
  const text = new TextDecoder().decode(out.stdout).trim();
  let reply: MountNamespaceReply;
  try {
    reply = JSON.parse(text.split("\n").at(-1) ?? "");
  } catch (cause) {
    const stderr = new TextDecoder().decode(out.stderr).trim();
    throw new Error(`Cannot ${what}: child exited ${out.code}: ${stderr}`, { cause });
  }
  if (reply.ok) return reply.results;
  const e = reply.error;
  if (e.errno !== undefined) {
    throw new ErrnoError(e.action ?? e.message, e.errno, e.description ?? "");
  }
  throw new Error(e.message);
}

/**
 * Runs {@linkcode bindContainerFile} in a child process (the agent's own threads never change
 * namespace); resolves with whether it mounted (false: the target carried a mount already).
 */
export async function bindContainerFileInChild(
  bind: ContainerFileBind,
  options: RunInMountNamespaceOptions = {},
): Promise<boolean> {
  const [result] = await runMntnsChild(
    { bind },
    `bind a file of process ${bind.containerPid}`,
    options,
  );
  return result === "mounted";
}

/** The child's answer on stdout (one JSON line). */
export type MountNamespaceReply =
  | { ok: true; results: (string | null)[] }
  | {
    ok: false;
    error: { message: string; action?: string; errno?: number; description?: string };
  };

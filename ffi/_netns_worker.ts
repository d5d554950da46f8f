/**
 * The worker behind {@linkcode NetnsRunner} (`netns.ts`): a thread of its own that enters a
 * network namespace with `setns(2)` for each step of a request and leaves it right after,
 * so the agent's other threads never change namespace. A step runs inside the namespace
 * from `setns` to the return to the worker's own namespace, synchronously: a program is
 * spawned there (the child keeps the namespace while the worker waits for it outside),
 * a file under `/proc/sys/net` is read or written there, a UDP socket is made there.
 * Private to `ffi/`.
 *
 * @module
 */

import { ErrnoError, errorText } from "./errors.ts";
import { close, O_CLOEXEC, O_RDONLY, open } from "./files.ts";
import { disableTxChecksum, openUdpSocket } from "./sockets.ts";
import { CLONE_NEWNET, setns, unshare } from "./namespaces.ts";
import { bindMount, umount2 } from "./mounts.ts";
import type { NetnsRequest, NetnsResponse, NetnsResult, NetnsStep } from "./netns.ts";

/** This thread's own network namespace, to come back to after each step. */
const home = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
const decoder = new TextDecoder();

/**
 * Runs `fn` with this thread inside the namespace `netns` (none: the worker's own). A
 * thread that cannot come back ends the worker: the next request gets a fresh one.
 */
function inside<T>(netns: string | undefined, fn: () => T): T {
  if (netns === undefined) return fn();
  const fd = open(netns, O_RDONLY | O_CLOEXEC);
  try {
    setns(fd, CLONE_NEWNET);
  } finally {
    close(fd);
  }
  try {
    return fn();
  } finally {
    try {
      setns(home, CLONE_NEWNET);
    } catch (error) {
      self.postMessage({ fatal: String(error) });
      self.close();
    }
  }
}

async function perform(netns: string | undefined, step: NetnsStep): Promise<NetnsResult> {
  switch (step.op) {
    case "exec": {
      const child = inside(netns, () =>
        new Deno.Command(step.cmd, {
          args: step.args,
          stdin: step.stdin === undefined ? "null" : "piped",
          stdout: "piped",
          stderr: "piped",
          signal: AbortSignal.timeout(step.timeoutMs ?? 20_000),
        }).spawn());
      if (step.stdin !== undefined) {
        const writer = child.stdin.getWriter();
        // A child that exits without reading its stdin closes the pipe; its exit status and
        // stderr, below, tell what went wrong.
        await writer.write(new TextEncoder().encode(step.stdin)).catch(() => {});
        await writer.close().catch(() => {}); // Fails only on a pipe closed already, as above.
      }
      const out = await child.output();
      return {
        code: out.signal ? -1 : out.code,
        stdout: decoder.decode(out.stdout),
        stderr: out.signal ? `killed by ${out.signal} (timeout)` : decoder.decode(out.stderr),
      };
    }
    case "readFile":
      return inside(netns, () => Deno.readTextFileSync(step.path));
    case "writeFile":
      inside(netns, () => Deno.writeTextFileSync(step.path, step.data));
      return null;
    case "udpSocket":
      return inside(netns, () => openUdpSocket(step));
    case "txChecksumOff":
      inside(netns, () => disableTxChecksum(step.device));
      return null;
    case "create": {
      // A new namespace for this thread, pinned by a bind mount of it on `path`.
      const { path } = step;
      Deno.writeTextFileSync(path, "", { createNew: true, mode: 0o444 });
      try {
        unshare(CLONE_NEWNET);
        try {
          bindMount("/proc/thread-self/ns/net", path);
        } finally {
          setns(home, CLONE_NEWNET);
        }
      } catch (error) {
        Deno.removeSync(path);
        throw error;
      }
      return null;
    }
    case "remove": {
      try {
        umount2(step.path, 2 /* MNT_DETACH */);
      } catch (error) {
        // Not mounted (a half-made one) or not there at all (removed already).
        if (!(error instanceof ErrnoError && (error.errno === 22 || error.errno === 2))) {
          throw error;
        }
      }
      try {
        Deno.removeSync(step.path);
      } catch (error) {
        if (!(error instanceof Deno.errors.NotFound)) throw error;
      }
      return null;
    }
  }
}

self.onmessage = async (event: MessageEvent<NetnsRequest>) => {
  const { id, netns, steps } = event.data;
  const results: NetnsResult[] = [];
  let reply: NetnsResponse;
  try {
    for (const step of steps) results.push(await perform(netns, step));
    reply = { id, ok: true, results };
  } catch (error) {
    reply = {
      id,
      ok: false,
      step: results.length,
      error: error instanceof ErrnoError
        ? {
          message: error.message,
          action: error.action,
          errno: error.errno,
          description: error.description,
        }
        : { message: errorText(error) },
    };
  }
  self.postMessage(reply);
};

/**
 * A stand-in launcher pod for the security tier: a process in a mount namespace of its
 * own with a tmpfs on `/run` (so `/var/run/kubevirt` is the pod's, not the host's),
 * listening on its cmd socket below a kubelet-style pods directory, as the handler finds
 * a launcher pod's socket. What a compromised launcher would do is done by the test
 * through `/proc/<pid>/root`.
 *
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";

/** The pod's UID and its sockets emptyDir below the pods directory. */
export const POD_UID = "5c1e9d2a-7777-4abc-8def-0123456789ab";
/** The sockets emptyDir of {@linkcode POD_UID}, relative to the pods directory. */
export const POD_SOCKETS = `${POD_UID}/volumes/kubernetes.io~empty-dir/sockets`;

/** A running stand-in pod. */
export interface StandInPod {
  /** The pod's process. */
  pid: number;
  /** The pods directory (a temporary one). */
  podsDir: string;
  /** The launcher's cmd socket, as the handler sees it. */
  socket: string;
  /** The pod's `/run`, as seen from the host. */
  run: string;
  /** Ends the pod and removes its directories. */
  stop(): Promise<void>;
}

/** Starts a stand-in pod in a temporary pods directory. */
export async function startStandInPod(): Promise<StandInPod> {
  const dir = await Deno.makeTempDir({ prefix: "virtnode-sec-pod-" });
  const podsDir = join(dir, "pods");
  await Deno.mkdir(join(podsDir, POD_SOCKETS), { recursive: true });
  const socket = join(podsDir, POD_SOCKETS, "launcher-sock");
  const script = [
    "import os, socket, sys, time",
    "s = socket.socket(socket.AF_UNIX)",
    // The kubelet's path is longer than a socket address may be: bind short, then move it.
    "s.bind(sys.argv[1]); os.rename(sys.argv[1], sys.argv[2]); s.listen(16)",
    "print('ready', flush=True)",
    "time.sleep(600)",
  ].join("\n");
  const child = new Deno.Command("unshare", {
    args: [
      "--mount",
      "--propagation",
      "private",
      "sh",
      "-c",
      'mount -t tmpfs pod-run /run && mkdir -p /run/kubevirt && exec python3 -c "$0" "$1" "$2"',
      script,
      join(dir, "s"),
      socket,
    ],
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  const { value } = await reader.read();
  assert.match(value ?? "", /ready/, "the stand-in launcher pod did not start");
  reader.releaseLock();
  return {
    pid: child.pid,
    podsDir,
    socket,
    run: `/proc/${child.pid}/root/run`,
    async stop() {
      child.kill("SIGKILL");
      await child.status;
      await child.stdout.cancel().catch(() => {});
      await Deno.remove(dir, { recursive: true });
    },
  };
}

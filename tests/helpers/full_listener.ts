/**
 * A unix listener whose backlog is full, for tests of connects that must not block or must
 * wait for room: a child process listens with `listen(fd, 0)` and one connection of its
 * own waits unaccepted, which a non-blocking probe confirms (EAGAIN) before `fn` runs.
 * With `acceptAfterS`, the child accepts that waiting connection after so many seconds,
 * then the next one, to which it writes `hello`; without, it never accepts.
 *
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";

/** Runs `fn` with the path of a full listener; ends the listener and its folder after. */
export async function withFullListener(
  fn: (path: string) => Promise<void>,
  options: { acceptAfterS?: number } = {},
): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "vn-backlog-" });
  const path = join(dir, "listener.sock");
  const server = new Deno.Command("/usr/bin/python3", {
    args: [
      "-c",
      `import socket, sys, time
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(0)
waiting = socket.socket(socket.AF_UNIX); waiting.setblocking(False); waiting.connect(sys.argv[1])
probe = socket.socket(socket.AF_UNIX); probe.setblocking(False)
try:
    probe.connect(sys.argv[1]); print("room left", flush=True)
except BlockingIOError:
    print("full", flush=True)
after = float(sys.argv[2])
if after < 0:
    time.sleep(120)
time.sleep(after)
first, _ = s.accept()
second, _ = s.accept()
second.sendall(b"hello")
time.sleep(120)`,
      path,
      String(options.acceptAfterS ?? -1),
    ],
    stdin: "null",
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const reader = server.stdout.pipeThrough(new TextDecoderStream()).getReader();
  try {
    assert.equal((await reader.read()).value?.trim(), "full", "the listener's backlog is full");
    await fn(path);
  } finally {
    server.kill("SIGKILL");
    await reader.cancel();
    await server.status;
    await Deno.remove(dir, { recursive: true });
  }
}

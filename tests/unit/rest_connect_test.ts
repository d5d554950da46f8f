/**
 * The REST server's connect to a VMI's socket (serial console, VNC) when the listener's
 * backlog is full, as QEMU's chardev socket's (a backlog of one) is while the connection
 * before is still waiting to be accepted: the connect is tried again until there is room,
 * and gives up with EAGAIN after its time. A real listener (`listen(fd, 0)`) in a child.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { connectRetrying } from "../../mod/rest/testing.ts";

/** A listener whose backlog one waiting connection fills; it accepts after `acceptAfterS`. */
async function withFullListener(
  acceptAfterS: number | undefined,
  fn: (path: string) => Promise<void>,
): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "vn-rest-backlog-" });
  const path = join(dir, "serial.sock");
  const server = new Deno.Command("/usr/bin/python3", {
    args: [
      "-c",
      `import socket, sys, time
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(0)
waiting = socket.socket(socket.AF_UNIX); waiting.setblocking(False); waiting.connect(sys.argv[1])
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
      String(acceptAfterS ?? -1),
    ],
    stdin: "null",
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const reader = server.stdout.pipeThrough(new TextDecoderStream()).getReader();
  try {
    assert.equal((await reader.read()).value?.trim(), "full");
    await fn(path);
  } finally {
    server.kill("SIGKILL");
    await reader.cancel();
    await server.status;
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("REST: a connect to a VMI socket whose backlog is full waits for room and then connects", async () => {
  await withFullListener(0.3, async (path) => {
    const socket = await connectRetrying(path);
    const data = await new Promise<string>((resolve) =>
      socket.once("data", (d) => resolve(String(d)))
    );
    socket.destroy();
    assert.equal(data, "hello");
  });
});

Deno.test("REST: a connect to a VMI socket whose backlog stays full fails with EAGAIN in time", async () => {
  await withFullListener(undefined, async (path) => {
    const started = performance.now();
    await assert.rejects(connectRetrying(path, 300), (e: { code?: string }) => e.code === "EAGAIN");
    const ms = performance.now() - started;
    assert.ok(ms >= 300 && ms < 5_000, `gave up after ${ms} ms`);
  });
});

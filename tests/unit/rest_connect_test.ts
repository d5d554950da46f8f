/**
 * The REST server's connect to a VMI's socket (serial console, VNC) when the listener's
 * backlog is full, as QEMU's chardev socket's (a backlog of one) is while the connection
 * before is still waiting to be accepted: the connect is tried again until there is room,
 * and gives up with EAGAIN after its time. A real listener (`listen(fd, 0)`) in a child.
 */
import assert from "node:assert/strict";
import { connectRetrying } from "../../mod/rest/testing.ts";
import { withFullListener } from "../helpers/full_listener.ts";

Deno.test("REST: a connect to a VMI socket whose backlog is full waits for room and then connects", async () => {
  await withFullListener(async (path) => {
    const socket = await connectRetrying(path);
    const data = await new Promise<string>((resolve) =>
      socket.once("data", (d) => resolve(String(d)))
    );
    socket.destroy();
    assert.equal(data, "hello");
  }, { acceptAfterS: 0.3 });
});

Deno.test("REST: a connect to a VMI socket whose backlog stays full fails with EAGAIN in time", async () => {
  await withFullListener(async (path) => {
    const started = performance.now();
    await assert.rejects(connectRetrying(path, 300), (e: { code?: string }) => e.code === "EAGAIN");
    const ms = performance.now() - started;
    assert.ok(ms >= 300 && ms < 5_000, `gave up after ${ms} ms`);
  });
});

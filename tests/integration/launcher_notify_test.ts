/** The launcher's notify client against a real notify server on a unix socket. */

import assert from "node:assert/strict";
import { join } from "node:path";
import { LifeCycle, newDomain, StateChangeReason } from "../../mod/domain/mod.ts";
import { NotifyClient, NotifyError } from "../../mod/launcher/mod.ts";
import { startNotifyServer } from "../helpers/notify_server.ts";

const grpcTest = { sanitizeOps: false, sanitizeResources: false };
const vmi = { namespace: "default", name: "vm1", uid: "uid-1" };
const running = newDomain(vmi, { status: LifeCycle.Running, reason: StateChangeReason.Unknown });
const paused = newDomain(vmi, { status: LifeCycle.Paused, reason: StateChangeReason.PausedUser });

Deno.test(
  "NotifyClient retries transient failures and keeps events in order",
  grpcTest,
  async () => {
    const server = await startNotifyServer({ failFirst: 3 });
    const client = new NotifyClient(server.socketPath, { intervalMs: 50, totalTimeoutMs: 5_000 });
    try {
      const sends = [
        client.sendDomainEvent("ADDED", running),
        client.sendDomainEvent("MODIFIED", paused),
        client.sendK8sEvent(vmi, "Normal", "Started", "VirtualMachineInstance started"),
        client.sendDomainEvent("MODIFIED", running),
      ];
      await Promise.all(sends);
      assert.equal(server.domainCalls, 6);
      assert.deepEqual(server.statuses(), [
        "ADDED:Running/Unknown",
        "MODIFIED:Paused/User",
        "MODIFIED:Running/Unknown",
      ]);
      const event = server.k8sEvents[0];
      assert.equal(event.reason, "Started");
      assert.equal(event.type, "Normal");
      assert.deepEqual(event.involvedObject, {
        kind: "VirtualMachineInstance",
        namespace: "default",
        name: "vm1",
        uid: "uid-1",
        apiVersion: "kubevirt.io/v1",
      });
      assert.equal(server.domainEvents[0].statusJSON, "");
      assert.equal(JSON.parse(server.domainEvents[0].domainJSON).Status.Status, "Running");
    } finally {
      client.close();
      await server.close();
    }
  },
);

Deno.test(
  "NotifyClient gives up after the total timeout; later sends get one try each until one gets through",
  grpcTest,
  async () => {
    const dir = await Deno.makeTempDir({ prefix: "vn-notify-none" });
    const socket = join(dir, "domain-notify-pipe.sock");
    const client = new NotifyClient(socket, {
      intervalMs: 100,
      sendTimeoutMs: 200,
      totalTimeoutMs: 600,
    });
    const failure = (p: Promise<void>) =>
      p.then(() => assert.fail("expected a failure"), (e: unknown) => e as Error);
    try {
      const started = Date.now();
      const first = client.sendDomainEvent("MODIFIED", running);
      const second = client.sendDomainEvent("MODIFIED", paused);
      const error = await failure(first);
      assert.ok(error instanceof NotifyError);
      assert.match(
        error.message,
        /^Cannot send domain event MODIFIED to ".*": gave up after 600 ms/,
      );
      const took = Date.now() - started;
      assert.ok(took >= 500 && took < 3_000, `gave up after ${took} ms`);
      // The handler is taken as gone: the queued event gets one try, not 600 ms more.
      const secondError = await failure(second);
      assert.match(secondError.message, /one try, the handler being unreachable/);
      const quick = Date.now() - started - took;
      assert.ok(quick < 300, `the queued event took ${quick} ms more`);
      const t1 = Date.now();
      await failure(client.sendK8sEvent(vmi, "Normal", "Started", "started"));
      assert.ok(Date.now() - t1 < 300, `a new send took ${Date.now() - t1} ms`);

      // The handler is back: the next send gets through, and later ones retry in full again.
      const server = await startNotifyServer({ socketPath: socket });
      try {
        await client.sendDomainEvent("MODIFIED", running);
        assert.equal(server.statuses().at(-1), "MODIFIED:Running/Unknown");
      } finally {
        await server.close();
      }
      await Deno.remove(socket).catch(() => {});
      const t2 = Date.now();
      const again = await failure(client.sendDomainEvent("MODIFIED", paused));
      assert.match(again.message, /gave up after 600 ms/);
      assert.ok(Date.now() - t2 >= 500, `retried for ${Date.now() - t2} ms`);
    } finally {
      client.close();
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
);

Deno.test(
  "NotifyClient fails at once when the handler speaks no common version",
  grpcTest,
  async () => {
    const server = await startNotifyServer({ supportedVersions: [7] });
    const client = new NotifyClient(server.socketPath, { intervalMs: 100, totalTimeoutMs: 5_000 });
    try {
      const started = Date.now();
      await assert.rejects(client.sendDomainEvent("MODIFIED", running), /no common notify version/);
      assert.ok(Date.now() - started < 2_000);
      assert.equal(server.domainCalls, 0);
    } finally {
      client.close();
      await server.close();
    }
  },
);

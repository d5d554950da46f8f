/**
 * The launcher's cmd API over its real unix socket, with libvirt's test driver
 * (`test:///default`) and a real notify server recording the events.
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import type * as grpc from "@grpc/grpc-js";
import { openLibvirt } from "../../ffi/mod.ts";
import { decodeDomainJson } from "../../mod/domain/mod.ts";
import { launcherInitSocketPath, launcherSocketPath, runLauncher } from "../../mod/launcher/mod.ts";
import type { LauncherOptions } from "../../mod/launcher/mod.ts";
import { TestCmdClient } from "../helpers/cmd_client.ts";
import { startNotifyServer, type TestNotifyServer } from "../helpers/notify_server.ts";

const grpcTest = { sanitizeOps: false, sanitizeResources: false };

function testVmi(name: string, extra: Record<string, unknown> = {}) {
  return {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachineInstance",
    metadata: { name, namespace: "default", uid: `uid-${name}` },
    spec: {
      terminationGracePeriodSeconds: 0,
      domain: { memory: { guest: "64Mi" }, devices: {} },
      ...extra,
    },
  };
}

interface Harness {
  dir: string;
  options: LauncherOptions;
  notify: TestNotifyServer;
  client: TestCmdClient;
  abort: AbortController;
  exit: Promise<number>;
}

async function startHarness(name: string): Promise<Harness> {
  const dir = await Deno.makeTempDir({ prefix: "vn-launcher" });
  const notify = await startNotifyServer();
  const options: LauncherOptions = {
    namespace: "default",
    name,
    uid: `uid-${name}`,
    socketDir: join(dir, "sockets"),
    libvirtUri: "test:///default",
    notifySocket: notify.socketPath,
    gracePeriodSeconds: 1,
    runDir: join(dir, "run"),
    diskDir: join(dir, "disks"),
    imageDir: join(dir, "images"),
    hostDiskRoot: join(dir, "hostdisks"),
    domainType: "qemu",
    migrationSocketDir: join(dir, "share"),
  };
  await Deno.mkdir(options.hostDiskRoot!, { recursive: true });
  const abort = new AbortController();
  let ready!: () => void;
  const isReady = new Promise<void>((resolve) => ready = resolve);
  const exit = runLauncher(options, {
    signal: abort.signal,
    handleSignals: false,
    onReady: () => ready(),
    notifyTimeouts: { intervalMs: 100, sendTimeoutMs: 2_000, totalTimeoutMs: 5_000 },
  });
  await Promise.race([isReady, exit.then((code) => assert.fail(`launcher exited ${code}`))]);
  const client = new TestCmdClient(launcherSocketPath(options.socketDir));
  return { dir, options, notify, client, abort, exit };
}

async function stopHarness(h: Harness): Promise<number> {
  h.abort.abort();
  const code = await h.exit;
  h.client.close();
  await h.notify.close();
  await Deno.remove(h.dir, { recursive: true }).catch(() => {});
  return code;
}

async function domainStatus(client: TestCmdClient): Promise<string> {
  const res = await client.getDomain();
  assert.equal(res.response?.success, true, res.response?.message ?? "");
  if (res.domain === "") return "none";
  const domain = decodeDomainJson(res.domain);
  return `${domain.status.status}/${domain.status.reason}`;
}

/**
 * GetGuestInfo, GetUsers and GetFilesystems answer as KubeVirt's launcher does without an
 * agent: success with the empty shapes. A gRPC error status (UNIMPLEMENTED) rejects the
 * call and fails the caller too.
 */
async function assertNoGuestAgentAnswers(client: TestCmdClient): Promise<void> {
  const guest = await client.call<
    { response: { success: boolean; message: string }; guestInfoResponse: string }
  >("GetGuestInfo");
  assert.deepEqual(guest.response, { success: true, message: "" });
  assert.deepEqual(JSON.parse(guest.guestInfoResponse), { os: {}, fsInfo: { disks: [] } });
  const users = await client.call<
    { response: { success: boolean; message: string }; guestUserListResponse: string }
  >("GetUsers");
  assert.deepEqual(users.response, { success: true, message: "" });
  assert.equal(users.guestUserListResponse, "[]");
  const filesystems = await client.call<
    { response: { success: boolean; message: string }; guestFilesystemsResponse: string }
  >("GetFilesystems");
  assert.deepEqual(filesystems.response, { success: true, message: "" });
  assert.equal(filesystems.guestFilesystemsResponse, "[]");
}

Deno.test("launcher cmd server: lifecycle over the real socket", grpcTest, async (t) => {
  const h = await startHarness("vm-cmd");
  let exitCode: number | undefined;
  try {
    await t.step(
      "the socket is launcher-sock, mode 0600, and the init socket is gone",
      async () => {
        const info = await Deno.lstat(launcherSocketPath(h.options.socketDir));
        assert.equal(info.isSocket, true);
        assert.equal(info.mode! & 0o777, 0o600);
        await assert.rejects(
          Deno.lstat(launcherInitSocketPath(h.options.socketDir)),
          Deno.errors.NotFound,
        );
      },
    );

    await t.step("Info reports cmd version 1 and Ping succeeds", async () => {
      assert.deepEqual(await h.client.info(), [1]);
      assert.deepEqual(await h.client.call("Ping"), { success: true, message: "" });
    });

    await t.step("GetDomain before Sync has no domain", async () => {
      assert.equal(await domainStatus(h.client), "none");
    });

    await t.step("without a domain the guest agent queries succeed, empty", async () => {
      await assertNoGuestAgentAnswers(h.client);
    });

    await t.step("Sync defines and starts the domain", async () => {
      const res = await h.client.vmiCall("SyncVirtualMachine", testVmi("vm-cmd"));
      assert.deepEqual(res, { success: true, message: "" });
      assert.equal(await domainStatus(h.client), "Running/Unknown");
      const added = await h.notify.waitForDomainEvent((e) => e.eventType === "ADDED");
      assert.equal(added.domain?.metadata.name, "vm-cmd");
      assert.equal(added.domain?.spec.name, "default_vm-cmd");
      assert.equal(added.domain?.spec.metadata.kubevirt.uid, "uid-vm-cmd");
      await h.notify.waitForDomainEvent((e) => e.domain?.status.status === "Running");
      // The handler records Started when it sees the phase change; the launcher does not
      // send one too (it would show twice on the VMI).
      assert.ok(!h.notify.k8sEvents.some((e) => e.reason === "Started"));
    });

    await t.step("a second Sync of the running domain changes nothing", async () => {
      const before = decodeDomainJson((await h.client.getDomain()).domain);
      await new Promise((resolve) => setTimeout(resolve, 300));
      const events = h.notify.domainEvents.length;
      const res = await h.client.vmiCall("SyncVirtualMachine", testVmi("vm-cmd"));
      assert.equal(res.success, true, res.message);
      await new Promise((resolve) => setTimeout(resolve, 300));
      const after = decodeDomainJson((await h.client.getDomain()).domain);
      assert.equal(after.spec.uuid, before.spec.uuid);
      assert.equal(after.status.status, "Running");
      assert.equal(h.notify.domainEvents.length, events);
    });

    await t.step("Pause and Unpause, each seen by the notify server in order", async () => {
      assert.equal(
        (await h.client.vmiCall("PauseVirtualMachine", testVmi("vm-cmd"))).success,
        true,
      );
      assert.equal(await domainStatus(h.client), "Paused/User");
      const paused = await h.notify.waitForDomainEvent((e) => e.domain?.status.status === "Paused");
      assert.equal(
        (await h.client.vmiCall("PauseVirtualMachine", testVmi("vm-cmd"))).success,
        true,
      );
      assert.equal(
        (await h.client.vmiCall("UnpauseVirtualMachine", testVmi("vm-cmd"))).success,
        true,
      );
      assert.equal(await domainStatus(h.client), "Running/Unknown");
      const resumed = await h.notify.waitForDomainEvent((e) =>
        h.notify.domainEvents.indexOf(e) > h.notify.domainEvents.indexOf(paused) &&
        e.domain?.status.status === "Running"
      );
      assert.ok(h.notify.domainEvents.indexOf(resumed) > h.notify.domainEvents.indexOf(paused));
    });

    await t.step("GetDomainStats, GetQemuVersion", async () => {
      const stats = await h.client.call<{ response: { success: boolean }; domainStats: string }>(
        "GetDomainStats",
      );
      assert.equal(stats.response.success, true);
      assert.equal(JSON.parse(stats.domainStats).Name, "default_vm-cmd");
      const version = await h.client.call<{ response: { success: boolean }; version: string }>(
        "GetQemuVersion",
      );
      assert.equal(version.response.success, true);
      assert.match(version.version, /^QEMU \d+\.\d+\.\d+$/);
    });

    await t.step(
      "without a guest agent GetGuestInfo, GetUsers and GetFilesystems succeed, empty",
      async () => {
        await assertNoGuestAgentAnswers(h.client);
      },
    );

    await t.step("an unimplemented RPC answers UNIMPLEMENTED naming it", async () => {
      const error = await h.client.vmiCall("HotplugHostDevices", testVmi("vm-cmd")).then(
        () => assert.fail("expected UNIMPLEMENTED"),
        (e: grpc.ServiceError) => e,
      );
      assert.equal(error.code, 12);
      assert.match(error.details, /HotplugHostDevices/);
      // A failed migration's target is told to clean up: acknowledged, as KubeVirt's does.
      const signalled = await h.client.vmiCall("SignalTargetPodCleanup", testVmi("vm-cmd"));
      assert.equal(signalled.success, true, signalled.message);
      const other = await h.client.call("GetSEVInfo").catch((e: grpc.ServiceError) => e);
      assert.equal((other as grpc.ServiceError).code, 12);
      assert.match((other as grpc.ServiceError).details, /GetSEVInfo/);
    });

    await t.step(
      "MigrateVirtualMachine for a VMI with no migration in its status fails clearly",
      async () => {
        const r = await h.client.vmiCall("MigrateVirtualMachine", testVmi("vm-cmd"));
        assert.equal(r.success, false);
        assert.match(r.message, /^Cannot migrate VMI "default\/vm-cmd": .*names no migrationUid/);
      },
    );

    await t.step(
      "bad input is answered with a clear error and the server keeps serving",
      async () => {
        const malformed = await h.client.vmiCall("SyncVirtualMachine", '{"metadata": {');
        assert.equal(malformed.success, false);
        assert.match(malformed.message, /^Cannot sync VMI "default\/vm-cmd": malformed VMI JSON/);

        const empty = await h.client.call<{ success: boolean; message: string }>(
          "SyncVirtualMachine",
          {},
        );
        assert.equal(empty.success, false);
        assert.match(empty.message, /no VMI JSON/);

        const unsupported = testVmi("vm-cmd");
        (unsupported.spec.domain.devices as Record<string, unknown>).gpus = [
          { name: "gpu1", deviceName: "nvidia.com/GP100" },
        ];
        const res = await h.client.vmiCall("SyncVirtualMachine", unsupported);
        assert.equal(res.success, false);
        assert.match(res.message, /^Cannot sync VMI "default\/vm-cmd": /);
        assert.match(res.message, /unsupported field "spec\.domain\.devices\.gpus"/);

        const other = await h.client.vmiCall("SyncVirtualMachine", testVmi("someone-else"));
        assert.equal(other.success, false);
        assert.match(other.message, /the request is for VMI "default\/someone-else"/);

        assert.deepEqual(await h.client.call("Ping"), { success: true, message: "" });
        assert.equal(await domainStatus(h.client), "Running/Unknown");
      },
    );

    await t.step("Kill destroys the domain: Shutoff/Destroyed", async () => {
      assert.equal((await h.client.vmiCall("KillVirtualMachine", testVmi("vm-cmd"))).success, true);
      assert.equal(await domainStatus(h.client), "Shutoff/Destroyed");
      await h.notify.waitForDomainEvent((e) =>
        e.domain?.status.status === "Shutoff" && e.domain.status.reason === "Destroyed"
      );
      // A second Kill of a stopped domain is fine; the launcher keeps serving.
      assert.equal((await h.client.vmiCall("KillVirtualMachine", testVmi("vm-cmd"))).success, true);
      assert.deepEqual(await h.client.call("Ping"), { success: true, message: "" });
    });

    await t.step("Delete removes the domain: DELETED, GetDomain is empty", async () => {
      assert.equal(
        (await h.client.vmiCall("DeleteVirtualMachine", testVmi("vm-cmd"))).success,
        true,
      );
      assert.equal(await domainStatus(h.client), "none");
      const deleted = await h.notify.waitForDomainEvent((e) => e.eventType === "DELETED");
      assert.equal(deleted.domain?.status.status, "NoState");
      assert.equal(deleted.domain?.status.reason, "NonExistent");
      assert.equal(
        (await h.client.vmiCall("DeleteVirtualMachine", testVmi("vm-cmd"))).success,
        true,
      );
    });

    await t.step("events arrived in the order the changes happened", () => {
      const order = h.notify.statuses().filter((s, i, all) => s !== all[i - 1]);
      const wanted = [
        "MODIFIED:Running/Unknown",
        "MODIFIED:Paused/User",
        "MODIFIED:Running/Unknown",
        "MODIFIED:Shutoff/Destroyed",
        "DELETED:NoState/NonExistent",
      ];
      let at = 0;
      for (const entry of order) if (entry === wanted[at]) at++;
      assert.equal(at, wanted.length, `got ${order.join(", ")}`);
      assert.ok(order[0].startsWith("ADDED:"), `got ${order.join(", ")}`);
    });
  } finally {
    exitCode = await stopHarness(h);
  }
  assert.equal(exitCode, 0);
  await assert.rejects(Deno.lstat(launcherSocketPath(h.options.socketDir)), Deno.errors.NotFound);
});

Deno.test(
  "launcher cmd server: a hostDisk path escaping its directory is refused",
  grpcTest,
  async () => {
    const h = await startHarness("vm-hostdisk");
    try {
      const vmi = testVmi("vm-hostdisk", {
        volumes: [{
          name: "data",
          hostDisk: { path: join(h.options.hostDiskRoot!, "..", "outside.img"), type: "Disk" },
        }],
      });
      (vmi.spec.domain.devices as Record<string, unknown>).disks = [
        { name: "data", disk: { bus: "virtio" } },
      ];
      const res = await h.client.vmiCall("SyncVirtualMachine", vmi);
      assert.equal(res.success, false);
      assert.match(res.message, /^Cannot sync VMI "default\/vm-hostdisk": /);
      assert.match(res.message, /spec\.volumes\[0\]/);
      assert.equal(await domainStatus(h.client), "none");
      assert.deepEqual(await h.client.call("Ping"), { success: true, message: "" });
    } finally {
      assert.equal(await stopHarness(h), 0);
    }
  },
);

Deno.test(
  "launcher cmd server: SyncMigrationTarget readies disks and sockets without defining a domain",
  grpcTest,
  async () => {
    // It prepares the target's disks and socket folder only. Bad
    // input and a source that is not a unix socket are refused.
    const h = await startHarness("vm-target");
    try {
      const spec = {
        domain: {
          memory: { guest: "64Mi" },
          devices: {
            disks: [{ name: "scratch", disk: { bus: "virtio" } }, {
              name: "init",
              cdrom: { bus: "sata" },
            }],
          },
        },
        volumes: [
          { name: "scratch", emptyDisk: { capacity: "16Mi" } },
          { name: "init", cloudInitNoCloud: { userData: "#cloud-config\n" } },
        ],
      };
      const target = (status: Record<string, unknown>) => ({
        ...testVmi("vm-target"),
        spec: { ...testVmi("vm-target").spec, ...spec },
        status: { phase: "Running", migrationState: { migrationUid: "mig-1" }, ...status },
      });

      const tcp = await h.client.vmiCall("SyncMigrationTarget", target({}));
      assert.equal(tcp.success, false);
      assert.match(
        tcp.message,
        /^Cannot prepare the migration target of VMI "default\/vm-target": .*over TCP; .*unix sockets only/,
      );

      const bad = await h.client.vmiCall("SyncMigrationTarget", {
        ...target({ migrationTransport: "Unix" }),
        spec: { ...target({}).spec, volumes: [{ name: "scratch", emptyDisk: {} }] },
      });
      assert.equal(bad.success, false);
      assert.match(
        bad.message,
        /^Cannot prepare the migration target of VMI "default\/vm-target": /,
      );
      assert.equal(await domainStatus(h.client), "none");

      const ok = await h.client.vmiCall(
        "SyncMigrationTarget",
        target({ migrationTransport: "Unix" }),
      );
      assert.deepEqual(ok, { success: true, message: "" });
      assert.equal(await domainStatus(h.client), "none", "the domain comes with the migration");
      const made = (name: string) =>
        [...Deno.readDirSync(join(h.options.diskDir, name))].filter((e) => e.isFile).map((e) =>
          Deno.statSync(join(h.options.diskDir, name, e.name)).size
        );
      assert.ok(made("scratch").some((size) => size > 0), "the empty disk");
      assert.ok(made("init").some((size) => size > 0), "the cloud-init ISO");
      const sockets = await Deno.lstat(join(h.options.migrationSocketDir!, "migrationproxy"));
      assert.ok(sockets.isDirectory);
      assert.equal((sockets.mode ?? 0) & 0o007, 0, "no access for others");
      // Asked again (the handler's next sync): the same answer, nothing else changes.
      assert.deepEqual(
        await h.client.vmiCall("SyncMigrationTarget", target({ migrationTransport: "Unix" })),
        { success: true, message: "" },
      );
      // No domain arrived: there is nothing to finalize.
      const early = await h.client.vmiCall(
        "FinalizeVirtualMachineMigration",
        target({ migrationTransport: "Unix" }),
      );
      assert.equal(early.success, false);
      assert.match(
        early.message,
        /^Cannot finalize the migration of VMI "default\/vm-target": domain "default_vm-target" not found/,
      );
      // Another VMI's request is refused.
      const other = await h.client.vmiCall("SyncMigrationTarget", {
        ...target({ migrationTransport: "Unix" }),
        metadata: { name: "someone-else", namespace: "default", uid: "x" },
      });
      assert.equal(other.success, false);
      assert.match(other.message, /the request is for VMI "default\/someone-else"/);
    } finally {
      assert.equal(await stopHarness(h), 0);
    }
  },
);

Deno.test(
  "launcher: a domain stopped from outside is reported and the launcher exits 1",
  grpcTest,
  async () => {
    const h = await startHarness("vm-outside");
    const other = await openLibvirt("test:///default");
    try {
      assert.equal(
        (await h.client.vmiCall("SyncVirtualMachine", testVmi("vm-outside"))).success,
        true,
      );
      await h.notify.waitForDomainEvent((e) => e.domain?.status.status === "Running");
      await (await other.lookupByName("default_vm-outside")).destroy();
      const code = await Promise.race([
        h.exit,
        new Promise<string>((resolve) => setTimeout(() => resolve("timeout"), 10_000)),
      ]);
      assert.equal(code, 1);
      const last = h.notify.domainEvents.at(-1);
      assert.equal(last?.domain?.status.status, "Shutoff");
      assert.equal(last?.domain?.status.reason, "Destroyed");
      await h.notify.waitForK8sEvent((e) => e.reason === "Stopped" && e.type === "Warning");
    } finally {
      await (await other.lookupByName("default_vm-outside").catch(() => undefined))?.undefine()
        .catch(() => {});
      await other.close();
      await stopHarness(h);
    }
  },
);

Deno.test(
  "launcher: SIGTERM-style stop of a running test-driver guest exits 0 and removes it",
  grpcTest,
  async () => {
    const h = await startHarness("vm-stop");
    assert.equal((await h.client.vmiCall("SyncVirtualMachine", testVmi("vm-stop"))).success, true);
    await h.notify.waitForDomainEvent((e) => e.domain?.status.status === "Running");
    const notify = h.notify;
    h.abort.abort();
    const code = await h.exit;
    assert.equal(code, 0);
    const statuses = notify.statuses();
    assert.ok(statuses.some((s) => s.startsWith("MODIFIED:Shutoff/")), statuses.join(", "));
    assert.equal(statuses.at(-1), "DELETED:NoState/NonExistent");
    assert.ok(notify.k8sEvents.some((e) => e.reason === "ShuttingDown"));
    await stopHarness(h);
  },
);

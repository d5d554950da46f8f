/**
 * A live migration of the test guest between two libvirtds, each a "node" of its own
 * (its own mount namespace and host UUID), through virtnode's migration proxy as KubeVirt's
 * launcher does it: `virDomainMigrateToURI3` through the FFI, peer to peer, libvirt's
 * connection and the guest's memory each through a source unix socket, mutual TLS and a
 * target listener into the other libvirtd's socket and its QEMU's incoming socket. The
 * guest's agent answers on the target afterwards (the source is left Shutoff/Migrated);
 * a migration whose source presents another CA's certificate fails and the guest runs on
 * where it was.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { VIR_DOMAIN_JOB_STATS_COMPLETED } from "../../ffi/mod.ts";
import { MigrationProxyManager } from "../../mod/migration/mod.ts";
import { DomainManager } from "../../mod/launcher/testing.ts";
import { addVmiSamples, Exposition } from "../../mod/metrics/mod.ts";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { promtoolCheck } from "../helpers/promtool.ts";
import { testGuestImage } from "../helpers/guest.ts";
import {
  guestAgentAnswers,
  migrateDomain,
  migrationGuestXml,
  type MigrationNodes,
  migrationTargets,
  startMigrationNodes,
} from "../helpers/migration.ts";
import { type KeyPair, makeCertificates } from "../helpers/rest_client.ts";

async function waitUntil(what: string, check: () => Promise<boolean>, ms: number) {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`Timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 500));
  }
}

Deno.test("migration through the proxy (QEMU): the guest moves and its agent answers on the other node", async () => {
  // Two libvirtds. A source with another CA's certificate fails, and the guest stays where it was.
  const dir = await Deno.makeTempDir({ prefix: "virtnode-migq-" });
  const certs = await makeCertificates(dir);
  const server: KeyPair = {
    cert: await Deno.readTextFile(join(certs.serverDir, "tls.crt")),
    key: await Deno.readTextFile(join(certs.serverDir, "tls.key")),
  };
  const guestDir = join(await testGuestImage(), "..");
  const managers: MigrationProxyManager[] = [];
  const manager = (client: KeyPair) => {
    const m = new MigrationProxyManager({
      serverTls: () => ({ ...server, ca: certs.ca }),
      clientTls: () => ({ ...client, ca: certs.ca }),
      bindAddress: "127.0.0.1",
    });
    managers.push(m);
    return m;
  };
  const name = `vn-migrate-${crypto.randomUUID().slice(0, 6)}`;
  const uid = crypto.randomUUID();
  let nodes: MigrationNodes | undefined;
  try {
    nodes = await startMigrationNodes();
    const { a, b } = nodes;
    const domain = await a.conn.defineXML(migrationGuestXml(name, uid, guestDir));
    await domain.start();
    await waitUntil(
      "the guest's agent on the source",
      () => guestAgentAnswers(a.conn, name),
      180_000,
    );

    // A source with another CA's client certificate: refused, the guest stays.
    const target = manager(certs.client);
    await target.startTargetListener(uid, migrationTargets(b, uid));
    const ports = target.targetListenerPorts(uid);
    const impostor = manager(certs.otherCa);
    await impostor.startSourceListener(uid, "127.0.0.1", ports, a.run);
    await assert.rejects(migrateDomain(domain, uid), /migrate/i);
    await impostor.stopSourceListener(uid);
    assert.equal((await domain.getState()).state, 1, "the guest still runs on the source");
    assert.ok(await guestAgentAnswers(a.conn, name), "its agent still answers on the source");
    assert.deepEqual(
      (await b.conn.listAllDomains()).map((d) => d.name),
      [],
      "nothing arrived on the target",
    );

    // The right certificates: the guest moves.
    const source = manager(certs.client);
    await source.startSourceListener(uid, "127.0.0.1", ports, a.run);
    const started = performance.now();
    await migrateDomain(domain, uid);
    const ms = Math.round(performance.now() - started);
    const done = await domain.jobStats(VIR_DOMAIN_JOB_STATS_COMPLETED);
    console.log(
      `migrated in ${ms} ms through the proxy; libvirt: ${done.params.time_elapsed} ms, ` +
        `${done.params.memory_processed} bytes of memory, downtime ${done.params.downtime} ms`,
    );
    const state = await domain.getState();
    assert.equal(state.state, 5, "the source's domain is Shutoff");
    assert.equal(state.reasonName, "Migrated");
    const moved = await b.conn.lookupByName(name);
    assert.equal((await moved.getState()).state, 1, "the guest runs on the target");
    assert.equal(moved.uuid, uid);
    await waitUntil(
      "the guest's agent on the target",
      () => guestAgentAnswers(b.conn, name),
      30_000,
    );

    await source.stopSourceListener(uid);
    await target.stopTargetListener(uid);
    assert.deepEqual(
      [...Deno.readDirSync(join(a.run, "migrationproxy"))].map((e) => e.name),
      [],
      "the source's sockets are gone",
    );
  } finally {
    for (const m of managers) await m.shutdown();
    await nodes?.stop();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
});

Deno.test("migration by the launcher (QEMU): migrate, cancel and finalize through the domain manager", async () => {
  // Two libvirtds. MigrateVirtualMachine moves the guest through the proxy and
  // reports KubeVirt's migration metadata. A cancelled migration fails with
  // abortStatus Succeeded and the guest stays. FinalizeVirtualMachineMigration
  // on the target refreshes the interface's link and sets the guest's clock.
  const dir = await Deno.makeTempDir({ prefix: "virtnode-migl-" });
  const certs = await makeCertificates(dir);
  const server: KeyPair = {
    cert: await Deno.readTextFile(join(certs.serverDir, "tls.crt")),
    key: await Deno.readTextFile(join(certs.serverDir, "tls.key")),
  };
  const guestDir = join(await testGuestImage(), "..");
  const proxy = () =>
    new MigrationProxyManager({
      serverTls: () => ({ ...server, ca: certs.ca }),
      clientTls: () => ({ ...certs.client, ca: certs.ca }),
      bindAddress: "127.0.0.1",
    });
  const target = proxy();
  const source = proxy();
  const name = `vm-${crypto.randomUUID().slice(0, 6)}`;
  const uid = crypto.randomUUID();
  let nodes: MigrationNodes | undefined;
  try {
    nodes = await startMigrationNodes();
    const { a, b } = nodes;
    const domainName = `default_${name}`;
    await (await a.conn.defineXML(migrationGuestXml(domainName, uid, guestDir))).start();
    await waitUntil("the guest's agent", () => guestAgentAnswers(a.conn, domainName), 180_000);
    let changes = 0;
    const manager = new DomainManager({
      vmi: { namespace: "default", name, uid },
      connection: a.conn,
      converter: { runDir: join(dir, "run"), diskDir: join(dir, "disks") },
      // Inside the source libvirtd, its /run/libvirt holds the proxy's sockets.
      migrationSocketDir: "/run/libvirt",
    });
    manager.onChange = () => changes++;
    const vmiJson = (migrationUid: string) =>
      JSON.stringify({
        apiVersion: "kubevirt.io/v1",
        kind: "VirtualMachineInstance",
        metadata: { namespace: "default", name, uid },
        spec: { domain: { devices: {}, memory: { guest: "128Mi" } } },
        status: { migrationState: { migrationUid } },
      });
    await target.startTargetListener(uid, migrationTargets(b, uid));
    await source.startSourceListener(uid, "127.0.0.1", target.targetListenerPorts(uid), a.run);

    // Bad options are refused before anything moves.
    await assert.rejects(
      manager.migrate(vmiJson("m0"), '{"ProgressTimeout":"soon"}'),
      /ProgressTimeout must be a whole number/,
    );
    await assert.rejects(manager.migrate(vmiJson(""), "{}"), /names no migrationUid/);

    // A migration slow enough not to end before it is cancelled: 1 MiB/s (KubeVirt's
    // Bandwidth option), with at most 1 ms of pause at its end, so its first pass alone over
    // the guest's tens of MiB lasts far longer than this part of the test. (A guest made to
    // rewrite its memory so that a faster one cannot converge did converge under CI's load.)
    // Its progress is in GetDomainStats, as KubeVirt's MigrateDomainJobInfo, and becomes the
    // migration families of /metrics.
    const guest = await a.conn.lookupByName(domainName);
    await manager.migrate(vmiJson("m1"), '{"Bandwidth":"1Mi"}');
    await guest.migrateSetMaxDowntime(1);
    let stats: Record<string, unknown> | undefined;
    await waitUntil("the migration's progress in the domain statistics", async () => {
      stats = await manager.getDomainStats();
      const job = stats?.MigrateDomainJobInfo as Record<string, number | boolean> | undefined;
      return job?.DataTotalSet === true && job?.MemDirtyRateSet === true &&
        (job?.MemoryBps as number) > 0;
    }, 60_000);
    const job = stats!.MigrateDomainJobInfo as Record<string, number>;
    assert.ok(
      job.MemoryBps <= 1.5 * 1024 * 1024,
      `the Bandwidth option caps the transfer: ${job.MemoryBps} B/s`,
    );
    const exp = new Exposition();
    addVmiSamples(
      exp,
      JSON.parse(vmiJson("m1")) as VirtualMachineInstance,
      stats!,
    );
    const text = exp.toString();
    for (
      const family of [
        "kubevirt_vmi_migration_data_total_bytes",
        "kubevirt_vmi_migration_data_remaining_bytes",
        "kubevirt_vmi_migration_data_processed_bytes",
        "kubevirt_vmi_migration_dirty_memory_rate_bytes",
        "kubevirt_vmi_migration_memory_transfer_rate_bytes",
      ]
    ) {
      assert.match(text, new RegExp(`^${family}\\{[^}]*name="${name}"[^}]*\\} \\d`, "m"), family);
    }
    const checked = await promtoolCheck(text);
    assert.ok(checked.ok, checked.complaints);

    // Cancelled: it fails, aborted, and the guest stays.
    await manager.cancelMigration(vmiJson("m1"));
    await manager.migrationDone();
    const cancelled = (await manager.getDomain())!.spec.metadata.kubevirt.migration!;
    assert.equal(cancelled.uid, "m1");
    assert.equal(cancelled.failed, true);
    assert.equal(cancelled.abortStatus, "Succeeded");
    assert.ok(cancelled.endTimestamp);
    assert.equal((await manager.getDomain())!.status.status, "Running");
    assert.ok(await guestAgentAnswers(a.conn, domainName), "the guest still answers on the source");

    // The real one, at full speed: it moves; the metadata says it is over and did not fail.
    await guest.migrateSetMaxDowntime(300); // QEMU keeps the limit: back to its default
    await manager.migrate(vmiJson("m2"), "{}");
    await manager.migrate(vmiJson("m2"), "{}"); // the same again: nothing new
    await manager.migrationDone();
    const domain = await manager.getDomain();
    const done = domain!.spec.metadata.kubevirt.migration!;
    assert.equal(done.uid, "m2");
    assert.equal(done.failed ?? false, false, done.failureReason ?? "");
    assert.ok(done.startTimestamp && done.endTimestamp);
    assert.equal(done.mode, "PreCopy");
    assert.equal(domain!.status.status, "Shutoff");
    assert.equal(domain!.status.reason, "Migrated");
    await waitUntil(
      "the guest's agent on the target",
      () => guestAgentAnswers(b.conn, domainName),
      30_000,
    );
    assert.ok(changes >= 4, `the domain was sent again on each change (${changes})`);
    assert.equal(
      (await manager.getDomainStats().catch(() => undefined))?.MigrateDomainJobInfo ?? null,
      null,
      "no migration progress once it is over",
    );

    // On the target, FinalizeVirtualMachineMigration: the interface named for link-refresh
    // goes down and up again, and the guest's clock, set a day back here, is set to the
    // host's through its agent.
    const moved = await b.conn.lookupByName(domainName);
    const day = 86_400;
    await moved.setTime({ seconds: Math.floor(Date.now() / 1000) - day, nanoseconds: 0 });
    const guestClock = async () =>
      Number(JSON.parse(await moved.agentCommand('{"execute":"guest-get-time"}', 5)).return) /
      1e9;
    assert.ok(Date.now() / 1000 - (await guestClock()) > day - 60, "the guest's clock is behind");
    // What the manager asks of libvirt's device update, recorded on its way (libvirt's
    // answer is the real one).
    const updates: string[] = [];
    const recording = new Proxy(b.conn, {
      get(conn, key) {
        if (key !== "lookupByName") return Reflect.get(conn, key, conn);
        return async (domain: string) => {
          const found = await conn.lookupByName(domain);
          return new Proxy(found, {
            get(d, k) {
              const value = Reflect.get(d, k, d);
              if (k !== "updateDevice") return typeof value === "function" ? value.bind(d) : value;
              return async (xml: string, flags?: number) => {
                await d.updateDevice(xml, flags);
                updates.push(xml);
              };
            },
          });
        };
      },
    });
    const targetManager = new DomainManager({
      vmi: { namespace: "default", name, uid },
      connection: recording,
      converter: { runDir: join(dir, "run-b"), diskDir: join(dir, "disks-b") },
    });
    await targetManager.finalizeMigration(vmiJson("m2"), {
      interfaceMigration: { default: { method: "link-refresh" } },
    });
    assert.equal(updates.length, 2, "down, then up");
    assert.match(updates[0], /<alias name='ua-default'\/>[\s\S]*<link state='down'\/>/);
    assert.doesNotMatch(updates[1], /<link/);
    await waitUntil(
      "the guest's clock set to the host's",
      async () => Math.abs(Date.now() / 1000 - (await guestClock())) < 30,
      30_000,
    );
    assert.doesNotMatch(await moved.getXMLDesc(), /<link state='down'\/>/, "the link is up");
    await assert.rejects(
      targetManager.finalizeMigration(vmiJson("m2").replace(`"${name}"`, '"other"'), {}),
      /the request is for VMI "default\/other"/,
    );
  } finally {
    await source.shutdown();
    await target.shutdown();
    await nodes?.stop();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
});

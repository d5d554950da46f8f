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

Deno.test("migration through the proxy (QEMU, two libvirtds): the running test guest moves to the other node, its agent answers there; a source with another CA's certificate fails and the guest stays", async () => {
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

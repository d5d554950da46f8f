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
import {
  type Connection,
  openLibvirt,
  VIR_DOMAIN_JOB_STATS_COMPLETED,
  VIR_MIGRATE_LIVE,
  VIR_MIGRATE_PEER2PEER,
  VIR_MIGRATE_PERSIST_DEST,
} from "../../ffi/mod.ts";
import { kvmUsable } from "../../mod/host/mod.ts";
import {
  LIBVIRT_DIRECT_MIGRATION_PORT,
  MigrationProxyManager,
  proxyKey,
  type ProxyTarget,
  sourceUnixFile,
} from "../../mod/migration/mod.ts";
import { type PrivateLibvirtd, startPrivateLibvirtd } from "../helpers/libvirtd.ts";
import { testGuestImage } from "../helpers/guest.ts";
import { type KeyPair, makeCertificates } from "../helpers/rest_client.ts";

/** The test guest, booted from its kernel and initramfs, its agent on a virtio channel. */
function guestXml(name: string, uuid: string, dir: string): string {
  const kvm = kvmUsable();
  return `<domain type='${kvm ? "kvm" : "qemu"}'>
  <name>${name}</name>
  <uuid>${uuid}</uuid>
  <memory unit='MiB'>128</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>${dir}/vmlinuz</kernel>
    <initrd>${dir}/initrd</initrd>
    <cmdline>console=ttyS0,115200 quiet</cmdline>
  </os>
  ${
    kvm
      ? "<cpu mode='host-passthrough'><feature policy='disable' name='arch-capabilities'/></cpu>"
      : "<cpu mode='custom'><model>qemu64</model></cpu>"
  }
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw'/>
      <source file='${dir}/guest.img'/>
      <target dev='vda' bus='virtio'/>
      <readonly/>
    </disk>
    <channel type='unix'>
      <target type='virtio' name='org.qemu.guest_agent.0'/>
    </channel>
    <serial type='pty'><target port='0'/></serial>
    <console type='pty'><target type='serial' port='0'/></console>
    <memballoon model='none'/>
  </devices>
</domain>`;
}

async function agentAnswers(conn: Connection, name: string): Promise<boolean> {
  try {
    const dom = await conn.lookupByName(name);
    const reply = await dom.agentCommand('{"execute":"guest-get-osinfo"}', 2);
    return reply.includes("virtnode-guest");
  } catch {
    return false;
  }
}

async function waitUntil(what: string, check: () => Promise<boolean>, ms: number) {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`Timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 500));
  }
}

/** The target's listeners into the libvirtd whose `/run/libvirt` is `runDir`, and its QEMU's incoming socket. */
function targets(runDir: string, uid: string): ProxyTarget[] {
  const open = (path: string) => () => Promise.resolve({ path, release: () => {} });
  return [
    { port: 0, open: open(join(runDir, "libvirt-sock")) },
    {
      port: LIBVIRT_DIRECT_MIGRATION_PORT,
      // libvirt has the target's QEMU listen where the migration URI points, in its own
      // /run/libvirt: this node's copy of the path the source's sockets have.
      open: open(sourceUnixFile(runDir, proxyKey(uid, LIBVIRT_DIRECT_MIGRATION_PORT))),
    },
  ];
}

/**
 * A short path to `runDir` (a unix socket's path holds 107 bytes, and the temporary
 * directories' names are long), removed at the end.
 */
async function shortLink(runDir: string, links: string[]): Promise<string> {
  const link = `/tmp/vnm-${crypto.randomUUID().slice(0, 6)}`;
  await Deno.symlink(runDir, link);
  links.push(link);
  return link;
}

Deno.test("migration through the proxy (QEMU, two libvirtds): the running test guest moves to the other node, its agent answers there; a source with another CA's certificate fails and the guest stays", async () => {
  const dir = await Deno.makeTempDir({ prefix: "virtnode-migq-" });
  const certs = await makeCertificates(dir);
  const server: KeyPair = {
    cert: await Deno.readTextFile(join(certs.serverDir, "tls.crt")),
    key: await Deno.readTextFile(join(certs.serverDir, "tls.key")),
  };
  const guestDir = join(await testGuestImage(), "..");
  const nodes: PrivateLibvirtd[] = [];
  const links: string[] = [];
  const conns: Connection[] = [];
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
  try {
    const a = await startPrivateLibvirtd({ user: 0, group: 0, hostUuid: crypto.randomUUID() });
    nodes.push(a);
    const b = await startPrivateLibvirtd({ user: 0, group: 0, hostUuid: crypto.randomUUID() });
    nodes.push(b);
    for (const node of nodes) await Deno.mkdir(join(node.runDir, "migrationproxy"));
    const runA = await shortLink(a.runDir, links);
    const runB = await shortLink(b.runDir, links);
    const connA = await openLibvirt(a.uri);
    conns.push(connA);
    const connB = await openLibvirt(b.uri);
    conns.push(connB);

    const domain = await connA.defineXML(guestXml(name, uid, guestDir));
    await domain.start();
    await waitUntil("the guest's agent on the source", () => agentAnswers(connA, name), 180_000);

    // Inside each libvirtd, its /run/libvirt holds the proxy's sockets.
    const inside = (key: string) => sourceUnixFile("/run/libvirt", key);
    const migrate = () =>
      domain.migrateToURI3(
        `qemu+unix:///system?socket=${inside(uid)}`,
        [["migrate_uri", `unix://${inside(proxyKey(uid, LIBVIRT_DIRECT_MIGRATION_PORT))}`]],
        VIR_MIGRATE_LIVE | VIR_MIGRATE_PEER2PEER | VIR_MIGRATE_PERSIST_DEST,
      );

    // A source with another CA's client certificate: refused, the guest stays.
    const target = manager(certs.client);
    await target.startTargetListener(uid, targets(runB, uid));
    const ports = target.targetListenerPorts(uid);
    const impostor = manager(certs.otherCa);
    await impostor.startSourceListener(uid, "127.0.0.1", ports, runA);
    await assert.rejects(migrate(), /migrate/i);
    await impostor.stopSourceListener(uid);
    assert.equal((await domain.getState()).state, 1, "the guest still runs on the source");
    assert.ok(await agentAnswers(connA, name), "its agent still answers on the source");
    assert.deepEqual(
      (await connB.listAllDomains()).map((d) => d.name),
      [],
      "nothing arrived on the target",
    );

    // The right certificates: the guest moves.
    const source = manager(certs.client);
    await source.startSourceListener(uid, "127.0.0.1", ports, runA);
    const started = performance.now();
    await migrate();
    const ms = Math.round(performance.now() - started);
    const done = await domain.jobStats(VIR_DOMAIN_JOB_STATS_COMPLETED);
    console.log(
      `migrated in ${ms} ms through the proxy; libvirt: ${done.params.time_elapsed} ms, ` +
        `${done.params.memory_processed} bytes of memory, downtime ${done.params.downtime} ms`,
    );
    const state = await domain.getState();
    assert.equal(state.state, 5, "the source's domain is Shutoff");
    assert.equal(state.reasonName, "Migrated");
    const moved = await connB.lookupByName(name);
    assert.equal((await moved.getState()).state, 1, "the guest runs on the target");
    assert.equal(moved.uuid, uid);
    await waitUntil("the guest's agent on the target", () => agentAnswers(connB, name), 30_000);

    await source.stopSourceListener(uid);
    await target.stopTargetListener(uid);
    assert.deepEqual(
      [...Deno.readDirSync(join(a.runDir, "migrationproxy"))].map((e) => e.name),
      [],
      "the source's sockets are gone",
    );
  } finally {
    for (const m of managers) await m.shutdown();
    for (const c of conns) await c.close().catch(() => {});
    for (const node of nodes) await node.stop();
    for (const link of links) await Deno.remove(link).catch(() => {});
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
});

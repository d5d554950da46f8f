/**
 * Two libvirt "nodes" on one machine for migration tests and the bench: two private
 * libvirtds (own mount namespaces and host UUIDs), the test guest's domain for them, and the
 * URIs a migration through virtnode's proxy, or straight between them, takes.
 *
 * @module
 */
import { join } from "node:path";
import {
  type Connection,
  type Domain,
  openLibvirt,
  VIR_MIGRATE_LIVE,
  VIR_MIGRATE_PEER2PEER,
  VIR_MIGRATE_PERSIST_DEST,
} from "../../ffi/mod.ts";
import { kvmUsable } from "../../mod/host/mod.ts";
import {
  LIBVIRT_DIRECT_MIGRATION_PORT,
  proxyKey,
  type ProxyTarget,
  sourceUnixFile,
} from "../../mod/migration/mod.ts";
import { type PrivateLibvirtd, startPrivateLibvirtd } from "./libvirtd.ts";

/** KubeVirt's migration flags: live, peer to peer, defined on the destination. */
export const MIGRATE_FLAGS = VIR_MIGRATE_LIVE | VIR_MIGRATE_PEER2PEER | VIR_MIGRATE_PERSIST_DEST;

/** The test guest (from `guestDir`: vmlinuz, initrd, guest.img), its agent on a virtio channel. */
export function migrationGuestXml(
  name: string,
  uuid: string,
  guestDir: string,
  memoryMiB = 128,
): string {
  const kvm = kvmUsable();
  return `<domain type='${kvm ? "kvm" : "qemu"}'>
  <name>${name}</name>
  <uuid>${uuid}</uuid>
  <memory unit='MiB'>${memoryMiB}</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>${guestDir}/vmlinuz</kernel>
    <initrd>${guestDir}/initrd</initrd>
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
      <source file='${guestDir}/guest.img'/>
      <target dev='vda' bus='virtio'/>
      <readonly/>
    </disk>
    <channel type='unix'>
      <target type='virtio' name='org.qemu.guest_agent.0'/>
    </channel>
    <interface type='user'>
      <model type='virtio'/>
      <alias name='ua-default'/>
    </interface>
    <serial type='pty'><target port='0'/></serial>
    <console type='pty'><target type='serial' port='0'/></console>
    <memballoon model='none'/>
  </devices>
</domain>`;
}

/** One libvirt node: its daemon, a short host path to its `/run/libvirt`, a connection. */
export interface MigrationNode {
  /** The daemon. */
  libvirtd: PrivateLibvirtd;
  /**
   * A short host path (a link) to its `/run/libvirt`: a unix socket's path holds 107
   * bytes, and the daemon's temporary directory has a long name.
   */
  run: string;
  /** A connection to it. */
  conn: Connection;
}

/** Two nodes; `stop()` ends both and removes what they made. */
export interface MigrationNodes {
  /** The first node. */
  a: MigrationNode;
  /** The second node. */
  b: MigrationNode;
  /** Ends both daemons (destroying their guests) and removes the links. */
  stop(): Promise<void>;
}

/** Starts two libvirt nodes, each with a `migrationproxy` folder in its `/run/libvirt`. */
export async function startMigrationNodes(): Promise<MigrationNodes> {
  const started: MigrationNode[] = [];
  const stop = async () => {
    for (const n of started) {
      await n.conn.close().catch(() => {});
      await n.libvirtd.stop();
      await Deno.remove(n.run).catch(() => {});
    }
  };
  try {
    for (let i = 0; i < 2; i++) {
      const libvirtd = await startPrivateLibvirtd({
        user: 0,
        group: 0,
        hostUuid: crypto.randomUUID(),
      });
      const run = `/tmp/vnm-${crypto.randomUUID().slice(0, 6)}`;
      await Deno.mkdir(join(libvirtd.runDir, "migrationproxy"));
      await Deno.symlink(libvirtd.runDir, run);
      const conn = await openLibvirt(libvirtd.uri).catch(async (error) => {
        await libvirtd.stop();
        await Deno.remove(run).catch(() => {});
        throw error;
      });
      started.push({ libvirtd, run, conn });
    }
  } catch (error) {
    await stop();
    throw error;
  }
  return { a: started[0], b: started[1], stop };
}

/**
 * The target proxy's listeners into `node`'s libvirtd and into the socket its QEMU listens
 * on for the memory (libvirt has the target's QEMU listen where the migration URI points,
 * in the target's own `/run/libvirt`).
 */
export function migrationTargets(node: MigrationNode, uid: string): ProxyTarget[] {
  const open = (path: string) => () => Promise.resolve({ path, release: () => {} });
  return [
    { port: 0, open: open(join(node.run, "libvirt-sock")) },
    {
      port: LIBVIRT_DIRECT_MIGRATION_PORT,
      open: open(sourceUnixFile(node.run, proxyKey(uid, LIBVIRT_DIRECT_MIGRATION_PORT))),
    },
  ];
}

/**
 * Migrates `domain` as KubeVirt's launcher does, through the source proxy's sockets (which
 * a source node sees in its `/run/libvirt`), or `straight` to `target`'s own sockets.
 */
export async function migrateDomain(
  domain: Domain,
  uid: string,
  options: { straight?: MigrationNode } = {},
): Promise<void> {
  const memory = proxyKey(uid, LIBVIRT_DIRECT_MIGRATION_PORT);
  const [dconnuri, uri] = options.straight
    ? [
      `qemu+unix:///system?socket=${join(options.straight.run, "libvirt-sock")}`,
      // Not the proxy's name: a source proxy may have its socket by that name there.
      `unix://${join(options.straight.run, "migrationproxy", `${uid}-straight-memory.sock`)}`,
    ]
    : [
      `qemu+unix:///system?socket=${sourceUnixFile("/run/libvirt", uid)}`,
      `unix://${sourceUnixFile("/run/libvirt", memory)}`,
    ];
  await domain.migrateToURI3(dconnuri, [["migrate_uri", uri]], MIGRATE_FLAGS);
}

/** Whether the test guest's agent answers on `conn`'s domain `name`. */
export async function guestAgentAnswers(conn: Connection, name: string): Promise<boolean> {
  try {
    const dom = await conn.lookupByName(name);
    const reply = await dom.agentCommand('{"execute":"guest-get-osinfo"}', 2);
    return reply.includes("virtnode-guest");
  } catch {
    return false;
  }
}

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
import { ensureLibvirtd, type PrivateLibvirtd, startPrivateLibvirtd } from "./libvirtd.ts";

/** KubeVirt's migration flags: live, peer to peer, defined on the destination. */
export const MIGRATE_FLAGS = VIR_MIGRATE_LIVE | VIR_MIGRATE_PEER2PEER | VIR_MIGRATE_PERSIST_DEST;

/**
 * The test guest (from `guestDir`: vmlinuz, initrd, guest.img), its agent on a virtio channel;
 * `uuid` is its libvirt UUID and, in its KubeVirt metadata, its VMI's UID (a launcher acts
 * only on its own VMI's domain).
 */
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
  <metadata><kubevirt xmlns="http://kubevirt.io"><uid>${uuid}</uid></kubevirt></metadata>
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

/**
 * One test "node" for migrations between handlers: a network namespace of its own (its
 * `eth0` on the test's bridge, with an address of the bridge's /24) and a mount namespace,
 * held by the node's private libvirtd, in which `/run/libvirt` and the other libvirt folders
 * and `/var/run/kubevirt` are the node's own. A handler started with {@linkcode NodeHost.enter}
 * runs in both, so it, its launcher host, libvirtd and QEMU see the same paths, and the
 * migration's sockets are at the same path on every node, as on real ones.
 */
export interface NodeHost {
  /** The node's name. */
  name: string;
  /** Its network namespace (`/run/netns/<name>`). */
  netns: string;
  /** Its address, where the other node's handler reaches its migration listeners. */
  address: string;
  /** Its pod network (a bridge and /24 inside the node's namespace). */
  podNetwork: { bridge: string; cidr: string };
  /** The host folder that is `/var/run/kubevirt` in the node. */
  runDir: string;
  /** The node's libvirtd. */
  libvirtd: PrivateLibvirtd;
  /** The command line prefix that runs a program in the node's namespaces. */
  enter: string[];
}

/** Nodes on one bridge; `stop()` ends their libvirtds and removes their namespaces and links. */
export interface NodeHosts {
  /** The nodes. */
  nodes: NodeHost[];
  /** Ends every libvirtd (and its guests), removes namespaces, links, routes and folders. */
  stop(): Promise<void>;
}

async function ip(...args: string[]): Promise<void> {
  const out = await new Deno.Command("ip", { args, stdout: "null", stderr: "piped" }).output();
  if (!out.success) {
    throw new Error(`ip ${args.join(" ")}: ${new TextDecoder().decode(out.stderr).trim()}`);
  }
}

/**
 * Starts `count` nodes: a bridge in this namespace (`<net>.254`), each node's network
 * namespace joined to it by a veth pair (`<net>.<i+1>`, its default route through the
 * bridge, IPv4 forwarding on for its pods), a route from here to each node's pods, and a
 * libvirtd of its own host UUID in each.
 */
export async function startNodeHosts(count: number): Promise<NodeHosts> {
  // The machine's libvirt set up (its QEMU user and groups, which a private daemon's QEMU
  // driver looks up), as for every QEMU test.
  await ensureLibvirtd();
  const id = crypto.randomUUID().slice(0, 6);
  const bytes = crypto.getRandomValues(new Uint8Array(2));
  const net = `10.${150 + (bytes[0] % 40)}.${bytes[1]}`;
  const bridge = `vnmb${id}`;
  const nodes: NodeHost[] = [];
  const namespaces: string[] = [];
  const routes: string[] = [];
  const dirs: string[] = [];
  const stop = async () => {
    for (const n of nodes) await n.libvirtd.stop().catch(() => {});
    for (const r of routes) await ip("route", "del", r).catch(() => {});
    for (const ns of namespaces) await ip("netns", "delete", ns).catch(() => {});
    await ip("link", "delete", bridge).catch(() => {});
    for (const d of dirs) await Deno.remove(d, { recursive: true }).catch(() => {});
  };
  try {
    await ip("link", "add", bridge, "type", "bridge");
    await ip("addr", "add", `${net}.254/24`, "dev", bridge);
    await ip("link", "set", bridge, "up");
    for (let i = 0; i < count; i++) {
      const name = `vnm-${id}-${i}`;
      await ip("netns", "add", name);
      namespaces.push(name);
      const outer = `vnm${id}${i}`;
      await ip("link", "add", outer, "type", "veth", "peer", "name", `${outer}p`);
      await ip("link", "set", outer, "master", bridge, "up");
      await ip("link", "set", `${outer}p`, "netns", name);
      await ip("-n", name, "link", "set", `${outer}p`, "name", "eth0");
      const address = `${net}.${i + 1}`;
      await ip("-n", name, "addr", "add", `${address}/24`, "dev", "eth0");
      await ip("-n", name, "link", "set", "eth0", "up");
      await ip("-n", name, "link", "set", "lo", "up");
      await ip("-n", name, "route", "add", "default", "via", `${net}.254`);
      const sysctl = await new Deno.Command("ip", {
        args: ["netns", "exec", name, "sysctl", "-qw", "net.ipv4.ip_forward=1"],
        stdout: "null",
        stderr: "piped",
      }).output();
      if (!sysctl.success) throw new Error(new TextDecoder().decode(sysctl.stderr));
      const pods = `10.${200 + (bytes[0] % 40)}.${(bytes[1] + i + 1) % 256}.0/24`;
      await ip("route", "add", pods, "via", address);
      routes.push(pods);
      const runDir = await Deno.makeTempDir({ prefix: `virtnode-node${i}-run-` });
      dirs.push(runDir);
      const libvirtd = await startPrivateLibvirtd({
        user: 0,
        group: 0,
        hostUuid: crypto.randomUUID(),
        netns: `/run/netns/${name}`,
        binds: { "/var/run/kubevirt": runDir },
      });
      nodes.push({
        name,
        netns: `/run/netns/${name}`,
        address,
        podNetwork: { bridge: `vnp${id}${i}`, cidr: pods },
        runDir,
        libvirtd,
        enter: [
          "nsenter",
          `--net=/run/netns/${name}`,
          `--mount=/proc/${libvirtd.pid}/ns/mnt`,
          "--",
        ],
      });
    }
  } catch (error) {
    await stop();
    throw error;
  }
  return { nodes, stop };
}

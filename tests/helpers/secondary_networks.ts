/**
 * Secondary networks as the tests give them to the test guest: a Linux bridge of the node per
 * network with the node's address `<subnet>.1` and a web server on it, a bridge
 * NetworkAttachmentDefinition for it (no IPAM, as KubeVirt's secondary bridge networks
 * usually are), and a VMI's bridge interfaces on them with fixed MACs and static addresses
 * `<subnet>.<host>` from cloud-init's network-config (the test guest reads it; no DHCP on
 * secondaries, as in KubeVirt).
 *
 * @module
 */

/** One secondary network of a test. */
export interface SecondaryNetwork {
  /** The VMI's network name and the NetworkAttachmentDefinition's. */
  name: string;
  /** The node's bridge. */
  bridge: string;
  /** The first three octets of its /24. */
  subnet: string;
  /** The first five octets of its guests' MACs. */
  mac: string;
}

/**
 * Two secondary networks (`red`, `blue`) with bridges named after `id` (6 hex digits), in
 * /24s picked by it (tests that run beside each other do not share a subnet).
 */
export function secondaryNetworks(id: string): SecondaryNetwork[] {
  const octet = parseInt(id.slice(0, 2), 16);
  return [
    { name: "red", bridge: `vnr${id}`, subnet: `172.30.${octet}`, mac: "02:00:00:0a:96" },
    { name: "blue", bridge: `vnb${id}`, subnet: `172.31.${octet}`, mac: "02:00:00:0a:97" },
  ];
}

/** A guest's MAC on a network: the network's prefix and the guest's host number. */
export function guestMac(net: SecondaryNetwork, host: number): string {
  return `${net.mac}:${host.toString(16).padStart(2, "0")}`;
}

async function ip(args: string[]): Promise<void> {
  const out = await new Deno.Command("ip", { args, stdout: "null", stderr: "piped" }).output();
  if (!out.success) {
    throw new Error(`ip ${args.join(" ")}: ${new TextDecoder().decode(out.stderr).trim()}`);
  }
}

/** The node's side of the networks, made by {@linkcode nodeBridges}. */
export interface NodeBridges {
  /** The port of the web server on `<subnet>.1`, which answers `node-<name>`, by network. */
  ports: Map<string, number>;
  /** Stops the servers and deletes the bridges. */
  remove(): Promise<void>;
}

/** Makes each network's bridge with the node's address, and a web server on it. */
export async function nodeBridges(nets: SecondaryNetwork[]): Promise<NodeBridges> {
  const servers: Deno.HttpServer[] = [];
  const ports = new Map<string, number>();
  const remove = async () => {
    for (const server of servers) await server.shutdown();
    for (const n of nets) await ip(["link", "delete", n.bridge]).catch(() => {});
  };
  try {
    for (const n of nets) {
      await ip(["link", "add", n.bridge, "type", "bridge"]);
      await ip(["address", "add", `${n.subnet}.1/24`, "dev", n.bridge]);
      await ip(["link", "set", n.bridge, "up"]);
      const server = Deno.serve(
        { hostname: `${n.subnet}.1`, port: 0, onListen: () => {} },
        () => new Response(`node-${n.name}\n`),
      );
      servers.push(server);
      ports.set(n.name, server.addr.port);
    }
  } catch (error) {
    await remove();
    throw error;
  }
  return { ports, remove };
}

/** The bridge NetworkAttachmentDefinition of a network (no IPAM). */
export function networkAttachment(net: SecondaryNetwork, namespace: string) {
  return {
    apiVersion: "k8s.cni.cncf.io/v1",
    kind: "NetworkAttachmentDefinition",
    metadata: { name: net.name, namespace },
    spec: {
      config: JSON.stringify({
        cniVersion: "0.3.1",
        name: net.name,
        type: "bridge",
        bridge: net.bridge,
      }),
    },
  };
}

/** The spec of a VMI, the parts these helpers add to. */
interface SpecParts {
  domain: {
    devices: { disks?: Record<string, unknown>[]; interfaces?: Record<string, unknown>[] };
  };
  networks?: Record<string, unknown>[];
  volumes?: Record<string, unknown>[];
}

/**
 * `spec` with a bridge interface on each network (`<mac>:<host>`), its network, and a
 * cloud-init NoCloud disk whose network-config addresses them `<subnet>.<host>/24`.
 */
export function withSecondaryNetworks<S extends SpecParts>(
  spec: S,
  nets: SecondaryNetwork[],
  host: number,
): S {
  const networkData = [
    "version: 1",
    "config:",
    ...nets.flatMap((n) => [
      "  - type: physical",
      `    name: ${n.name}`,
      `    mac_address: "${guestMac(n, host)}"`,
      "    subnets:",
      "      - type: static",
      `        address: ${n.subnet}.${host}/24`,
    ]),
  ].join("\n") + "\n";
  return {
    ...spec,
    domain: {
      ...spec.domain,
      devices: {
        ...spec.domain.devices,
        disks: [...(spec.domain.devices.disks ?? []), {
          name: "cloudinit",
          disk: { bus: "virtio" },
        }],
        interfaces: [
          ...(spec.domain.devices.interfaces ?? []),
          ...nets.map((n) => ({ name: n.name, bridge: {}, macAddress: guestMac(n, host) })),
        ],
      },
    },
    networks: [
      ...(spec.networks ?? []),
      ...nets.map((n) => ({ name: n.name, multus: { networkName: n.name } })),
    ],
    volumes: [...(spec.volumes ?? []), {
      name: "cloudinit",
      cloudInitNoCloud: { userData: "#cloud-config\n", networkData },
    }],
  };
}

/**
 * What the test guest's `/cgi-bin/echo` says of a caller at `<subnet>.<host>`: busybox httpd
 * gives an IPv4 caller as itself or IPv4-mapped (`[::ffff:a.b.c.d]`).
 */
export function echoedCaller(subnet: string, host: number): RegExp {
  return new RegExp(`remote=(\\[::ffff:)?${subnet.replaceAll(".", "\\.")}\\.${host}\\b`);
}

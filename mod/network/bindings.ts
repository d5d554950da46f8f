/**
 * The two bindings as steps in the pod's network namespace, the way KubeVirt's handler
 * lays them out (pure: what to run, decided from the plan, what was discovered of the pod
 * interface and what the namespace holds now):
 *
 * - **bridge**: the in-pod bridge `k6t-eth0`; the pod interface renamed `eth0-nic`, its
 *   addresses removed, its MAC replaced by the bridge's and made a port of the bridge
 *   (learning off); the tap `tap0` on the bridge; and a placeholder named `eth0` that keeps
 *   the pod interface's MAC, MTU and addresses, down. KubeVirt uses a `dummy` link; this
 *   kernel has no dummy link type (and an `ifb` link, which it has, cannot take a MAC), so
 *   the placeholder is a bridge with no ports, kept down: it holds a MAC, an MTU and
 *   addresses as a dummy does and passes no traffic. As with KubeVirt's dummy, the pod's IP
 *   stays a local address of the pod; `arp_ignore=1` keeps the pod from answering ARP for
 *   it (the guest owns it now). The in-pod bridge gets `169.254.75.1<n>/32` to send DHCP
 *   from.
 * - **masquerade**: the bridge `k6t-eth0` with MAC `02:00:00:00:00:00`, the guest's
 *   gateway `10.0.2.1/24` (and `fd10:0:2::1/120` where the pod has IPv6), the tap on it,
 *   forwarding on, `route_localnet` on the bridge, and KubeVirt's `nat` tables: the
 *   guest's traffic masqueraded, the pod's inbound traffic (every port, or the listed
 *   ones) and the pod's own loopback traffic sent to the guest `10.0.2.2`.
 *
 * Every step is safe to repeat: links are added only when missing, attributes and
 * addresses are set (`replace`), the `nat` tables are replaced whole in one `nft`
 * transaction. A setup cut short by a restart is finished by running the steps again.
 *
 * @module
 */

import { nthAddress } from "./address.ts";
import type { PodDiscovery } from "./cache.ts";
import type { NamespaceState } from "./links.ts";
import { MASQUERADE_BRIDGE_MAC, type PodInterfacePlan } from "./plan.ts";

/** What a binding's setup runs. */
export interface BindingSteps {
  /** `ip -batch` lines in the pod's namespace. */
  ip: string[];
  /** `[path, value]` sysctls under `/proc/sys/net`, written in the pod's namespace. */
  sysctls: [string, string][];
  /** Devices whose transmit checksum offload goes off. */
  txChecksumOff: string[];
  /** The `nft -f` script, when the binding has one. */
  nft?: string;
}

/** Options of {@linkcode bindingSteps}. */
export interface BindingOptions {
  /** The tap's owner: 0, or the VMI's runtime user (107) for a non-root launcher. */
  tapOwner: number;
  /**
   * Pod-less mode: the tap is made in the host's namespace under this name (libvirtd opens
   * it there) and moved into the pod's once the domain runs; the pod's steps leave it out.
   */
  hostTap?: string;
  /** `status.migrationTransport` of the VMI: without `Unix`, masquerade lets the old migration ports through. */
  migrationTransport?: string;
}

/** KubeVirt's migration ports of the TCP transport, which masquerade must not forward. */
const LEGACY_MIGRATION_PORTS = [49152, 49153];

/** The address the in-pod bridge of interface `n` sends DHCP from under bridge binding. */
export function bridgeFakeAddress(index: number): string {
  return `169.254.75.1${index}`;
}

/** Masquerade: the gateway and the guest's address of a CIDR (its first and second hosts). */
export function masqueradeAddresses(
  cidr: string,
): { gateway: string; guest: string; prefix: number } {
  return {
    gateway: nthAddress(cidr, 1),
    guest: nthAddress(cidr, 2),
    prefix: Number(cidr.split("/")[1]),
  };
}

function tapSteps(plan: PodInterfacePlan, mtu: number, state: NamespaceState, o: BindingOptions) {
  if (o.hostTap !== undefined) return [];
  const lines: string[] = [];
  if (!state.links.has(plan.tap)) {
    lines.push(`tuntap add dev ${plan.tap} mode tap user ${o.tapOwner} group ${o.tapOwner}`);
  }
  lines.push(`link set dev ${plan.tap} mtu ${mtu} master ${plan.bridge} up`);
  return lines;
}

function bridgeBinding(
  plan: PodInterfacePlan,
  d: PodDiscovery,
  state: NamespaceState,
  o: BindingOptions,
): BindingSteps {
  const pod = plan.podInterface;
  const renamed = plan.renamedPodInterface;
  const br = plan.bridge;
  const bridgeMac = d.bridgeMac!;
  const ip: string[] = [];
  if (!state.links.has(br)) ip.push(`link add name ${br} type bridge`);
  ip.push(`link set dev ${br} address ${bridgeMac} mtu ${d.mtu}`);
  // The pod interface keeps its index through the rename; a link called like it that has
  // another index is the placeholder of an earlier pass.
  const original = [...state.links.values()].find((l) => l.index === d.index);
  if (original && original.name !== renamed) {
    ip.push(`link set dev ${original.name} down`, `link set dev ${original.name} name ${renamed}`);
  }
  ip.push(
    `link set dev ${renamed} address ${bridgeMac}`,
    `address flush dev ${renamed}`,
    `link set dev ${renamed} master ${br}`,
    `link set dev ${renamed} type bridge_slave learning off`,
    `link set dev ${renamed} up`,
  );
  ip.push(...tapSteps(plan, d.mtu, state, o));
  const placeholder = state.links.get(pod);
  if (!placeholder || placeholder.index === d.index) ip.push(`link add name ${pod} type bridge`);
  ip.push(`link set dev ${pod} address ${d.mac} mtu ${d.mtu}`);
  for (const a of [...d.ipv4, ...d.ipv6]) {
    ip.push(
      `address replace ${a.address}/${a.prefix} dev ${pod}${
        a.address.includes(":") ? " nodad" : ""
      }`,
    );
  }
  // The renamed pod interface is a bridge port only: no addresses, IPv6 included.
  const sysctls: [string, string][] = [[`ipv6/conf/${renamed}/disable_ipv6`, "1"]];
  if (d.ipv4.length > 0) {
    ip.push(`address replace ${bridgeFakeAddress(plan.index)}/32 dev ${br}`);
    sysctls.push(["ipv4/conf/all/arp_ignore", "1"]);
  }
  ip.push(`link set dev ${br} up`);
  return { ip, sysctls, txChecksumOff: [br] };
}

function masqueradeBinding(
  plan: PodInterfacePlan,
  d: PodDiscovery,
  state: NamespaceState,
  o: BindingOptions,
): BindingSteps {
  const br = plan.bridge;
  const ip: string[] = [];
  if (!state.links.has(br)) ip.push(`link add name ${br} type bridge`);
  ip.push(`link set dev ${br} address ${MASQUERADE_BRIDGE_MAC} mtu ${d.mtu}`);
  const sysctls: [string, string][] = [];
  const v4 = d.ipv4.length > 0 ? masqueradeAddresses(plan.vmCidr4) : undefined;
  const v6 = d.ipv6.length > 0 ? masqueradeAddresses(plan.vmCidr6) : undefined;
  if (v4) {
    ip.push(`address replace ${v4.gateway}/${v4.prefix} dev ${br}`);
    sysctls.push(["ipv4/ip_forward", "1"], [`ipv4/conf/${br}/route_localnet`, "1"]);
  }
  if (v6) {
    // No duplicate address detection: the address must be usable before the guest exists.
    sysctls.push([`ipv6/conf/${br}/accept_dad`, "0"], ["ipv6/conf/all/forwarding", "1"]);
  }
  ip.push(...tapSteps(plan, d.mtu, state, o));
  if (v6) ip.push(`address replace ${v6.gateway}/${v6.prefix} dev ${br} nodad`);
  ip.push(`link set dev ${br} up`);
  const families: NatFamily[] = [];
  if (v4) {
    families.push({ family: "ip", gateway: v4.gateway, guest: v4.guest, loopback: "127.0.0.1" });
  }
  if (v6) families.push({ family: "ip6", gateway: v6.gateway, guest: v6.guest, loopback: "::1" });
  return {
    ip,
    sysctls,
    txChecksumOff: [br],
    nft: families.length > 0 ? natScript(plan, families, o.migrationTransport) : undefined,
  };
}

/** One address family of masquerade's rules. */
export interface NatFamily {
  /** nft's family: `ip` or `ip6`. */
  family: "ip" | "ip6";
  /** The in-pod bridge's address, the guest's gateway. */
  gateway: string;
  /** The guest's address. */
  guest: string;
  /** The family's loopback address. */
  loopback: string;
}

/**
 * KubeVirt's masquerade rules as one `nft -f` transaction that replaces the `nat` table of
 * each family: the guest's traffic masqueraded out; inbound traffic of the pod interface
 * (the listed ports, or all) sent to the guest; the pod's own loopback traffic to those
 * ports sent to the guest with the gateway as its source.
 */
export function natScript(
  plan: PodInterfacePlan,
  families: NatFamily[],
  migrationTransport?: string,
): string {
  const lines: string[] = [];
  for (const f of families) {
    const F = f.family;
    const pre: string[] = [];
    const post: string[] = [];
    const output: string[] = [];
    if (migrationTransport !== "Unix") {
      const ports = LEGACY_MIGRATION_PORTS.join(", ");
      output.push(`tcp dport { ${ports} } ${F} saddr ${f.loopback} counter return`);
      post.push(`tcp dport { ${ports} } ${F} saddr ${f.loopback} counter return`);
    }
    if (plan.ports.length === 0) {
      pre.push(`counter dnat to ${f.guest}`);
      post.push(`${F} saddr { ${f.loopback} } counter snat to ${f.gateway}`);
      output.push(`${F} daddr { ${f.loopback} } counter dnat to ${f.guest}`);
    }
    for (const p of plan.ports) {
      pre.push(`${p.protocol} dport { ${p.port} } counter dnat to ${f.guest}`);
      post.push(
        `${p.protocol} dport ${p.port} ${F} saddr { ${f.loopback} } counter snat to ${f.gateway}`,
      );
      output.push(
        `${F} daddr { ${f.loopback} } ${p.protocol} dport ${p.port} counter dnat to ${f.guest}`,
      );
    }
    const chain = (name: string, head: string | undefined, rules: string[]) => {
      lines.push(`  chain ${name} {`);
      if (head) lines.push(`    ${head}`);
      for (const rule of rules) lines.push(`    ${rule}`);
      lines.push("  }");
    };
    // Declared first, so the delete below never fails: the table is replaced whole.
    lines.push(`table ${F} nat`, `delete table ${F} nat`, `table ${F} nat {`);
    chain("prerouting", "type nat hook prerouting priority -100;", [
      `iifname "${plan.podInterface}" counter jump KUBEVIRT_PREINBOUND`,
    ]);
    chain("input", "type nat hook input priority 100;", []);
    chain("output", "type nat hook output priority -100;", output);
    chain("postrouting", "type nat hook postrouting priority 100;", [
      `${F} saddr ${f.guest} counter masquerade`,
      `oifname "${plan.bridge}" counter jump KUBEVIRT_POSTINBOUND`,
    ]);
    chain("KUBEVIRT_PREINBOUND", undefined, pre);
    chain("KUBEVIRT_POSTINBOUND", undefined, post);
    lines.push("}");
  }
  return lines.join("\n") + "\n";
}

/** The steps of one interface's binding. */
export function bindingSteps(
  plan: PodInterfacePlan,
  discovery: PodDiscovery,
  state: NamespaceState,
  options: BindingOptions,
): BindingSteps {
  return plan.binding === "bridge"
    ? bridgeBinding(plan, discovery, state, options)
    : masqueradeBinding(plan, discovery, state, options);
}

/**
 * Pod-less mode, once libvirtd has opened the tap in the host's namespace: the host's
 * step moves it into the pod's namespace, the pod's steps name it like KubeVirt's tap and
 * put it on the bridge.
 */
export function adoptHostTapSteps(
  plan: PodInterfacePlan,
  hostTap: string,
  netns: string,
  mtu: number,
): { host: string[]; pod: string[] } {
  return {
    host: [`link set dev ${hostTap} netns ${netns}`],
    pod: [
      `link set dev ${hostTap} name ${plan.tap}`,
      `link set dev ${plan.tap} mtu ${mtu} master ${plan.bridge} up`,
    ],
  };
}

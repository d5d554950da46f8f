/**
 * The launcher's part of a VMI's pod network (KubeVirt's launcher's network setup), once
 * the handler has built the bindings: for each pod-network interface it reads the pod's
 * links (the guest's MAC and MTU are the pod interface's, unless the spec sets a MAC), says
 * which tap the domain's `<interface type="ethernet">` opens, and starts the guest's DHCP
 * servers on the in-pod bridge: for bridge binding from the handler's
 * `vif-cache-<iface>.json` (the pod's address, gateway and routes), for masquerade from
 * the VM CIDR (`10.0.2.2`, gateway `10.0.2.1`; DHCPv6 `fd10:0:2::2` where the pod has
 * IPv6). DNS servers and search domains come from the pod's resolv.conf.
 *
 * What it started is written to `network.json` in the VMI's private directory, so a
 * launcher host that restarts serves the same leases again without the VMI's spec.
 *
 * @module
 */

import { join } from "node:path";
import { type NetnsRunner, writeFileDurably } from "../../ffi/mod.ts";
import type { VirtualMachineInstance } from "../api/mod.ts";
import { bridgeFakeAddress, masqueradeAddresses } from "./bindings.ts";
import { parseBridgeDhcpCache } from "./cache.ts";
import type { Dhcp4Lease, Dhcp4Route } from "./dhcp4.ts";
import type { DhcpServers, GuestLeases } from "./dhcp_server.ts";
import { guestHostname, parseResolvConf } from "./dns.ts";
import { globalAddresses, type Link, parseNamespaceState, READ_STATE_COMMANDS } from "./links.ts";
import { MASQUERADE_BRIDGE_MAC, type PodInterfacePlan, podNetworkPlan } from "./plan.ts";

/** What the domain's `<interface>` of a pod-network interface needs. */
export interface PreparedInterface {
  /** The tap the domain opens (`managed="no"`). */
  targetDev: string;
  /** The guest's MAC. */
  mac: string;
  /** The guest's MTU. */
  mtu: number;
}

/** Where the launcher finds its pod network. */
export interface GuestNetworkEnv {
  /** Makes sockets and reads links inside the pod's namespace. */
  runner: NetnsRunner;
  /** The DHCP servers of this process. */
  dhcp: DhcpServers;
  /** The pod's network namespace; none: this process's own (a launcher in its pod). */
  netns?: string;
  /** The launcher's private directory: `vif-cache-<iface>.json` is read, `network.json` written here. */
  privateDir: string;
  /** Pod-less mode: the tap's name in the host's namespace, which the domain opens. */
  hostTap?(plan: PodInterfacePlan): string;
  /** The pod's resolver configuration; `/etc/resolv.conf` unless told. */
  resolvConf?: string;
  /** The guest's host name; the one virt-controller gives the VMI's pod unless told. */
  hostname?: string;
}

/** A pod network the launcher cannot serve (the handler's part missing or broken). */
export class GuestNetworkError extends Error {
  /** Creates `Cannot prepare the pod network of interface "<name>": <detail>`. */
  constructor(name: string, detail: string, options?: ErrorOptions) {
    super(`Cannot prepare the pod network of interface "${name}": ${detail}`, options);
    this.name = "GuestNetworkError";
  }
}

const NETWORK_FILE = "network.json";

function routesForDhcp(routes: { destination: string; gateway?: string }[]): Dhcp4Route[] {
  const out = routes.map((r) => {
    const [destination, prefix] = r.destination === "default"
      ? ["0.0.0.0", 0]
      : [r.destination.split("/")[0], Number(r.destination.split("/")[1] ?? 32)];
    return { destination, prefix: Number(prefix), gateway: r.gateway ?? "0.0.0.0" };
  });
  // The default route last, as KubeVirt's server sorts them.
  return [...out.filter((r) => r.prefix !== 0), ...out.filter((r) => r.prefix === 0)];
}

async function readText(path: string, what: string, name: string): Promise<string> {
  try {
    return await Deno.readTextFile(path);
  } catch (error) {
    throw new GuestNetworkError(name, `cannot read ${what} "${path}": ${String(error)}`, {
      cause: error,
    });
  }
}

/**
 * Prepares every pod-network interface of `vmi` (see the module doc) and returns what the
 * domain XML needs, by interface name. Throws `NetworkSpecError` for a spec the node
 * cannot serve and {@linkcode GuestNetworkError} when the pod is not as the handler
 * should have left it.
 */
export async function prepareGuestNetwork(
  vmi: VirtualMachineInstance,
  env: GuestNetworkEnv,
): Promise<Record<string, PreparedInterface>> {
  const plans = podNetworkPlan(vmi);
  const prepared: Record<string, PreparedInterface> = {};
  if (plans.length === 0) return prepared;
  const results = await env.runner.run(
    env.netns,
    READ_STATE_COMMANDS.map((c) => ({ op: "exec" as const, ...c })),
  ) as { code: number; stdout: string; stderr: string }[];
  const failed = results.find((r) => r.code !== 0);
  if (failed) {
    throw new GuestNetworkError(
      plans[0].name,
      `cannot read the pod's links: ${failed.stderr.trim()}`,
    );
  }
  const state = parseNamespaceState(results[0].stdout, results[1].stdout, results[2].stdout);
  const dns = parseResolvConf(
    await Deno.readTextFile(env.resolvConf ?? "/etc/resolv.conf").catch(() => ""),
    vmi.spec.subdomain,
  );
  const hostname = env.hostname ?? guestHostname(vmi);
  const leases: Record<string, GuestLeases> = {};
  for (const plan of plans) {
    const pod = state.links.get(plan.podInterface);
    if (!pod) {
      throw new GuestNetworkError(
        plan.name,
        `the pod has no interface "${plan.podInterface}": its network was not set up`,
      );
    }
    if (state.links.get(plan.bridge)?.kind !== "bridge") {
      throw new GuestNetworkError(
        plan.name,
        `the pod has no bridge "${plan.bridge}": its network was not set up`,
      );
    }
    const mac = plan.macAddress ?? pod.mac;
    const targetDev = env.hostTap?.(plan) ??
      (state.links.has(plan.tap) ? plan.tap : plan.podInterface);
    prepared[plan.name] = { targetDev, mac, mtu: pod.mtu };
    const common = {
      dnsServers: dns.servers4,
      searchDomains: dns.search,
      domainName: dns.domain,
      hostname,
    };
    leases[plan.name] = plan.binding === "bridge"
      ? await bridgeLeases(plan, env, state.links.get(plan.renamedPodInterface), common)
      : masqueradeLeases(plan, pod, common, dns.servers6);
    leases[plan.name].netns = env.netns;
  }
  for (const [name, lease] of Object.entries(leases)) {
    await env.dhcp.start(`${vmi.metadata.uid}/${name}`, lease);
  }
  await writeFileDurably(join(env.privateDir, NETWORK_FILE), JSON.stringify(leases), {
    mode: 0o600,
  });
  return prepared;
}

async function bridgeLeases(
  plan: PodInterfacePlan,
  env: GuestNetworkEnv,
  renamed: Link | undefined,
  common: Partial<Dhcp4Lease>,
): Promise<GuestLeases> {
  const file = join(env.privateDir, `vif-cache-${plan.podInterface}.json`);
  let facts;
  try {
    facts = parseBridgeDhcpCache(await readText(file, "the DHCP facts", plan.name));
  } catch (error) {
    if (error instanceof GuestNetworkError) throw error;
    throw new GuestNetworkError(plan.name, `malformed DHCP facts in "${file}": ${String(error)}`);
  }
  if (facts.ipamDisabled || !facts.address) return { device: plan.bridge };
  return {
    device: plan.bridge,
    v4: {
      ...common,
      mac: plan.macAddress ?? facts.mac,
      address: facts.address.address,
      prefix: facts.address.prefix,
      serverAddress: bridgeFakeAddress(plan.index),
      router: facts.gateway,
      routes: routesForDhcp(facts.routes),
      mtu: renamed?.mtu,
    },
  };
}

function masqueradeLeases(
  plan: PodInterfacePlan,
  pod: Link,
  common: Partial<Dhcp4Lease>,
  servers6: string[],
): GuestLeases {
  const leases: GuestLeases = { device: plan.bridge };
  if (globalAddresses(pod, 4).length > 0) {
    const v4 = masqueradeAddresses(plan.vmCidr4);
    leases.v4 = {
      ...common,
      address: v4.guest,
      prefix: v4.prefix,
      serverAddress: v4.gateway,
      router: v4.gateway,
      mtu: pod.mtu,
    };
  }
  if (globalAddresses(pod, 6).length > 0) {
    leases.v6 = {
      address: masqueradeAddresses(plan.vmCidr6).guest,
      serverMac: MASQUERADE_BRIDGE_MAC,
      dnsServers: servers6,
    };
  }
  return leases;
}

/**
 * Starts the DHCP servers recorded in `network.json` of a private directory again (a
 * launcher host taking a running VMI back); returns how many interfaces it serves.
 */
export async function restoreGuestNetwork(
  uid: string,
  env: Pick<GuestNetworkEnv, "dhcp" | "privateDir">,
): Promise<number> {
  let text: string;
  try {
    text = await Deno.readTextFile(join(env.privateDir, NETWORK_FILE));
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return 0;
    throw error;
  }
  const leases = JSON.parse(text) as Record<string, GuestLeases>;
  for (const [name, lease] of Object.entries(leases)) await env.dhcp.start(`${uid}/${name}`, lease);
  return Object.keys(leases).length;
}

/**
 * The files KubeVirt's handler and launcher keep about a VMI's pod network, in KubeVirt's
 * own formats, so that virtnode's handler can drive KubeVirt's launcher (and find a
 * network KubeVirt's handler set up):
 *
 * - the network's state on the node, `<cache dir>/<vmi uid>/<network name>` (KubeVirt:
 *   `/var/run/kubevirt-private/network-info-cache/...`): the interface, the pod's IPs
 *   (what `status.interfaces` reports) and the setup's progress marker (`networkState`:
 *   absent pending, 1 started, 2 finished). virtnode adds what it discovered of the pod
 *   interface before changing it (`virtnodeDiscovery`), so that a setup a restart broke
 *   off is finished from the same facts; KubeVirt's handler ignores the extra key.
 * - the bridge binding's DHCP facts in the launcher's private directory,
 *   `vif-cache-<pod interface>.json`: KubeVirt's `DHCPConfig` as Go's encoding/json writes
 *   it (no JSON tags: Go's field names; an IPv4 mask as the base64 of its 4 bytes, a MAC
 *   as the base64 of its 6).
 *
 * @module
 */

import { writeFileDurably } from "../../ffi/mod.ts";
import { type Cidr, cidrContains, familyOf } from "./address.ts";
import type { Route } from "./links.ts";

/** The setup's progress marker (KubeVirt's `PodIfaceState`). */
export const NetworkState = { Pending: 0, Started: 1, Finished: 2 } as const;

/** What virtnode learned of the pod interface before its binding changed it. */
export interface PodDiscovery {
  /** The pod interface's name (`eth0`). */
  podInterface: string;
  /** Its interface index, which stays when it is renamed. */
  index: number;
  /** Its MAC address, which the guest takes over under bridge binding. */
  mac: string;
  /** Its MTU. */
  mtu: number;
  /** Its global IPv4 addresses. */
  ipv4: Cidr[];
  /** Its global IPv6 addresses. */
  ipv6: Cidr[];
  /** The IPv4 routes through it. */
  routes4: Route[];
  /** Bridge binding: the MAC of the in-pod bridge, which the renamed pod interface takes. */
  bridgeMac?: string;
}

/** One network's state file (KubeVirt's `PodIfaceCacheData`, plus virtnode's discovery). */
export interface NetworkStateRecord {
  /** The VMI's interface. */
  iface?: unknown;
  /** The pod's first IP. */
  podIP?: string;
  /** The pod's IPs, IPv4 first. */
  podIPs?: string[];
  /** The progress marker; absent while pending. */
  networkState?: number;
  /** What the pod interface was before the binding (virtnode only). */
  virtnodeDiscovery?: PodDiscovery;
}

/** The pod IPs a discovery reports: the first global IPv4 and the first global IPv6. */
export function podIPsOf(discovery: PodDiscovery): string[] {
  return [discovery.ipv4[0]?.address, discovery.ipv6[0]?.address].filter((a): a is string =>
    a !== undefined
  );
}

/** Reads a network's state file; an absent one is pending. Throws on a corrupt file. */
export async function readNetworkState(file: string): Promise<NetworkStateRecord> {
  let text: string;
  try {
    text = await Deno.readTextFile(file);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return {};
    throw error;
  }
  try {
    const record = JSON.parse(text);
    if (typeof record !== "object" || record === null || Array.isArray(record)) {
      throw new Error("not a JSON object");
    }
    return record as NetworkStateRecord;
  } catch (error) {
    throw new Error(`Cannot read network state "${file}": ${String(error)}`, { cause: error });
  }
}

/** Writes a network's state file whole and durably (`writeFileDurably`). */
export async function writeNetworkState(file: string, record: NetworkStateRecord): Promise<void> {
  await writeFileDurably(file, JSON.stringify(record, null, 2), { mode: 0o600, dirMode: 0o750 });
}

function base64(bytes: Uint8Array): string {
  let text = "";
  for (const byte of bytes) text += String.fromCharCode(byte);
  return btoa(text);
}

function unbase64(text: string): Uint8Array {
  return Uint8Array.from(atob(text), (ch) => ch.charCodeAt(0));
}

function macBytes(mac: string): Uint8Array {
  return Uint8Array.from(mac.split(":").map((part) => parseInt(part, 16)));
}

function maskBytes(prefix: number, family: 4 | 6): Uint8Array {
  const bytes = new Uint8Array(family === 4 ? 4 : 16);
  for (let i = 0; i < prefix; i++) bytes[i >> 3] |= 0x80 >> (i & 7);
  return bytes;
}

function prefixOfMask(mask: Uint8Array): number {
  let prefix = 0;
  for (const byte of mask) {
    for (let bit = 7; bit >= 0; bit--) {
      if ((byte >> bit) & 1) prefix++;
      else return prefix;
    }
  }
  return prefix;
}

/** Go's JSON of a `net.IPNet`. */
function ipNet(cidr: Cidr): { IP: string; Mask: string } {
  return { IP: cidr.address, Mask: base64(maskBytes(cidr.prefix, familyOf(cidr.address))) };
}

/** Go's JSON of a `netlink.Addr` (an unset one has no `IP` and `Mask`). */
function netlinkAddr(cidr: Cidr | undefined): Record<string, unknown> {
  return {
    ...(cidr ? ipNet(cidr) : {}),
    Label: "",
    Flags: 0,
    Scope: 0,
    Peer: null,
    Broadcast: "",
    PreferedLft: 0,
    ValidLft: 0,
    LinkIndex: 0,
  };
}

/** The bridge binding's DHCP facts, as the launcher reads them back. */
export interface BridgeDhcpFacts {
  /** The guest's address, or none (no DHCP: the pod interface had no IPv4). */
  address?: Cidr;
  /** The guest's MAC. */
  mac: string;
  /** The gateway. */
  gateway?: string;
  /** The routes to hand out (the default route as destination `default`). */
  routes: Route[];
}

/** The local subnet's route: no gateway, and the address's own network as destination. */
function isLocalSubnet(route: Route, address: Cidr | undefined): boolean {
  if (!address || route.destination === "default" || route.gateway) return false;
  const [, prefix] = route.destination.split("/");
  return Number(prefix ?? 32) === address.prefix &&
    cidrContains(route.destination, address.address);
}

/**
 * KubeVirt's `vif-cache-<iface>.json` for a bridge-bound interface: the pod's address and
 * MAC (the guest takes them over), the first gateway of the pod interface's routes and
 * those routes but the local subnet's. Without an IPv4 the file says `IPAMDisabled`.
 */
export function bridgeDhcpCache(discovery: PodDiscovery, guestMac: string): string {
  const address = discovery.ipv4[0];
  const routes = discovery.routes4.filter((r) => !isLocalSubnet(r, address));
  const gateway = discovery.routes4.find((r) => r.gateway)?.gateway;
  const config = {
    Name: "",
    IP: netlinkAddr(address),
    IPv6: netlinkAddr(undefined),
    MAC: base64(macBytes(guestMac)),
    AdvertisingIPAddr: "",
    AdvertisingIPv6Addr: "",
    Routes: address && routes.length > 0
      ? routes.map((r) => ({
        Dst: r.destination === "default" ? null : ipNet({
          address: r.destination.split("/")[0],
          prefix: Number(r.destination.split("/")[1] ?? 32),
        }),
        Gw: r.gateway ?? "",
      }))
      : null,
    Mtu: 0,
    IPAMDisabled: address === undefined,
    Gateway: gateway ?? "",
    Subdomain: "",
  };
  return JSON.stringify(config, null, "  ");
}

/** Reads a `vif-cache-<iface>.json` (KubeVirt's or virtnode's). Throws on a malformed one. */
export function parseBridgeDhcpCache(text: string): BridgeDhcpFacts & { ipamDisabled: boolean } {
  const c = JSON.parse(text) as {
    IP?: { IP?: string; Mask?: string };
    MAC?: string | null;
    Gateway?: string;
    Routes?: { Dst?: { IP?: string; Mask?: string } | null; Gw?: string }[] | null;
    IPAMDisabled?: boolean;
  };
  if (typeof c !== "object" || c === null) throw new Error("not a JSON object");
  const address = c.IP?.IP && c.IP.Mask
    ? { address: c.IP.IP, prefix: prefixOfMask(unbase64(c.IP.Mask)) }
    : undefined;
  const mac = c.MAC
    ? [...unbase64(c.MAC)].map((b) => b.toString(16).padStart(2, "0")).join(":")
    : "";
  const routes: Route[] = (c.Routes ?? []).map((r) => ({
    destination: r.Dst?.IP && r.Dst.Mask
      ? `${r.Dst.IP}/${prefixOfMask(unbase64(r.Dst.Mask))}`
      : "default",
    gateway: r.Gw || undefined,
  }));
  return {
    address,
    mac,
    gateway: c.Gateway || undefined,
    routes,
    ipamDisabled: c.IPAMDisabled === true,
  };
}

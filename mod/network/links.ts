/**
 * What a network namespace holds, read as `ip -json` prints it: its links with their
 * kind, MAC, MTU, master and addresses, and its routes. The bindings decide from this what
 * to build (and what is built already, after a restart in the middle of a setup).
 *
 * @module
 */

import { type Cidr, familyOf, isGlobalUnicast } from "./address.ts";

/** One link of a namespace. */
export interface Link {
  /** Its interface index. */
  index: number;
  /** Its name. */
  name: string;
  /** `veth`, `bridge`, `tun`, `ifb`, ... (`ip -d`'s `info_kind`); `""` when none. */
  kind: string;
  /** Its MAC address (lower case). */
  mac: string;
  /** Its MTU. */
  mtu: number;
  /** Whether it is administratively up. */
  up: boolean;
  /** The bridge it is a port of, if any. */
  master?: string;
  /** Its addresses. */
  addresses: (Cidr & { family: 4 | 6; scope: string })[];
  /** tun/tap links: the owning user, if one is set. */
  tapOwner?: number;
}

/** One route (main table). */
export interface Route {
  /** `default` or `address/prefix`. */
  destination: string;
  /** Its gateway, if any. */
  gateway?: string;
  /** Its device. */
  device?: string;
}

/** A namespace's links and routes. */
export interface NamespaceState {
  /** Its links by name. */
  links: Map<string, Link>;
  /** Its IPv4 routes. */
  routes4: Route[];
  /** Its IPv6 routes. */
  routes6: Route[];
}

/** The commands whose output {@linkcode parseNamespaceState} reads. */
export const READ_STATE_COMMANDS: { cmd: string; args: string[] }[] = [
  { cmd: "ip", args: ["-json", "-details", "address", "show"] },
  { cmd: "ip", args: ["-json", "-4", "route", "show", "table", "main"] },
  { cmd: "ip", args: ["-json", "-6", "route", "show", "table", "main"] },
];

function parseJson(text: string, what: string): unknown[] {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text.trim() === "" ? "[]" : text);
  } catch (error) {
    throw new Error(`Cannot read ${what}: ip printed no JSON: ${String(error)}`);
  }
  if (!Array.isArray(parsed)) throw new Error(`Cannot read ${what}: ip printed no JSON list`);
  return parsed;
}

/** Reads the output of {@linkcode READ_STATE_COMMANDS}, in that order. */
export function parseNamespaceState(
  addresses: string,
  routes4: string,
  routes6: string,
): NamespaceState {
  const links = new Map<string, Link>();
  for (const raw of parseJson(addresses, "the links")) {
    const l = raw as Record<string, unknown>;
    const info = (l.linkinfo ?? {}) as { info_kind?: string; info_data?: { user?: string } };
    const flags = Array.isArray(l.flags) ? l.flags as string[] : [];
    const link: Link = {
      index: Number(l.ifindex),
      name: String(l.ifname),
      kind: info.info_kind ?? "",
      mac: String(l.address ?? "").toLowerCase(),
      mtu: Number(l.mtu),
      up: flags.includes("UP"),
      master: typeof l.master === "string" ? l.master : undefined,
      addresses: ((l.addr_info ?? []) as Record<string, unknown>[])
        .filter((a) => a.family === "inet" || a.family === "inet6")
        .map((a) => ({
          address: String(a.local),
          prefix: Number(a.prefixlen),
          family: a.family === "inet" ? 4 as const : 6 as const,
          scope: String(a.scope ?? ""),
        })),
    };
    const user = info.info_data?.user;
    if (user !== undefined && /^\d+$/.test(String(user))) link.tapOwner = Number(user);
    links.set(link.name, link);
  }
  const routes = (text: string, what: string): Route[] =>
    parseJson(text, what).map((raw) => {
      const r = raw as Record<string, unknown>;
      return {
        destination: String(r.dst),
        gateway: typeof r.gateway === "string" ? r.gateway : undefined,
        device: typeof r.dev === "string" ? r.dev : undefined,
      };
    });
  return {
    links,
    routes4: routes(routes4, "the IPv4 routes"),
    routes6: routes(routes6, "the IPv6 routes"),
  };
}

/** The global unicast addresses of a link of one family, in the order the link has them. */
export function globalAddresses(link: Link | undefined, family: 4 | 6): Cidr[] {
  return (link?.addresses ?? [])
    .filter((a) => a.family === family && familyOf(a.address) === family)
    .filter((a) => a.scope === "global" && isGlobalUnicast(a.address))
    .map(({ address, prefix }) => ({ address, prefix }));
}

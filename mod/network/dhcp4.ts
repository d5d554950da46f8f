/**
 * DHCPv4 (RFC 2131, options RFC 2132) for the one guest behind a VM's bridge: reading a
 * client's message, and the OFFER / ACK / NAK a server that leases exactly one address
 * to exactly one MAC gives it. KubeVirt's launcher serves the same: the pod's address for
 * bridge binding, 10.0.2.2 for masquerade; subnet mask, router, DNS servers, hostname,
 * domain name, MTU, search domains (RFC 3397, uncompressed) and classless static routes
 * (RFC 3442); a lease of 999 days.
 *
 * Everything here works on bytes: the socket that carries them lives elsewhere. Input
 * comes from the guest, so {@linkcode decodeDhcp4} trusts nothing and throws
 * {@linkcode Dhcp4Error} on anything malformed.
 *
 * @module
 */

import { concatBytes } from "./_bytes.ts";

/** A malformed DHCP message, or a lease that cannot be encoded. */
export class Dhcp4Error extends Error {
  /** Creates the error. */
  constructor(message: string) {
    super(message);
    this.name = "Dhcp4Error";
  }
}

/** DHCP message types (option 53). */
export const DhcpMessageType = {
  Discover: 1,
  Offer: 2,
  Request: 3,
  Decline: 4,
  Ack: 5,
  Nak: 6,
  Release: 7,
  Inform: 8,
} as const;

/** Option codes used here. */
export const DhcpOption = {
  SubnetMask: 1,
  Router: 3,
  DomainNameServer: 6,
  HostName: 12,
  DomainName: 15,
  InterfaceMtu: 26,
  RequestedIp: 50,
  LeaseTime: 51,
  MessageType: 53,
  ServerId: 54,
  DomainSearch: 119,
  ClasslessStaticRoute: 121,
} as const;

const encoder = new TextEncoder();
const MAGIC_COOKIE = 0x63825363;
/** Fixed BOOTP header (236 bytes) plus the magic cookie. */
const HEADER_LENGTH = 240;
const BOOTREQUEST = 1;
const BOOTREPLY = 2;
/** KubeVirt's "infinite" lease: 999 days, in seconds. */
export const LEASE_SECONDS = 999 * 24 * 3600;

/** A DHCP message, as far as a one-guest server needs it. */
export interface Dhcp4Message {
  /** 1 request (client), 2 reply (server). */
  op: number;
  /** Transaction ID chosen by the client. */
  xid: number;
  /** Seconds since the client began. */
  secs: number;
  /** Flags; bit 15 asks for a broadcast reply. */
  flags: number;
  /** Client's address (when it has one). */
  ciaddr: string;
  /** "Your" address: the one offered. */
  yiaddr: string;
  /** Next server's address. */
  siaddr: string;
  /** Relay agent's address. */
  giaddr: string;
  /** Client hardware address, lower-case colon form (Ethernet: 6 bytes). */
  chaddr: string;
  /** Options by code, raw values (split instances of a code joined, RFC 3396). */
  options: Map<number, Uint8Array>;
}

/** A route for option 121: destination prefix and the gateway that reaches it. */
export interface Dhcp4Route {
  /** Destination network address, e.g. `0.0.0.0` for the default route. */
  destination: string;
  /** Prefix length, 0–32. */
  prefix: number;
  /** Gateway address. */
  gateway: string;
}

/** What the guest is told: the one lease of its MAC. */
export interface Dhcp4Lease {
  /** The guest's MAC; messages from any other are not answered. None: any client (masquerade). */
  mac?: string;
  /** The guest's address. */
  address: string;
  /** Its prefix length (subnet mask). */
  prefix: number;
  /** The server's address (server identifier). */
  serverAddress: string;
  /** Default gateway, if any. */
  router?: string;
  /** DNS servers (IPv4). */
  dnsServers?: string[];
  /** Search domains (option 119). */
  searchDomains?: string[];
  /** Domain name (option 15). */
  domainName?: string;
  /** Host name (option 12). */
  hostname?: string;
  /** Interface MTU (option 26), 68–65535. */
  mtu?: number;
  /** Classless static routes (option 121). */
  routes?: Dhcp4Route[];
  /** Lease time in seconds; {@linkcode LEASE_SECONDS} unless told. */
  leaseSeconds?: number;
}

function ipv4Bytes(address: string, what: string): number[] {
  const parts = address.split(".");
  if (parts.length !== 4) throw new Dhcp4Error(`${what} "${address}" is not an IPv4 address`);
  return parts.map((p) => {
    const n = Number(p);
    if (!/^\d{1,3}$/.test(p) || n > 255) {
      throw new Dhcp4Error(`${what} "${address}" is not an IPv4 address`);
    }
    return n;
  });
}

function ipv4String(bytes: Uint8Array, offset: number): string {
  return Array.from(bytes.subarray(offset, offset + 4)).join(".");
}

function macBytes(mac: string): number[] {
  const parts = mac.split(":");
  if (parts.length !== 6 || parts.some((p) => !/^[0-9a-fA-F]{2}$/.test(p))) {
    throw new Dhcp4Error(`MAC "${mac}" is not an Ethernet address`);
  }
  return parts.map((p) => parseInt(p, 16));
}

/** The mask of a prefix length, as four bytes. */
export function prefixMask(prefix: number): number[] {
  if (!Number.isInteger(prefix) || prefix < 0 || prefix > 32) {
    throw new Dhcp4Error(`prefix length ${prefix} is not between 0 and 32`);
  }
  const mask = prefix === 0 ? 0 : (0xffffffff << (32 - prefix)) >>> 0;
  return [mask >>> 24, (mask >>> 16) & 255, (mask >>> 8) & 255, mask & 255];
}

/** Reads a client's DHCP message; throws {@linkcode Dhcp4Error} when it is malformed. */
export function decodeDhcp4(bytes: Uint8Array): Dhcp4Message {
  if (bytes.length < HEADER_LENGTH) {
    throw new Dhcp4Error(`message of ${bytes.length} bytes is shorter than a DHCP header`);
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (view.getUint32(236) !== MAGIC_COOKIE) throw new Dhcp4Error("no DHCP magic cookie");
  const hlen = bytes[2];
  if (bytes[1] !== 1 || hlen !== 6) {
    throw new Dhcp4Error(`hardware type ${bytes[1]}/${hlen} is not Ethernet`);
  }
  const chaddr = Array.from(bytes.subarray(28, 34))
    .map((b) => b.toString(16).padStart(2, "0"))
    .join(":");
  // Several instances of one option are one value, concatenated (RFC 3396). The parts
  // are joined once at the end: joining as they come costs time in the square of their
  // number, and a guest's fragmented datagram holds some 21,000 of them.
  const parts = new Map<number, Uint8Array[]>();
  let i = HEADER_LENGTH;
  for (;;) {
    if (i >= bytes.length) throw new Dhcp4Error("options end without the end option");
    const code = bytes[i++];
    if (code === 255) break;
    if (code === 0) continue;
    if (i >= bytes.length) throw new Dhcp4Error(`option ${code} has no length`);
    const length = bytes[i++];
    if (i + length > bytes.length) throw new Dhcp4Error(`option ${code} runs past the message`);
    const value = bytes.subarray(i, i + length);
    const before = parts.get(code);
    if (before) before.push(value);
    else parts.set(code, [value]);
    i += length;
  }
  const options = new Map<number, Uint8Array>();
  for (const [code, values] of parts) options.set(code, concatBytes(values));
  return {
    op: bytes[0],
    xid: view.getUint32(4),
    secs: view.getUint16(8),
    flags: view.getUint16(10),
    ciaddr: ipv4String(bytes, 12),
    yiaddr: ipv4String(bytes, 16),
    siaddr: ipv4String(bytes, 20),
    giaddr: ipv4String(bytes, 24),
    chaddr,
    options,
  };
}

/** Writes a DHCP message (options in ascending code order, then the end option). */
export function encodeDhcp4(message: Dhcp4Message): Uint8Array {
  const optionBytes: number[] = [];
  for (const code of [...message.options.keys()].sort((a, b) => a - b)) {
    const value = message.options.get(code)!;
    // Longer values are split into several instances of the option (RFC 3396).
    let off = 0;
    do {
      const part = value.subarray(off, off + 255);
      optionBytes.push(code, part.length, ...part);
      off += 255;
    } while (off < value.length);
  }
  optionBytes.push(255);
  const out = new Uint8Array(HEADER_LENGTH + optionBytes.length);
  const view = new DataView(out.buffer);
  out[0] = message.op;
  out[1] = 1;
  out[2] = 6;
  view.setUint32(4, message.xid);
  view.setUint16(8, message.secs);
  view.setUint16(10, message.flags);
  out.set(ipv4Bytes(message.ciaddr, "ciaddr"), 12);
  out.set(ipv4Bytes(message.yiaddr, "yiaddr"), 16);
  out.set(ipv4Bytes(message.siaddr, "siaddr"), 20);
  out.set(ipv4Bytes(message.giaddr, "giaddr"), 24);
  out.set(macBytes(message.chaddr), 28);
  view.setUint32(236, MAGIC_COOKIE);
  out.set(optionBytes, HEADER_LENGTH);
  return out;
}

/** Search domains as option 119 wants them: RFC 1035 names, no compression. */
export function encodeSearchDomains(domains: string[]): Uint8Array {
  const out: number[] = [];
  for (const domain of domains) {
    const name = domain.replace(/\.$/, "");
    const labels = name.split(".");
    if (
      name === "" || labels.some((l) => l === "" || l.length > 63 || !/^[A-Za-z0-9-_]+$/.test(l))
    ) {
      throw new Dhcp4Error(`search domain "${domain}" is not a domain name`);
    }
    for (const label of labels) out.push(label.length, ...encoder.encode(label));
    out.push(0);
  }
  return Uint8Array.from(out);
}

/** Routes as option 121 wants them: width, significant destination octets, gateway. */
export function encodeClasslessRoutes(routes: Dhcp4Route[]): Uint8Array {
  const out: number[] = [];
  for (const route of routes) {
    const destination = ipv4Bytes(route.destination, "route destination");
    const mask = prefixMask(route.prefix);
    if (destination.some((b, i) => (b & ~mask[i]) !== 0)) {
      throw new Dhcp4Error(
        `route destination ${route.destination}/${route.prefix} has host bits set`,
      );
    }
    out.push(
      route.prefix,
      ...destination.slice(0, Math.ceil(route.prefix / 8)),
      ...ipv4Bytes(route.gateway, "route gateway"),
    );
  }
  return Uint8Array.from(out);
}

function addresses(list: string[], what: string): Uint8Array {
  return Uint8Array.from(list.flatMap((a) => ipv4Bytes(a, what)));
}

function u32(n: number): Uint8Array {
  return Uint8Array.of(n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255);
}

/** The options of an OFFER or ACK for `lease`. */
function leaseOptions(type: number, lease: Dhcp4Lease): Map<number, Uint8Array> {
  const text = (s: string) => encoder.encode(s);
  const o = new Map<number, Uint8Array>();
  o.set(DhcpOption.MessageType, Uint8Array.of(type));
  o.set(DhcpOption.ServerId, addresses([lease.serverAddress], "server address"));
  o.set(DhcpOption.LeaseTime, u32(lease.leaseSeconds ?? LEASE_SECONDS));
  o.set(DhcpOption.SubnetMask, Uint8Array.from(prefixMask(lease.prefix)));
  if (lease.router) o.set(DhcpOption.Router, addresses([lease.router], "router"));
  if (lease.dnsServers?.length) {
    o.set(DhcpOption.DomainNameServer, addresses(lease.dnsServers, "DNS server"));
  }
  if (lease.hostname) o.set(DhcpOption.HostName, text(lease.hostname));
  if (lease.domainName) o.set(DhcpOption.DomainName, text(lease.domainName));
  if (lease.mtu !== undefined) {
    if (!Number.isInteger(lease.mtu) || lease.mtu < 68 || lease.mtu > 65535) {
      throw new Dhcp4Error(`MTU ${lease.mtu} is not between 68 and 65535`);
    }
    o.set(DhcpOption.InterfaceMtu, Uint8Array.of(lease.mtu >>> 8, lease.mtu & 255));
  }
  if (lease.searchDomains?.length) {
    o.set(DhcpOption.DomainSearch, encodeSearchDomains(lease.searchDomains));
  }
  if (lease.routes?.length) {
    o.set(DhcpOption.ClasslessStaticRoute, encodeClasslessRoutes(lease.routes));
  }
  return o;
}

/**
 * The server's answer to a client's message, or undefined when it gets none: a message
 * from another MAC, a reply, or a type this server does not answer (DECLINE, RELEASE,
 * INFORM). DISCOVER gets an OFFER; REQUEST gets an ACK when it asks for the lease's
 * address (or for none), a NAK otherwise.
 */
export function answerDhcp4(request: Dhcp4Message, lease: Dhcp4Lease): Dhcp4Message | undefined {
  if (request.op !== BOOTREQUEST) return undefined;
  if (lease.mac !== undefined && request.chaddr !== lease.mac.toLowerCase()) return undefined;
  const type = request.options.get(DhcpOption.MessageType)?.[0];
  const base = {
    op: BOOTREPLY,
    xid: request.xid,
    secs: 0,
    flags: request.flags,
    ciaddr: "0.0.0.0",
    giaddr: request.giaddr,
    chaddr: request.chaddr,
  };
  if (type === DhcpMessageType.Discover) {
    return {
      ...base,
      yiaddr: lease.address,
      siaddr: lease.serverAddress,
      options: leaseOptions(DhcpMessageType.Offer, lease),
    };
  }
  if (type !== DhcpMessageType.Request) return undefined;
  const requested = request.options.get(DhcpOption.RequestedIp);
  const asked = requested?.length === 4
    ? ipv4String(requested, 0)
    : request.ciaddr !== "0.0.0.0"
    ? request.ciaddr
    : lease.address;
  const serverId = request.options.get(DhcpOption.ServerId);
  const otherServer = serverId?.length === 4 && ipv4String(serverId, 0) !== lease.serverAddress;
  if (otherServer) return undefined; // The client chose another server's offer.
  if (asked !== lease.address) {
    const nak = new Map<number, Uint8Array>();
    nak.set(DhcpOption.MessageType, Uint8Array.of(DhcpMessageType.Nak));
    nak.set(DhcpOption.ServerId, addresses([lease.serverAddress], "server address"));
    return { ...base, yiaddr: "0.0.0.0", siaddr: "0.0.0.0", options: nak };
  }
  return {
    ...base,
    ciaddr: request.ciaddr,
    yiaddr: lease.address,
    siaddr: lease.serverAddress,
    options: leaseOptions(DhcpMessageType.Ack, lease),
  };
}

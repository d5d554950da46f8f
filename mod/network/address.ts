/**
 * IPv4 and IPv6 addresses and prefixes as the bindings need them: the n-th address of a
 * CIDR (masquerade's gateway and guest), prefixes to masks, and which addresses are global
 * unicast (the pod's addresses worth reporting).
 *
 * @module
 */

import { ipv6FromBytes, ipv6ToBytes } from "../../ffi/mod.ts";

/** An address with its prefix length. */
export interface Cidr {
  /** The address in text form. */
  address: string;
  /** The prefix length. */
  prefix: number;
}

/** 4 or 6, from an address's text form. */
export function familyOf(address: string): 4 | 6 {
  return address.includes(":") ? 6 : 4;
}

function toBigInt(address: string): bigint {
  if (familyOf(address) === 4) {
    return address.split(".").reduce((acc, part) => (acc << 8n) | BigInt(Number(part)), 0n);
  }
  return ipv6ToBytes(address).reduce((acc, byte) => (acc << 8n) | BigInt(byte), 0n);
}

function fromBigInt(value: bigint, family: 4 | 6): string {
  if (family === 4) {
    return [24n, 16n, 8n, 0n].map((shift) => String((value >> shift) & 0xffn)).join(".");
  }
  const bytes = new Uint8Array(16);
  for (let i = 15; i >= 0; i--) {
    bytes[i] = Number(value & 0xffn);
    value >>= 8n;
  }
  return ipv6FromBytes(bytes);
}

/** Parses `address/prefix`; throws on anything else. */
export function parseCidr(text: string): Cidr {
  const [address, prefix] = text.split("/");
  const family = familyOf(address);
  const n = Number(prefix);
  if (prefix === undefined || !Number.isInteger(n) || n < 0 || n > (family === 4 ? 32 : 128)) {
    throw new Error(`Invalid CIDR ${JSON.stringify(text)}`);
  }
  toBigInt(address); // throws on a malformed address
  return { address, prefix: n };
}

/** The `n`-th address of the network `cidr` (0 is the network address itself). */
export function nthAddress(cidr: string, n: number): string {
  const { address, prefix } = parseCidr(cidr);
  const family = familyOf(address);
  const bits = BigInt(family === 4 ? 32 : 128);
  const hostBits = bits - BigInt(prefix);
  const network = (toBigInt(address) >> hostBits) << hostBits;
  return fromBigInt(network + BigInt(n), family);
}

/** The canonical text of an address (IPv6 shortened; IPv4 unchanged). */
export function canonicalAddress(address: string): string {
  return familyOf(address) === 6 ? fromBigInt(toBigInt(address), 6) : address;
}

/**
 * Whether `address` is a loopback address: in 127.0.0.0/8, `::1` in any spelling, or an IPv4
 * loopback address mapped into IPv6 (`::ffff:127.0.0.1`, a dual-stack socket's peer).
 */
export function isLoopbackAddress(address: string): boolean {
  if (familyOf(address) === 4) return address.startsWith("127.");
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
  if (mapped) return mapped[1].startsWith("127.");
  try {
    return toBigInt(address) === 1n;
  } catch {
    return false; // not an address
  }
}

/** Whether `address` is a global unicast address (not loopback, link-local, multicast or unspecified). */
export function isGlobalUnicast(address: string): boolean {
  if (familyOf(address) === 4) {
    const [a, b] = address.split(".").map(Number);
    return !(a === 0 || a === 127 || (a === 169 && b === 254) || a >= 224);
  }
  const value = toBigInt(address);
  const top16 = Number(value >> 112n);
  return value > 1n && (top16 & 0xffc0) !== 0xfe80 && (top16 & 0xff00) !== 0xff00;
}

/** Whether `address` lies in the network `cidr`. */
export function cidrContains(cidr: string, address: string): boolean {
  const { address: net, prefix } = parseCidr(cidr);
  if (familyOf(net) !== familyOf(address)) return false;
  const hostBits = BigInt(familyOf(net) === 4 ? 32 : 128) - BigInt(prefix);
  return (toBigInt(net) >> hostBits) === (toBigInt(address) >> hostBits);
}

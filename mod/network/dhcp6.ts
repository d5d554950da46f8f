/**
 * DHCPv6 (RFC 8415) for the one guest behind a masquerade bridge, as KubeVirt's launcher
 * serves it: the guest's address (`fd10:0:2::2`) in an IA_NA with a 999-day lifetime,
 * the DNS servers (RFC 3646), the server's DUID made of the bridge's MAC. A SOLICIT gets
 * an ADVERTISE (or, when the client asks for rapid commit, a REPLY); every other client
 * message a REPLY. Bytes only: the socket lives elsewhere. Guest input is trusted for
 * nothing: {@linkcode decodeDhcp6} throws {@linkcode Dhcp6Error} on anything malformed.
 *
 * @module
 */

import { ipv6FromBytes, ipv6ToBytes } from "../../ffi/mod.ts";
import { concatBytes } from "./_bytes.ts";
import { LEASE_SECONDS } from "./dhcp4.ts";

/** A malformed DHCPv6 message. */
export class Dhcp6Error extends Error {
  /** Creates the error. */
  constructor(message: string) {
    super(message);
    this.name = "Dhcp6Error";
  }
}

/** DHCPv6 message types used here. */
export const Dhcp6MessageType = {
  Solicit: 1,
  Advertise: 2,
  Request: 3,
  Confirm: 4,
  Renew: 5,
  Rebind: 6,
  Reply: 7,
  Release: 8,
  Decline: 9,
  InformationRequest: 11,
} as const;

/** DHCPv6 option codes used here. */
export const Dhcp6Option = {
  ClientId: 1,
  ServerId: 2,
  IaNa: 3,
  IaAddr: 5,
  RapidCommit: 14,
  DnsServers: 23,
} as const;

/** A DHCPv6 message: its type, transaction ID and options (code -> payloads, in order). */
export interface Dhcp6Message {
  /** The message type. */
  type: number;
  /** The 24-bit transaction ID. */
  transactionId: number;
  /** Options as code and payload, in the order they came. */
  options: [number, Uint8Array][];
}

/** What the guest is told. */
export interface Dhcp6Lease {
  /** The guest's address. */
  address: string;
  /** The server's MAC (the in-pod bridge's), for its DUID-LL. */
  serverMac: string;
  /** DNS servers (IPv6). */
  dnsServers?: string[];
  /** Preferred and valid lifetime, seconds; {@linkcode LEASE_SECONDS} unless told. */
  leaseSeconds?: number;
}

/** Reads a DHCPv6 message; throws {@linkcode Dhcp6Error} when it is malformed. */
export function decodeDhcp6(bytes: Uint8Array): Dhcp6Message {
  if (bytes.length < 4) throw new Dhcp6Error(`DHCPv6 message too short: ${bytes.length} bytes`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const options: [number, Uint8Array][] = [];
  for (let at = 4; at < bytes.length;) {
    if (at + 4 > bytes.length) throw new Dhcp6Error(`DHCPv6 option header cut off at byte ${at}`);
    const code = view.getUint16(at);
    const length = view.getUint16(at + 2);
    if (at + 4 + length > bytes.length) {
      throw new Dhcp6Error(`DHCPv6 option ${code} runs past the end (${length} bytes)`);
    }
    // The answer reads an IA_NA's IAID, T1 and T2: one without them is refused here, where
    // the server expects a guest's malformed messages, not while it answers.
    if (code === Dhcp6Option.IaNa && length < 12) {
      throw new Dhcp6Error(`DHCPv6 IA_NA option too short: ${length} bytes`);
    }
    options.push([code, bytes.slice(at + 4, at + 4 + length)]);
    at += 4 + length;
  }
  return { type: bytes[0], transactionId: (bytes[1] << 16) | (bytes[2] << 8) | bytes[3], options };
}

/** Writes a DHCPv6 message. */
export function encodeDhcp6(message: Dhcp6Message): Uint8Array {
  const length = 4 + message.options.reduce((n, [, data]) => n + 4 + data.length, 0);
  const out = new Uint8Array(length);
  const view = new DataView(out.buffer);
  out[0] = message.type;
  out[1] = (message.transactionId >> 16) & 0xff;
  out[2] = (message.transactionId >> 8) & 0xff;
  out[3] = message.transactionId & 0xff;
  let at = 4;
  for (const [code, data] of message.options) {
    if (data.length > 0xffff) throw new Dhcp6Error(`DHCPv6 option ${code} is too long`);
    view.setUint16(at, code);
    view.setUint16(at + 2, data.length);
    out.set(data, at + 4);
    at += 4 + data.length;
  }
  return out;
}

/** The first payload of an option, if present. */
export function dhcp6Option(message: Dhcp6Message, code: number): Uint8Array | undefined {
  return message.options.find(([c]) => c === code)?.[1];
}

function u32(value: number): Uint8Array {
  const out = new Uint8Array(4);
  new DataView(out.buffer).setUint32(0, value >>> 0);
  return out;
}

function option(code: number, data: Uint8Array): Uint8Array {
  const head = new Uint8Array(4);
  new DataView(head.buffer).setUint16(0, code);
  new DataView(head.buffer).setUint16(2, data.length);
  return concatBytes([head, data]);
}

/** A DUID-LL (type 3, hardware type 1: Ethernet) for a MAC. */
export function duidLl(mac: string): Uint8Array {
  return Uint8Array.from([0, 3, 0, 1, ...mac.split(":").map((p) => parseInt(p, 16))]);
}

/** The guest's address in the text of an IA_NA's IAADDR option, if it holds one. */
export function iaNaAddress(iaNa: Uint8Array): string | undefined {
  const view = new DataView(iaNa.buffer, iaNa.byteOffset, iaNa.byteLength);
  for (let at = 12; at + 4 <= iaNa.length;) {
    const code = view.getUint16(at);
    const length = view.getUint16(at + 2);
    if (code === Dhcp6Option.IaAddr && length >= 24 && at + 4 + length <= iaNa.length) {
      return ipv6FromBytes(iaNa.subarray(at + 4, at + 20));
    }
    at += 4 + length;
  }
  return undefined;
}

/**
 * The server's answer to a client's message, or undefined when it gets none: a server's
 * message, a message without a client ID, or one addressed to another server.
 */
export function answerDhcp6(request: Dhcp6Message, lease: Dhcp6Lease): Dhcp6Message | undefined {
  const clientTypes: number[] = [
    Dhcp6MessageType.Solicit,
    Dhcp6MessageType.Request,
    Dhcp6MessageType.Confirm,
    Dhcp6MessageType.Renew,
    Dhcp6MessageType.Rebind,
    Dhcp6MessageType.Release,
    Dhcp6MessageType.Decline,
    Dhcp6MessageType.InformationRequest,
  ];
  if (!clientTypes.includes(request.type)) return undefined;
  const clientId = dhcp6Option(request, Dhcp6Option.ClientId);
  if (!clientId && request.type !== Dhcp6MessageType.InformationRequest) return undefined;
  const serverId = duidLl(lease.serverMac);
  const asked = dhcp6Option(request, Dhcp6Option.ServerId);
  if (asked && (asked.length !== serverId.length || asked.some((b, i) => b !== serverId[i]))) {
    return undefined; // for another server
  }
  const options: [number, Uint8Array][] = [];
  if (clientId) options.push([Dhcp6Option.ClientId, clientId]);
  options.push([Dhcp6Option.ServerId, serverId]);
  const iaNa = dhcp6Option(request, Dhcp6Option.IaNa);
  if (iaNa && request.type !== Dhcp6MessageType.InformationRequest) {
    if (iaNa.length < 12) throw new Dhcp6Error(`IA_NA option too short: ${iaNa.length} bytes`);
    const seconds = lease.leaseSeconds ?? LEASE_SECONDS;
    const address = concatBytes([ipv6ToBytes(lease.address), u32(seconds), u32(seconds)]);
    // T1 and T2 zero: the client chooses when to renew (RFC 8415 21.4).
    options.push([
      Dhcp6Option.IaNa,
      concatBytes([iaNa.subarray(0, 4), u32(0), u32(0), option(Dhcp6Option.IaAddr, address)]),
    ]);
  }
  if (lease.dnsServers?.length) {
    options.push([
      Dhcp6Option.DnsServers,
      concatBytes(lease.dnsServers.map((s) => ipv6ToBytes(s))),
    ]);
  }
  const rapid = request.type === Dhcp6MessageType.Solicit &&
    dhcp6Option(request, Dhcp6Option.RapidCommit) !== undefined;
  if (rapid) options.push([Dhcp6Option.RapidCommit, new Uint8Array(0)]);
  const type = request.type === Dhcp6MessageType.Solicit && !rapid
    ? Dhcp6MessageType.Advertise
    : Dhcp6MessageType.Reply;
  return { type, transactionId: request.transactionId, options };
}

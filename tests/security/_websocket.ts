/**
 * RFC 6455 frames as a test's client writes and reads them, for the WebSocket tests of
 * the security tier.
 *
 * @module
 */
import { writeBigEndian } from "./_fuzz.ts";

/** A client frame: masked with `mask`, with the shortest length form. */
export function clientFrame(
  opcode: number,
  payload: Uint8Array,
  fin = true,
  mask = [0x37, 0xfa, 0x21, 0x3d],
): Uint8Array {
  const n = payload.length;
  const head = n < 126 ? 2 : n < 65536 ? 4 : 10;
  const out = new Uint8Array(head + 4 + n);
  out[0] = (fin ? 0x80 : 0) | opcode;
  if (n < 126) out[1] = 0x80 | n;
  else if (n < 65536) {
    out[1] = 0x80 | 126;
    writeBigEndian(out, 2, 2, n);
  } else {
    out[1] = 0x80 | 127;
    writeBigEndian(out, 2, 8, n);
  }
  out.set(mask, head);
  for (let i = 0; i < n; i++) out[head + 4 + i] = payload[i] ^ mask[i & 3];
  return out;
}

/** A frame's header at `at`: its opcode, where its payload starts and how long it is. */
export interface FrameHeader {
  /** The opcode (low four bits of the first byte). */
  opcode: number;
  /** Bytes before the payload: length fields and the mask, if any. */
  head: number;
  /** The payload's length as the header claims it (the low 53 bits of a 64-bit one). */
  length: number;
}

/** The header of the frame at `at`, or undefined when it is cut off. */
export function frameHeader(bytes: Uint8Array, at: number): FrameHeader | undefined {
  if (at + 2 > bytes.length) return undefined;
  const masked = (bytes[at + 1] & 0x80) ? 4 : 0;
  let length = bytes[at + 1] & 0x7f;
  let head = 2;
  if (length === 126) {
    if (at + 4 > bytes.length) return undefined;
    length = (bytes[at + 2] << 8) | bytes[at + 3];
    head = 4;
  } else if (length === 127) {
    if (at + 10 > bytes.length) return undefined;
    const view = new DataView(bytes.buffer, bytes.byteOffset + at + 2, 8);
    length = Number(view.getBigUint64(0) & 0x1fffffffffffffn);
    head = 10;
  }
  return { opcode: bytes[at] & 0x0f, head: head + masked, length };
}

/**
 * The server half of RFC 6455 that the handler's console and VNC routes need: the
 * upgrade answer, frames read from a client (masked, possibly fragmented, with control
 * frames in between) and binary frames written back. Only binary messages carry data, as
 * KubeVirt's `plain.kubevirt.io` streams use them; text messages are read and dropped, the
 * way KubeVirt's binary reader skips them.
 *
 * @module
 */
import { createHash } from "node:crypto";

/** The subprotocol of KubeVirt's plain byte streams (console, VNC). */
export const PLAIN_STREAM_PROTOCOL = "plain.kubevirt.io";

/** The largest frame payload accepted from a client; virt-api sends 10 KiB ones. */
export const MAX_FRAME_PAYLOAD = 1024 * 1024;

const HANDSHAKE_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/** Close codes used here (RFC 6455 section 7.4.1). */
export const CloseCode = {
  Normal: 1000,
  GoingAway: 1001,
  ProtocolError: 1002,
  TooBig: 1009,
  InternalError: 1011,
} as const;

/** `Sec-WebSocket-Accept` for a client's `Sec-WebSocket-Key`. */
export function acceptKey(key: string): string {
  return createHash("sha1").update(key + HANDSHAKE_GUID).digest("base64");
}

/** Why an upgrade request is refused; the HTTP status and message to answer with. */
export class UpgradeRefused extends Error {
  /** The HTTP status. */
  readonly status: number;
  /** Creates the refusal. */
  constructor(status: number, message: string) {
    super(message);
    this.name = "UpgradeRefused";
    this.status = status;
  }
}

/** Request headers as node's `IncomingMessage.headers` has them (lower-case names). */
export type UpgradeHeaders = Record<string, string | string[] | undefined>;

function header(headers: UpgradeHeaders, name: string): string {
  const value = headers[name];
  return Array.isArray(value) ? value.join(",") : value ?? "";
}

/**
 * The `101 Switching Protocols` answer to a WebSocket upgrade that asks for `protocol`;
 * throws {@linkcode UpgradeRefused} for a request that is not a version 13 upgrade or does
 * not offer the subprotocol.
 */
export function upgradeResponse(
  method: string | undefined,
  headers: UpgradeHeaders,
  protocol: string = PLAIN_STREAM_PROTOCOL,
): string {
  if (method !== "GET") throw new UpgradeRefused(405, `Method ${method} is not allowed here`);
  const tokens = (name: string) =>
    header(headers, name).split(",").map((t) => t.trim().toLowerCase()).filter(Boolean);
  if (!tokens("upgrade").includes("websocket") || !tokens("connection").includes("upgrade")) {
    throw new UpgradeRefused(400, "This route serves WebSocket connections only");
  }
  if (header(headers, "sec-websocket-version").trim() !== "13") {
    throw new UpgradeRefused(400, "Only WebSocket version 13 is supported");
  }
  const key = header(headers, "sec-websocket-key").trim();
  if (!/^[A-Za-z0-9+/]{22}==$/.test(key)) {
    throw new UpgradeRefused(400, "The Sec-WebSocket-Key header is missing or malformed");
  }
  const offered = header(headers, "sec-websocket-protocol").split(",").map((p) => p.trim());
  if (!offered.includes(protocol)) {
    throw new UpgradeRefused(400, `The WebSocket subprotocol "${protocol}" is required`);
  }
  return [
    "HTTP/1.1 101 Switching Protocols",
    "Upgrade: websocket",
    "Connection: Upgrade",
    `Sec-WebSocket-Accept: ${acceptKey(key)}`,
    `Sec-WebSocket-Protocol: ${protocol}`,
    "",
    "",
  ].join("\r\n");
}

/** A plain HTTP answer on a socket that was going to be upgraded. */
export function refusalResponse(status: number, message: string): string {
  const body = JSON.stringify({ kind: "Status", status: "Failure", message, code: status }) + "\n";
  const reason = STATUS_TEXT[status] ?? "Error";
  return [
    `HTTP/1.1 ${status} ${reason}`,
    "Content-Type: application/json",
    `Content-Length: ${new TextEncoder().encode(body).length}`,
    "Connection: close",
    "",
    body,
  ].join("\r\n");
}

const STATUS_TEXT: Record<number, string> = {
  400: "Bad Request",
  403: "Forbidden",
  404: "Not Found",
  405: "Method Not Allowed",
  500: "Internal Server Error",
  503: "Service Unavailable",
};

/** What {@linkcode FrameReader} found in the bytes so far. */
export type FrameEvent =
  | { kind: "data"; payload: Uint8Array }
  | { kind: "ping"; payload: Uint8Array }
  | { kind: "close"; code?: number }
  | { kind: "error"; code: number; reason: string };

/**
 * Reads client frames from a byte stream fed in pieces: unmasks them, joins the parts of
 * fragmented messages to nothing (each part's bytes are given as they come), and reports
 * binary data, pings and the close. A protocol violation ends the reader with an `error`
 * event carrying the close code to send.
 */
export class FrameReader {
  /**
   * The bytes not yet read are `#storage[#start, #end)`. The storage grows by doubling and
   * is reused: copying everything held on every push would cost a client that sends a
   * large frame a few bytes at a time nothing, and the handler time in the square of the
   * frame's size.
   */
  #storage: Uint8Array = new Uint8Array(0);
  #start = 0;
  #end = 0;
  /** The opcode of the message whose continuation frames are expected, or 0. */
  #message = 0;
  #done = false;

  /** Takes the next bytes and returns what they complete, in order. */
  push(bytes: Uint8Array): FrameEvent[] {
    if (this.#done) return [];
    this.#append(bytes);
    const events: FrameEvent[] = [];
    for (;;) {
      const frame = this.#next();
      if (frame === undefined) break;
      events.push(frame);
      if (frame.kind === "close" || frame.kind === "error") {
        this.#done = true;
        break;
      }
    }
    if (this.#done || this.#start === this.#end) this.#release();
    return events;
  }

  #append(bytes: Uint8Array): void {
    const held = this.#end - this.#start;
    if (this.#end + bytes.length > this.#storage.length) {
      const need = held + bytes.length;
      if (need <= this.#storage.length >> 1) {
        this.#storage.copyWithin(0, this.#start, this.#end);
      } else {
        const grown = new Uint8Array(Math.max(need, this.#storage.length * 2, 4096));
        grown.set(this.#storage.subarray(this.#start, this.#end));
        this.#storage = grown;
      }
      this.#start = 0;
      this.#end = held;
    }
    this.#storage.set(bytes, this.#end);
    this.#end += bytes.length;
  }

  /** Nothing is held: an idle session keeps no large buffer (a frame may be 1 MiB). */
  #release(): void {
    if (this.#storage.length > 64 * 1024) this.#storage = new Uint8Array(0);
    this.#start = 0;
    this.#end = 0;
  }

  #next(): FrameEvent | undefined {
    const b = this.#storage.subarray(this.#start, this.#end);
    if (b.length < 2) return undefined;
    const fin = (b[0] & 0x80) !== 0;
    const opcode = b[0] & 0x0f;
    if ((b[0] & 0x70) !== 0) return error(CloseCode.ProtocolError, "reserved bits set");
    if ((b[1] & 0x80) === 0) return error(CloseCode.ProtocolError, "client frame not masked");
    let length = b[1] & 0x7f;
    let at = 2;
    if (length === 126) {
      if (b.length < 4) return undefined;
      length = (b[2] << 8) | b[3];
      at = 4;
    } else if (length === 127) {
      if (b.length < 10) return undefined;
      const high = (b[2] << 24 >>> 0) + (b[3] << 16) + (b[4] << 8) + b[5];
      if (high !== 0) return error(CloseCode.TooBig, "frame too large");
      length = (b[6] << 24 >>> 0) + (b[7] << 16) + (b[8] << 8) + b[9];
      at = 10;
    }
    if (length > MAX_FRAME_PAYLOAD) return error(CloseCode.TooBig, "frame too large");
    if (opcode >= 0x8 && (!fin || length > 125)) {
      return error(CloseCode.ProtocolError, "malformed control frame");
    }
    if (b.length < at + 4 + length) return undefined;
    const mask = b.subarray(at, at + 4);
    // A copy: the storage is reused for the next bytes.
    const payload = b.slice(at + 4, at + 4 + length);
    for (let i = 0; i < payload.length; i++) payload[i] ^= mask[i & 3];
    this.#start += at + 4 + length;

    switch (opcode) {
      case 0x0: // continuation
        if (this.#message === 0) return error(CloseCode.ProtocolError, "unexpected continuation");
        return this.#part(this.#message, fin, payload);
      case 0x1: // text
      case 0x2: // binary
        if (this.#message !== 0) return error(CloseCode.ProtocolError, "message interleaved");
        return this.#part(opcode, fin, payload);
      case 0x8: {
        const code = payload.length >= 2 ? (payload[0] << 8) | payload[1] : undefined;
        return { kind: "close", code };
      }
      case 0x9:
        return { kind: "ping", payload };
      case 0xa: // pong: nothing to do
        return { kind: "data", payload: new Uint8Array(0) };
      default:
        return error(CloseCode.ProtocolError, `unknown opcode ${opcode}`);
    }
  }

  #part(opcode: number, fin: boolean, payload: Uint8Array): FrameEvent {
    this.#message = fin ? 0 : opcode;
    // Text is not a stream's data (KubeVirt's reader drops it too).
    return { kind: "data", payload: opcode === 0x2 ? payload : new Uint8Array(0) };
  }
}

function error(code: number, reason: string): FrameEvent {
  return { kind: "error", code, reason };
}

function frame(opcode: number, payload: Uint8Array): Uint8Array {
  const n = payload.length;
  const head = n < 126 ? 2 : n < 65536 ? 4 : 10;
  const out = new Uint8Array(head + n);
  out[0] = 0x80 | opcode;
  if (n < 126) {
    out[1] = n;
  } else if (n < 65536) {
    out[1] = 126;
    out[2] = n >> 8;
    out[3] = n & 0xff;
  } else {
    out[1] = 127;
    new DataView(out.buffer).setBigUint64(2, BigInt(n));
  }
  out.set(payload, head);
  return out;
}

/** A binary data frame from the server (unmasked). */
export function binaryFrame(payload: Uint8Array): Uint8Array {
  return frame(0x2, payload);
}

/** The pong answering a ping's payload. */
export function pongFrame(payload: Uint8Array): Uint8Array {
  return frame(0xa, payload);
}

/** A close frame with its code. */
export function closeFrame(code: number): Uint8Array {
  return frame(0x8, new Uint8Array([code >> 8, code & 0xff]));
}

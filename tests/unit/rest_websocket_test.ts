import assert from "node:assert/strict";
import {
  acceptKey,
  binaryFrame,
  FrameReader,
  parseGoDuration,
  refuseClient,
  UpgradeRefused,
  upgradeResponse,
} from "../../mod/rest/mod.ts";

function masked(opcode: number, payload: Uint8Array, fin = true): Uint8Array {
  const mask = [0x12, 0x34, 0x56, 0x78];
  const n = payload.length;
  const head = n < 126 ? [n | 0x80] : [126 | 0x80, n >> 8, n & 0xff];
  const out = new Uint8Array(1 + head.length + 4 + n);
  out[0] = (fin ? 0x80 : 0) | opcode;
  out.set(head, 1);
  out.set(mask, 1 + head.length);
  for (let i = 0; i < n; i++) out[1 + head.length + 4 + i] = payload[i] ^ mask[i & 3];
  return out;
}

const bytes = (s: string) => new TextEncoder().encode(s);
const text = (b: Uint8Array) => new TextDecoder().decode(b);

Deno.test("acceptKey() answers RFC 6455's example key with its example accept", () => {
  assert.equal(acceptKey("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
});

Deno.test("upgradeResponse() accepts a version 13 upgrade offering plain.kubevirt.io, refuses the rest", () => {
  // Each refusal has its own status.
  const headers = {
    upgrade: "websocket",
    connection: "keep-alive, Upgrade",
    "sec-websocket-version": "13",
    "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
    "sec-websocket-protocol": "other, plain.kubevirt.io",
  };
  const answer = upgradeResponse("GET", headers);
  assert.match(answer, /^HTTP\/1\.1 101 /);
  assert.match(answer, /Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK\+xOo=\r\n/);
  assert.match(answer, /Sec-WebSocket-Protocol: plain\.kubevirt\.io\r\n\r\n$/);
  const refused = (method: string, h: Record<string, string>) => {
    try {
      upgradeResponse(method, h);
    } catch (error) {
      assert.ok(error instanceof UpgradeRefused);
      return error.status;
    }
    return 101;
  };
  assert.equal(refused("POST", headers), 405);
  assert.equal(refused("GET", { ...headers, "sec-websocket-protocol": "other" }), 400);
  assert.equal(refused("GET", { ...headers, "sec-websocket-version": "8" }), 400);
  assert.equal(refused("GET", { ...headers, "sec-websocket-key": "short" }), 400);
  assert.equal(refused("GET", { ...headers, upgrade: "h2c" }), 400);
});

Deno.test("FrameReader joins split frames, keeps binary data, drops text, answers pings and stops at close", () => {
  const reader = new FrameReader();
  const one = masked(0x2, bytes("hello"));
  assert.deepEqual(reader.push(one.subarray(0, 3)), []);
  const [data] = reader.push(one.subarray(3));
  assert.equal(data.kind, "data");
  assert.equal(text((data as { payload: Uint8Array }).payload), "hello");
  // A fragmented binary message with a ping between its parts, then a text message.
  const events = reader.push(
    new Uint8Array([
      ...masked(0x2, bytes("ab"), false),
      ...masked(0x9, bytes("p")),
      ...masked(0x0, bytes("cd")),
      ...masked(0x1, bytes("text")),
      ...masked(0x8, new Uint8Array([0x03, 0xe8])),
      ...masked(0x2, bytes("after close")),
    ]),
  );
  assert.deepEqual(events.map((e) => e.kind), ["data", "ping", "data", "data", "close"]);
  const payloads = events.filter((e) => e.kind === "data").map((e) =>
    text((e as { payload: Uint8Array }).payload)
  );
  assert.deepEqual(payloads, ["ab", "cd", ""]);
  assert.equal((events[4] as { code?: number }).code, 1000);
});

Deno.test("FrameReader ends with a protocol error for unmasked frames, stray continuations and oversized frames", () => {
  const unmasked = new FrameReader().push(binaryFrame(bytes("x")));
  assert.deepEqual(unmasked.map((e) => e.kind), ["error"]);
  const stray = new FrameReader().push(masked(0x0, bytes("x")));
  assert.deepEqual(stray.map((e) => e.kind), ["error"]);
  const huge = new Uint8Array([0x82, 0xff, 0, 0, 0, 0, 0, 0x20, 0, 0]);
  const tooBig = new FrameReader().push(huge);
  assert.deepEqual(tooBig.map((e) => [e.kind, (e as { code?: number }).code]), [["error", 1009]]);
});

Deno.test("binaryFrame() writes the three length forms", () => {
  assert.deepEqual([...binaryFrame(bytes("ab")).subarray(0, 2)], [0x82, 2]);
  assert.deepEqual([...binaryFrame(new Uint8Array(300)).subarray(0, 4)], [0x82, 126, 1, 44]);
  const big = binaryFrame(new Uint8Array(70000));
  assert.deepEqual([...big.subarray(0, 2)], [0x82, 127]);
  assert.equal(big.length, 70010);
});

Deno.test("parseGoDuration() reads Go durations as KubeVirt's unfreezeTimeout and refuses others", () => {
  assert.equal(parseGoDuration("5m"), 300);
  assert.equal(parseGoDuration("1h30m10s"), 5410);
  assert.equal(parseGoDuration("1.5m"), 90);
  assert.equal(parseGoDuration("0"), 0);
  assert.equal(parseGoDuration("500ms"), 0.5);
  assert.equal(parseGoDuration("5"), undefined);
  assert.equal(parseGoDuration("5 m"), undefined);
  assert.equal(parseGoDuration(""), undefined);
});

Deno.test("refuseClient() lets in KubeVirt's client names of the allowed types only", () => {
  const peer = (CN: string) => ({ subject: { CN } }) as never;
  assert.equal(
    refuseClient(peer("kubevirt.io:system:client:virt-handler"), ["virt-handler"]),
    undefined,
  );
  assert.match(
    refuseClient(peer("kubevirt.io:system:client:other"), ["virt-handler"])!,
    /"kubevirt\.io:system:client:other"/,
  );
  assert.match(refuseClient(undefined, ["virt-handler"])!, /no certificate/);
});

/**
 * A console or VNC client that floods pings and never reads: the handler's bridge must not
 * queue a pong for each. The client's pings go over a real TCP connection into the
 * bridge the REST server uses, joined to a real unix socket; the handler's queue for the
 * client and its memory stay small, and the client is still answered once it reads.
 */
import assert from "node:assert/strict";
import net from "node:net";
import { join } from "node:path";
import { bridge } from "../../mod/rest/testing.ts";
import { clientFrame, frameHeader } from "./_websocket.ts";

const PINGS = 100_000;
/** The most a ping may carry (RFC 6455 5.5). */
const PAYLOAD = 125;

/** A masked client ping whose payload starts with its number. */
function ping(n: number): Uint8Array {
  const payload = new Uint8Array(PAYLOAD).fill(0x70);
  new DataView(payload.buffer).setUint32(0, n);
  return clientFrame(0x9, payload);
}

/** Server frames (unmasked) in `bytes`: opcode and payload of each complete one. */
function serverFrames(bytes: Uint8Array): { opcode: number; payload: Uint8Array }[] {
  const frames = [];
  for (let at = 0;;) {
    const header = frameHeader(bytes, at);
    if (!header || at + header.head + header.length > bytes.length) return frames;
    const start = at + header.head;
    frames.push({ opcode: header.opcode, payload: bytes.slice(start, start + header.length) });
    at = start + header.length;
  }
}

/** The number a ping's payload starts with. */
function pingNumber(payload: Uint8Array): number {
  return new DataView(payload.buffer, payload.byteOffset, payload.length).getUint32(0);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

Deno.test("a WebSocket client sending 100,000 pings unread leaves a bounded queue and is still answered", async () => {
  // The client never reads; the handler's queue for it stays bounded all the same.
  const dir = await Deno.makeTempDir({ prefix: "virtnode-ping-flood-" });
  // The guest's console: a unix socket that takes what comes and says nothing.
  const consoleSockets: net.Socket[] = [];
  const consoleServer = net.createServer((s) => {
    consoleSockets.push(s);
    s.on("error", () => {});
    s.resume();
  });
  await new Promise<void>((resolve) => consoleServer.listen(join(dir, "serial"), resolve));
  let accepted!: (s: net.Socket) => void;
  const handlerSide = new Promise<net.Socket>((resolve) => accepted = resolve);
  const tcp = net.createServer((s) => accepted(s));
  await new Promise<void>((resolve) => tcp.listen(0, "127.0.0.1", resolve));
  const client = net.connect((tcp.address() as net.AddressInfo).port, "127.0.0.1");
  client.on("error", () => {});
  client.pause(); // never reads while it floods
  const socket = await handlerSide;
  const target = net.connect(join(dir, "serial"));
  const b = bridge(socket, new Uint8Array(), target);
  let ended: string | undefined;
  b.done.then((reason) => ended = reason);
  const rssBefore = Deno.memoryUsage().rss;
  let peakQueued = 0;
  const sampler = setInterval(() => {
    peakQueued = Math.max(peakQueued, socket.writableLength);
  }, 5);
  try {
    // The pings go out as fast as the client's own socket takes them.
    for (let sent = 0; sent < PINGS && !client.destroyed;) {
      const batch: Uint8Array[] = [];
      for (let i = 0; i < 500 && sent < PINGS; i++) batch.push(ping(sent++));
      if (!client.write(Buffer.concat(batch))) {
        await Promise.race([
          new Promise((resolve) => client.once("drain", resolve)),
          sleep(2_000),
        ]);
      }
      peakQueued = Math.max(peakQueued, socket.writableLength);
    }
    // Until the handler has read every ping (or ended the session).
    for (let i = 0; i < 200 && client.writableLength > 0 && ended === undefined; i++) {
      await sleep(25);
    }
    await sleep(200);
    peakQueued = Math.max(peakQueued, socket.writableLength);
    const rssGrowth = Deno.memoryUsage().rss - rssBefore;
    console.log(
      `${PINGS} pings (${PINGS * (6 + PAYLOAD)} bytes): the handler queued at most ` +
        `${peakQueued} bytes for the client (its high-water mark ${socket.writableHighWaterMark}), RSS +${
          (rssGrowth / 1048576).toFixed(1)
        } MiB, ` +
        `session ${ended === undefined ? "open" : `ended: ${ended}`}`,
    );
    assert.ok(
      peakQueued <= 128 * 1024,
      `the handler queued ${peakQueued} bytes of pongs for a client that does not read`,
    );
    assert.ok(rssGrowth < 64 * 1024 * 1024, `RSS grew ${rssGrowth} bytes`);

    // The client reads now: it hears a pong for a ping it sent, or a policy close.
    const chunks: Uint8Array[] = [];
    client.on("data", (chunk: Uint8Array) => chunks.push(chunk));
    client.resume();
    let frames: { opcode: number; payload: Uint8Array }[] = [];
    for (let i = 0; i < 100; i++) {
      frames = serverFrames(Buffer.concat(chunks));
      if (
        frames.some((f) =>
          f.opcode === 0x8 || (f.opcode === 0xa && pingNumber(f.payload) === PINGS - 1)
        )
      ) break;
      await sleep(50);
    }
    const pongs = frames.filter((f) => f.opcode === 0xa);
    console.log(`once it reads, the client gets ${pongs.length} pongs`);
    const close = frames.find((f) => f.opcode === 0x8);
    assert.ok(
      pongs.length > 0 || close !== undefined,
      "the client was neither answered nor closed",
    );
    if (close) {
      assert.equal((close.payload[0] << 8) | close.payload[1], 1008, "a policy violation close");
    } else {
      // The pong that waited answers the latest ping, the last one sent.
      const answer = pongs.at(-1)!.payload;
      assert.equal(answer.length, PAYLOAD);
      assert.equal(pingNumber(answer), PINGS - 1, "the last pong answers the last ping");
      assert.ok(pongs.length < PINGS / 2, `${pongs.length} pongs for ${PINGS} pings`);
      assert.equal(ended, undefined, "the session is still open");
    }
  } finally {
    clearInterval(sampler);
    b.stop("test over");
    await b.done;
    client.destroy();
    for (const s of consoleSockets) s.destroy();
    await new Promise<void>((resolve) => tcp.close(() => resolve()));
    await new Promise<void>((resolve) => consoleServer.close(() => resolve()));
    await Deno.remove(dir, { recursive: true });
  }
});

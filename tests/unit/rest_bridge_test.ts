/**
 * The console bridge under a slow and a vanished WebSocket peer: a console that floods
 * is held back (its writes stop, the handler's buffer stays small) while the client does
 * not read, goes on when it reads again, and a client that goes away ends the bridge and
 * closes the console's socket.
 */
import assert from "node:assert/strict";
import net from "node:net";
import { join } from "node:path";
import { bridge } from "../../mod/rest/testing.ts";

const CHUNK = new Uint8Array(64 * 1024).fill(0x61);

/** A unix socket server that writes as fast as its peer lets it; counts what it wrote. */
async function floodServer(path: string) {
  const state = { written: 0, closed: false, sockets: [] as net.Socket[] };
  const server = net.createServer((socket) => {
    state.sockets.push(socket);
    socket.on("error", () => {});
    socket.on("close", () => state.closed = true);
    const pump = () => {
      while (!socket.destroyed) {
        state.written += CHUNK.length;
        if (!socket.write(CHUNK)) {
          socket.once("drain", pump);
          return;
        }
      }
    };
    pump();
  });
  await new Promise<void>((resolve) => server.listen(path, resolve));
  return {
    state,
    close: () => {
      for (const s of state.sockets) s.destroy();
      return new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** A connected TCP pair: `handlerSide` is what the bridge gets, `peer` the WebSocket client. */
async function tcpPair(): Promise<
  { handlerSide: net.Socket; peer: net.Socket; close(): Promise<void> }
> {
  let accepted!: (s: net.Socket) => void;
  const got = new Promise<net.Socket>((resolve) => accepted = resolve);
  const server = net.createServer((s) => accepted(s));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as net.AddressInfo).port;
  const peer = net.connect(port, "127.0.0.1");
  peer.on("error", () => {});
  const handlerSide = await got;
  return {
    handlerSide,
    peer,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

Deno.test("bridge: a client that stops reading holds a flooding console back; reading again resumes it", async () => {
  // The handler buffers only a little meanwhile.
  const dir = await Deno.makeTempDir({ prefix: "virtnode-bridge-" });
  const flood = await floodServer(join(dir, "serial"));
  const pair = await tcpPair();
  try {
    pair.peer.pause();
    const target = net.connect(join(dir, "serial"));
    const b = bridge(pair.handlerSide, new Uint8Array(), target);
    // Kernel buffers on both sockets fill first; after that the console's writes stop.
    let last = -1;
    for (let i = 0; i < 50 && flood.state.written !== last; i++) {
      last = flood.state.written;
      await sleep(200);
    }
    assert.equal(flood.state.written, last, "the console's writes stopped");
    assert.ok(last < 32 * 1024 * 1024, `${last} bytes went out before the console was held`);
    assert.ok(
      pair.handlerSide.writableLength <= 2 * (CHUNK.length + 14),
      `the handler buffers ${pair.handlerSide.writableLength} bytes for the client`,
    );

    // The client reads again: the console goes on.
    let read = 0;
    pair.peer.on("data", (chunk: Uint8Array) => read += chunk.length);
    pair.peer.resume();
    const held = flood.state.written;
    for (let i = 0; i < 50 && flood.state.written < held + 8 * 1024 * 1024; i++) await sleep(100);
    assert.ok(flood.state.written >= held + 8 * 1024 * 1024, "the console went on");
    assert.ok(read > 8 * 1024 * 1024, `the client read ${read} bytes`);

    b.stop("test over");
    assert.equal(await b.done, "test over");
  } finally {
    pair.peer.destroy();
    await pair.close();
    await flood.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("bridge: a client vanishing while the console floods ends the bridge and closes the console", async () => {
  const dir = await Deno.makeTempDir({ prefix: "virtnode-bridge-" });
  const flood = await floodServer(join(dir, "serial"));
  const pair = await tcpPair();
  try {
    pair.peer.pause();
    const target = net.connect(join(dir, "serial"));
    const b = bridge(pair.handlerSide, new Uint8Array(), target);
    await sleep(300);
    pair.peer.destroy();
    const reason = await b.done;
    assert.match(reason, /client/);
    for (let i = 0; i < 50 && !flood.state.closed; i++) await sleep(50);
    assert.ok(flood.state.closed, "the console's socket was closed");
    assert.ok(pair.handlerSide.destroyed && target.destroyed);
  } finally {
    await pair.close();
    await flood.close();
    await Deno.remove(dir, { recursive: true });
  }
});

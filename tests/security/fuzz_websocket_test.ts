/**
 * Fuzzing the WebSocket frame reader of the console and VNC routes with what a hostile
 * client can send: real masked frames (binary in the three length forms, fragmented
 * messages with pings between their parts, text, pong, close), mutated (opcodes, FIN and
 * reserved bits, the mask bit, length fields set to edge values up to 2^64 - 1, frames
 * repeated) and fed in random pieces. The reader never throws; it reports the same events
 * however the bytes are cut; it gives out no more data than came in; and its time and
 * memory grow with the bytes it is given, also when they come a few at a time.
 */
import assert from "node:assert/strict";
import {
  CloseCode,
  type FrameEvent,
  FrameReader,
  MAX_FRAME_PAYLOAD,
} from "../../mod/rest/testing.ts";
import {
  type ByteMutation,
  concatBytes,
  EDGE_VALUES,
  fuzz,
  genericMutations,
  hex,
  mutate,
  type Rand,
  repeatRange,
  writeBigEndian,
} from "./_fuzz.ts";
import { clientFrame, frameHeader } from "./_websocket.ts";

const encoder = new TextEncoder();
const keys = (n: number) => Uint8Array.from({ length: n }, (_, i) => (i * 31 + 7) & 0xff);
/** Byte streams a real client sends: console keystrokes, VNC updates, control frames. */
const SEEDS: Uint8Array[] = [
  clientFrame(0x2, encoder.encode("ls -l\r")),
  concatBytes([
    clientFrame(0x2, keys(300)),
    clientFrame(0x9, encoder.encode("keepalive")),
    clientFrame(0x2, keys(5)),
  ]),
  concatBytes([
    clientFrame(0x2, keys(40), false),
    clientFrame(0x9, new Uint8Array()),
    clientFrame(0x0, keys(200), false),
    clientFrame(0x0, keys(3)),
    clientFrame(0xa, encoder.encode("pong")),
  ]),
  concatBytes([
    clientFrame(0x1, encoder.encode("text is dropped")),
    clientFrame(0x2, keys(70_000)),
  ]),
  concatBytes([clientFrame(0x2, keys(10)), clientFrame(0x8, Uint8Array.of(0x03, 0xe8))]),
];

/** Where the frames of a byte stream start (valid streams only; mutations may break it). */
function frameStarts(bytes: Uint8Array): number[] {
  const starts: number[] = [];
  for (let at = 0;;) {
    const header = frameHeader(bytes, at);
    if (!header) return starts;
    starts.push(at);
    at += header.head + header.length;
  }
}

const MAX_STREAM = 256 * 1024;
const MUTATIONS: ByteMutation[] = [
  ...genericMutations(MAX_STREAM),
  {
    name: "opcode",
    apply: (b, rand) => {
      const starts = frameStarts(b);
      if (starts.length) {
        const at = rand.pick(starts);
        b[at] = (b[at] & 0xf0) | rand.int(16);
      }
      return b;
    },
  },
  {
    name: "fin/rsv/mask",
    apply: (b, rand) => {
      const starts = frameStarts(b);
      if (starts.length) {
        const at = rand.pick(starts);
        if (rand.chance(0.7)) b[at] ^= rand.pick([0x80, 0x40, 0x20, 0x10]);
        else b[at + 1] ^= 0x80;
      }
      return b;
    },
  },
  {
    name: "length",
    apply: (b, rand) => {
      const starts = frameStarts(b);
      if (!starts.length) return b;
      const at = rand.pick(starts);
      const form = rand.pick([125, 126, 127, rand.int(126)]);
      b[at + 1] = (b[at + 1] & 0x80) | form;
      if (form === 126) writeBigEndian(b, at + 2, 2, rand.pick(EDGE_VALUES));
      if (form === 127) {
        // High and low halves: 2^31, 2^32 - 1, 2^63 and beyond the reader's bound.
        writeBigEndian(b, at + 2, 4, rand.pick([0, 0, 1, 0x7fffffff, 0x80000000, 0xffffffff]));
        writeBigEndian(
          b,
          at + 6,
          4,
          rand.pick([...EDGE_VALUES, MAX_FRAME_PAYLOAD, MAX_FRAME_PAYLOAD + 1]),
        );
      }
      return b;
    },
  },
  {
    name: "repeat-frame",
    apply: (b, rand) => {
      const starts = frameStarts(b);
      if (!starts.length) return b;
      const i = rand.int(starts.length);
      const times = rand.chance(0.5) ? 2 + rand.int(8) : 1000;
      return repeatRange(b, starts[i], starts[i + 1] ?? b.length, times, MAX_STREAM);
    },
  },
];

/** Random cut points: mostly large pieces, sometimes a few bytes at a time. */
function cuts(length: number, rand: Rand): number[] {
  const out: number[] = [];
  const small = rand.chance(0.3);
  for (let at = 0; at < length;) {
    const size = small ? 1 + rand.int(16) : 1 + rand.int(8192);
    at = Math.min(length, at + size);
    out.push(at);
  }
  return out;
}

/** Feeds `bytes` in the pieces `ends` marks; returns the events and checks each push. */
function feed(bytes: Uint8Array, ends: number[]): FrameEvent[] {
  const reader = new FrameReader();
  const events: FrameEvent[] = [];
  let from = 0;
  let finished = false;
  for (const end of ends) {
    let got: FrameEvent[];
    try {
      got = reader.push(bytes.subarray(from, end));
    } catch (error) {
      assert.fail(`FrameReader.push threw ${String(error)}`);
    }
    from = end;
    if (finished) assert.deepEqual(got, [], "events after the close or the error");
    for (const event of got) {
      assert.ok(!finished, "an event after the close or the error");
      if (event.kind === "close" || event.kind === "error") finished = true;
      if (event.kind === "error") {
        assert.ok(
          event.code === CloseCode.ProtocolError || event.code === CloseCode.TooBig,
          `error close code ${event.code}`,
        );
      }
      if (event.kind === "ping") assert.ok(event.payload.length <= 125, "a ping over 125 bytes");
      events.push(event);
    }
  }
  return events;
}

/** Checks the reader's properties on one input; returns how long the pieced feed took. */
function checkReader(bytes: Uint8Array, rand: Rand): void {
  const whole = feed(bytes, [bytes.length]);
  const started = performance.now();
  const pieced = feed(bytes, cuts(bytes.length, rand));
  const ms = performance.now() - started;
  assert.deepEqual(pieced, whole, "the events depend on how the bytes were cut");
  const out = whole.reduce((n, e) => n + ("payload" in e ? e.payload.length : 0), 0);
  assert.ok(out <= bytes.length, `${out} bytes of payload out of ${bytes.length} in`);
  // Linear work: a few milliseconds for the largest input, however small its pieces (the
  // bound leaves room for a loaded machine; the regression case below holds the quadratic).
  assert.ok(ms < 1_000, `${bytes.length} bytes in pieces took ${ms.toFixed(0)} ms`);
}

Deno.test("WebSocket FrameReader: mutated client streams never throw and read the same however cut", async () => {
  // Each stream is also read in bounded time and memory.
  await fuzz("websocket", { budgetMs: 10_000, minCases: 100 }, (c) => {
    const { bytes, applied } = mutate(c.rand.pick(SEEDS), c.rand, MUTATIONS);
    c.note = `${applied.join("+")} ${hex(bytes)}`;
    checkReader(bytes, c.rand);
  });
});

Deno.test("WebSocket FrameReader: random bytes after a valid frame never throw", async () => {
  await fuzz("websocket-random", { budgetMs: 3_000, minCases: 100 }, (c) => {
    const bytes = concatBytes([SEEDS[0], c.rand.bytes(c.rand.int(4096))]);
    c.note = hex(bytes);
    checkReader(bytes, c.rand);
  });
});

Deno.test("WebSocket FrameReader regression: a largest frame dripped 16 bytes at a time reads in linear time", () => {
  // Found by the fuzzer on c1d8a68 (small pieces): every push copied all the bytes held
  // so far, so a client that drips a 1 MiB frame made the handler copy 32 GiB.
  const frame = clientFrame(0x2, keys(MAX_FRAME_PAYLOAD));
  const reader = new FrameReader();
  const started = performance.now();
  let got = 0;
  for (let at = 0; at < frame.length; at += 16) {
    for (const event of reader.push(frame.subarray(at, at + 16))) {
      if (event.kind === "data") got += event.payload.length;
    }
  }
  const ms = performance.now() - started;
  assert.equal(got, MAX_FRAME_PAYLOAD);
  assert.ok(ms < 1_000, `a ${frame.length}-byte frame in 16-byte pieces took ${ms.toFixed(0)} ms`);
});

Deno.test("WebSocket FrameReader: length fields of 2^31 and 2^63 end the reader at once, holding nothing", () => {
  for (const high of [0, 0x80000000]) {
    const before = Deno.memoryUsage().external;
    const header = Uint8Array.of(0x82, 0xff, ...[high >>> 24, 0, 0, 0], 0x80, 0, 0, 0, 1, 2, 3, 4);
    const events = new FrameReader().push(header);
    assert.deepEqual(events.map((e) => [e.kind, "code" in e ? e.code : undefined]), [[
      "error",
      CloseCode.TooBig,
    ]]);
    assert.ok(
      Deno.memoryUsage().external - before < 16 * 1024 * 1024,
      "no buffer for the claimed length",
    );
  }
});

/**
 * Memory: 100,000 cheap libvirt calls (lookups, state reads, failing lookups, XML and
 * list calls: each allocates strings or objects that must be freed) against
 * `test:///default` keep RSS growth bounded.
 *
 * The measurement runs in a child `deno run` of this same file, as the agent runs:
 * under `deno test` the harness itself keeps ~1 KiB per worker round trip, which would
 * hide (or fake) a leak of ours.
 */

import assert from "node:assert/strict";
import { openLibvirt } from "../../ffi/mod.ts";

const CALLS = 100_000;
const WARM_UP = 150_000;
const BATCH = 200;
const CHILD_ENV = "VIRTNODE_FFI_LEAK_CHILD";

interface LeakReport {
  calls: number;
  seconds: number;
  freshMiB: number;
  beforeMiB: number;
  afterMiB: number;
  peakMiB: number;
}

function rssMiB(): number {
  return Deno.memoryUsage().rss / (1024 * 1024);
}

async function measure(): Promise<LeakReport> {
  const conn = await openLibvirt("test:///default", { workers: 2 });
  try {
    const dom = await conn.lookupByName("test");
    const call = (i: number): Promise<unknown> => {
      switch (i % 5) {
        case 0:
          return conn.lookupByName("test");
        case 1:
          return dom.getState();
        case 2:
          return conn.lookupByName(`vn-missing-${i}`).catch((e) => e);
        case 3:
          return dom.getXMLDesc();
        default:
          return conn.listAllDomains();
      }
    };
    const batches = async (from: number, to: number, sample: () => void) => {
      for (let i = from; i < to; i += BATCH) {
        await Promise.all(Array.from({ length: BATCH }, (_, j) => call(i + j)));
        if (i % 10_000 === 0) sample();
      }
    };
    // Warm up: the three V8 heaps (main thread and two call workers) grow by ~100 MiB
    // over the first ~100k calls before their GC settles (with --max-old-space-size=32
    // the plateau is ~35 MiB); a native leak only shows in the growth after that.
    const freshMiB = rssMiB();
    await batches(0, WARM_UP, () => {});
    const beforeMiB = rssMiB();
    let peakMiB = beforeMiB;
    const started = performance.now();
    await batches(WARM_UP, WARM_UP + CALLS, () => peakMiB = Math.max(peakMiB, rssMiB()));
    const seconds = (performance.now() - started) / 1000;
    return { calls: CALLS, seconds, freshMiB, beforeMiB, afterMiB: rssMiB(), peakMiB };
  } finally {
    await conn.close();
  }
}

if (Deno.env.get(CHILD_ENV) === "1") {
  console.log(JSON.stringify(await measure()));
}

Deno.test("100k cheap libvirt calls keep RSS growth bounded", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-all", new URL(import.meta.url).pathname],
    env: { [CHILD_ENV]: "1" },
    stdout: "piped",
    stderr: "inherit",
  }).output();
  assert.ok(out.success, `the measuring child exited ${out.code}`);
  const lines = new TextDecoder().decode(out.stdout).trim().split("\n");
  const r = JSON.parse(lines.at(-1) ?? "") as LeakReport;
  const growth = r.afterMiB - r.beforeMiB;
  console.log(
    `${r.calls} calls in ${r.seconds.toFixed(1)} s (${(r.calls / r.seconds).toFixed(0)}/s); ` +
      `RSS fresh ${r.freshMiB.toFixed(1)} MiB, after ${WARM_UP} warm-up calls ${
        r.beforeMiB.toFixed(1)
      } MiB, after ${r.calls} more ${r.afterMiB.toFixed(1)} MiB: growth ${
        growth.toFixed(1)
      } MiB (peak ${r.peakMiB.toFixed(1)} MiB)`,
  );
  // Leaking the ~1 KiB XML string of each getXMLDesc alone would add ~20 MiB here, and
  // leaking the domain objects or error copies of every call more still.
  assert.ok(growth < 16, `RSS grew ${growth.toFixed(1)} MiB`);
});

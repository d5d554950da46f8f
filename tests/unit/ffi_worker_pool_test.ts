/**
 * The libvirt call worker pool's sizing, with stand-in workers whose calls end when the
 * test says: a call that hangs gets a worker started beside it (the next caller finds an
 * idle one at once), and calls that end in time start none.
 *
 * @module
 */

import assert from "node:assert/strict";
import { CallTimeoutError } from "../../ffi/mod.ts";
import { type CallWorker, WorkerPool } from "../../ffi/mod.ts";

/** A worker whose calls stay pending until {@linkcode finish}. */
class StandIn {
  readonly calls: { op: string; resolve: (v: unknown) => void }[] = [];
  busySince: number | undefined;
  dead = false;
  onIdle: (() => void) | undefined;

  get load(): number {
    return this.calls.length;
  }

  call(op: string): Promise<unknown> {
    this.busySince ??= performance.now();
    return new Promise((resolve) => this.calls.push({ op, resolve }));
  }

  finish(): void {
    for (const c of this.calls.splice(0)) c.resolve(c.op);
    this.busySince = undefined;
    this.onIdle?.();
  }

  terminate(): void {
    this.dead = true;
  }
}

function poolOf(min: number, max: number, stuckAfterMs = 40) {
  const made: StandIn[] = [];
  const pool = new WorkerPool({
    min,
    max,
    stuckAfterMs,
    retireAfterMs: 60_000,
    newWorker: () => {
      const w = new StandIn();
      made.push(w);
      return w as unknown as CallWorker;
    },
  });
  return { pool, made };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

Deno.test("worker pool: a call stuck past stuckAfterMs gets a worker started beside it", async () => {
  const { pool, made } = poolOf(2, 4);
  try {
    const hung = pool.call("domainSuspend", ["uuid-a"], "pause A");
    assert.equal(pool.size, 2);
    await sleep(80);
    // Two workers must answer: one is stuck, so a third started, though one is idle.
    assert.equal(pool.size, 3);
    const other = pool.call("domainState", ["uuid-b"], "state of B");
    const busy = made.filter((w) => w.load === 1);
    assert.equal(busy.length, 2, "B's call went straight to an idle worker, beside A's");
    busy.find((w) => w.calls[0].op === "domainState")!.finish();
    assert.equal(await other, "domainState");
    // Still one stuck of three: two answer, so no fourth.
    await sleep(80);
    assert.equal(pool.size, 3);
    made[0].finish();
    assert.equal(await hung, "domainSuspend");
  } finally {
    pool.terminate();
  }
});

Deno.test("worker pool: calls that end before stuckAfterMs start no worker", async () => {
  // Each call ends after about 10 ms; on a loaded machine a 10 ms timer once fired past 40 ms,
  // so this pool calls a worker stuck only after a second.
  const { pool, made } = poolOf(2, 4, 1000);
  try {
    for (let i = 0; i < 5; i++) {
      const c = pool.call("domainState", ["u"], "state");
      await sleep(10);
      made.find((w) => w.load > 0)!.finish();
      await c;
    }
    await sleep(80);
    assert.equal(pool.size, 2);
  } finally {
    pool.terminate();
  }
});

Deno.test("worker pool: a fixed pool (max = min) starts none, stuck or not", async () => {
  const { pool, made } = poolOf(1, 1);
  try {
    const hung = pool.call("domainSuspend", ["a"], "pause");
    await sleep(80);
    assert.equal(pool.size, 1);
    made[0].finish();
    await hung;
  } finally {
    pool.terminate();
  }
});

Deno.test("worker pool: a call past its timeout fails with CallTimeoutError, queued or running", async () => {
  // A queued call leaves the queue; a running one keeps its worker until it ends.
  const { pool, made } = poolOf(1, 1);
  try {
    const running = pool.call("domainSuspend", ["a"], "Cannot pause A", { timeoutMs: 30 });
    const queued = pool.call("domainState", ["b"], "Cannot read B", { timeoutMs: 30 });
    await assert.rejects(running, (e: unknown) => {
      assert.ok(e instanceof CallTimeoutError);
      assert.equal(e.message, "Cannot pause A: no answer within 30 ms");
      return true;
    });
    await assert.rejects(queued, CallTimeoutError);
    assert.equal(made[0].load, 1, "the worker still runs A's call");
    made[0].finish();
    // B left the queue: it never reaches the worker, which takes the next call.
    assert.equal(made[0].load, 0);
    const next = pool.call("domainState", ["c"], "Cannot read C", { timeoutMs: 1_000 });
    assert.deepEqual(made[0].calls.map((c) => c.op), ["domainState"]);
    made[0].finish();
    assert.equal(await next, "domainState");
  } finally {
    pool.terminate();
  }
});

Deno.test("worker pool: with min 0 no worker runs before the first call or after retireAfterMs idle", async () => {
  const made: StandIn[] = [];
  const pool = new WorkerPool({
    min: 0,
    max: 2,
    growAfterMs: 0,
    retireAfterMs: 40,
    newWorker: () => {
      const w = new StandIn();
      made.push(w);
      return w as unknown as CallWorker;
    },
  });
  try {
    assert.equal(pool.size, 0);
    const call = pool.call("domainState", ["a"], "state");
    await sleep(20);
    assert.equal(pool.size, 1);
    made[0].finish();
    assert.equal(await call, "domainState");
    await sleep(80);
    assert.equal(pool.size, 0);
    assert.equal(made[0].dead, true);
  } finally {
    pool.terminate();
  }
});

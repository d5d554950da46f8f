import assert from "node:assert/strict";
import {
  BucketRateLimiter,
  defaultControllerRateLimiter,
  ItemExponentialRateLimiter,
  MaxOfRateLimiter,
  WorkQueue,
} from "../../mod/kube/mod.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Resolves with the next key, or "timeout" when none comes within `ms`. */
function getWithin(queue: WorkQueue, ms: number): Promise<string | undefined | "timeout"> {
  let timer: ReturnType<typeof setTimeout>;
  const timeout = new Promise<"timeout">((r) => timer = setTimeout(() => r("timeout"), ms));
  return Promise.race([queue.get(), timeout]).finally(() => clearTimeout(timer));
}

Deno.test("WorkQueue dedups a key added several times before it is taken", async () => {
  const q = new WorkQueue();
  q.add("ns/a");
  q.add("ns/b");
  q.add("ns/a");
  q.add("ns/a");
  assert.equal(q.len(), 2);
  assert.equal(await q.get(), "ns/a");
  assert.equal(await q.get(), "ns/b");
  assert.equal(q.len(), 0);
  q.done("ns/a");
  q.done("ns/b");
  q.shutDown();
});

Deno.test("WorkQueue never hands a key to two workers at once", async () => {
  const q = new WorkQueue();
  q.add("ns/a");
  assert.equal(await q.get(), "ns/a");
  q.add("ns/a"); // re-added while a worker holds it
  assert.equal(q.len(), 0);
  assert.equal(await getWithin(q, 30), "timeout", "a second worker must not get ns/a");
  q.shutDown();
});

Deno.test("WorkQueue processes a key re-added during processing again after done()", async () => {
  const q = new WorkQueue();
  q.add("ns/a");
  const key = await q.get();
  q.add("ns/a");
  q.add("ns/a");
  const second = q.get(); // a worker waiting
  q.done(key!);
  assert.equal(await second, "ns/a");
  q.done("ns/a");
  assert.equal(q.len(), 0);
  assert.equal(await getWithin(q, 20), "timeout", "re-adds while processing collapse to one");
  q.shutDown();
});

Deno.test("WorkQueue hands a key to a worker already waiting in get()", async () => {
  const q = new WorkQueue();
  const waiting = q.get();
  q.add("ns/x");
  assert.equal(await waiting, "ns/x");
  q.done("ns/x");
  q.shutDown();
});

Deno.test("ItemExponentialRateLimiter backs off 5ms, 10ms, 20ms ... up to 1000s", () => {
  const rl = new ItemExponentialRateLimiter<string>();
  const seq = Array.from({ length: 6 }, () => rl.when("k"));
  assert.deepEqual(seq, [5, 10, 20, 40, 80, 160]);
  assert.equal(rl.numRequeues("k"), 6);
  for (let i = 0; i < 100; i++) rl.when("k");
  assert.equal(rl.when("k"), 1_000_000);
  assert.equal(rl.when("other"), 5, "keys back off independently");
  rl.forget("k");
  assert.equal(rl.numRequeues("k"), 0);
  assert.equal(rl.when("k"), 5);
});

Deno.test("BucketRateLimiter allows a burst of 100 then 10 per second", () => {
  let now = 0;
  const rl = new BucketRateLimiter<string>(10, 100, () => now);
  for (let i = 0; i < 100; i++) assert.equal(rl.when(`k${i}`), 0);
  assert.equal(Math.round(rl.when("k100")), 100);
  assert.equal(Math.round(rl.when("k101")), 200);
  now += 1000; // ten tokens refill, two of them already reserved
  assert.equal(Math.round(rl.when("k102")), 0);
});

Deno.test("MaxOfRateLimiter takes the longest delay of its limiters", () => {
  const now = 0;
  const rl = new MaxOfRateLimiter<string>(
    new ItemExponentialRateLimiter(5, 1_000_000),
    new BucketRateLimiter(10, 1, () => now),
  );
  assert.equal(rl.when("a"), 5);
  assert.equal(Math.round(rl.when("b")), 100, "the bucket is empty after a burst of 1");
  assert.equal(rl.numRequeues("a"), 1);
  const def = defaultControllerRateLimiter<string>();
  assert.equal(def.when("x"), 5);
  assert.equal(def.when("x"), 10);
});

Deno.test("WorkQueue.addRateLimited delays by the per-key backoff and forget() resets it", async () => {
  const q = new WorkQueue({ rateLimiter: new ItemExponentialRateLimiter(20, 1000) });
  q.addRateLimited("ns/a");
  assert.equal(q.len(), 0, "not queued at once");
  const t0 = performance.now();
  assert.equal(await q.get(), "ns/a");
  assert.ok(performance.now() - t0 >= 15);
  q.done("ns/a");
  q.addRateLimited("ns/a");
  const t1 = performance.now();
  assert.equal(await q.get(), "ns/a");
  assert.ok(performance.now() - t1 >= 35, "second requeue waits about 40 ms");
  q.done("ns/a");
  assert.equal(q.numRequeues("ns/a"), 2);
  q.forget("ns/a");
  assert.equal(q.numRequeues("ns/a"), 0);
  q.shutDown();
});

Deno.test("WorkQueue.addAfter adds later and keeps the earlier of two delays", async () => {
  const q = new WorkQueue();
  q.addAfter("ns/a", 200);
  q.addAfter("ns/a", 20);
  q.addAfter("ns/a", 500);
  const t0 = performance.now();
  assert.equal(await q.get(), "ns/a");
  const waited = performance.now() - t0;
  assert.ok(waited >= 15 && waited < 190, `waited ${waited} ms`);
  q.done("ns/a");
  assert.equal(await getWithin(q, 250), "timeout", "the later delays were merged");
  q.shutDown();
  const q2 = new WorkQueue();
  q2.addAfter("ns/b", 0);
  assert.equal(q2.len(), 1, "a delay of 0 adds at once");
  q2.shutDown();
});

Deno.test("WorkQueue.shutDown wakes waiting workers with undefined and cancels delayed adds", async () => {
  const q = new WorkQueue();
  const waiting = q.get();
  q.addAfter("ns/late", 10_000);
  q.shutDown();
  assert.equal(await waiting, undefined);
  q.add("ns/after");
  assert.equal(await q.get(), undefined);
  assert.equal(q.shuttingDown(), true);
});

Deno.test("WorkQueue hands out keys queued before shutDown, then undefined", async () => {
  const q = new WorkQueue();
  q.add("ns/a");
  q.shutDown();
  assert.equal(await q.get(), "ns/a");
  q.done("ns/a");
  assert.equal(await q.get(), undefined);
});

Deno.test("WorkQueue.shutDownWithDrain waits for keys in flight", async () => {
  const q = new WorkQueue();
  q.add("ns/a");
  const key = await q.get();
  let drained = false;
  const drain = q.shutDownWithDrain().then(() => drained = true);
  await sleep(20);
  assert.equal(drained, false, "ns/a is still being processed");
  q.done(key!);
  await drain;
  assert.equal(drained, true);
  await q.shutDownWithDrain(); // nothing in flight: resolves at once
});

import assert from "node:assert/strict";
import { Expectations, EXPECTATIONS_TTL_MS } from "../../mod/kube/mod.ts";

Deno.test("Expectations: a key with no record is satisfied", () => {
  assert.equal(new Expectations().satisfied("ns/a"), true);
});

Deno.test("Expectations: an expected write is unsatisfied until observed", () => {
  const e = new Expectations();
  e.expectWrites("ns/a");
  assert.equal(e.satisfied("ns/a"), false);
  assert.equal(e.satisfied("ns/b"), true, "other keys are not affected");
  e.writeObserved("ns/a");
  assert.equal(e.satisfied("ns/a"), true);
});

Deno.test("Expectations: two writes need two observations; a failed write lowers too", () => {
  const e = new Expectations();
  e.expectWrites("ns/a", 2);
  e.writeObserved("ns/a");
  assert.equal(e.satisfied("ns/a"), false);
  e.writeFailed("ns/a");
  assert.equal(e.satisfied("ns/a"), true);
});

Deno.test("Expectations: UID-tracked deletions are satisfied when every UID is observed", () => {
  const e = new Expectations();
  e.expectDeletions("ns/a", ["uid-1", "uid-2"]);
  e.deletionObserved("ns/a", "uid-1");
  assert.equal(e.satisfied("ns/a"), false);
  assert.deepEqual(e.get("ns/a")?.uids, ["uid-2"]);
  e.deletionObserved("ns/a", "uid-2");
  assert.equal(e.satisfied("ns/a"), true);
});

Deno.test("Expectations: setExpectations, raise and lower count adds and deletions", () => {
  const e = new Expectations();
  e.setExpectations("ns/a", 1, 1);
  e.lower("ns/a", 1, 0);
  assert.equal(e.satisfied("ns/a"), false);
  e.raise("ns/a", 0, 1);
  e.deletionObserved("ns/a");
  e.deletionObserved("ns/a");
  assert.equal(e.satisfied("ns/a"), true);
  e.delete("ns/a");
  assert.equal(e.get("ns/a"), undefined);
});

Deno.test("Expectations older than the TTL (5 min) count as satisfied", () => {
  let now = 1_000_000;
  const e = new Expectations({ now: () => now });
  e.expectWrites("ns/a");
  now += EXPECTATIONS_TTL_MS;
  assert.equal(e.satisfied("ns/a"), false, "exactly at the TTL it is still pending");
  now += 1;
  assert.equal(e.satisfied("ns/a"), true);
  assert.equal(EXPECTATIONS_TTL_MS, 300_000);
});

Deno.test("Expectations: raising again restarts the TTL", () => {
  let now = 0;
  const e = new Expectations({ now: () => now, ttlMs: 100 });
  e.expectWrites("ns/a");
  now = 90;
  e.expectWrites("ns/a");
  now = 150;
  assert.equal(e.satisfied("ns/a"), false);
});

Deno.test("expectingWrite() expects, settles an unwritten write at once and forgets a failed one", async () => {
  const e = new Expectations();
  await e.expectingWrite("ns/a", () => Promise.resolve({ written: true }));
  assert.equal(e.satisfied("ns/a"), false, "a made write waits for its watch event");
  e.writeObserved("ns/a");
  assert.equal(e.satisfied("ns/a"), true);
  await e.expectingWrite("ns/b", () => Promise.resolve({ written: false }));
  assert.equal(e.satisfied("ns/b"), true, "no write, no event to wait for");
  await assert.rejects(
    e.expectingWrite("ns/c", () => Promise.reject(new Error("conflict"))),
    /conflict/,
  );
  assert.equal(e.satisfied("ns/c"), true, "a failed write is not waited for");
});

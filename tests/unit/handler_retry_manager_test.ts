import assert from "node:assert/strict";
import { FailRetryManager } from "../../mod/handler/testing.ts";

function clock() {
  let t = 1_000_000;
  return { now: () => t, advance: (ms: number) => (t += ms) };
}

Deno.test("FailRetryManager tries at once, then after 10 s doubling to 3 min", () => {
  const c = clock();
  const m = new FailRetryManager({ now: c.now });
  assert.deepEqual(m.shouldDelay("vm", true), { delay: false });
  const tries: number[] = [];
  let last = c.now();
  for (let i = 0; i < 7; i++) {
    const d = m.shouldDelay("vm", true);
    assert.equal(d.delay, true);
    c.advance((d as { afterMs: number }).afterMs);
    assert.deepEqual(m.shouldDelay("vm", true), { delay: false });
    tries.push((c.now() - last) / 1000);
    last = c.now();
  }
  assert.deepEqual(tries, [10, 20, 40, 80, 160, 180, 180]);
});

Deno.test("FailRetryManager counts 30 s without a failure after a try as recovered", () => {
  const c = clock();
  const m = new FailRetryManager({ now: c.now });
  m.shouldDelay("vm", true);
  c.advance(10_000);
  m.shouldDelay("vm", true);
  c.advance(29_000);
  assert.deepEqual(m.shouldDelay("vm", false), { delay: false });
  // 29 s is not yet recovered: the backoff carries on (next wait 40 s, not 10 s).
  assert.deepEqual(m.shouldDelay("vm", true), { delay: false });
  assert.deepEqual(m.shouldDelay("vm", true), { delay: true, afterMs: 40_000 });
  c.advance(31_000);
  m.shouldDelay("vm", false);
  assert.deepEqual(m.shouldDelay("vm", true), { delay: false }, "recovered: first retry at once");
  assert.deepEqual(m.shouldDelay("vm", true), { delay: true, afterMs: 10_000 });
});

Deno.test("FailRetryManager keeps keys apart and forgets on request", () => {
  const c = clock();
  const m = new FailRetryManager({ now: c.now });
  m.shouldDelay("a", true);
  assert.deepEqual(m.shouldDelay("b", true), { delay: false });
  assert.equal(m.shouldDelay("a", true).delay, true);
  m.forget("a");
  assert.deepEqual(m.shouldDelay("a", true), { delay: false });
});

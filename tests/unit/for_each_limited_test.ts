/** forEachLimited(): every item once, never more than the limit in flight, failures kept. */
import assert from "node:assert/strict";
import { forEachLimited } from "../../mod/lifecycle/mod.ts";

const tick = () => new Promise((r) => setTimeout(r, 1));

Deno.test("forEachLimited() calls each item once with at most the limit in flight", async () => {
  const seen: number[] = [];
  let inFlight = 0;
  let most = 0;
  await forEachLimited([...Array(20).keys()], 3, async (item, index) => {
    assert.equal(item, index);
    inFlight++;
    most = Math.max(most, inFlight);
    // Uneven lengths: a lane that ends early takes the next item at once.
    for (let i = 0; i < item % 4; i++) await tick();
    seen.push(item);
    inFlight--;
  });
  assert.deepEqual(seen.toSorted((a, b) => a - b), [...Array(20).keys()]);
  assert.equal(most, 3);
});

Deno.test("forEachLimited() rejects with a call's error once the calls in flight end", async () => {
  const ended: number[] = [];
  await assert.rejects(
    forEachLimited([0, 1, 2, 3, 4, 5], 2, async (item) => {
      await tick();
      if (item === 1) throw new Error("item 1 failed");
      await tick();
      ended.push(item);
    }),
    /item 1 failed/,
  );
  // Item 0 was in flight beside the failure and ended; nothing new started after it.
  assert.deepEqual(ended, [0]);
  await forEachLimited([], 4, () => Promise.reject(new Error("never called")));
});

import assert from "node:assert/strict";
import { desiredStatus, jsonEqual } from "../../mod/kube/mod.ts";

interface Status {
  phase?: string;
  conditions?: { type: string; status: string; reason?: string }[];
  nodeName?: string;
}

Deno.test("jsonEqual compares JSON values deeply and ignores undefined members", () => {
  assert.equal(jsonEqual({ a: 1, b: [1, { c: "x" }] }, { b: [1, { c: "x" }], a: 1 }), true);
  assert.equal(jsonEqual({ a: undefined }, {}), true);
  assert.equal(jsonEqual({ a: null }, {}), false);
  assert.equal(jsonEqual([1, 2], [2, 1]), false);
  assert.equal(jsonEqual({ a: [] }, { a: {} }), false);
  assert.equal(jsonEqual({ a: 1 }, { a: "1" }), false);
  assert.equal(jsonEqual({ a: 1, b: 2 }, { a: 1 }), false);
});

Deno.test("desiredStatus returns undefined when the mutation changes nothing", () => {
  const current: Status = { phase: "Running", conditions: [{ type: "Ready", status: "True" }] };
  assert.equal(desiredStatus(current, (s) => void (s.phase = "Running")), undefined);
  assert.equal(
    desiredStatus(current, (s) => ({ ...s, conditions: [{ type: "Ready", status: "True" }] })),
    undefined,
  );
});

Deno.test("desiredStatus returns the changed status and leaves the input untouched", () => {
  const current: Status = { phase: "Scheduled", nodeName: "n1" };
  const desired = desiredStatus(current, (s) => {
    s.phase = "Running";
  });
  assert.deepEqual(desired, { phase: "Running", nodeName: "n1" });
  assert.equal(current.phase, "Scheduled", "the cached object is not modified");
});

Deno.test("desiredStatus starts from an empty status when there is none", () => {
  assert.deepEqual(desiredStatus<Status>(undefined, (s) => void (s.phase = "Pending")), {
    phase: "Pending",
  });
  assert.equal(desiredStatus<Status>(undefined, () => {}), undefined);
});

Deno.test("desiredStatus sees a condition change inside a list", () => {
  const current: Status = { conditions: [{ type: "Ready", status: "True" }] };
  const desired = desiredStatus(current, (s) => {
    s.conditions![0].status = "False";
  });
  assert.deepEqual(desired?.conditions, [{ type: "Ready", status: "False" }]);
  assert.equal(current.conditions![0].status, "True");
});

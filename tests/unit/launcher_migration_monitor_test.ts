import assert from "node:assert/strict";
import { MigrationMonitor, type MonitorOptions } from "../../mod/launcher/testing.ts";

const KUBEVIRT_DEFAULTS: MonitorOptions = {
  progressTimeout: 150,
  completionTimeoutPerGiB: 150,
  allowWorkloadDisruption: false,
  allowPostCopy: false,
};
const S = 1000;

Deno.test("MigrationMonitor counts progress against its last look, as KubeVirt's does", () => {
  // Data that is dirtied again and then shrinks still counts as progress.
  const m = new MigrationMonitor({ ...KUBEVIRT_DEFAULTS, progressTimeout: 10 }, 1, 0);
  assert.equal(m.look(4000, 0).kind, "continue");
  assert.equal(m.look(4500, 9 * S).kind, "continue");
  assert.equal(m.look(4400, 11 * S).kind, "continue", "4400 is less than 4500");
  assert.equal(m.look(4400, 21 * S).kind, "continue");
  assert.equal(m.look(4400, 22 * S).kind, "abort");
});

Deno.test("MigrationMonitor lets a migration that makes progress run, within its time", () => {
  const m = new MigrationMonitor(KUBEVIRT_DEFAULTS, 0.125, 0);
  assert.equal(m.acceptableSeconds, 150, "a guest under 1 GiB counts as 1 GiB");
  let remaining = 1_000_000;
  for (let t = 0; t <= 140 * S; t += 400) {
    remaining = Math.max(1, remaining - 100);
    assert.deepEqual(m.look(remaining, t), { kind: "continue" }, `at ${t} ms`);
  }
});

Deno.test("MigrationMonitor aborts a migration whose remaining data has not shrunk for progressTimeout seconds", () => {
  const m = new MigrationMonitor({ ...KUBEVIRT_DEFAULTS, progressTimeout: 10 }, 1, 0);
  assert.equal(m.look(5000, 0).kind, "continue");
  assert.equal(m.look(4000, 2 * S).kind, "continue");
  // Stays at 4000 from 2 s on.
  assert.equal(m.look(4000, 10 * S).kind, "continue");
  assert.equal(
    m.look(4000, 12 * S).kind,
    "continue",
    "10 s without progress is not yet more than 10",
  );
  assert.deepEqual(m.look(4000, 13 * S), {
    kind: "abort",
    reason: "Live migration stuck for 11 seconds and has been aborted",
  });
});

Deno.test("MigrationMonitor aborts a migration past completionTimeoutPerGiB per GiB of memory", () => {
  const m = new MigrationMonitor({ ...KUBEVIRT_DEFAULTS, completionTimeoutPerGiB: 5 }, 2.5, 0);
  assert.equal(m.acceptableSeconds, 15, "2.5 GiB count as 3");
  let remaining = 10_000_000;
  const next = () => remaining -= 1000;
  for (let t = 0; t <= 15 * S; t += 400) assert.equal(m.look(next(), t).kind, "continue");
  assert.deepEqual(m.look(next(), 16 * S), {
    kind: "abort",
    reason: "Live migration is not completed after 15 seconds and has been aborted",
  });
});

Deno.test("MigrationMonitor with workload disruption allowed switches to post-copy once, then never aborts", () => {
  // It switches only when post-copy is allowed; after that nothing aborts the migration.
  const m = new MigrationMonitor(
    {
      ...KUBEVIRT_DEFAULTS,
      completionTimeoutPerGiB: 5,
      allowWorkloadDisruption: true,
      allowPostCopy: true,
    },
    1,
    0,
  );
  assert.equal(m.look(100, 5 * S).kind, "continue");
  assert.deepEqual(m.look(90, 6 * S), { kind: "postCopy" });
  assert.equal(m.mode, "postcopy");
  // Stuck and late: still left alone, the target runs the guest.
  assert.equal(m.look(90, 600 * S).kind, "continue");
});

Deno.test("MigrationMonitor with workload disruption but no post-copy pauses once, then aborts past 2x time", () => {
  // The guest is paused once and the completion time doubled; past that the migration aborts.
  const m = new MigrationMonitor(
    { ...KUBEVIRT_DEFAULTS, completionTimeoutPerGiB: 5, allowWorkloadDisruption: true },
    1,
    0,
  );
  let remaining = 1_000_000;
  const next = () => remaining -= 10;
  assert.deepEqual(m.look(next(), 6 * S), { kind: "pause" });
  assert.equal(m.mode, "paused");
  assert.equal(m.acceptableSeconds, 10);
  assert.equal(m.look(next(), 10 * S).kind, "continue");
  assert.equal(m.look(next(), 11 * S).kind, "abort");
});

Deno.test("MigrationMonitor with both timeouts 0 never aborts", () => {
  const m = new MigrationMonitor(
    { ...KUBEVIRT_DEFAULTS, progressTimeout: 0, completionTimeoutPerGiB: 0 },
    64,
    0,
  );
  assert.equal(m.look(5, 0).kind, "continue");
  assert.equal(m.look(5, 10_000 * S).kind, "continue");
});

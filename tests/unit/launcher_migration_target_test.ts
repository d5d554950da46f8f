import assert from "node:assert/strict";
import type { Domain as LibvirtDomain, DomainEvent } from "../../ffi/mod.ts";
import {
  endsIncomingMigration,
  IncomingMigration,
  startsIncomingMigration,
} from "../../mod/launcher/testing.ts";

function lifecycle(event: number, detail: number): DomainEvent {
  return {
    type: "lifecycle",
    domain: { name: "ns_vm", uuid: "u" },
    event,
    detail,
    eventName: "",
    detailName: "",
  } as DomainEvent;
}

/** A domain whose job statistics say `jobs` in turn (then the last one again). */
function jobDomain(jobs: { type: number; operation?: number }[]): LibvirtDomain {
  let i = 0;
  return {
    jobStats: () => {
      const job = jobs[Math.min(i++, jobs.length - 1)];
      return Promise.resolve({ type: job.type, params: { operation: job.operation ?? 0 } });
    },
  } as unknown as LibvirtDomain;
}

Deno.test("the target's events: started by migration begins it, resumed after migration or paused ends it", () => {
  assert.equal(startsIncomingMigration(lifecycle(2, 1)), true, "Started/Migrated");
  assert.equal(startsIncomingMigration(lifecycle(2, 0)), false, "Started/Booted");
  assert.equal(endsIncomingMigration(lifecycle(4, 1)), true, "Resumed/Migrated");
  assert.equal(endsIncomingMigration(lifecycle(3, 0)), true, "Suspended/Paused");
  assert.equal(endsIncomingMigration(lifecycle(4, 0)), false, "Resumed/Unpaused");
  assert.equal(endsIncomingMigration(lifecycle(5, 3)), false, "Stopped/Migrated (the source's)");
});

Deno.test("IncomingMigration marks the end once libvirt's incoming job is over, and tells once", async () => {
  let changes = 0;
  const incoming = new IncomingMigration("m1", { onChange: () => changes++, log: {} });
  const meta = () => incoming.metadata;
  assert.equal(meta(), undefined, "nothing before the domain arrives");
  incoming.noteEvent(lifecycle(2, 1), () => Promise.resolve(undefined));
  assert.equal(changes, 1);
  assert.ok(meta()?.startTimestamp);
  assert.equal(meta()?.endTimestamp, undefined);
  // The incoming job still runs for two looks, then libvirt has none.
  const domain = jobDomain([{ type: 2, operation: 4 }, { type: 2, operation: 4 }, { type: 0 }]);
  incoming.noteEvent(lifecycle(4, 1), () => Promise.resolve(domain));
  incoming.noteEvent(lifecycle(4, 1), () => Promise.resolve(domain)); // a second: one wait
  const deadline = Date.now() + 5_000;
  while (!incoming.ended && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  assert.equal(incoming.ended, true);
  assert.equal(meta()?.uid, "m1");
  assert.ok(meta()?.endTimestamp);
  assert.equal(changes, 2);
  incoming.noteEvent(lifecycle(4, 1), () => Promise.resolve(domain));
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(changes, 2, "an end is marked once");
});

Deno.test("IncomingMigration counts another job than an incoming migration as the end", async () => {
  const incoming = new IncomingMigration("m2", { onChange: () => {}, log: {} });
  incoming.noteEvent(
    lifecycle(3, 0),
    () => Promise.resolve(jobDomain([{ type: 2, operation: 5 }])),
  );
  const deadline = Date.now() + 2_000;
  while (!incoming.ended && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  assert.equal(incoming.ended, true);
  assert.ok(incoming.metadata?.startTimestamp, "a start is given where none was seen");
});

import assert from "node:assert/strict";
import { VmiPhase } from "../../mod/api/mod.ts";
import {
  acpiShutdownApplies,
  LifeCycle,
  pausedConditionReason,
  StateChangeReason,
  vmiPhaseFromDomain,
} from "../../mod/domain/mod.ts";

Deno.test("vmiPhaseFromDomain() keeps Scheduled and requeues when no domain and the launcher is not ready", () => {
  const decision = vmiPhaseFromDomain({ vmiPhase: VmiPhase.Scheduled, launcher: "notReady" });
  assert.deepEqual(decision, { phase: VmiPhase.Scheduled, requeue: true });
});

Deno.test("vmiPhaseFromDomain() maps no domain and an unresponsive launcher to Failed", () => {
  for (const vmiPhase of [VmiPhase.Scheduled, VmiPhase.Running]) {
    const decision = vmiPhaseFromDomain({ vmiPhase, launcher: "unresponsive" });
    assert.equal(decision.phase, VmiPhase.Failed, vmiPhase);
    assert.equal(decision.requeue, false);
  }
});

Deno.test("vmiPhaseFromDomain() maps a migration target without domain or answer to WaitingForSync", () => {
  // On a migration target a missing domain and an unresponsive launcher both wait for sync.
  for (const vmiPhase of [VmiPhase.Scheduled, VmiPhase.Running]) {
    const decision = vmiPhaseFromDomain({
      vmiPhase,
      launcher: "unresponsive",
      isMigrationTarget: true,
    });
    assert.equal(decision.phase, VmiPhase.WaitingForSync, vmiPhase);
  }
});

Deno.test("vmiPhaseFromDomain() keeps Running when no domain and the launcher responds", () => {
  const decision = vmiPhaseFromDomain({ vmiPhase: VmiPhase.Running, launcher: "responsive" });
  assert.deepEqual(decision, { phase: VmiPhase.Running, requeue: false });
});

Deno.test("vmiPhaseFromDomain() maps Running, Blocked and PMSuspended to Running whatever the reason", () => {
  for (const status of [LifeCycle.Running, LifeCycle.Blocked, LifeCycle.PMSuspended]) {
    for (const reason of [StateChangeReason.Unknown, StateChangeReason.User]) {
      const decision = vmiPhaseFromDomain({
        domain: { status, reason },
        vmiPhase: VmiPhase.Scheduled,
        launcher: "responsive",
      });
      assert.deepEqual(decision, { phase: VmiPhase.Running, requeue: false }, status);
    }
  }
});

Deno.test("vmiPhaseFromDomain() maps Paused/PostcopyFailed to Failed", () => {
  const decision = vmiPhaseFromDomain({
    domain: { status: LifeCycle.Paused, reason: StateChangeReason.PausedPostcopyFailed },
    vmiPhase: VmiPhase.Running,
    launcher: "responsive",
  });
  assert.equal(decision.phase, VmiPhase.Failed);
  assert.equal(decision.pausedReason, undefined);
});

Deno.test("vmiPhaseFromDomain() maps other Paused reasons to Running with the pause reason", () => {
  for (
    const reason of [
      StateChangeReason.PausedUser,
      StateChangeReason.PausedIOError,
      StateChangeReason.PausedMigration,
      StateChangeReason.PausedUnknown,
    ]
  ) {
    const decision = vmiPhaseFromDomain({
      domain: { status: LifeCycle.Paused, reason },
      vmiPhase: VmiPhase.Running,
      launcher: "responsive",
    });
    assert.deepEqual(decision, { phase: VmiPhase.Running, requeue: false, pausedReason: reason });
  }
});

Deno.test("vmiPhaseFromDomain() maps Shutoff/Crashed and Crashed/Panicked to Failed", () => {
  for (const status of [LifeCycle.Shutoff, LifeCycle.Crashed]) {
    for (const reason of [StateChangeReason.Crashed, StateChangeReason.Panicked]) {
      const decision = vmiPhaseFromDomain({
        domain: { status, reason },
        vmiPhase: VmiPhase.Running,
        launcher: "responsive",
      });
      assert.equal(decision.phase, VmiPhase.Failed, `${status}/${reason}`);
    }
  }
});

Deno.test("vmiPhaseFromDomain() maps Shutoff/Destroyed to Failed or Succeeded as KubeVirt does", () => {
  // Failed when ACPI is on and the grace period is unset or not 0,
  // or after a failed post-copy migration; Succeeded otherwise.
  // KubeVirt's isACPIEnabled and the phase rule beside it, every combination written out.
  const rows: [
    grace: number | null | undefined,
    acpi: boolean,
    postCopyFailed: boolean,
    VmiPhase,
  ][] = [
    [undefined, false, false, VmiPhase.Succeeded],
    [undefined, true, false, VmiPhase.Failed],
    [undefined, false, true, VmiPhase.Failed],
    [undefined, true, true, VmiPhase.Failed],
    [null, false, false, VmiPhase.Succeeded],
    [null, true, false, VmiPhase.Failed],
    [null, false, true, VmiPhase.Failed],
    [null, true, true, VmiPhase.Failed],
    [0, false, false, VmiPhase.Succeeded],
    [0, true, false, VmiPhase.Succeeded],
    [0, false, true, VmiPhase.Failed],
    [0, true, true, VmiPhase.Failed],
    [30, false, false, VmiPhase.Succeeded],
    [30, true, false, VmiPhase.Failed],
    [30, false, true, VmiPhase.Failed],
    [30, true, true, VmiPhase.Failed],
  ];
  for (const [grace, acpi, postCopyFailed, phase] of rows) {
    const decision = vmiPhaseFromDomain({
      domain: { status: LifeCycle.Shutoff, reason: StateChangeReason.Destroyed },
      vmiPhase: VmiPhase.Running,
      launcher: "responsive",
      terminationGracePeriodSeconds: grace,
      domainHasAcpi: acpi,
      postCopyMigrationFailed: postCopyFailed,
    });
    assert.deepEqual(
      decision,
      { phase, requeue: false },
      `grace=${grace} acpi=${acpi} postCopyFailed=${postCopyFailed}`,
    );
  }
});

Deno.test("acpiShutdownApplies() needs ACPI in the domain and a VMI grace period that is unset or not 0", () => {
  assert.equal(acpiShutdownApplies({ domainHasAcpi: true }), true);
  assert.equal(
    acpiShutdownApplies({ domainHasAcpi: true, terminationGracePeriodSeconds: 1 }),
    true,
  );
  assert.equal(
    acpiShutdownApplies({ domainHasAcpi: true, terminationGracePeriodSeconds: 0 }),
    false,
  );
  assert.equal(acpiShutdownApplies({ domainHasAcpi: false }), false);
  assert.equal(acpiShutdownApplies({ terminationGracePeriodSeconds: 30 }), false);
});

Deno.test("vmiPhaseFromDomain() maps Shutoff/Shutdown, Saved and FromSnapshot to Succeeded", () => {
  for (
    const reason of [
      StateChangeReason.Shutdown,
      StateChangeReason.Saved,
      StateChangeReason.FromSnapshot,
    ]
  ) {
    const decision = vmiPhaseFromDomain({
      domain: { status: LifeCycle.Shutoff, reason },
      vmiPhase: VmiPhase.Running,
      launcher: "responsive",
    });
    assert.equal(decision.phase, VmiPhase.Succeeded, reason);
  }
});

Deno.test("vmiPhaseFromDomain() keeps the phase for Shutoff/Migrated", () => {
  const decision = vmiPhaseFromDomain({
    domain: { status: LifeCycle.Shutoff, reason: StateChangeReason.Migrated },
    vmiPhase: VmiPhase.Running,
    launcher: "responsive",
  });
  assert.deepEqual(decision, { phase: VmiPhase.Running, requeue: false });
});

Deno.test("vmiPhaseFromDomain() keeps the phase for NoState, ShuttingDown and Shutoff/Unknown", () => {
  const cases = [
    { status: LifeCycle.NoState, reason: StateChangeReason.NonExistent },
    { status: LifeCycle.Shutdown, reason: StateChangeReason.User },
    { status: LifeCycle.Shutoff, reason: StateChangeReason.Unknown },
  ];
  for (const domain of cases) {
    for (const vmiPhase of [VmiPhase.Scheduled, VmiPhase.Running]) {
      const decision = vmiPhaseFromDomain({ domain, vmiPhase, launcher: "responsive" });
      assert.deepEqual(decision, { phase: vmiPhase, requeue: false }, domain.status);
    }
  }
});

Deno.test("pausedConditionReason() names KubeVirt's Paused condition reasons", () => {
  assert.equal(pausedConditionReason(StateChangeReason.PausedUser), "PausedByUser");
  assert.equal(pausedConditionReason(StateChangeReason.PausedIOError), "PausedIOError");
  assert.equal(
    pausedConditionReason(StateChangeReason.PausedMigration),
    "PausedByMigrationMonitor",
  );
  assert.equal(pausedConditionReason(StateChangeReason.PausedWatchdog), undefined);
});

import assert from "node:assert/strict";
import {
  domainStateFromLibvirt,
  isDomainActive,
  isDomainAlive,
  isDomainDown,
  LifeCycle,
  lifeCycleFromLibvirt,
  newDomain,
  reasonFromLibvirt,
  StateChangeReason,
  stoppedEventReason,
  VirDomainCrashedReason,
  VirDomainPausedReason,
  VirDomainRunningReason,
  VirDomainShutdownReason,
  VirDomainShutoffReason,
  VirDomainState,
} from "../../mod/domain/mod.ts";

Deno.test("lifeCycleFromLibvirt() names every virDomainState as KubeVirt does", () => {
  const expected: [number, string][] = [
    [VirDomainState.NOSTATE, "NoState"],
    [VirDomainState.RUNNING, "Running"],
    [VirDomainState.BLOCKED, "Blocked"],
    [VirDomainState.PAUSED, "Paused"],
    [VirDomainState.SHUTDOWN, "ShuttingDown"],
    [VirDomainState.SHUTOFF, "Shutoff"],
    [VirDomainState.CRASHED, "Crashed"],
    [VirDomainState.PMSUSPENDED, "PMSuspended"],
  ];
  for (const [state, name] of expected) assert.equal(lifeCycleFromLibvirt(state), name);
  assert.equal(lifeCycleFromLibvirt(99), LifeCycle.NoState);
});

Deno.test("reasonFromLibvirt() maps every Shutoff reason", () => {
  const expected: [number, string][] = [
    [VirDomainShutoffReason.UNKNOWN, "Unknown"],
    [VirDomainShutoffReason.SHUTDOWN, "Shutdown"],
    [VirDomainShutoffReason.DESTROYED, "Destroyed"],
    [VirDomainShutoffReason.CRASHED, "Crashed"],
    [VirDomainShutoffReason.MIGRATED, "Migrated"],
    [VirDomainShutoffReason.SAVED, "Saved"],
    [VirDomainShutoffReason.FAILED, "Failed"],
    [VirDomainShutoffReason.FROM_SNAPSHOT, "FromSnapshot"],
    [VirDomainShutoffReason.DAEMON, "Unknown"],
  ];
  for (const [reason, name] of expected) {
    assert.equal(reasonFromLibvirt(VirDomainState.SHUTOFF, reason), name, `reason ${reason}`);
  }
});

Deno.test("reasonFromLibvirt() maps every Paused reason", () => {
  const expected: [number, string][] = [
    [VirDomainPausedReason.UNKNOWN, "Unknown"],
    [VirDomainPausedReason.USER, "User"],
    [VirDomainPausedReason.MIGRATION, "Migration"],
    [VirDomainPausedReason.SAVE, "Save"],
    [VirDomainPausedReason.DUMP, "Dump"],
    [VirDomainPausedReason.IOERROR, "IOError"],
    [VirDomainPausedReason.WATCHDOG, "Watchdog"],
    [VirDomainPausedReason.FROM_SNAPSHOT, "FromSnapshot"],
    [VirDomainPausedReason.SHUTTING_DOWN, "ShuttingDown"],
    [VirDomainPausedReason.SNAPSHOT, "Snapshot"],
    [VirDomainPausedReason.CRASHED, "Crashed"],
    [VirDomainPausedReason.STARTING_UP, "StartingUp"],
    [VirDomainPausedReason.POSTCOPY, "Postcopy"],
    [VirDomainPausedReason.POSTCOPY_FAILED, "PostcopyFailed"],
  ];
  for (const [reason, name] of expected) {
    assert.equal(reasonFromLibvirt(VirDomainState.PAUSED, reason), name, `reason ${reason}`);
  }
});

Deno.test("reasonFromLibvirt() maps ShuttingDown and Crashed reasons", () => {
  assert.equal(reasonFromLibvirt(VirDomainState.SHUTDOWN, VirDomainShutdownReason.USER), "User");
  assert.equal(
    reasonFromLibvirt(VirDomainState.SHUTDOWN, VirDomainShutdownReason.UNKNOWN),
    "Unknown",
  );
  assert.equal(
    reasonFromLibvirt(VirDomainState.CRASHED, VirDomainCrashedReason.PANICKED),
    "Panicked",
  );
  assert.equal(
    reasonFromLibvirt(VirDomainState.CRASHED, VirDomainCrashedReason.UNKNOWN),
    "Unknown",
  );
});

Deno.test("reasonFromLibvirt() names no reason for Running, as KubeVirt", () => {
  for (const reason of Object.values(VirDomainRunningReason)) {
    assert.equal(reasonFromLibvirt(VirDomainState.RUNNING, reason), "Unknown");
  }
});

Deno.test("domainStateFromLibvirt() pairs status and reason", () => {
  assert.deepEqual(
    domainStateFromLibvirt(VirDomainState.SHUTOFF, VirDomainShutoffReason.DESTROYED),
    { status: "Shutoff", reason: "Destroyed" },
  );
  assert.deepEqual(
    domainStateFromLibvirt(VirDomainState.PAUSED, VirDomainPausedReason.IOERROR),
    { status: "Paused", reason: "IOError" },
  );
});

Deno.test("isDomainActive() and isDomainDown() split the lifecycle states", () => {
  assert.equal(isDomainActive(LifeCycle.Paused), true);
  assert.equal(isDomainActive(LifeCycle.Shutoff), false);
  assert.equal(isDomainDown(LifeCycle.Crashed), true);
  assert.equal(isDomainDown(LifeCycle.Running), false);
});

Deno.test("isDomainAlive() is false for no domain and for a Shutoff or Crashed one", () => {
  const meta = { namespace: "d", name: "v", uid: "u" };
  assert.equal(isDomainAlive(undefined), false);
  for (const status of [LifeCycle.Shutoff, LifeCycle.Crashed]) {
    assert.equal(
      isDomainAlive(newDomain(meta, { status, reason: StateChangeReason.Unknown })),
      false,
      status,
    );
  }
  for (const status of [LifeCycle.Running, LifeCycle.Paused, LifeCycle.Shutdown]) {
    assert.equal(
      isDomainAlive(newDomain(meta, { status, reason: StateChangeReason.Unknown })),
      true,
      status,
    );
  }
});

Deno.test("stoppedEventReason() reads a STOPPED event's detail as the shutoff reason it is", () => {
  // libvirt numbers the stopped details as its shutoff reasons less one.
  assert.equal(stoppedEventReason(0), StateChangeReason.Shutdown);
  assert.equal(stoppedEventReason(1), StateChangeReason.Destroyed);
  assert.equal(stoppedEventReason(3), StateChangeReason.Migrated);
  assert.equal(stoppedEventReason(6), StateChangeReason.FromSnapshot);
  assert.equal(stoppedEventReason(42), StateChangeReason.Unknown);
});

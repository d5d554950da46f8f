/**
 * decideSync(), row by row: one case for every row of the decision order in
 * mod/handler/decide.ts, plus the cases where two rows meet and the order decides.
 */
import assert from "node:assert/strict";
import { type VirtualMachineInstance, VmiPhase } from "../../mod/api/mod.ts";
import {
  type Domain,
  type LauncherState,
  LifeCycle,
  newDomain,
  StateChangeReason,
} from "../../mod/domain/mod.ts";
import { decideSync, SyncAction, type SyncInput } from "../../mod/handler/testing.ts";
import { podlessStandIn } from "../../mod/handler/podless/testing.ts";

const STAND_IN = podlessStandIn(() => new Map());

const UID = "c0ffee00-0000-4000-8000-000000000001";

function vmi(phase: string, extra: { deleting?: boolean } = {}): VirtualMachineInstance {
  return {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachineInstance",
    metadata: {
      namespace: "default",
      name: "vm1",
      uid: UID,
      ...(extra.deleting ? { deletionTimestamp: "2026-11-30T00:00:00Z" } : {}),
    },
    spec: { domain: { devices: {} } },
    status: phase ? { phase } : {},
  } as VirtualMachineInstance;
}

function domain(status: LifeCycle, reason: StateChangeReason = StateChangeReason.Unknown): Domain {
  return newDomain({ namespace: "default", name: "vm1", uid: UID }, { status, reason });
}

interface Row {
  /** The row of the table in decide.ts, and what it shows. */
  name: string;
  input: Partial<SyncInput> & { vmi: VirtualMachineInstance };
  action: SyncAction;
  writesStatus: boolean;
  resumeAfterIOError?: boolean;
  /** `cleanup`: the launcher answers and is told to delete the domain first. */
  deleteFirst?: boolean;
}

const running = domain(LifeCycle.Running, StateChangeReason.Unknown);
const shutoff = domain(LifeCycle.Shutoff, StateChangeReason.Destroyed);
const crashed = domain(LifeCycle.Crashed, StateChangeReason.Crashed);
const pausedUser = domain(LifeCycle.Paused, StateChangeReason.PausedUser);
const pausedIO = domain(LifeCycle.Paused, StateChangeReason.PausedIOError);
const postcopy = domain(LifeCycle.Paused, StateChangeReason.PausedPostcopyFailed);

const ROWS: Row[] = [
  // 1 and 2: before the VMI is scheduled.
  {
    name: "1: a Pending VMI is scheduled when the handler stands in for virt-controller",
    input: { vmi: vmi(VmiPhase.Pending), standIn: STAND_IN },
    action: SyncAction.Schedule,
    writesStatus: false,
  },
  {
    name: "1: a VMI without a phase counts as Pending",
    input: { vmi: vmi(""), standIn: STAND_IN },
    action: SyncAction.Schedule,
    writesStatus: false,
  },
  {
    name: "2: a Pending VMI waits for virt-controller in KubeVirt mode",
    input: { vmi: vmi(VmiPhase.Pending), standIn: undefined },
    action: SyncAction.None,
    writesStatus: false,
  },
  {
    name: "2: a Pending VMI being deleted is not scheduled",
    input: {
      vmi: vmi(VmiPhase.Pending, { deleting: true }),
      standIn: STAND_IN,
    },
    action: SyncAction.None,
    writesStatus: false,
  },
  {
    name: "2: a Scheduling VMI waits for its launcher pod",
    input: { vmi: vmi(VmiPhase.Scheduling) },
    action: SyncAction.None,
    writesStatus: false,
  },
  // 3: gone, deleting or final, domain alive.
  {
    name: "3: a deleted VMI whose domain runs is shut down",
    input: { vmi: vmi(VmiPhase.Running), vmiExists: false, domain: running },
    action: SyncAction.Shutdown,
    writesStatus: true,
  },
  {
    name: "3: a VMI being deleted whose domain runs is shut down",
    input: { vmi: vmi(VmiPhase.Running, { deleting: true }), domain: running },
    action: SyncAction.Shutdown,
    writesStatus: true,
  },
  {
    name: "3: a Succeeded VMI whose domain still runs is shut down",
    input: { vmi: vmi(VmiPhase.Succeeded), domain: running },
    action: SyncAction.Shutdown,
    writesStatus: true,
  },
  {
    name: "3: a paused domain counts as alive: shut down, not deleted",
    input: { vmi: vmi(VmiPhase.Running, { deleting: true }), domain: pausedUser },
    action: SyncAction.Shutdown,
    writesStatus: true,
  },
  {
    name: "3 before 6: a deleted VMI whose post-copy failed is shut down (then killed)",
    input: { vmi: vmi(VmiPhase.Running), vmiExists: false, domain: postcopy },
    action: SyncAction.Shutdown,
    writesStatus: true,
  },
  // 4: domain down.
  {
    name: "4: a Failed VMI whose domain crashed gets its domain deleted",
    input: { vmi: vmi(VmiPhase.Failed), domain: crashed },
    action: SyncAction.Delete,
    writesStatus: true,
  },
  {
    name: "4: a deleted VMI whose domain is shut off gets its domain deleted",
    input: { vmi: vmi(VmiPhase.Succeeded), vmiExists: false, domain: shutoff },
    action: SyncAction.Delete,
    writesStatus: true,
  },
  // 5: nothing left.
  {
    name: "5: a deleted VMI without a domain is cleaned up, its launcher told to delete first",
    input: { vmi: vmi(VmiPhase.Succeeded), vmiExists: false, domain: undefined },
    action: SyncAction.Cleanup,
    writesStatus: true,
    deleteFirst: true,
  },
  {
    // Its launcher still answers, so it is told to delete before the cleanup.
    name: "5: a VMI deleted before it started has its launcher delete, then is cleaned up",
    input: { vmi: vmi(VmiPhase.Scheduled, { deleting: true }), domain: undefined },
    action: SyncAction.Cleanup,
    writesStatus: true,
    deleteFirst: true,
  },
  {
    name: "5: a domain whose launcher is unresponsive counts as gone: cleanup, not shutdown",
    input: {
      vmi: vmi(VmiPhase.Running, { deleting: true }),
      domain: running,
      launcher: "unresponsive",
    },
    action: SyncAction.Cleanup,
    writesStatus: true,
  },
  {
    name: "5: a Failed VMI without a domain is cleaned up",
    input: { vmi: vmi(VmiPhase.Failed), domain: undefined, launcher: "unresponsive" },
    action: SyncAction.Cleanup,
    writesStatus: true,
  },
  {
    name: "5: a Failed VMI whose crashed domain's launcher is gone is cleaned up, not called",
    input: { vmi: vmi(VmiPhase.Failed), domain: crashed, launcher: "notReady" },
    action: SyncAction.Cleanup,
    writesStatus: true,
  },
  {
    name: "5: a VMI deleted while its launcher still starts is cleaned up",
    input: { vmi: vmi(VmiPhase.Scheduled), vmiExists: false, launcher: "notReady" },
    action: SyncAction.Cleanup,
    writesStatus: true,
  },
  // 6: irrecoverable.
  {
    name: "6: a live VMI whose domain is paused by a failed post-copy is destroyed",
    input: { vmi: vmi(VmiPhase.Running), domain: postcopy },
    action: SyncAction.Destroy,
    writesStatus: true,
  },
  // 7: update.
  {
    // The update is what creates the domain.
    name: "7: a Scheduled VMI with a ready launcher but no domain is updated",
    input: { vmi: vmi(VmiPhase.Scheduled), domain: undefined, launcher: "responsive" },
    action: SyncAction.Update,
    writesStatus: true,
  },
  {
    name: "7: a Running VMI whose domain runs is updated (spec synced)",
    input: { vmi: vmi(VmiPhase.Running), domain: running },
    action: SyncAction.Update,
    writesStatus: true,
  },
  {
    name: "7: a domain paused by an IO error is resumed through the update",
    input: { vmi: vmi(VmiPhase.Running), domain: pausedIO },
    action: SyncAction.Update,
    writesStatus: true,
    resumeAfterIOError: true,
  },
  {
    name: "7: a domain paused by the user is left paused but synced",
    input: { vmi: vmi(VmiPhase.Running), domain: pausedUser },
    action: SyncAction.Update,
    writesStatus: true,
    resumeAfterIOError: undefined,
  },
  {
    name: "7: a Scheduled VMI whose launcher is still starting waits in update for it",
    input: { vmi: vmi(VmiPhase.Scheduled), domain: undefined, launcher: "notReady" },
    action: SyncAction.Update,
    writesStatus: true,
  },
  // 9: a domain down for a reason that decides no phase.
  {
    name: "9: a Scheduled VMI whose domain is defined but not started waits without a write",
    input: {
      vmi: vmi(VmiPhase.Scheduled),
      domain: domain(LifeCycle.Shutoff, StateChangeReason.Unknown),
    },
    action: SyncAction.None,
    writesStatus: false,
  },
  {
    name: "9: a Scheduled VMI whose domain failed to start gets its status written",
    input: {
      vmi: vmi(VmiPhase.Scheduled),
      domain: domain(LifeCycle.Shutoff, StateChangeReason.Failed),
    },
    action: SyncAction.None,
    writesStatus: true,
  },
  {
    // QEMU's death shows as Shutoff with the reason Failed.
    name: "9: a Running VMI whose QEMU died is not synced: its launcher is going",
    input: {
      vmi: vmi(VmiPhase.Running),
      domain: domain(LifeCycle.Shutoff, StateChangeReason.Failed),
    },
    action: SyncAction.None,
    writesStatus: true,
  },
  // 8: the status moves first.
  {
    name: "8: a Scheduled VMI whose domain runs becomes Running before anything is done",
    input: { vmi: vmi(VmiPhase.Scheduled), domain: running },
    action: SyncAction.None,
    writesStatus: true,
  },
  {
    name: "8: a Running VMI whose domain crashed becomes Failed before it is cleaned up",
    input: { vmi: vmi(VmiPhase.Running), domain: crashed },
    action: SyncAction.None,
    writesStatus: true,
  },
  {
    name: "8: a Running VMI whose launcher is unresponsive becomes Failed",
    input: { vmi: vmi(VmiPhase.Running), domain: undefined, launcher: "unresponsive" },
    action: SyncAction.None,
    writesStatus: true,
  },
];

function decide(row: Row) {
  return decideSync({
    vmiExists: true,
    domain: undefined,
    launcher: "responsive" as LauncherState,
    ...row.input,
  });
}

for (const row of ROWS) {
  Deno.test(`decideSync() row ${row.name}`, () => {
    const d = decide(row);
    assert.equal(d.action, row.action, `reason: ${d.reason}`);
    assert.equal(d.writesStatus, row.writesStatus);
    assert.equal(d.resumeAfterIOError, row.resumeAfterIOError);
    assert.equal(d.deleteFirst, row.deleteFirst);
    assert.ok(d.reason.length > 0, "every decision says why");
  });
}

Deno.test("decideSync() covers every action of the table", () => {
  const seen = new Set(ROWS.map((r) => decide(r).action));
  assert.deepEqual([...seen].sort(), Object.values(SyncAction).sort());
});

Deno.test("decideSync() is pure: the same input gives the same decision and is not changed", () => {
  for (const row of ROWS) {
    // The stand-in holds functions, which structuredClone cannot copy: it is compared by identity.
    const { standIn, ...data } = row.input;
    const before = structuredClone(data);
    assert.deepEqual(decide(row), decide(row));
    const { standIn: standInAfter, ...dataAfter } = row.input;
    assert.deepEqual(dataAfter, before);
    assert.equal(standInAfter, standIn);
  }
});

Deno.test("decideSync() names the domain and the phase change in its reason", () => {
  const d = decideSync({
    vmi: vmi(VmiPhase.Scheduled),
    vmiExists: true,
    domain: running,
    launcher: "responsive",
  });
  assert.match(d.reason, /domain Running/);
  assert.match(d.reason, /Scheduled becomes Running/);
});

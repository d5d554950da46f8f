/**
 * The Events of a VMI deleted before its guest ever ran, as KubeVirt's virt-handler records
 * them (`pkg/virt-handler/vm.go`): a launcher that answers is told to delete the domain
 * ("Deleted", "Signaled Deletion"), and the VMI's end is no crash. In pod-less mode the
 * handler also writes the Failed that virt-controller writes once the launcher pod is gone,
 * and virt-controller records no Event for it. A guest that ran and vanished is the
 * handler's "crashed", as before.
 */
import assert from "node:assert/strict";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import type { LauncherState } from "../../mod/domain/mod.ts";
import {
  type ControllerDeps,
  LauncherCallError,
  VmiController,
} from "../../mod/handler/testing.ts";
import { podlessStandIn } from "../../mod/handler/podless/testing.ts";
import { Expectations, WorkQueue } from "../../mod/kube/mod.ts";

const STAND_IN = podlessStandIn(() => new Map());

const UID = "0badf00d-0000-4000-8000-0000000000e6";
const KEY = "default/vm1";

interface Recorded {
  type: string;
  reason: string;
  message: string;
}

function deletedVmi(phase: string): VirtualMachineInstance {
  return {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachineInstance",
    metadata: {
      namespace: "default",
      name: "vm1",
      uid: UID,
      resourceVersion: "7",
      deletionTimestamp: "2026-12-01T00:00:00Z",
      finalizers: ["kubevirt.io/foregroundDeleteVirtualMachine"],
    },
    spec: { domain: { devices: {} } },
    status: { phase, nodeName: "node1" },
  } as VirtualMachineInstance;
}

/** One reconcile of the deleted VMI with a launcher in `launcher` state and no domain. */
async function reconcileDeleted(
  phase: string,
  launcher: LauncherState,
  deleteFails?: Error,
) {
  const events: Recorded[] = [];
  const calls: string[] = [];
  const written: string[] = [];
  const vmi = deletedVmi(phase);
  const client = {
    deleteVirtualMachine: () => {
      calls.push("deleteVirtualMachine");
      return deleteFails ? Promise.reject(deleteFails) : Promise.resolve();
    },
  };
  const provider = {
    notReadyRequeueMs: 1_000,
    socketOf: () => Promise.resolve(launcher === "notReady" ? undefined : "/nonexistent/sock"),
    stop: () => {
      calls.push("provider.stop");
      return Promise.resolve();
    },
    releasePodNetwork: () => Promise.resolve(),
    hotplugMounted: () => Promise.resolve(new Set<string>()),
  } as unknown as ControllerDeps["provider"];
  let served = launcher !== "notReady";
  const deps = {
    nodeName: "node1",
    provider,
    // Pod-less mode: the handler plays virt-controller's part.
    standIn: STAND_IN,
    informer: {
      addHandlers: () => {},
      hasSynced: () => true,
      get: (key: string) => (key === KEY ? vmi : undefined),
    },
    queue: new WorkQueue<string>(),
    expectations: new Expectations(),
    statusWriter: {
      update: (
        current: VirtualMachineInstance,
        mutate: (s: NonNullable<VirtualMachineInstance["status"]>) => unknown,
      ) => {
        const before = structuredClone(current.status ?? {});
        const after = (mutate(structuredClone(before)) ?? before) as typeof before;
        const changed = JSON.stringify(after) !== JSON.stringify(before);
        if (changed) written.push(after.phase ?? "");
        return Promise.resolve({ written: changed });
      },
      removeFinalizer: () => Promise.resolve(true),
    },
    recorder: {
      record: (_ref: unknown, type: string, reason: string, message: string) => {
        events.push({ type, reason, message });
        return Promise.resolve();
      },
    },
    ghosts: {
      get: () => undefined,
      findByKey: () => [],
      lastKnownUid: () => undefined,
      delete: () => Promise.resolve(),
    },
    launchers: {
      get: () => (served ? client : undefined),
      getOrCreate: () => client,
      state: () => Promise.resolve(launcher),
      isReady: () => Promise.resolve(launcher === "responsive"),
      remove: () => {
        served = false;
      },
      forgetMark: () => Promise.resolve(),
    },
    networks: {
      addresses: () => Promise.resolve(new Map()),
      teardown: () => Promise.resolve(),
    },
  } as unknown as ControllerDeps;
  const controller = new VmiController(deps);
  await controller.reconcile(KEY);
  deps.queue.shutDown();
  return { events, calls, written };
}

const CRASHED = "The VirtualMachineInstance crashed.";

Deno.test("a VMI deleted before it started gets virt-handler's deletion Event and no crash", async () => {
  // Its launcher still answers, so it is told to delete before it is stopped.
  const { events, calls, written } = await reconcileDeleted("Scheduled", "responsive");
  assert.deepEqual(events, [{ type: "Normal", reason: "Deleted", message: "Signaled Deletion" }]);
  assert.deepEqual(calls, ["deleteVirtualMachine", "provider.stop"]);
  // Pod-less: virt-controller's Failed once the launcher is gone, in the same sync.
  assert.deepEqual(written, ["Failed"]);
});

Deno.test("a VMI deleted before its launcher ever answered ends Failed without a crash Event", async () => {
  const { events, calls, written } = await reconcileDeleted("Scheduled", "notReady");
  assert.deepEqual(events.filter((e) => e.message === CRASHED), [], JSON.stringify(events));
  assert.deepEqual(events, []);
  assert.deepEqual(calls, ["provider.stop"]);
  assert.deepEqual(written, ["Failed"]);
});

Deno.test("a Running VMI deleted after its guest vanished unseen is still the handler's crash", async () => {
  const { events, written } = await reconcileDeleted("Running", "notReady");
  assert.deepEqual(written, ["Failed"]);
  assert.deepEqual(events, [{ type: "Warning", reason: "Stopped", message: CRASHED }]);
});

Deno.test("a VMI deleted after its launcher went away unseen is cleaned up without an error", async () => {
  // Deleting through a disconnected launcher fails, and that failure is expected here.
  const gone = new LauncherCallError("DeleteVirtualMachine", "connect ECONNREFUSED", {
    unreachable: true,
  });
  const { calls, written } = await reconcileDeleted("Scheduled", "responsive", gone);
  assert.deepEqual(calls, ["deleteVirtualMachine", "provider.stop"]);
  assert.deepEqual(written, ["Failed"]);
  // One whose connection ended during the delete (it exited meanwhile) is gone as well.
  const ended = new LauncherCallError("DeleteVirtualMachine", "socket has been ended", {
    disconnected: true,
  });
  const after = await reconcileDeleted("Scheduled", "responsive", ended);
  assert.deepEqual(after.calls, ["deleteVirtualMachine", "provider.stop"]);
  // A launcher that answered and refused is the sync's error (retried with backoff).
  await assert.rejects(
    reconcileDeleted(
      "Scheduled",
      "responsive",
      new LauncherCallError("DeleteVirtualMachine", "no"),
    ),
    /command DeleteVirtualMachine failed: no/,
  );
});

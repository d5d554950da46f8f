/**
 * VmiController.reconcile() with test doubles for its collaborators: what it returns to the worker
 * loop and what it leaves behind. The real-process behaviour is in the integration tier.
 */
import assert from "node:assert/strict";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { LifeCycle, newDomain, StateChangeReason } from "../../mod/domain/mod.ts";
import { type ControllerDeps, type GhostRecord, VmiController } from "../../mod/handler/testing.ts";
import { podlessStandIn } from "../../mod/handler/podless/testing.ts";
import { Expectations, WorkQueue } from "../../mod/kube/mod.ts";

const STAND_IN = podlessStandIn(() => new Map());

const UID = "0badf00d-0000-4000-8000-000000000001";
const KEY = "default/vm1";

interface Doubles {
  controller: VmiController;
  expectations: Expectations;
  queue: WorkQueue<string>;
  handlers: {
    onAdd?(v: VirtualMachineInstance): void;
    onDelete?(v: VirtualMachineInstance): void;
  };
  calls: string[];
  cache: Map<string, VirtualMachineInstance>;
  /** The statuses written, when the double writes (`writes`). */
  statuses: NonNullable<VirtualMachineInstance["status"]>[];
  /** Gives the provider KubeVirt mode's pod check. */
  setLauncherPodGone(check: (v: VirtualMachineInstance) => Promise<boolean>): void;
}

function vmi(phase: string): VirtualMachineInstance {
  return {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachineInstance",
    metadata: { namespace: "default", name: "vm1", uid: UID, resourceVersion: "1" },
    spec: { domain: { devices: {} } },
    status: { phase },
  } as VirtualMachineInstance;
}

function doubles(
  standsInForController = true,
  writes = false,
  more: Partial<ControllerDeps> = {},
): Doubles {
  const calls: string[] = [];
  const statuses: Doubles["statuses"] = [];
  const cache = new Map<string, VirtualMachineInstance>();
  const handlers: Doubles["handlers"] = {};
  let ghost: GhostRecord | undefined = {
    name: "vm1",
    namespace: "default",
    uid: UID,
    socketFile: "/nonexistent/launcher-sock",
  };
  // Only the parts of a provider the controller uses.
  const provider: ControllerDeps["provider"] = {
    notReadyRequeueMs: 1_000,
    socketOf: () => Promise.resolve(undefined),
    start: () => Promise.resolve({ waiting: "no slot in this test" }),
    stop: () => {
      calls.push("provider.stop");
      return Promise.resolve();
    },
    prepareDisks: () => Promise.resolve("ready"),
    forLauncher: (vmi: VirtualMachineInstance) => vmi,
    hotplug: () => Promise.resolve(),
    hotplugMounted: () => Promise.resolve(new Set<string>()),
    launcherRoot: () => Promise.resolve(undefined),
    unplug: () => Promise.resolve(),
    podNetwork: () => Promise.resolve(undefined),
    adoptedPodNetwork: () => Promise.resolve(undefined),
    releasePodNetwork: () => {
      calls.push("provider.releasePodNetwork");
      return Promise.resolve();
    },
  };
  const expectations = new Expectations();
  const queue = new WorkQueue<string>();
  const deps = {
    nodeName: "node1",
    provider,
    standIn: standsInForController ? STAND_IN : undefined,
    informer: {
      addHandlers: (h: Doubles["handlers"]) => Object.assign(handlers, h),
      hasSynced: () => true,
      waitForSync: () => Promise.resolve(),
      get: (key: string) => cache.get(key),
      list: () => [...cache.values()],
    },
    queue,
    expectations,
    statusWriter: {
      update: (
        current: VirtualMachineInstance,
        mutate: (s: NonNullable<VirtualMachineInstance["status"]>) => unknown,
      ) => {
        calls.push("status.update");
        const before = structuredClone(current.status ?? {});
        const after = (mutate(structuredClone(before)) ?? before) as typeof before;
        const changed = JSON.stringify(after) !== JSON.stringify(before);
        if (writes && changed) statuses.push(after);
        return Promise.resolve({ written: writes && changed });
      },
      removeFinalizer: (current: VirtualMachineInstance, finalizer: string) => {
        calls.push(`removeFinalizer ${finalizer}`);
        return Promise.resolve(current.metadata.finalizers?.includes(finalizer) ?? false);
      },
    },
    recorder: { record: () => Promise.resolve() },
    ghosts: {
      get: (uid: string) => (ghost?.uid === uid ? ghost : undefined),
      findByKey: (key: string) => (ghost && key === KEY ? [ghost] : []),
      lastKnownUid: (key: string) => (key === KEY ? ghost?.uid : undefined),
      delete: () => {
        calls.push("ghosts.delete");
        ghost = undefined;
        return Promise.resolve();
      },
    },
    launchers: {
      get: () => undefined,
      getOrCreate: () => ({}),
      state: () => Promise.resolve("notReady"),
      isReady: () => Promise.resolve(false),
      remove: () => calls.push("launchers.remove"),
      forgetMark: () => Promise.resolve(),
    },
    stopMigrationProxies: () => {
      calls.push("proxies.stop");
      return Promise.resolve();
    },
    networks: {
      addresses: () => Promise.resolve(new Map()),
      teardown: () => {
        calls.push("networks.teardown");
        return Promise.resolve();
      },
    },
    ...more,
  } as unknown as ControllerDeps;
  return {
    controller: new VmiController(deps),
    setLauncherPodGone: (check) => {
      provider.launcherPodGone = check;
    },
    expectations,
    queue,
    handlers,
    calls,
    cache,
    statuses,
  };
}

Deno.test("reconcile() of a deleted VMI cleans up and prunes its domain and expectations", async () => {
  const s = doubles();
  const v = vmi("Failed");
  s.cache.set(KEY, v);
  s.handlers.onAdd!(v);
  s.expectations.expectWrites(KEY);
  s.controller.domainEvent(
    "ADDED",
    newDomain({ namespace: "default", name: "vm1", uid: UID }, {
      status: LifeCycle.Crashed,
      reason: StateChangeReason.Crashed,
    }),
  );
  s.cache.delete(KEY);
  s.handlers.onDelete!(v);
  assert.equal(s.expectations.get(KEY), undefined, "a deleted VMI's expectations are forgotten");

  const result = await s.controller.reconcile(KEY);
  assert.deepEqual(result, { kind: "done" });
  assert.deepEqual(s.calls, [
    "proxies.stop",
    "launchers.remove",
    "provider.stop",
    "provider.releasePodNetwork",
    "networks.teardown",
    "ghosts.delete",
    "launchers.remove",
  ]);
  assert.equal(s.controller.domains.size, 0, "the domain store forgets the VMI");
  assert.equal(s.expectations.get(KEY), undefined);
  // A second reconcile finds nothing left and does nothing (level-driven, idempotent).
  s.calls.length = 0;
  assert.deepEqual(await s.controller.reconcile(KEY), { kind: "done" });
  assert.deepEqual(s.calls, []);
  s.queue.shutDown();
});

Deno.test("reconcile() asks the worker loop to look again while the launcher cannot start yet", async () => {
  const s = doubles();
  const v = vmi("Scheduled");
  s.cache.set(KEY, v);
  // The test double's launcher is never ready: the status write asks for a requeue.
  const result = await s.controller.reconcile(KEY);
  assert.equal(result.kind, "requeueAfter");
  assert.equal(result.kind === "requeueAfter" && result.ms, 1_000);
  assert.deepEqual(s.calls, ["status.update"]);
  s.queue.shutDown();
});

for (const podless of [true, false]) {
  Deno.test(
    `reconcile() of a final VMI whose domain is gone ${
      podless
        ? "removes virt-api's finalizer in pod-less mode"
        : "leaves the finalizer to virt-controller"
    }`,
    async () => {
      const s = doubles(podless);
      const v = vmi("Succeeded");
      v.metadata.finalizers = ["kubevirt.io/foregroundDeleteVirtualMachine"];
      v.metadata.deletionTimestamp = "2026-11-30T00:00:00Z";
      s.cache.set(KEY, v);
      await s.controller.reconcile(KEY);
      const removed = s.calls.filter((c) => c.startsWith("removeFinalizer"));
      assert.deepEqual(
        removed,
        podless ? ["removeFinalizer kubevirt.io/foregroundDeleteVirtualMachine"] : [],
      );
      s.queue.shutDown();
    },
  );
}

Deno.test("reconcile() keeps the finalizer while the VMI is not final", async () => {
  const s = doubles(true);
  const v = vmi("Running");
  v.metadata.finalizers = ["kubevirt.io/foregroundDeleteVirtualMachine"];
  s.cache.set(KEY, v);
  await s.controller.reconcile(KEY);
  assert.deepEqual(s.calls.filter((c) => c.startsWith("removeFinalizer")), []);
  s.queue.shutDown();
});

Deno.test("reconcile() syncs a VMI again once it is back on this node by a later migration", async () => {
  const s = doubles(false);
  const away = vmi("Running");
  away.status = {
    phase: "Running",
    nodeName: "node1",
    migrationState: { sourceNode: "node1", targetNode: "node2" },
  } as typeof away.status;
  s.cache.set(KEY, away);
  s.controller.domainEvent(
    "MODIFIED",
    newDomain({ namespace: "default", name: "vm1", uid: UID }, {
      status: LifeCycle.Shutoff,
      reason: StateChangeReason.Migrated,
    }),
  );
  assert.deepEqual(await s.controller.reconcile(KEY), { kind: "done" });
  assert.ok(s.calls.includes("networks.teardown"), "the source cleans up after the migration");
  // Until the VMI names its new node, this node leaves it alone: no status write.
  s.calls.length = 0;
  assert.deepEqual(await s.controller.reconcile(KEY), { kind: "done" });
  assert.equal(s.calls.join(", "), "");

  // Migrated back (the VMI never left this node's cache in between): this node owns it again.
  const back = structuredClone(away);
  back.status!.migrationState = { sourceNode: "node2", targetNode: "node1", completed: true };
  back.metadata.resourceVersion = "2";
  s.cache.set(KEY, back);
  s.controller.domainEvent(
    "MODIFIED",
    newDomain({ namespace: "default", name: "vm1", uid: UID }, {
      status: LifeCycle.Running,
      reason: StateChangeReason.Unknown,
    }),
  );
  await s.controller.reconcile(KEY);
  assert.ok(s.calls.includes("status.update"), `the VMI is synced again: ${s.calls.join(", ")}`);
  s.queue.shutDown();
});

Deno.test("domainEvent() counts a domain with a deletion timestamp as gone (a launcher's final event)", () => {
  const s = doubles();
  const running = newDomain({ namespace: "default", name: "vm1", uid: UID }, {
    status: LifeCycle.Running,
    reason: StateChangeReason.Unknown,
  });
  s.controller.domainEvent("ADDED", running);
  assert.equal(s.controller.domains.size, 1);
  // KubeVirt's launcher ends with a MODIFIED event: NoState/NonExistent, deletionTimestamp set.
  const final = newDomain({ namespace: "default", name: "vm1", uid: UID }, {
    status: LifeCycle.NoState,
    reason: StateChangeReason.NonExistent,
  });
  final.metadata.deletionTimestamp = "2026-11-30T23:47:20Z";
  s.controller.domainEvent("MODIFIED", final);
  assert.equal(s.controller.domains.size, 0, "no domain is left for the VMI");
  assert.equal(s.queue.len(), 1, "its key is queued");
});

Deno.test("hotplugUnsettled() is true while a hotplugged volume still waits for the launcher", async () => {
  // That is: in the spec but not yet Ready, or out of the spec while it still has a target.
  const { hotplugUnsettled } = await import("../../mod/handler/testing.ts");
  const vmi = (volumes: string[], statuses: Record<string, unknown>[]) =>
    ({
      metadata: { name: "v", namespace: "d", uid: "u" },
      spec: { domain: { devices: {} }, volumes: volumes.map((name) => ({ name })) },
      status: { volumeStatus: statuses },
    }) as unknown as Parameters<typeof hotplugUnsettled>[0];
  const hp = (name: string, phase: string, target = "") => ({
    name,
    phase,
    target,
    hotplugVolume: {},
  });
  assert.equal(
    hotplugUnsettled(
      vmi(["root", "hp"], [{ name: "root", target: "vda" }, hp("hp", "Ready", "sda")]),
    ),
    false,
  );
  assert.equal(
    hotplugUnsettled(vmi(["hp"], [hp("hp", "MountedToPod")])),
    true,
    "added, not attached",
  );
  assert.equal(
    hotplugUnsettled(vmi([], [hp("hp", "Ready", "sda")])),
    true,
    "removed, still attached",
  );
  assert.equal(
    hotplugUnsettled(vmi([], [hp("hp", "UnMountedFromPod")])),
    false,
    "removed and detached",
  );
});

for (const podless of [true, false]) {
  Deno.test(
    `reconcile() of a deleted Running VMI whose guest died unseen ${
      podless ? "fails it, finalizer removed (pod-less)" : "leaves both to virt-controller"
    }`,
    async () => {
      // No domain or launcher is left. Pod-less, one sync makes the VMI Failed and removes its
      // finalizer; in KubeVirt mode both are virt-controller's job.
      const s = doubles(podless, true);
      const v = vmi("Running");
      v.metadata.finalizers = ["kubevirt.io/foregroundDeleteVirtualMachine"];
      v.metadata.deletionTimestamp = "2026-12-03T00:00:00Z";
      s.cache.set(KEY, v);
      await s.controller.reconcile(KEY);
      assert.deepEqual(
        s.statuses.map((st) => st.phase).filter((phase) => phase === "Failed"),
        podless ? ["Failed"] : [],
        "the phase written",
      );
      assert.deepEqual(
        s.calls.filter((c) => c.startsWith("removeFinalizer")),
        podless ? ["removeFinalizer kubevirt.io/foregroundDeleteVirtualMachine"] : [],
      );
      s.queue.shutDown();
    },
  );
}

Deno.test("domainEvent() drops a domain without a VMI UID: it is foreign and never replaces the VMI's domain", () => {
  const s = doubles();
  const own = newDomain({ namespace: "default", name: "vm1", uid: UID }, {
    status: LifeCycle.Running,
    reason: StateChangeReason.Unknown,
  });
  s.controller.domainEvent("ADDED", own);
  const forged = newDomain({ namespace: "default", name: "vm1" }, {
    status: LifeCycle.Crashed,
    reason: StateChangeReason.Crashed,
  });
  s.controller.domainEvent("MODIFIED", forged);
  assert.equal(s.controller.domains.get(KEY)?.status.status, LifeCycle.Running);
  s.controller.domainEvent(
    "ADDED",
    newDomain({ namespace: "other", name: "ghost" }, forged.status),
  );
  assert.equal(s.controller.domains.has("other/ghost"), false);
  assert.equal(s.controller.foreignDomains, 2);
});

Deno.test("reconcile() forgets domains under names no VMI, deleted VMI or ghost record has", async () => {
  const s = doubles();
  for (let i = 0; i < 50; i++) {
    s.controller.domainEvent(
      "ADDED",
      // Half of them carry a UID; the others are foreign and must not be kept either.
      newDomain({ namespace: "flood", name: `vm-${i}`, uid: i % 2 ? crypto.randomUUID() : "" }, {
        status: LifeCycle.Running,
        reason: StateChangeReason.Unknown,
      }),
    );
  }
  for (let i = 0; i < 50; i++) await s.controller.reconcile(`flood/vm-${i}`);
  assert.equal(s.controller.domains.size, 0);
});

Deno.test("reconcile() fails a Scheduled VMI whose launcher pod ended before it made its socket", async () => {
  // virt-handler does the same.
  for (const podGone of [true, false]) {
    const s = doubles(false, true);
    // KubeVirt mode: the provider looks for the launcher pod's folder on the host.
    const v = vmi("Scheduled");
    v.status!.activePods = { "5ca1ab1e-0000-4000-8000-000000000001": "node1" };
    s.cache.set(KEY, v);
    s.setLauncherPodGone(() => Promise.resolve(podGone));
    await s.controller.reconcile(KEY);
    const phases = s.statuses.map((st) => st.phase);
    if (podGone) assert.ok(phases.includes("Failed"), `phases written: ${phases.join(",")}`);
    else assert.ok(!phases.includes("Failed"), "a pod still starting is waited for");
    s.queue.shutDown();
  }
});

Deno.test("run() starts syncing once the labeller has read the host CPU model, as virt-handler", async () => {
  // virt-handler reads the host's CPU model before its VMI controller exists, so a host-model
  // VMI's first Running status already says whether it can migrate.
  const read: { model?: string } = {};
  const listeners = new Set<() => void>();
  const hostCpu = {
    get hostCpuModel() {
      return read.model;
    },
    onHostCpuModel(listener: () => void) {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
  };
  let started = 0;
  const s = doubles(true, false, { hostCpu, onStarted: () => started++ });
  const stop = new AbortController();
  const running = s.controller.run(stop.signal);
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(started, 0, "no worker before the host CPU model is known");
  read.model = "EPYC";
  for (const l of [...listeners]) l();
  await new Promise((r) => setTimeout(r, 10));
  assert.equal(started, 1, "the workers start once it is");
  assert.equal(listeners.size, 1, "the wait's listener is taken off; the controller's stays");
  stop.abort();
  await running;

  // A labeller that never reads it keeps no VM from starting: the wait is bounded.
  let late = 0;
  const never = doubles(true, false, {
    hostCpu: { hostCpuModel: undefined, onHostCpuModel: () => () => {} },
    hostCpuWaitMs: 30,
    onStarted: () => late++,
  });
  const stop2 = new AbortController();
  const running2 = never.controller.run(stop2.signal);
  await new Promise((r) => setTimeout(r, 100));
  assert.equal(late, 1);
  stop2.abort();
  await running2;
});

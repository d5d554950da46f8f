import assert from "node:assert/strict";
import type { VirtualMachine, VirtualMachineInstance, VmiCondition } from "../../mod/api/mod.ts";
import {
  decideVm,
  firmwareUuid,
  liveUpdate,
  liveUpdateMemoryRefusal,
  memoryDumpActions,
  nextMemoryDumpRequest,
  ownsVm,
  printableStatus,
  runStrategyOf,
  vmiFromVm,
  vmStatus,
} from "../../mod/handler/testing.ts";

function vm(spec: Partial<VirtualMachine["spec"]> = {}, status?: VirtualMachine["status"]) {
  return {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachine",
    metadata: { name: "testvm", namespace: "default", uid: "vm-uid", generation: 3 },
    spec: {
      template: {
        metadata: { labels: { app: "a" }, annotations: { note: "n" } },
        spec: {
          nodeSelector: { "kubernetes.io/hostname": "node-a" },
          domain: { devices: { disks: [{ name: "root" }] } },
          volumes: [{ name: "root", containerDisk: { image: "x" } }, {
            name: "cloudinit",
            cloudInitNoCloud: { userData: "#cloud-config" },
          }],
        },
      },
      ...spec,
    },
    status,
  } as VirtualMachine;
}

function vmi(phase: string, extra: Partial<VirtualMachineInstance["metadata"]> = {}) {
  return {
    metadata: { name: "testvm", namespace: "default", uid: "vmi-1", ...extra },
    spec: { domain: { devices: {} } },
    status: { phase },
  } as VirtualMachineInstance;
}

Deno.test("the run strategy: runStrategy, the deprecated running, Halted without either, both refused", () => {
  assert.equal(runStrategyOf(vm({ runStrategy: "Manual" })), "Manual");
  assert.equal(runStrategyOf(vm({ running: true })), "Always");
  assert.equal(runStrategyOf(vm({ running: false })), "Halted");
  assert.equal(runStrategyOf(vm()), "Halted");
  const both = runStrategyOf(vm({ running: true, runStrategy: "Always" }));
  assert.ok(both instanceof Error);
  assert.match(both.message, /mutually exclusive/);
});

Deno.test("a node owns the VMs whose template's nodeSelector names it, and only those", () => {
  assert.ok(ownsVm(vm(), "node-a"));
  assert.ok(!ownsVm(vm(), "node-b"));
  const unplaced = vm();
  delete unplaced.spec.template.spec.nodeSelector;
  assert.ok(!ownsVm(unplaced, "node-a"));
});

Deno.test("decideVm() follows virt-controller's run strategies and start and stop requests", () => {
  const stopReq = { stateChangeRequests: [{ action: "Stop" as const, uid: "vmi-1" }] };
  const startReq = { stateChangeRequests: [{ action: "Start" as const }] };
  const cases: [string, VirtualMachine, VirtualMachineInstance | undefined, string][] = [
    ["Always, no VMI", vm({ runStrategy: "Always" }), undefined, "start"],
    ["Always, running", vm({ runStrategy: "Always" }), vmi("Running"), "none"],
    ["Always, VMI ended", vm({ runStrategy: "Always" }), vmi("Succeeded"), "stop"],
    ["Always, restart's stop", vm({ runStrategy: "Always" }, stopReq), vmi("Running"), "stop"],
    [
      "Always, a stop for another VMI",
      vm({ runStrategy: "Always" }, { stateChangeRequests: [{ action: "Stop", uid: "old" }] }),
      vmi("Running"),
      "none",
    ],
    [
      "Always, VMI being deleted",
      vm({ runStrategy: "Always" }, stopReq),
      vmi("Running", { deletionTimestamp: "t" }),
      "none",
    ],
    ["Halted, running", vm({ runStrategy: "Halted" }), vmi("Running"), "stop"],
    ["Halted, none", vm({ runStrategy: "Halted" }, startReq), undefined, "none"],
    ["Manual, none", vm({ runStrategy: "Manual" }), undefined, "none"],
    ["Manual, start asked", vm({ runStrategy: "Manual" }, startReq), undefined, "start"],
    ["Manual, VMI ended", vm({ runStrategy: "Manual" }), vmi("Failed"), "none"],
    ["Manual, stop asked", vm({ runStrategy: "Manual" }, stopReq), vmi("Running"), "stop"],
    ["Once, none", vm({ runStrategy: "Once" }), undefined, "start"],
    ["Once, ended", vm({ runStrategy: "Once" }), vmi("Succeeded"), "none"],
    ["RerunOnFailure, failed", vm({ runStrategy: "RerunOnFailure" }), vmi("Failed"), "stop"],
    [
      "RerunOnFailure, first start",
      vm({ runStrategy: "RerunOnFailure" }),
      undefined,
      "start",
    ],
    [
      "RerunOnFailure, stopped after success",
      vm({ runStrategy: "RerunOnFailure" }, { runStrategy: "RerunOnFailure" }),
      undefined,
      "none",
    ],
  ];
  for (const [what, machine, instance, want] of cases) {
    const strategy = runStrategyOf(machine);
    assert.ok(!(strategy instanceof Error));
    assert.equal(decideVm(machine, instance, strategy), want, what);
  }
});

Deno.test("the VMI made from a VM: name, labels, owner, finalizer, generation, firmware UUID, default disks", async () => {
  const made = await vmiFromVm(vm({ runStrategy: "Always" }));
  assert.equal(made.metadata.name, "testvm");
  assert.deepEqual(made.metadata.labels, { app: "a" });
  assert.equal(made.metadata.annotations?.note, "n");
  assert.equal(made.metadata.annotations?.["kubevirt.io/vm-generation"], "3");
  assert.deepEqual(made.metadata.finalizers, ["kubevirt.io/virtualMachineControllerFinalize"]);
  assert.deepEqual(made.metadata.ownerReferences, [{
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachine",
    name: "testvm",
    uid: "vm-uid",
    controller: true,
    blockOwnerDeletion: true,
  }]);
  // KubeVirt's legacy UUID of "testvm" (google/uuid's NewSHA1 in KubeVirt's namespace).
  assert.equal(made.spec.domain.firmware?.uuid, "5a9fc181-957e-5c32-9e5a-2de5e9673531");
  assert.equal(await firmwareUuid("vm-cirros"), "0d2a2043-41c0-59c3-9b17-025022203668");
  assert.deepEqual(made.spec.domain.devices?.disks, [{ name: "root" }, { name: "cloudinit" }]);
  assert.equal(made.spec.startStrategy, undefined);
  const paused = await vmiFromVm(
    vm({}, { stateChangeRequests: [{ action: "Start", data: { paused: "true" } }] }),
  );
  assert.equal(paused.spec.startStrategy, "Paused");
});

Deno.test("printableStatus(): Terminating, Stopping, Running, Paused, Starting, Stopped, first match wins", () => {
  const none = { startExpected: false, stopExpected: false };
  assert.equal(printableStatus(vm(), undefined, none), "Stopped");
  assert.equal(printableStatus(vm(), undefined, { ...none, startExpected: true }), "Starting");
  assert.equal(printableStatus(vm(), vmi("Scheduled"), none), "Starting");
  assert.equal(printableStatus(vm(), vmi("Running"), none), "Running");
  const paused = vmi("Running");
  paused.status!.conditions = [{ type: "Paused", status: "True" }];
  assert.equal(printableStatus(vm(), paused, none), "Paused");
  assert.equal(printableStatus(vm(), vmi("Running"), { ...none, stopExpected: true }), "Stopping");
  assert.equal(printableStatus(vm(), vmi("Running", { deletionTimestamp: "t" }), none), "Stopping");
  assert.equal(printableStatus(vm(), vmi("Succeeded"), none), "Stopped");
  const deleting = vm();
  deleting.metadata.deletionTimestamp = "t";
  assert.equal(printableStatus(deleting, vmi("Running"), none), "Terminating");
});

Deno.test("vmStatus(): Ready from the VMI, its other conditions mirrored, a done request dropped, Failure", () => {
  const running = vmi("Running", { annotations: { "kubevirt.io/vm-generation": "2" } });
  running.status!.conditions = [
    { type: "Ready", status: "True", lastTransitionTime: "t1" },
    { type: "AgentConnected", status: "True" },
  ];
  const before = vm({ runStrategy: "Always" }, {
    stateChangeRequests: [{ action: "Start" }],
    conditions: [{ type: "Stale", status: "True" }],
  });
  const s = vmStatus(before, running, "Always", {
    startExpected: false,
    stopExpected: false,
    now: "t9",
  });
  assert.equal(s.created, true);
  assert.equal(s.ready, true);
  assert.equal(s.printableStatus, "Running");
  assert.equal(s.runStrategy, "Always");
  assert.equal(s.observedGeneration, 2);
  assert.equal(s.desiredGeneration, 3);
  assert.equal(s.stateChangeRequests, undefined, "the start request is done");
  assert.deepEqual(s.conditions?.map((c) => [c.type, c.status]), [
    ["Ready", "True"],
    ["AgentConnected", "True"],
  ]);

  const gone = vmStatus(vm({ runStrategy: "Always" }), undefined, "Always", {
    startExpected: true,
    stopExpected: false,
    syncError: { reason: "FailedCreate", message: "Failure while starting VMI: no" },
    now: "t9",
  });
  assert.equal(gone.created, undefined);
  assert.equal(gone.runStrategy, undefined, "set once a VMI was seen, as virt-controller does");
  assert.equal(gone.printableStatus, "Starting");
  assert.deepEqual(gone.conditions?.map((c) => [c.type, c.status, c.reason]), [
    ["Ready", "False", "VMINotExists"],
    ["Failure", "True", "FailedCreate"],
  ]);
  // The Ready condition keeps its times while it says the same.
  const again = vmStatus(vm({ runStrategy: "Always" }, gone), undefined, "Always", {
    startExpected: false,
    stopExpected: false,
    now: "t10",
  });
  assert.equal(again.conditions?.[0].lastTransitionTime, "t9");
  assert.deepEqual(again.conditions?.map((c) => c.type), ["Ready"], "the failure cleared");
  assert.equal(again.printableStatus, "Stopped");
  assert.equal(again.runStrategy, undefined);
});

/** `vm()` with a memory dump request in its status, and its template's volumes. */
function dumping(phase: string, extra: Record<string, unknown> = {}, inTemplate = false) {
  const v = vm({}, { memoryDumpRequest: { claimName: "dump", phase, ...extra } });
  if (inTemplate) {
    v.spec.template.spec.volumes!.push({
      name: "dump",
      memoryDump: { claimName: "dump", hotpluggable: true },
    });
  }
  return v;
}

const DUMP_VOLUME = { name: "dump", memoryDump: { claimName: "dump", hotpluggable: true } };

Deno.test("a memory dump request's actions: volume in while Associating, annotation and out after", () => {
  const running = vmi("Running");
  running.spec.volumes = [{ name: "root", containerDisk: { image: "x" } }];
  // Associating: the volume goes into the template and the running VMI, once.
  const first = memoryDumpActions(dumping("Associating"), running);
  assert.deepEqual(first.templateVolumes?.map((v) => v.name), ["root", "cloudinit", "dump"]);
  assert.deepEqual(first.vmiVolumes, [running.spec.volumes[0], DUMP_VOLUME]);
  assert.equal(first.annotation, undefined);
  const withVolume = { ...running, spec: { ...running.spec, volumes: first.vmiVolumes } };
  assert.deepEqual(memoryDumpActions(dumping("Associating", {}, true), withVolume), {});
  // ... but not into a VMI that is not running, or going.
  assert.deepEqual(memoryDumpActions(dumping("Associating"), vmi("Scheduled")), {});
  assert.deepEqual(memoryDumpActions(dumping("Associating"), undefined), {});
  const going = vmi("Running", { deletionTimestamp: "2026-12-07T00:00:00Z" });
  assert.deepEqual(memoryDumpActions(dumping("Associating"), going), {});
  // InProgress: the handler's; nothing here.
  assert.deepEqual(memoryDumpActions(dumping("InProgress", {}, true), withVolume), {});
  // Unmounting: the claim names the file, the volume leaves the VMI (not the template).
  const unmounting = memoryDumpActions(
    dumping("Unmounting", { fileName: "f.memory.dump" }, true),
    withVolume,
  );
  assert.deepEqual(unmounting, { annotation: "f.memory.dump", vmiVolumes: running.spec.volumes });
  // ... no file name, no annotation (KubeVirt's rule).
  assert.deepEqual(memoryDumpActions(dumping("Unmounting", {}, true), running), {});
  // Failed: the claim says so.
  assert.deepEqual(memoryDumpActions(dumping("Failed", {}, true), withVolume), {
    annotation: "Memory dump failed",
    vmiVolumes: running.spec.volumes,
  });
  // Dissociating: out of the VMI and the template.
  const removing = memoryDumpActions(dumping("Dissociating", {}, true), withVolume);
  assert.deepEqual(removing.vmiVolumes, running.spec.volumes);
  assert.deepEqual(removing.templateVolumes?.map((v) => v.name), ["root", "cloudinit"]);
  assert.deepEqual(memoryDumpActions(vm(), running), {}, "no request, nothing");
});

Deno.test("a memory dump request's phases move on as virt-controller's: the VMI's volume status", () => {
  const statusOf = (phase: string, dump: Record<string, string>) => {
    const v = vmi("Running");
    v.status!.volumeStatus = [{
      name: "dump",
      target: "",
      phase,
      message: "why",
      memoryDumpVolume: { claimName: "dump", ...dump },
    }];
    return v;
  };
  // Associating -> InProgress once the template has the volume.
  assert.equal(nextMemoryDumpRequest(dumping("Associating"), vmi("Running"))?.phase, "Associating");
  assert.equal(
    nextMemoryDumpRequest(dumping("Associating", {}, true), vmi("Running"))?.phase,
    "InProgress",
  );
  // InProgress: the start is copied; Completed -> Unmounting with the file and end.
  const started = nextMemoryDumpRequest(
    dumping("InProgress", {}, true),
    statusOf("MemoryDumpInProgress", { startTimestamp: "t1", targetFileName: "f" }),
  );
  assert.deepEqual(started, { claimName: "dump", phase: "InProgress", startTimestamp: "t1" });
  assert.deepEqual(
    nextMemoryDumpRequest(
      dumping("InProgress", {}, true),
      statusOf("MemoryDumpCompleted", {
        startTimestamp: "t1",
        endTimestamp: "t2",
        targetFileName: "f",
      }),
    ),
    {
      claimName: "dump",
      phase: "Unmounting",
      startTimestamp: "t1",
      endTimestamp: "t2",
      fileName: "f",
    },
  );
  const failed = nextMemoryDumpRequest(
    dumping("InProgress", {}, true),
    statusOf("MemoryDumpFailed", { endTimestamp: "t2" }),
  );
  assert.deepEqual([failed?.phase, failed?.message, failed?.endTimestamp], ["Failed", "why", "t2"]);
  // Unmounting -> Completed once the VMI's status has the volume no more.
  const mounted = statusOf("MemoryDumpCompleted", {});
  assert.equal(nextMemoryDumpRequest(dumping("Unmounting"), mounted)?.phase, "Unmounting");
  assert.equal(nextMemoryDumpRequest(dumping("Unmounting"), vmi("Running"))?.phase, "Completed");
  assert.equal(nextMemoryDumpRequest(dumping("Completed"), vmi("Running"))?.phase, "Completed");
  // remove: Dissociating, gone once neither the template nor the VMI has the volume.
  const removing = dumping("Completed", { remove: true }, true);
  assert.equal(nextMemoryDumpRequest(removing, vmi("Running"))?.phase, "Completed");
  assert.equal(
    nextMemoryDumpRequest(dumping("Dissociating", {}, true), vmi("Running"))?.phase,
    "Dissociating",
  );
  assert.equal(nextMemoryDumpRequest(dumping("Dissociating"), mounted)?.phase, "Dissociating");
  assert.equal(nextMemoryDumpRequest(dumping("Dissociating"), vmi("Running")), undefined);
  // The status carries it; a VMI made after the dump leaves the volume out.
  const status = vmStatus(dumping("Unmounting"), vmi("Running"), "Always", {
    startExpected: false,
    stopExpected: false,
    now: "t",
  });
  assert.equal(status.memoryDumpRequest?.phase, "Completed");
});

Deno.test("a VMI made from a VM whose dump is over has no memory dump volume; one in progress keeps it", async () => {
  const over = await vmiFromVm(dumping("Completed", {}, true));
  assert.ok(!over.spec.volumes?.some((v) => v.name === "dump"));
  assert.ok(!over.spec.domain.devices.disks?.some((d) => d.name === "dump"));
  const during = await vmiFromVm(dumping("InProgress", {}, true));
  assert.ok(during.spec.volumes?.some((v) => v.name === "dump"));
});

/** A running VMI of one socket of at most 2 and 1Gi of at most 2Gi, migratable. */
function liveVmi(conditions: { type: string; status: string }[] = []) {
  const v = vmi("Running");
  v.spec.domain.cpu = { sockets: 1, cores: 1, threads: 1, maxSockets: 2 };
  v.spec.domain.memory = { guest: "1Gi", maxGuest: "2Gi" };
  v.status!.memory = { guestAtBoot: "1Gi", guestCurrent: "1Gi", guestRequested: "1Gi" };
  v.status!.conditions = [
    { type: "LiveMigratable", status: "True" },
    ...conditions,
  ] as VmiCondition[];
  return v;
}

/** `vm()` whose template asks for `sockets` and `guest`. */
function liveVm(sockets: number, guest: string) {
  const v = vm();
  v.spec.template.spec.domain.cpu = { sockets, cores: 1, threads: 1, maxSockets: 2 };
  v.spec.template.spec.domain.memory = { guest, maxGuest: "2Gi" };
  v.spec.template.spec.architecture = "amd64"; // virt-api's default
  return v;
}

Deno.test("liveUpdate(): more sockets and memory patch the VMI, tested as read, as virt-controller", () => {
  assert.deepEqual(liveUpdate(liveVm(1, "1Gi"), liveVmi()), { patch: [] });
  assert.deepEqual(liveUpdate(liveVm(2, "1152Mi"), liveVmi()).patch, [
    { op: "test", path: "/spec/domain/cpu/sockets", value: 1 },
    { op: "replace", path: "/spec/domain/cpu/sockets", value: 2 },
    { op: "test", path: "/spec/domain/memory/guest", value: "1Gi" },
    { op: "replace", path: "/spec/domain/memory/guest", value: "1152Mi" },
  ]);
  assert.deepEqual(liveUpdate(liveVm(2, "1152Mi"), undefined), { patch: [] }, "no VMI");
});

Deno.test("liveUpdate(): fewer sockets, past the maxima, below boot or unmigratable need a restart", () => {
  const restart = (v: VirtualMachine, i = liveVmi()) => liveUpdate(v, i).restartRequired;
  const down = liveVmi();
  down.spec.domain.cpu!.sockets = 2;
  assert.equal(
    restart(liveVm(1, "1Gi"), down),
    "Reduction of CPU socket count requires a restart",
  );
  assert.equal(
    restart(liveVm(3, "1Gi")),
    "CPU sockets updated in template spec to a value higher than what's available",
  );
  // KubeVirt's validation comes first: past maxGuest is "not supported", not "not available".
  assert.equal(
    restart(liveVm(1, "3Gi")),
    "memory hotplug not supported, Guest memory is greater than the configured maxGuest memory",
  );
  const big = liveVmi();
  big.spec.domain.memory = { guest: "1536Mi", maxGuest: "2Gi" };
  big.status!.memory = { guestAtBoot: "1536Mi", guestCurrent: "1536Mi" };
  assert.equal(
    restart(liveVm(1, "1Gi"), big),
    "memory updated in template spec to a value lower than what the VM started with",
  );
  const pinned = liveVmi();
  pinned.status!.conditions = [{ type: "LiveMigratable", status: "False" }] as VmiCondition[];
  assert.match(restart(liveVm(1, "1152Mi"), pinned)!, /only available for migratable VMs/);
  const failed = liveVmi([{ type: "HotMemoryChange", status: "False" }]);
  assert.match(restart(liveVm(1, "1152Mi"), failed)!, /Memory-hotplug failed/);
});

Deno.test("liveUpdate(): a change waits while another hot-plug or a migration runs", () => {
  const busy = liveUpdate(liveVm(2, "1Gi"), liveVmi([{ type: "HotVCPUChange", status: "True" }]));
  assert.deepEqual(busy.error, {
    reason: "HotPlugCPUError",
    message:
      "Error encountered while handling CPU change request: another CPU hotplug is in progress",
  });
  const moving = liveVmi();
  moving.status!.migrationState = { startTimestamp: "t" };
  assert.match(liveUpdate(liveVm(1, "1152Mi"), moving).error!.message, /while VMI is migrating/);
  assert.equal(liveUpdate(liveVm(1, "1152Mi"), moving).error!.reason, "HotPlugMemoryError");
});

Deno.test("liveUpdateMemoryRefusal(): KubeVirt's rules for memory hot-plug, each in its words", () => {
  const spec = (memory: Record<string, unknown>, more: Record<string, unknown> = {}) =>
    ({ architecture: "amd64", domain: { devices: {}, memory, ...more } }) as never;
  assert.equal(liveUpdateMemoryRefusal(spec({ guest: "1Gi" }), "2Gi"), undefined);
  assert.equal(
    liveUpdateMemoryRefusal(spec({ guest: "512Mi" }), "2Gi"),
    "Memory hotplug is only available for VMs with at least 1Gi of guest memory",
  );
  assert.equal(
    liveUpdateMemoryRefusal(spec({ guest: "1025Mi" }), "2Gi"),
    "Guest memory must be 2Mi aligned",
  );
  assert.equal(
    liveUpdateMemoryRefusal(spec({ guest: "1Gi" }), "2049Mi"),
    "MaxGuest must be 2Mi aligned",
  );
  assert.equal(
    liveUpdateMemoryRefusal(spec({ guest: "3Gi" }), "2Gi"),
    "Guest memory is greater than the configured maxGuest memory",
  );
  assert.equal(
    liveUpdateMemoryRefusal(spec({ guest: "2Gi", hugepages: { pageSize: "1Gi" } }), "3Gi"),
    undefined,
  );
  assert.equal(
    liveUpdateMemoryRefusal(spec({ guest: "1026Mi", hugepages: { pageSize: "1Gi" } }), "3Gi"),
    "Guest memory must be 1Gi aligned",
  );
  assert.equal(
    liveUpdateMemoryRefusal(spec({ guest: "1Gi" }, { cpu: { realtime: {} } }), "2Gi"),
    "Memory hotplug is not compatible with realtime VMs",
  );
  assert.equal(
    liveUpdateMemoryRefusal(
      spec({ guest: "1Gi" }, { cpu: { numa: { guestMappingPassthrough: {} } } }),
      "2Gi",
    ),
    "Memory hotplug is not compatible with guest mapping passthrough",
  );
  assert.equal(
    liveUpdateMemoryRefusal(spec({ guest: "1Gi" }, { launchSecurity: {} }), "2Gi"),
    "Memory hotplug is not compatible with encrypted VMs",
  );
  assert.equal(
    liveUpdateMemoryRefusal({ domain: { devices: {}, memory: { guest: "1Gi" } } } as never, "2Gi"),
    "Memory hotplug is only available for x86_64 VMs",
  );
  assert.equal(
    liveUpdateMemoryRefusal(spec({}), "2Gi"),
    "Guest memory must be configured when memory hotplug is enabled",
  );
  // Through the VM controller: the VM's RestartRequired says it.
  const small = liveVm(1, "768Mi");
  small.spec.template.spec.domain.memory!.maxGuest = "1Gi";
  const running = liveVmi();
  running.spec.domain.memory = { guest: "512Mi", maxGuest: "1Gi" };
  running.status!.memory = { guestAtBoot: "512Mi", guestCurrent: "512Mi" };
  assert.equal(
    liveUpdate(small, running).restartRequired,
    "memory hotplug not supported, Memory hotplug is only available for VMs with at least 1Gi of guest memory",
  );
});

/**
 * What pod-less mode's VirtualMachine controller decides, as pure functions: the run
 * strategy in force, whether the VM's VMI should be started or stopped, the VMI made from
 * the template, and the VM's status. The rules are virt-controller's (KubeVirt v1.7.0's VM
 * controller), for the run strategies, start and stop requests and status fields it keeps;
 * {@linkcode PodlessVms} carries them out.
 *
 * @module
 */
import {
  Finalizers,
  type RunStrategy,
  type VirtualMachine,
  type VirtualMachineInstance,
  type VirtualMachineStatus,
  type VmCondition,
  VmiPhase,
} from "../../api/mod.ts";
import { memoryDumpOver, nextMemoryDumpRequest, withoutVolume } from "./memory_dump.ts";

/** The annotation on a VMI naming the VM generation it was made from (KubeVirt's). */
export const VM_GENERATION_ANNOTATION = "kubevirt.io/vm-generation";
/** The namespace of KubeVirt's firmware UUIDs (a UUID v5 of the VM's name in it). */
const FIRMWARE_UUID_NAMESPACE = "6a1a24a1-4061-4607-8bf4-a3963d0c5895";

/** The run strategy of `vm`, or why it has none (both `running` and `runStrategy` set). */
export function runStrategyOf(vm: VirtualMachine): RunStrategy | Error {
  const { running, runStrategy } = vm.spec;
  if (running !== undefined && running !== null && runStrategy !== undefined) {
    return new Error("running and runstrategy are mutually exclusive");
  }
  if (running !== undefined && running !== null) return running ? "Always" : "Halted";
  return runStrategy ?? "Halted";
}

/** Whether a VMI's phase is final. */
export function isFinal(vmi: VirtualMachineInstance): boolean {
  const phase = vmi.status?.phase;
  return phase === VmiPhase.Succeeded || phase === VmiPhase.Failed;
}

/** The first state change request, if it asks for a start. */
function hasStartRequest(vm: VirtualMachine): boolean {
  return vm.status?.stateChangeRequests?.[0]?.action === "Start";
}

/** The first state change request, if it asks to stop this VMI. */
function hasStopRequestFor(vm: VirtualMachine, vmi: VirtualMachineInstance): boolean {
  const first = vm.status?.stateChangeRequests?.[0];
  return first?.action === "Stop" && first.uid !== undefined && first.uid === vmi.metadata.uid;
}

/** What the controller does about a VM's VMI. */
export type VmAction = "start" | "stop" | "none";

/**
 * Whether `vm`'s VMI is to be started or stopped under `strategy`, as virt-controller's
 * run strategies rule (a VMI being deleted is left to go).
 */
export function decideVm(
  vm: VirtualMachine,
  vmi: VirtualMachineInstance | undefined,
  strategy: RunStrategy,
): VmAction {
  const stopping = vmi?.metadata.deletionTimestamp;
  switch (strategy) {
    case "Always":
      if (!vmi) return "start";
      return !stopping && (hasStopRequestFor(vm, vmi) || isFinal(vmi)) ? "stop" : "none";
    case "RerunOnFailure":
      if (!vmi) {
        return hasStartRequest(vm) || vm.status?.runStrategy !== strategy ? "start" : "none";
      }
      return !stopping &&
          (hasStopRequestFor(vm, vmi) || vmi.status?.phase === VmiPhase.Failed ||
            vmi.status?.phase === VmiPhase.Succeeded)
        ? "stop"
        : "none";
    case "Manual":
      if (!vmi) return hasStartRequest(vm) ? "start" : "none";
      return !stopping && hasStopRequestFor(vm, vmi) ? "stop" : "none";
    case "Halted":
      return vmi && !stopping ? "stop" : "none";
    case "Once":
      return vmi ? "none" : "start";
    default:
      // WaitAsReceiver (a decentralized migration's target) has no pod-less meaning.
      return "none";
  }
}

/** KubeVirt's stable firmware UUID of a VM: a UUID v5 (SHA-1) of its name. */
export async function firmwareUuid(name: string): Promise<string> {
  const ns = Uint8Array.from(
    FIRMWARE_UUID_NAMESPACE.replaceAll("-", "").match(/../g)!.map((h) => parseInt(h, 16)),
  );
  const input = new Uint8Array([...ns, ...new TextEncoder().encode(name)]);
  const hash = new Uint8Array(await crypto.subtle.digest("SHA-1", input)).slice(0, 16);
  hash[6] = (hash[6] & 0x0f) | 0x50;
  hash[8] = (hash[8] & 0x3f) | 0x80;
  const hex = [...hash].map((b) => b.toString(16).padStart(2, "0")).join("");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${
    hex.slice(20)
  }`;
}

/**
 * The VMI `vm` starts, as virt-controller makes it from the template: the VM's name and
 * namespace, the template's labels and annotations, the VM as controlling owner, the
 * generation annotation and the VM controller's finalizer, a stable firmware UUID, a disk
 * for each volume that has none, and a paused start when the start request asks for one;
 * a memory dump volume whose dump is over is left out (it is not dumped again).
 */
export async function vmiFromVm(vm: VirtualMachine): Promise<VirtualMachineInstance> {
  const template = structuredClone(vm.spec.template);
  const spec = template.spec;
  const dump = vm.status?.memoryDumpRequest;
  if (dump && memoryDumpOver(vm)) spec.volumes = withoutVolume(spec.volumes, dump.claimName);
  const first = vm.status?.stateChangeRequests?.[0];
  if (first?.action === "Start" && first.data?.paused === "true") spec.startStrategy = "Paused";
  spec.domain.firmware = { ...spec.domain.firmware };
  if (!spec.domain.firmware.uuid) spec.domain.firmware.uuid = await firmwareUuid(vm.metadata.name);
  const devices = spec.domain.devices ?? (spec.domain.devices = {});
  const named = new Set([
    ...(devices.disks ?? []).map((d) => d.name),
    ...(devices.filesystems ?? []).map((f) => (f as { name?: string }).name),
  ]);
  for (const volume of spec.volumes ?? []) {
    if (!named.has(volume.name)) (devices.disks ??= []).push({ name: volume.name });
  }
  return {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachineInstance",
    metadata: {
      name: vm.metadata.name,
      namespace: vm.metadata.namespace,
      labels: template.metadata?.labels,
      annotations: {
        ...template.metadata?.annotations,
        [VM_GENERATION_ANNOTATION]: String(vm.metadata.generation ?? 1),
      },
      finalizers: [Finalizers.VirtualMachineController],
      ownerReferences: [{
        apiVersion: "kubevirt.io/v1",
        kind: "VirtualMachine",
        name: vm.metadata.name,
        uid: vm.metadata.uid,
        controller: true,
        blockOwnerDeletion: true,
      }],
    },
    spec,
  };
}

/** The VM a VMI belongs to (its controlling owner of kind VirtualMachine), if any. */
export function owningVm(vmi: VirtualMachineInstance): { name: string; uid: string } | undefined {
  for (const ref of vmi.metadata.ownerReferences ?? []) {
    const r = ref as { kind?: string; name?: string; uid?: string; controller?: boolean };
    if (r.kind === "VirtualMachine" && r.controller && r.name && r.uid) {
      return { name: r.name, uid: r.uid };
    }
  }
  return undefined;
}

/** A sync's failure, shown in the VM's `Failure` condition. */
export interface VmSyncError {
  /** KubeVirt's reason, e.g. `FailedCreate`. */
  reason: string;
  /** What went wrong. */
  message: string;
}

/** What the status depends on besides the VM and its VMI. */
export interface VmStatusInput {
  /** A VMI was asked for and has not been seen yet. */
  startExpected: boolean;
  /** The VMI was asked to go and has not gone yet. */
  stopExpected: boolean;
  /** This sync's failure, if any. */
  syncError?: VmSyncError;
  /** Why the VM needs a restart (its `RestartRequired` condition), or `clear` to drop it. */
  restartRequired?: string;
  /** Now (RFC 3339). */
  now: string;
}

function cond(list: VmCondition[] | undefined, type: string): VmCondition | undefined {
  return list?.find((c) => c.type === type);
}

/** Sets `next` in `list` unless a condition of its type says the same already. */
function putCondition(list: VmCondition[], next: VmCondition): void {
  const i = list.findIndex((c) => c.type === next.type);
  if (i < 0) {
    list.push(next);
    return;
  }
  const old = list[i];
  if (old.status === next.status && old.reason === next.reason && old.message === next.message) {
    return;
  }
  list[i] = next;
}

/** Whether the VMI is in a migration that has begun and not ended. */
function migrating(vmi: VirtualMachineInstance): boolean {
  const state = vmi.status?.migrationState;
  return !!state?.startTimestamp && !state.endTimestamp && !state.completed && !state.failed;
}

/** The one word `kubectl get vm` shows, first match winning, in virt-controller's order. */
export function printableStatus(
  vm: VirtualMachine,
  vmi: VirtualMachineInstance | undefined,
  input: Pick<VmStatusInput, "startExpected" | "stopExpected">,
): string {
  if (vm.metadata.deletionTimestamp) return "Terminating";
  if (vmi && !isFinal(vmi) && (vmi.metadata.deletionTimestamp || input.stopExpected)) {
    return "Stopping";
  }
  if (vmi && migrating(vmi)) return "Migrating";
  const running = vmi?.status?.phase === VmiPhase.Running;
  const paused = cond(vmi?.status?.conditions, "Paused")?.status === "True";
  if (running && paused) return "Paused";
  if (running) return "Running";
  if (vmi) {
    const phase = vmi.status?.phase ?? VmiPhase.Unset;
    const starting: string[] = [
      VmiPhase.Unset,
      VmiPhase.Pending,
      VmiPhase.Scheduling,
      VmiPhase.Scheduled,
    ];
    if (starting.includes(phase)) return "Starting";
    if (isFinal(vmi)) return "Stopped";
    return "Unknown";
  }
  return input.startExpected ? "Starting" : "Stopped";
}

/** Whether the first state change request is done with and goes (virt-controller's rule). */
function firstRequestDone(vm: VirtualMachine, vmi: VirtualMachineInstance | undefined): boolean {
  const first = vm.status?.stateChangeRequests?.[0];
  if (!first) return false;
  if (first.action === "Stop") {
    return !vmi || first.uid === undefined || first.uid !== vmi.metadata.uid;
  }
  return !!vmi && !vmi.metadata.deletionTimestamp && !isFinal(vmi);
}

/** Conditions the VM keeps of its own; every other one mirrors the VMI's. */
const OWN_CONDITIONS = new Set(["Ready", "Failure", "RestartRequired"]);

/**
 * The VM's status after a sync, as virt-controller writes it: `created`, `ready`,
 * `runStrategy`, the generations, the first state change request dropped once done, the
 * `Ready` condition from the VMI's (or why there is none), `Failure` from the sync's
 * error, the VMI's other conditions mirrored, the memory dump request moved on, and
 * `printableStatus`.
 */
export function vmStatus(
  vm: VirtualMachine,
  vmi: VirtualMachineInstance | undefined,
  strategy: RunStrategy | undefined,
  input: VmStatusInput,
): VirtualMachineStatus {
  const status: VirtualMachineStatus = structuredClone(vm.status ?? {});
  status.created = vmi !== undefined;
  const vmiReady = cond(vmi?.status?.conditions, "Ready");
  status.ready = vmiReady?.status === "True";
  if (!status.created) delete status.created;
  if (!status.ready) delete status.ready;
  if (vmi) {
    const generation = Number(vmi.metadata.annotations?.[VM_GENERATION_ANNOTATION]);
    if (Number.isInteger(generation)) {
      status.observedGeneration = generation;
      status.desiredGeneration = vm.metadata.generation;
    }
  }
  if (strategy && (status.runStrategy !== undefined || vmi)) status.runStrategy = strategy;
  if (firstRequestDone(vm, vmi)) {
    status.stateChangeRequests = status.stateChangeRequests!.slice(1);
    if (status.stateChangeRequests.length === 0) delete status.stateChangeRequests;
  }
  const conditions = status.conditions ?? [];
  const now = input.now;
  putCondition(
    conditions,
    !vmi
      ? {
        type: "Ready",
        status: "False",
        reason: "VMINotExists",
        message: "VMI does not exist",
        lastProbeTime: now,
        lastTransitionTime: now,
      }
      : vmiReady
      ? { ...vmiReady, type: "Ready" }
      : {
        type: "Ready",
        status: "False",
        reason: "VMIConditionMissing",
        message: "VMI is missing the Ready condition",
        lastProbeTime: now,
        lastTransitionTime: now,
      },
  );
  if (input.restartRequired === "clear") {
    const i = conditions.findIndex((c) => c.type === "RestartRequired");
    if (i >= 0) conditions.splice(i, 1);
  } else if (input.restartRequired) {
    putCondition(conditions, {
      type: "RestartRequired",
      status: "True",
      message: input.restartRequired,
      lastProbeTime: null,
      lastTransitionTime: now,
    });
  }
  if (input.syncError) {
    putCondition(conditions, {
      type: "Failure",
      status: "True",
      reason: input.syncError.reason,
      message: input.syncError.message,
      lastProbeTime: now,
      lastTransitionTime: now,
    });
  } else {
    const i = conditions.findIndex((c) => c.type === "Failure");
    if (i >= 0) conditions.splice(i, 1);
  }
  if (vmi) {
    const mirrored = (vmi.status?.conditions ?? []).filter((c) => !OWN_CONDITIONS.has(c.type));
    for (const c of mirrored) putCondition(conditions, { ...c });
    const keep = new Set<string>(mirrored.map((c) => c.type));
    for (let i = conditions.length - 1; i >= 0; i--) {
      if (!OWN_CONDITIONS.has(conditions[i].type) && !keep.has(conditions[i].type)) {
        conditions.splice(i, 1);
      }
    }
  }
  status.conditions = conditions;
  const dump = nextMemoryDumpRequest(vm, vmi);
  if (dump) status.memoryDumpRequest = dump;
  else delete status.memoryDumpRequest;
  status.printableStatus = printableStatus(vm, vmi, input);
  return status;
}

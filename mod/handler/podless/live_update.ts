/**
 * A running VM's CPU sockets and guest memory changed in its template, as virt-controller's
 * VM controller takes such a change under KubeVirt v1.7.0's `LiveUpdate` rollout strategy
 * (its default), as pure functions: the VMI's spec is patched to the new value (the
 * handler then plugs it, pod-less mode in place, where KubeVirt migrates to a target sized
 * for it), or the VM gets `RestartRequired` saying why the change cannot go live, or the
 * change waits for the hot-plug or migration in progress.
 *
 * Left out: instance types, the CPU and memory requests and limits KubeVirt adjusts beside
 * (a pod-less VMI's are not a pod's), and the other fields KubeVirt compares with the spec
 * the VMI started from (controller revisions).
 *
 * @module
 */
import {
  parseQuantity,
  type Quantity,
  type VirtualMachine,
  type VirtualMachineInstance,
  type VmiCondition,
} from "../../api/mod.ts";
import { isMigrating } from "../migration_state.ts";
import type { VmSyncError } from "./vm_status.ts";

/** The VMI's condition while a vCPU change is carried out (KubeVirt's). */
export const VCPU_CHANGE = "HotVCPUChange";
/** The VMI's condition while a memory change is carried out; False when it failed. */
export const MEMORY_CHANGE = "HotMemoryChange";

/** One operation of a JSON patch. */
export interface PatchOp {
  op: "test" | "replace";
  path: string;
  value: unknown;
}

/** What a sync does about a running VM's CPU and memory. */
export interface LiveUpdate {
  /** The VMI's spec changes: each value tested as read, then replaced. */
  patch: PatchOp[];
  /** Why a change needs a restart (the VM's `RestartRequired` condition). */
  restartRequired?: string;
  /** A change that must wait (the VM's `Failure` condition, and a retry). */
  error?: VmSyncError;
}

function condition(vmi: VirtualMachineInstance, type: string): VmiCondition | undefined {
  return vmi.status?.conditions?.find((c) => c.type === type);
}

/** The live change of `vm`'s sockets and memory to its VMI `vmi`; see the module doc. */
export function liveUpdate(
  vm: VirtualMachine,
  vmi: VirtualMachineInstance | undefined,
): LiveUpdate {
  const result: LiveUpdate = { patch: [] };
  if (!vmi || vmi.metadata.deletionTimestamp) return result;
  cpuChange(vm, vmi, result);
  if (!result.error) memoryChange(vm, vmi, result);
  return result;
}

function cpuChange(vm: VirtualMachine, vmi: VirtualMachineInstance, result: LiveUpdate): void {
  const wanted = vm.spec.template.spec.domain.cpu;
  const running = vmi.spec.domain.cpu;
  if (!wanted || !running || wanted.sockets === running.sockets) return;
  const fail = (message: string) =>
    result.error = {
      reason: "HotPlugCPUError",
      message: `Error encountered while handling CPU change request: ${message}`,
    };
  if (condition(vmi, VCPU_CHANGE)?.status === "True") {
    return void fail("another CPU hotplug is in progress");
  }
  if (isMigrating(vmi)) return void fail("CPU hotplug is not allowed while VMI is migrating");
  const sockets = wanted.sockets ?? 1;
  if (sockets > (running.maxSockets ?? 0)) {
    result.restartRequired ??=
      "CPU sockets updated in template spec to a value higher than what's available";
    return;
  }
  if (sockets < (running.sockets ?? 1)) {
    result.restartRequired ??= "Reduction of CPU socket count requires a restart";
    return;
  }
  // With dedicated CPUs the launcher pins each plugged vCPU to a free CPU of its own first
  // (KubeVirt moves such a VMI to a pod given more CPUs); too few free fails the plug.
  result.patch.push(
    { op: "test", path: "/spec/domain/cpu/sockets", value: running.sockets },
    { op: "replace", path: "/spec/domain/cpu/sockets", value: sockets },
  );
}

function memoryChange(vm: VirtualMachine, vmi: VirtualMachineInstance, result: LiveUpdate): void {
  const wanted = vm.spec.template.spec.domain.memory?.guest;
  const running = vmi.spec.domain.memory;
  const status = vmi.status?.memory;
  if (wanted === undefined || running?.guest === undefined || !status?.guestCurrent) return;
  const restart = (message: string) => void (result.restartRequired ??= message);
  if (condition(vmi, MEMORY_CHANGE)?.status === "False") {
    return restart(
      "memory updated in template spec. Memory-hotplug failed and is not available for this VM configuration",
    );
  }
  if (parseQuantity(wanted) === parseQuantity(running.guest)) return;
  if (condition(vmi, "LiveMigratable")?.status !== "True") {
    return restart(
      "memory updated in template spec. Memory-hotplug is only available for migratable VMs",
    );
  }
  if (running.maxGuest === undefined) {
    return restart(
      "memory updated in template spec. Memory-hotplug is not available for this VM configuration",
    );
  }
  const fail = (message: string) =>
    result.error = {
      reason: "HotPlugMemoryError",
      message: `error encountered while handling memory hotplug requests: ${message}`,
    };
  if (condition(vmi, MEMORY_CHANGE)?.status === "True") {
    return void fail("another memory hotplug is in progress");
  }
  if (isMigrating(vmi)) return void fail("memory hotplug is not allowed while VMI is migrating");
  const unsupported = liveUpdateMemoryRefusal(vm.spec.template.spec, running.maxGuest);
  if (unsupported) return restart(`memory hotplug not supported, ${unsupported}`);
  if (
    status.guestAtBoot !== undefined && parseQuantity(wanted) < parseQuantity(status.guestAtBoot)
  ) {
    return restart(
      "memory updated in template spec to a value lower than what the VM started with",
    );
  }
  if (parseQuantity(wanted) > parseQuantity(running.maxGuest)) {
    return restart("memory updated in template spec to a value higher than what's available");
  }
  result.patch.push(
    { op: "test", path: "/spec/domain/memory/guest", value: running.guest },
    { op: "replace", path: "/spec/domain/memory/guest", value: wanted },
  );
}

/** virtio-mem's block: 2 MiB, a transparent huge page (KubeVirt's hot-plug alignment). */
const HOTPLUG_BLOCK_BYTES = 2 * 1024 ** 2;
/** The block under 1Gi huge pages. */
const HOTPLUG_1G_BLOCK_BYTES = 1024 ** 3;
/** The least guest memory memory hot-plug is offered for (KubeVirt's 1Gi). */
const MIN_HOTPLUG_GUEST_BYTES = 1024 ** 3;

/**
 * Why a VMI spec cannot have its memory plugged live up to `maxGuest`, in KubeVirt v1.7.0's
 * words (`liveupdate/memory.ValidateLiveUpdateMemory`, which virt-api, virt-controller and
 * the VMI defaults ask); undefined when it can.
 */
export function liveUpdateMemoryRefusal(
  spec: VirtualMachineInstance["spec"],
  maxGuest: Quantity | undefined,
): string | undefined {
  const domain = spec.domain;
  if (domain.cpu?.realtime != null) return "Memory hotplug is not compatible with realtime VMs";
  if (
    (domain.cpu?.numa as { guestMappingPassthrough?: unknown } | undefined)
      ?.guestMappingPassthrough != null
  ) {
    return "Memory hotplug is not compatible with guest mapping passthrough";
  }
  if (domain.launchSecurity != null) return "Memory hotplug is not compatible with encrypted VMs";
  const block = domain.memory?.hugepages?.pageSize === "1Gi"
    ? HOTPLUG_1G_BLOCK_BYTES
    : HOTPLUG_BLOCK_BYTES;
  const guest = domain.memory?.guest;
  if (guest === undefined) return "Guest memory must be configured when memory hotplug is enabled";
  if (maxGuest === undefined) {
    return "Max guest memory must be configured when memory hotplug is enabled";
  }
  const guestBytes = parseQuantity(guest);
  const maxBytes = parseQuantity(maxGuest);
  if (guestBytes > maxBytes) return "Guest memory is greater than the configured maxGuest memory";
  const aligned = block === HOTPLUG_BLOCK_BYTES ? "2Mi" : "1Gi";
  if (guestBytes % block !== 0) return `Guest memory must be ${aligned} aligned`;
  if (maxBytes % block !== 0) return `MaxGuest must be ${aligned} aligned`;
  if (spec.architecture !== "amd64") return "Memory hotplug is only available for x86_64 VMs";
  if (guestBytes < MIN_HOTPLUG_GUEST_BYTES) {
    return "Memory hotplug is only available for VMs with at least 1Gi of guest memory";
  }
  return undefined;
}

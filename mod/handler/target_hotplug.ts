/**
 * What a migration target's handler checks before it plugs the vCPUs and memory a VMI's
 * spec asks for, as KubeVirt v1.7.0's virt-handler does at the end of a migration that
 * virt-controller started for a live CPU or memory change (`migration-target.go`
 * `hotplugCPU` and `hotplugMemory`): the target pod virt-controller sized for the change
 * must hold it. Pure functions; {@linkcode MigrationTargetController} does the plugging.
 *
 * The pod's memory request is read from the VMI's label, and what the pod needs is
 * KubeVirt's launcher memory overhead (`services.GetMemoryOverhead`, computed here the same
 * way, term by term) plus the network binding plugins' memory plus the VMI's memory request.
 *
 * @module
 */
import { parseQuantity, type VirtualMachineInstance } from "../api/mod.ts";

/** The VMI label with the target pod's CPU limit (dedicated CPUs). */
export const POD_CPU_LIMITS_LABEL = "kubevirt.io/vmi-pod-cpu-resource-limits";
/** The VMI label with the target pod's memory request. */
export const POD_MEMORY_REQUESTS_LABEL = "kubevirt.io/vmi-pod-memory-resource-requests";
/** The VMI label with the memory overhead ratio virt-controller sized the pod with. */
export const MEMORY_OVERHEAD_RATIO_LABEL = "kubevirt.io/memory-hotplug-overhead-ratio";
/** The Reason of a failed memory plug's `HotMemoryChange` condition (virt-handler's). */
export const MEMORY_HOTPLUG_FAILED_REASON = "Memory Hotplug Failed";

const MI = 1024 ** 2;

/** vCPUs of a topology, as KubeVirt counts them (`hardware.GetNumberOfVCPUs`). */
export function vcpuCount(cpu: { sockets?: number; cores?: number; threads?: number }): number {
  let n = cpu.cores ?? 0;
  for (const factor of [cpu.sockets ?? 0, cpu.threads ?? 0]) {
    if (factor !== 0) n = n === 0 ? factor : n * factor;
  }
  return n;
}

/**
 * Why the vCPUs cannot be plugged on this target (KubeVirt's words); undefined when they
 * can. Only dedicated CPUs are bounded: by the pod's CPU limit in the VMI's label.
 */
export function cpuHotplugRefusal(vmi: VirtualMachineInstance): string | undefined {
  if (vmi.spec.domain.cpu?.dedicatedCpuPlacement !== true) return undefined;
  const limit = vmi.metadata.labels?.[POD_CPU_LIMITS_LABEL];
  if (!limit) return "cannot read CPU limit from VMI annotation";
  if (!/^[+-]?\d+$/.test(limit)) {
    return `cannot parse CPU limit from VMI annotation: strconv.Atoi: parsing ${
      JSON.stringify(limit)
    }: invalid syntax`;
  }
  const vcpus = vcpuCount(vmi.spec.domain.cpu);
  if (vcpus > Number(limit)) {
    return `number of requested VCPUS (${vcpus}) exceeds the limit (${Number(limit)})`;
  }
  return undefined;
}

/** A resource of `spec.domain.resources`, in bytes (or cores); 0 when absent. */
function resource(vmi: VirtualMachineInstance, kind: "requests" | "limits", name: string): number {
  const value = (vmi.spec.domain.resources?.[kind] as Record<string, string | number> | undefined)
    ?.[name];
  return value === undefined ? 0 : parseQuantity(value);
}

/** Bytes to kilobytes, rounded up (a Quantity's `ScaledValue(resource.Kilo)`). */
function kilo(bytes: number): number {
  return Math.ceil(bytes / 1000);
}

/**
 * The memory KubeVirt v1.7.0 adds to a launcher pod beside the guest's
 * (`services.GetMemoryOverhead` on amd64), in bytes, times `ratio` when given (the
 * `kubevirt.io/memory-hotplug-overhead-ratio` label).
 */
export function launcherMemoryOverhead(vmi: VirtualMachineInstance, ratio?: string): number {
  const domain = vmi.spec.domain;
  // Page tables: one byte per 512 of the memory request (counted in kilobytes).
  let overhead = Math.floor((kilo(resource(vmi, "requests", "memory")) * 1000) / 512);
  // virt-launcher-monitor, virt-launcher, virtlogd, virtqemud and QEMU itself.
  overhead += (25 + 100 + 25 + 40 + 30) * MI;
  let vcpus = domain.cpu ? vcpuCount(domain.cpu) : 0;
  if (!domain.cpu) {
    vcpus = Math.trunc(resource(vmi, "limits", "cpu") || resource(vmi, "requests", "cpu"));
  }
  overhead += 8 * MI * Math.max(vcpus, 1);
  overhead += 8 * MI; // the IO thread
  if (domain.devices.autoattachGraphicsDevice !== false) overhead += 32 * MI;
  const devices = domain.devices as Record<string, unknown>;
  const listed = (name: string) => Array.isArray(devices[name]) && (devices[name] as []).length > 0;
  const sriov = (domain.devices.interfaces ?? []).some((i) => "sriov" in i);
  if (listed("gpus") || listed("hostDevices") || sriov) overhead += 1024 * MI;
  if ((vmi.spec.volumes ?? []).some((v) => "downwardMetrics" in v)) overhead += MI;
  const exec = (probe: unknown) => (probe as { exec?: unknown } | undefined)?.exec != null;
  const liveness = exec((vmi.spec as Record<string, unknown>).livenessProbe);
  const readiness = exec((vmi.spec as Record<string, unknown>).readinessProbe);
  if (liveness) overhead += 10 * MI;
  if (readiness) overhead += 10 * MI;
  if (liveness || readiness) overhead += 100 * MI;
  const security = domain.launchSecurity as Record<string, unknown> | undefined | null;
  if (security && (security.sev != null || security.snp != null)) overhead += 256 * MI;
  const tpm = devices.tpm as { enabled?: boolean } | undefined | null;
  if (tpm && tpm.enabled !== false) overhead += 53 * MI;
  if (domain.cpu?.dedicatedCpuPlacement === true || qosGuaranteed(vmi)) overhead += 100 * MI;
  if (ratio !== undefined && ratio !== "") {
    const factor = Number(ratio);
    if (Number.isFinite(factor)) overhead += Math.trunc(kilo(overhead) * (factor - 1)) * 1000;
  }
  return overhead;
}

/** Requests equal to limits, for both memory and CPU, neither zero (KubeVirt's Guaranteed QoS). */
function qosGuaranteed(vmi: VirtualMachineInstance): boolean {
  const memory = resource(vmi, "requests", "memory");
  const cpu = resource(vmi, "requests", "cpu");
  return memory !== 0 && memory === resource(vmi, "limits", "memory") &&
    cpu !== 0 && cpu === resource(vmi, "limits", "cpu");
}

/**
 * The memory the network binding plugins of the VMI's interfaces ask for, each plugin
 * once (KubeVirt's `netbinding.MemoryCalculator`), from the cluster's configuration.
 */
export function bindingPluginsMemory(
  vmi: VirtualMachineInstance,
  overheads: Readonly<Record<string, string>>,
): number {
  const names = new Set(
    (vmi.spec.domain.devices.interfaces ?? []).flatMap((i) => i.binding ? [i.binding.name] : []),
  );
  let sum = 0;
  for (const name of names) {
    const memory = overheads[name];
    if (memory !== undefined) sum += parseQuantity(memory);
  }
  return sum;
}

/**
 * Why the memory cannot be plugged on this target, in virt-handler's words; undefined
 * when the target pod's memory request holds the guest's memory and its overheads.
 */
export function memoryHotplugRefusal(
  vmi: VirtualMachineInstance,
  bindingOverheads: Readonly<Record<string, string>>,
): string | undefined {
  const labels = vmi.metadata.labels ?? {};
  const requested = labels[POD_MEMORY_REQUESTS_LABEL] ?? "";
  let pod: number;
  try {
    pod = parseQuantity(requested);
  } catch {
    // Kubernetes' resource.ParseQuantity's words.
    return "cannot parse Memory requests from VMI label: quantities must match the regular " +
      "expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";
  }
  const needed = launcherMemoryOverhead(vmi, labels[MEMORY_OVERHEAD_RATIO_LABEL]) +
    bindingPluginsMemory(vmi, bindingOverheads) + resource(vmi, "requests", "memory");
  if (pod < needed) {
    return `amount of requested guest memory (${
      vmi.spec.domain.memory?.guest ?? ""
    }) exceeds the launcher memory request (${requested})`;
  }
  return undefined;
}

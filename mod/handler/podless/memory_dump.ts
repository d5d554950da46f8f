/**
 * `virtctl memory-dump` on a pod-less node, as virt-controller's VM controller carries it
 * (KubeVirt v1.7.0's memory dump request handling), as pure functions: what a sync does for
 * the request virt-api put in the VM's `status.memoryDumpRequest`, and the request's next
 * phase from what the VM and its VMI show.
 *
 * | Request phase | The sync does | Next phase when |
 * |---|---|---|
 * | `Associating` | a `memoryDump` volume of the claim into the VM's template and the running VMI's spec | `InProgress`: the template has it |
 * | `InProgress` | nothing (the handler dumps, the VMI's volume status tells) | `Unmounting` (file name, end) or `Failed` (message) |
 * | `Unmounting` | the claim annotated `kubevirt.io/memory-dump: <file>`, the volume out of the VMI | `Completed`: the VMI's volume status has it no more |
 * | `Failed` | the claim annotated `Memory dump failed`, the volume out of the VMI | stays |
 * | `Dissociating` (`remove`) | the volume out of the VMI and the template | gone: neither has it |
 *
 * @module
 */
import type {
  MemoryDumpRequest,
  VirtualMachine,
  VirtualMachineInstance,
  Volume,
} from "../../api/mod.ts";

/** The phases of a VM's memory dump request (KubeVirt's). */
export const DumpRequestPhase = {
  Associating: "Associating",
  InProgress: "InProgress",
  Unmounting: "Unmounting",
  Completed: "Completed",
  Dissociating: "Dissociating",
  Failed: "Failed",
} as const;

/** The claim's annotation naming the dump file on it, or that the dump failed (KubeVirt's). */
export const MEMORY_DUMP_ANNOTATION = "kubevirt.io/memory-dump";
/** The annotation's value when the dump failed. */
export const MEMORY_DUMP_FAILED = "Memory dump failed";
/** The VM's `Failure` reason when the request cannot be carried out. */
export const MEMORY_DUMP_ERROR = "MemoryDumpError";

/** Whether the VM's dump is over (a request past `Associating` and `InProgress`). */
export function memoryDumpOver(vm: VirtualMachine): boolean {
  const phase = vm.status?.memoryDumpRequest?.phase;
  return phase !== undefined && phase !== DumpRequestPhase.Associating &&
    phase !== DumpRequestPhase.InProgress;
}

/** `volumes` without the one named `name`. */
export function withoutVolume(volumes: readonly Volume[] | undefined, name: string): Volume[] {
  return (volumes ?? []).filter((v) => v.name !== name);
}

/** `volumes` with a hotpluggable memory dump volume of `claim` (named after it), once. */
export function withDumpVolume(volumes: readonly Volume[] | undefined, claim: string): Volume[] {
  const list = [...volumes ?? []];
  if (!list.some((v) => v.name === claim)) {
    list.push({ name: claim, memoryDump: { claimName: claim, hotpluggable: true } });
  }
  return list;
}

/** What a sync does for a VM's memory dump request; each part absent when nothing is to do. */
export interface MemoryDumpActions {
  /** The VM template's new volumes. */
  templateVolumes?: Volume[];
  /** The VMI's new volumes (its spec is patched). */
  vmiVolumes?: Volume[];
  /** The value the claim's {@linkcode MEMORY_DUMP_ANNOTATION} gets. */
  annotation?: string;
}

/** What a sync does for `vm`'s memory dump request with its VMI `vmi`; see the module doc. */
export function memoryDumpActions(
  vm: VirtualMachine,
  vmi: VirtualMachineInstance | undefined,
): MemoryDumpActions {
  const request = vm.status?.memoryDumpRequest;
  if (!request) return {};
  const claim = request.claimName;
  const inVmi = vmi?.spec.volumes?.some((v) => v.name === claim) ?? false;
  const template = vm.spec.template.spec.volumes;
  const inTemplate = template?.some((v) => v.name === claim) ?? false;
  switch (request.phase) {
    case DumpRequestPhase.Associating: {
      const running = vmi && !vmi.metadata.deletionTimestamp && vmi.status?.phase === "Running";
      if (!running) return {};
      return {
        ...(inTemplate ? {} : { templateVolumes: withDumpVolume(template, claim) }),
        ...(inVmi ? {} : { vmiVolumes: withDumpVolume(vmi.spec.volumes, claim) }),
      };
    }
    case DumpRequestPhase.Unmounting:
    case DumpRequestPhase.Failed: {
      const annotation = request.phase === DumpRequestPhase.Failed
        ? MEMORY_DUMP_FAILED
        : request.fileName;
      return {
        ...(annotation ? { annotation } : {}),
        ...(inVmi ? { vmiVolumes: withoutVolume(vmi!.spec.volumes, claim) } : {}),
      };
    }
    case DumpRequestPhase.Dissociating:
      return {
        ...(inVmi ? { vmiVolumes: withoutVolume(vmi!.spec.volumes, claim) } : {}),
        ...(inTemplate ? { templateVolumes: withoutVolume(template, claim) } : {}),
      };
    default:
      return {};
  }
}

/**
 * The VM's memory dump request after a sync (`undefined`: none, or it is gone), moved on as
 * virt-controller moves it from the VM's template and the VMI's volume status.
 */
export function nextMemoryDumpRequest(
  vm: VirtualMachine,
  vmi: VirtualMachineInstance | undefined,
): MemoryDumpRequest | undefined {
  const request = vm.status?.memoryDumpRequest;
  if (!request) return undefined;
  const next: MemoryDumpRequest = { ...request };
  if (request.remove) next.phase = DumpRequestPhase.Dissociating;
  const claim = request.claimName;
  const inTemplate = vm.spec.template.spec.volumes?.some((v) => v.name === claim) ?? false;
  const statuses = vmi?.status?.volumeStatus ?? [];
  const inVmiStatus = statuses.some((s) => s.name === claim);
  switch (request.phase) {
    case DumpRequestPhase.Completed:
      return request;
    case DumpRequestPhase.Associating:
      if (inTemplate) next.phase = DumpRequestPhase.InProgress;
      break;
    case DumpRequestPhase.InProgress:
      for (const s of statuses) {
        if (s.name !== claim || !s.memoryDumpVolume) continue;
        if (s.memoryDumpVolume.startTimestamp) {
          next.startTimestamp = s.memoryDumpVolume.startTimestamp;
        }
        if (s.phase === "MemoryDumpCompleted") {
          next.phase = DumpRequestPhase.Unmounting;
          next.endTimestamp = s.memoryDumpVolume.endTimestamp;
          next.fileName = s.memoryDumpVolume.targetFileName;
        } else if (s.phase === "MemoryDumpFailed") {
          next.phase = DumpRequestPhase.Failed;
          next.message = s.message;
          next.endTimestamp = s.memoryDumpVolume.endTimestamp;
        }
      }
      break;
    case DumpRequestPhase.Unmounting:
      if (inVmiStatus) return request;
      next.phase = DumpRequestPhase.Completed;
      break;
    case DumpRequestPhase.Dissociating:
      if (inVmiStatus || inTemplate) return request;
      return undefined;
  }
  return next;
}

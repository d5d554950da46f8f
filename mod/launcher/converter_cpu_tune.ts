/**
 * Dedicated CPUs in the domain, as KubeVirt's launcher writes them
 * (`converter/vcpu.AdjustDomainForTopologyAndCPUSet`, `numaMapping`), from the host CPUs
 * the VMI was given (pod-less: the launcher host's {@linkcode CpuPool}):
 * - `<cputune>`: each enabled vCPU pinned to a CPU of its own (`<vcpupin>`); with
 *   `isolateEmulatorThread`, QEMU's other threads pinned to the one CPU left
 *   (`<emulatorpin>`, the housekeeping CPU); with `realtime`, the mask's vCPUs under
 *   `SCHED_FIFO` priority 1 (`<vcpusched>`; KubeVirt's virt-handler sets the same policy
 *   on the threads after the start, libvirt sets it before the vCPUs run);
 * - the PMU off for `realtime`, and KVM's `hint-dedicated` under KVM on amd64;
 * - `numa.guestMappingPassthrough`: one guest NUMA node per host node the vCPUs are pinned
 *   to, its memory strictly from that node's huge pages, allocated at start.
 *
 * Pure: the XML's parts from numbers.
 *
 * @module
 */
import type { Cpu } from "../api/mod.ts";
import { formatCpuList } from "../domain/mod.ts";
import { realtimeMask, RealtimeMaskError } from "../cpus/mod.ts";
import { InvalidFieldError } from "./converter_errors.ts";
import { el } from "./_xml.ts";
import type { XmlElement } from "./_xml.ts";

/** A host NUMA node and its CPUs (the handler's `VirtualMachineOptions.topology`). */
export interface HostNumaCell {
  id: number;
  cpus: number[];
}

/** What a VMI's CPU placement needs of it. */
export interface CpuPlacementInput {
  /** `namespace/name`, for errors. */
  key: string;
  cpu: Cpu | undefined;
  /** Enabled vCPUs at start. */
  vcpus: number;
  /** Guest memory, bytes. */
  memoryBytes: number;
  /** The huge page size, bytes, when the VMI asks for huge pages. */
  hugepageBytes?: number;
  /** `spec.architecture`. */
  architecture?: string;
  domainType: "kvm" | "qemu";
}

/** The domain's parts for dedicated CPUs; see the module doc. */
export interface CpuPlacement {
  cputune: XmlElement;
  /** `<features>` children. */
  features: XmlElement[];
  /** With NUMA passthrough: `<numatune>`, the guest's cells and the huge pages per cell. */
  numa?: { numatune: XmlElement; cells: XmlElement[]; pages: XmlElement[] };
  /** `<memoryBacking>` children after `<hugepages>`. */
  memoryBacking: XmlElement[];
}

/**
 * The rules virt-api's admission puts on these fields (`validateCPUIsolatorThread`,
 * `validateRealtime`, `validateNUMA`), in its words, for VMIs that reach the launcher
 * without it.
 */
export function checkCpuPlacement(key: string, cpu: Cpu | undefined, hugepages: boolean): void {
  if (!cpu) return;
  const dedicated = cpu.dedicatedCpuPlacement === true;
  if (cpu.isolateEmulatorThread === true && !dedicated) {
    throw new InvalidFieldError(
      key,
      "spec.domain.cpu.isolateEmulatorThread",
      "IsolateEmulatorThread should be only set in combination with DedicatedCPUPlacement",
    );
  }
  const passthrough = cpu.numa?.guestMappingPassthrough !== undefined;
  if (cpu.realtime !== undefined) {
    if (!dedicated) {
      throw new InvalidFieldError(
        key,
        "spec.domain.cpu.dedicatedCpuPlacement",
        "spec.domain.cpu.dedicatedCpuPlacement must be set to true when spec.domain.cpu.realtime is used",
      );
    }
    if (!passthrough) {
      throw new InvalidFieldError(
        key,
        "spec.domain.cpu.numa.guestMappingPassthrough",
        "spec.domain.cpu.numa.guestMappingPassthrough must be defined when spec.domain.cpu.realtime is used",
      );
    }
    realtimeVcpus(key, cpu.realtime.mask, 0);
  }
  if (passthrough && !dedicated) {
    throw new InvalidFieldError(
      key,
      "spec.domain.cpu.numa.guestMappingPassthrough",
      "spec.domain.cpu.dedicatedCpuPlacement must be set to true when NUMA topology strategy is set in spec.domain.cpu.numa.guestMappingPassthrough",
    );
  }
  if (passthrough && !hugepages) {
    throw new InvalidFieldError(
      key,
      "spec.domain.cpu.numa.guestMappingPassthrough",
      "spec.domain.memory.hugepages must be requested when NUMA topology strategy is set in spec.domain.cpu.numa.guestMappingPassthrough",
    );
  }
}

/** The vCPUs below `count` the realtime mask selects (mod/cpus); a bad mask names the field. */
export function realtimeVcpus(key: string, mask: string | undefined, count: number): number[] {
  let selects: (vcpu: number) => boolean;
  try {
    selects = realtimeMask(mask);
  } catch (error) {
    if (!(error instanceof RealtimeMaskError)) throw error;
    throw new InvalidFieldError(key, "spec.domain.cpu.realtime.mask", error.message);
  }
  return Array.from({ length: count }, (_, i) => i).filter(selects);
}

/**
 * The domain's parts for a VMI with dedicated CPUs pinned to `cpus` (its vCPUs' first,
 * the emulator's last), over the host's NUMA `cells` (none: no NUMA mapping, as KubeVirt's
 * launcher does without a reported topology).
 */
export function cpuPlacement(
  input: CpuPlacementInput,
  cpus: readonly number[],
  cells: readonly HostNumaCell[],
): CpuPlacement {
  const { key, cpu, vcpus } = input;
  const isolate = cpu?.isolateEmulatorThread === true;
  const wanted = vcpus + (isolate ? 1 : 0);
  if (cpus.length !== wanted) {
    throw new InvalidFieldError(
      key,
      "spec.domain.cpu.dedicatedCpuPlacement",
      `the VMI needs ${wanted} dedicated CPUs and was given ${cpus.length}`,
    );
  }
  const pins = cpus.slice(0, vcpus);
  const tune: XmlElement[] = pins.map((host, vcpu) => el("vcpupin", { vcpu, cpuset: host }));
  if (isolate) tune.push(el("emulatorpin", { cpuset: cpus[vcpus] }));
  const features: XmlElement[] = [];
  if (cpu?.realtime !== undefined) {
    const fifo = realtimeVcpus(key, cpu.realtime.mask, vcpus);
    if (fifo.length > 0) {
      tune.push(el("vcpusched", { vcpus: formatCpuList(fifo), scheduler: "fifo", priority: 1 }));
    }
    features.push(el("pmu", { state: "off" }));
  }
  if (input.domainType === "kvm" && input.architecture === "amd64") {
    features.push(el("kvm", {}, el("hint-dedicated", { state: "on" })));
  }
  const memoryBacking: XmlElement[] = [];
  let numa: CpuPlacement["numa"];
  if (cpu?.numa?.guestMappingPassthrough !== undefined && cells.length > 0) {
    numa = numaPassthrough(input, pins, cells);
    if (cpu.realtime !== undefined) memoryBacking.push(el("nosharepages"));
    memoryBacking.push(el("allocation", { mode: "immediate" }));
  }
  return { cputune: el("cputune", {}, tune), features, numa, memoryBacking };
}

/** KubeVirt's `numaMapping`: guest cells over the host cells the vCPUs are pinned to. */
function numaPassthrough(
  input: CpuPlacementInput,
  pins: readonly number[],
  cells: readonly HostNumaCell[],
): NonNullable<CpuPlacement["numa"]> {
  const { key } = input;
  const field = "spec.domain.cpu.numa.guestMappingPassthrough";
  const cellOf = new Map<number, number>();
  for (const cell of cells) for (const c of cell.cpus) cellOf.set(c, cell.id);
  // Host cell -> the guest vCPUs pinned into it, in the host's cell order.
  const vcpusByCell = new Map<number, number[]>();
  pins.forEach((host, vcpu) => {
    const cell = cellOf.get(host);
    if (cell === undefined) {
      throw new InvalidFieldError(
        key,
        field,
        `vcpu ${vcpu} is mapped to a not existing host cpu set ${host}`,
      );
    }
    vcpusByCell.set(cell, [...vcpusByCell.get(cell) ?? [], vcpu]);
  });
  const involved = cells.map((c) => c.id).filter((id) => vcpusByCell.has(id));
  const page = input.hugepageBytes;
  if (page === undefined) {
    throw new InvalidFieldError(
      key,
      field,
      "passing through a numa topology is restricted to VMIs with hugepages enabled",
    );
  }
  let memory = input.memoryBytes;
  const count = involved.length;
  if (memory < count * page) {
    throw new InvalidFieldError(
      key,
      field,
      `not enough memory requested to allocate at least one hugepage per numa node: ${memory} < ${
        count * page
      }`,
    );
  }
  if (memory % page !== 0) {
    throw new InvalidFieldError(
      key,
      field,
      `requested memory can't be divided through the numa page size: ${memory} mod ${page} != 0`,
    );
  }
  const extraPages = (memory % (page * count)) / page;
  memory -= extraPages * page;
  const guestCells: XmlElement[] = [];
  const memnodes: XmlElement[] = [];
  const pages: XmlElement[] = [];
  involved.forEach((hostCell, guestCell) => {
    const bytes = memory / count + (guestCell < extraPages ? page : 0);
    guestCells.push(el("cell", {
      id: guestCell,
      cpus: formatCpuList(vcpusByCell.get(hostCell)!),
      memory: bytes,
      unit: "b",
    }));
    memnodes.push(el("memnode", { cellid: guestCell, mode: "strict", nodeset: hostCell }));
    pages.push(el("page", { size: page / 1024, unit: "KiB", nodeset: guestCell }));
  });
  return {
    numatune: el(
      "numatune",
      {},
      el("memory", { mode: "strict", nodeset: involved.join(",") }),
      memnodes,
    ),
    cells: guestCells,
    pages,
  };
}

/** The host cells of the handler's `VirtualMachineOptions.topology`, as numbers. */
export function hostNumaCellsOfOptions(options: unknown): HostNumaCell[] {
  const topology = (options as { topology?: { numa_cells?: unknown } } | null | undefined)
    ?.topology;
  const cells = topology?.numa_cells;
  if (!Array.isArray(cells)) return [];
  const out: HostNumaCell[] = [];
  for (const cell of cells) {
    const id = Number((cell as { id?: unknown })?.id ?? 0);
    const cpus = (cell as { cpus?: unknown })?.cpus;
    if (!Number.isInteger(id) || !Array.isArray(cpus)) continue;
    out.push({
      id,
      cpus: cpus.map((c) => Number((c as { id?: unknown })?.id ?? 0)).filter(Number.isInteger),
    });
  }
  return out;
}

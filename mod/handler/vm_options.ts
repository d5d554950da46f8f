/**
 * The `VirtualMachineOptions` the handler sends with every `SyncVirtualMachine`, filled
 * as KubeVirt's handler fills them (`pkg/virt-handler/options.go`): SMBIOS, the memory
 * balloon's statistics period, the host's NUMA topology, the cluster settings the
 * launcher reads, and how each interface is attached to the domain. KubeVirt's launcher
 * needs them (its topology drives dedicated CPUs and NUMA passthrough, the cluster
 * settings its devices); virtnode's launcher reads what it uses and ignores the rest.
 *
 * The cluster-wide values come from the KubeVirt CR's configuration in force
 * (`mod/config/kubevirt.ts`), KubeVirt's defaults where it says nothing; like KubeVirt's, a
 * change reaches the domains defined after it.
 *
 * @module
 */
import type { VirtualMachineInstance } from "../api/mod.ts";
import { featureGateEnabled, KUBEVIRT_DEFAULTS, type KubevirtConfig } from "../config/mod.ts";
import type { VirtualMachineOptions } from "../proto/mod.ts";
import { parseCpuList } from "../domain/mod.ts";

/** `kubevirt.cmd.v1.Cell`: one NUMA cell of the host. */
export interface NumaCell {
  id: number;
  memory: { amount: string; unit: string };
  pages: { count: string; unit: string; size: number }[];
  distances: { id: number; value: string }[];
  cpus: { id: number; siblings: number[] }[];
}

function read(path: string): string | undefined {
  try {
    return Deno.readTextFileSync(path);
  } catch {
    return undefined;
  }
}

/**
 * The host's NUMA cells from sysfs (what libvirt's capabilities report: each node's
 * memory in KiB, its free-standing and huge page pools, distances and CPUs with their
 * thread siblings). Empty when `sysRoot` has no NUMA nodes.
 */
export function hostTopology(sysRoot = "/sys"): NumaCell[] {
  const nodeDir = `${sysRoot}/devices/system/node`;
  let ids: number[];
  try {
    ids = [...Deno.readDirSync(nodeDir)]
      .map((e) => /^node(\d+)$/.exec(e.name)?.[1])
      .filter((id): id is string => id !== undefined)
      .map(Number)
      .sort((a, b) => a - b);
  } catch {
    return [];
  }
  const pageKiB = 4;
  return ids.map((id) => {
    const dir = `${nodeDir}/node${id}`;
    const memKiB = Number(/MemTotal:\s+(\d+)\s+kB/.exec(read(`${dir}/meminfo`) ?? "")?.[1] ?? 0);
    const pages: NumaCell["pages"] = [];
    let hugeKiB = 0;
    const huge: NumaCell["pages"] = [];
    try {
      for (const e of Deno.readDirSync(`${dir}/hugepages`)) {
        const size = Number(/^hugepages-(\d+)kB$/.exec(e.name)?.[1]);
        if (!size) continue;
        const count = Number(read(`${dir}/hugepages/${e.name}/nr_hugepages`)?.trim() ?? 0);
        hugeKiB += size * count;
        huge.push({ count: String(count), unit: "KiB", size });
      }
    } catch { /* no huge pages */ }
    // As libvirt counts them: the ordinary pages are what the huge pages leave.
    pages.push({
      count: String(Math.floor((memKiB - hugeKiB) / pageKiB)),
      unit: "KiB",
      size: pageKiB,
    });
    pages.push(...huge.sort((a, b) => a.size - b.size));
    const distanceValues = (read(`${dir}/distance`) ?? "").trim().split(/\s+/).filter(Boolean);
    const distances = distanceValues.map((value, i) => ({ id: ids[i] ?? i, value }));
    const cpus = parseCpuList(read(`${dir}/cpulist`) ?? "").map((cpu) => ({
      id: cpu,
      siblings: parseCpuList(
        read(`${sysRoot}/devices/system/cpu/cpu${cpu}/topology/thread_siblings_list`) ??
          String(cpu),
      ),
    }));
    return { id, memory: { amount: String(memKiB), unit: "KiB" }, pages, distances, cpus };
  });
}

/** How each interface of the VMI is attached to the domain (KubeVirt: `tap` for the core bindings). */
export function interfaceDomainAttachment(vmi: VirtualMachineInstance): Record<string, string> {
  const out: Record<string, string> = {};
  for (const iface of vmi.spec.domain.devices.interfaces ?? []) {
    const i = iface as unknown as Record<string, unknown>;
    if (i.masquerade !== undefined || i.bridge !== undefined || i.macvtap !== undefined) {
      out[iface.name] = "tap";
    }
  }
  return out;
}

/**
 * The options of one `SyncVirtualMachine` call for `vmi` on a host of `topology`, under the
 * cluster's configuration `config`.
 */
export function virtualMachineOptions(
  vmi: VirtualMachineInstance,
  topology: NumaCell[],
  config: KubevirtConfig = KUBEVIRT_DEFAULTS,
): VirtualMachineOptions {
  const expandDisks = featureGateEnabled(config, "ExpandDisks");
  return {
    VirtualMachineSMBios: { ...config.smbios },
    MemBalloonStatsPeriod: config.memBalloonStatsPeriod,
    PreallocatedVolumes: [],
    topology: { numa_cells: topology },
    // Kept empty by KubeVirt's handler too: launchers read disk facts themselves now.
    DisksInfo: {},
    ExpandDisksEnabled: expandDisks,
    clusterConfig: {
      ExpandDisksEnabled: expandDisks,
      FreePageReportingDisabled: config.freePageReportingDisabled,
      BochsDisplayForEFIGuests: config.bochsDisplayForEfiGuests,
      SerialConsoleLogDisabled: config.serialConsoleLogDisabled,
    },
    interfaceDomainAttachment: interfaceDomainAttachment(vmi),
  };
}

/**
 * The host's topology as virt-handler writes it into a migration's
 * `status.migrationState.targetNodeTopology`: `cmd.v1.Topology` through Go's JSON encoder,
 * numbers as numbers and zero values left out (`omitempty`), which the source's launcher
 * reads back to pin the domain to the target's CPUs.
 */
export function topologyJson(cells: readonly NumaCell[]): string {
  const num = (v: string | number) => Number(v) || undefined;
  const some = <T>(list: T[]) => list.length > 0 ? list : undefined;
  return JSON.stringify({
    numa_cells: some(cells.map((cell) => ({
      id: num(cell.id),
      memory: { amount: num(cell.memory.amount), unit: cell.memory.unit || undefined },
      pages: some(cell.pages.map((p) => ({
        count: num(p.count),
        unit: p.unit || undefined,
        size: num(p.size),
      }))),
      distances: some(cell.distances.map((d) => ({ id: num(d.id), value: num(d.value) }))),
      cpus: some(cell.cpus.map((c) => ({ id: num(c.id), siblings: some(c.siblings) }))),
    }))),
  });
}

/**
 * The `kubevirt_vmi_*` families from a launcher's `DomainStats` JSON and the guest agent's
 * filesystem list, with KubeVirt's names, types, units and labels: every sample carries
 * `node`, `namespace` and `name`, and each VMI label as `kubernetes_vmi_label_<label>`
 * (`.`, `/` and `-` turned into `_`). Values are converted as KubeVirt does: KiB to bytes,
 * nanoseconds to seconds. A value the launcher did not set (`<Field>Set` false) gives no
 * sample, so a missing statistic is never reported as 0.
 *
 * @module
 */
import type { VirtualMachineInstance } from "../api/mod.ts";
import type { Exposition, FamilySpec, Labels } from "./exposition.ts";

type Json = Record<string, unknown>;

const gauge = (name: string, help: string): FamilySpec => ({ name, help, type: "gauge" });
const counter = (name: string, help: string): FamilySpec => ({ name, help, type: "counter" });

/** Every family this module writes, by the part of the stats it comes from. */
export const VMI_FAMILIES = {
  cpu: {
    usage: counter(
      "kubevirt_vmi_cpu_usage_seconds_total",
      "CPU time the VM's domain used, seconds.",
    ),
    user: counter(
      "kubevirt_vmi_cpu_user_usage_seconds_total",
      "CPU time the domain used in user mode, seconds.",
    ),
    system: counter(
      "kubevirt_vmi_cpu_system_usage_seconds_total",
      "CPU time the domain used in kernel mode, seconds.",
    ),
    load1m: gauge("kubevirt_vmi_guest_load_1m", "The guest's load average over one minute."),
    load5m: gauge("kubevirt_vmi_guest_load_5m", "The guest's load average over five minutes."),
    load15m: gauge("kubevirt_vmi_guest_load_15m", "The guest's load average over fifteen minutes."),
    nodeAffinity: gauge(
      "kubevirt_vmi_node_cpu_affinity",
      "How many of the node's CPUs the VM's vCPUs may run on, summed over its vCPUs.",
    ),
  },
  vcpu: {
    seconds: counter(
      "kubevirt_vmi_vcpu_seconds_total",
      "Time each vCPU ran, seconds, by vCPU and its state.",
    ),
    wait: counter(
      "kubevirt_vmi_vcpu_wait_seconds_total",
      "Time each vCPU waited for I/O, seconds.",
    ),
    delay: counter(
      "kubevirt_vmi_vcpu_delay_seconds_total",
      "Time each vCPU was runnable but not running on the host, seconds.",
    ),
  },
  memory: {
    dirtyRate: gauge(
      "kubevirt_vmi_dirty_rate_bytes_per_second",
      "How fast the guest writes to its memory, bytes per second, measured over a second.",
    ),
    resident: gauge(
      "kubevirt_vmi_memory_resident_bytes",
      "Memory of the VM's process resident in host memory, bytes.",
    ),
    available: gauge(
      "kubevirt_vmi_memory_available_bytes",
      "Memory the guest sees as its total, bytes.",
    ),
    unused: gauge(
      "kubevirt_vmi_memory_unused_bytes",
      "Memory the guest leaves entirely unused, bytes.",
    ),
    cached: gauge(
      "kubevirt_vmi_memory_cached_bytes",
      "Memory the guest can reclaim at once (its caches), bytes.",
    ),
    swapIn: gauge(
      "kubevirt_vmi_memory_swap_in_traffic_bytes",
      "Memory the guest read back from swap, bytes.",
    ),
    swapOut: gauge(
      "kubevirt_vmi_memory_swap_out_traffic_bytes",
      "Memory the guest wrote out to swap, bytes.",
    ),
    majorFaults: counter(
      "kubevirt_vmi_memory_pgmajfault_total",
      "Page faults in the guest that needed disk I/O.",
    ),
    minorFaults: counter(
      "kubevirt_vmi_memory_pgminfault_total",
      "Page faults in the guest served without disk I/O.",
    ),
    balloon: gauge(
      "kubevirt_vmi_memory_actual_balloon_bytes",
      "The guest's memory with the balloon's current size, bytes.",
    ),
    usable: gauge(
      "kubevirt_vmi_memory_usable_bytes",
      "Memory the guest could use without swapping, bytes.",
    ),
    domain: gauge("kubevirt_vmi_memory_domain_bytes", "Memory given to the domain, bytes."),
  },
  storage: {
    iopsRead: counter("kubevirt_vmi_storage_iops_read_total", "Read requests of each drive."),
    iopsWrite: counter("kubevirt_vmi_storage_iops_write_total", "Write requests of each drive."),
    readBytes: counter(
      "kubevirt_vmi_storage_read_traffic_bytes_total",
      "Bytes read from each drive.",
    ),
    writeBytes: counter(
      "kubevirt_vmi_storage_write_traffic_bytes_total",
      "Bytes written to each drive.",
    ),
    readTimes: counter(
      "kubevirt_vmi_storage_read_times_seconds_total",
      "Time spent on reads of each drive, seconds.",
    ),
    writeTimes: counter(
      "kubevirt_vmi_storage_write_times_seconds_total",
      "Time spent on writes of each drive, seconds.",
    ),
    flushRequests: counter(
      "kubevirt_vmi_storage_flush_requests_total",
      "Flush requests of each drive.",
    ),
    flushTimes: counter(
      "kubevirt_vmi_storage_flush_times_seconds_total",
      "Time spent on flushes of each drive, seconds.",
    ),
  },
  network: {
    traffic: counter(
      "kubevirt_vmi_network_traffic_bytes_total",
      "Bytes through each interface by direction (type rx or tx); older form of the receive and transmit families.",
    ),
    receiveBytes: counter(
      "kubevirt_vmi_network_receive_bytes_total",
      "Bytes received on each interface.",
    ),
    transmitBytes: counter(
      "kubevirt_vmi_network_transmit_bytes_total",
      "Bytes sent on each interface.",
    ),
    receivePackets: counter(
      "kubevirt_vmi_network_receive_packets_total",
      "Packets received on each interface.",
    ),
    transmitPackets: counter(
      "kubevirt_vmi_network_transmit_packets_total",
      "Packets sent on each interface.",
    ),
    receiveErrors: counter(
      "kubevirt_vmi_network_receive_errors_total",
      "Receive errors of each interface.",
    ),
    transmitErrors: counter(
      "kubevirt_vmi_network_transmit_errors_total",
      "Transmit errors of each interface.",
    ),
    receiveDropped: counter(
      "kubevirt_vmi_network_receive_packets_dropped_total",
      "Received packets each interface dropped.",
    ),
    transmitDropped: counter(
      "kubevirt_vmi_network_transmit_packets_dropped_total",
      "Packets to send each interface dropped.",
    ),
  },
  filesystem: {
    capacity: gauge(
      "kubevirt_vmi_filesystem_capacity_bytes",
      "Size of each guest filesystem, bytes (from the guest agent).",
    ),
    used: gauge(
      "kubevirt_vmi_filesystem_used_bytes",
      "Bytes in use on each guest filesystem (from the guest agent).",
    ),
  },
  migration: {
    total: gauge(
      "kubevirt_vmi_migration_data_total_bytes",
      "Bytes the running migration has to move in all.",
    ),
    remaining: gauge(
      "kubevirt_vmi_migration_data_remaining_bytes",
      "Bytes the running migration has still to move.",
    ),
    processed: gauge(
      "kubevirt_vmi_migration_data_processed_bytes",
      "Bytes the running migration has moved.",
    ),
    dirtyRate: gauge(
      "kubevirt_vmi_migration_dirty_memory_rate_bytes",
      "Rate at which the guest dirties memory during its migration, bytes per second.",
    ),
    transferRate: gauge(
      "kubevirt_vmi_migration_memory_transfer_rate_bytes",
      "Rate at which the migration moves memory, bytes per second.",
    ),
  },
} as const;

const LABEL_FORMAT = /[./-]/g;

/** `node`, `namespace`, `name` and the VMI's own labels, as every VMI sample carries them. */
export function vmiLabels(vmi: VirtualMachineInstance): Labels {
  const labels: Labels = {
    node: vmi.status?.nodeName ?? "",
    namespace: vmi.metadata.namespace ?? "",
    name: vmi.metadata.name,
  };
  for (const [key, value] of Object.entries(vmi.metadata.labels ?? {})) {
    const name = `kubernetes_vmi_label_${key.replace(LABEL_FORMAT, "_")}`;
    // Label names Prometheus refuses (other characters than KubeVirt's replacer handles)
    // are skipped rather than breaking the scrape.
    if (/^[a-zA-Z_][a-zA-Z0-9_]*$/.test(name)) labels[name] = value;
  }
  return labels;
}

function isSet(o: Json | undefined, field: string): o is Json {
  return o !== undefined && o[`${field}Set`] === true && typeof o[field] === "number";
}

function asObject(v: unknown): Json | undefined {
  return typeof v === "object" && v !== null && !Array.isArray(v) ? v as Json : undefined;
}

function asArray(v: unknown): Json[] {
  return Array.isArray(v) ? v.map(asObject).filter((x): x is Json => x !== undefined) : [];
}

const NS = 1e-9;
const KIB = 1024;

const VCPU_STATES: Record<number, string> = { 0: "offline", 1: "running", 2: "blocked" };

/** A guest filesystem as the agent reports it (`VirtualMachineInstanceFileSystem`). */
export interface GuestFilesystemStat {
  /** The guest's device, e.g. `vda1`. */
  diskName: string;
  /** Where it is mounted. */
  mountPoint: string;
  /** E.g. `ext4`. */
  fileSystemType: string;
  /** Its size. */
  totalBytes: number;
  /** Bytes in use. */
  usedBytes: number;
}

/**
 * Adds the samples of one VMI: `stats` is the launcher's `DomainStats` JSON,
 * `filesystems` the agent's filesystem list (none without an agent).
 */
export function addVmiSamples(
  exp: Exposition,
  vmi: VirtualMachineInstance,
  stats: Record<string, unknown>,
  filesystems: GuestFilesystemStat[] = [],
  dirtyRateMbs?: number,
): void {
  const base = vmiLabels(vmi);
  const put = (spec: FamilySpec, o: Json | undefined, field: string, scale = 1, extra?: Labels) => {
    if (isSet(o, field)) {
      exp.sample(spec, extra ? { ...base, ...extra } : base, (o[field] as number) * scale);
    }
  };
  const f = VMI_FAMILIES;

  const cpu = asObject(stats.Cpu);
  put(f.cpu.usage, cpu, "Time", NS);
  put(f.cpu.user, cpu, "User", NS);
  put(f.cpu.system, cpu, "System", NS);
  const load = asObject(stats.Load);
  put(f.cpu.load1m, load, "Load1m");
  put(f.cpu.load5m, load, "Load5m");
  put(f.cpu.load15m, load, "Load15m");

  // Every (vCPU, host CPU) pair the vCPU may run on, as KubeVirt counts them.
  if (stats.CPUMapSet === true && Array.isArray(stats.CPUMap)) {
    const pairs = (stats.CPUMap as unknown[]).flatMap((row) => Array.isArray(row) ? row : [])
      .filter((allowed) => allowed === true).length;
    exp.sample(f.cpu.nodeAffinity, base, pairs);
  }
  if (dirtyRateMbs !== undefined) exp.sample(f.memory.dirtyRate, base, dirtyRateMbs * 1024 * 1024);

  asArray(stats.Vcpu).forEach((vcpu, i) => {
    const id = String(i);
    const state = VCPU_STATES[vcpu.State as number] ?? "unknown";
    put(f.vcpu.seconds, vcpu, "Time", NS, { id, state });
    put(f.vcpu.wait, vcpu, "Wait", NS, { id });
    put(f.vcpu.delay, vcpu, "Delay", NS, { id });
  });

  const mem = asObject(stats.Memory);
  put(f.memory.resident, mem, "RSS", KIB);
  put(f.memory.available, mem, "Available", KIB);
  put(f.memory.unused, mem, "Unused", KIB);
  put(f.memory.cached, mem, "Cached", KIB);
  put(f.memory.swapIn, mem, "SwapIn", KIB);
  put(f.memory.swapOut, mem, "SwapOut", KIB);
  put(f.memory.majorFaults, mem, "MajorFault");
  put(f.memory.minorFaults, mem, "MinorFault");
  put(f.memory.balloon, mem, "ActualBalloon", KIB);
  put(f.memory.usable, mem, "Usable", KIB);
  put(f.memory.domain, mem, "Total", KIB);

  for (const block of asArray(stats.Block)) {
    if (block.NameSet !== true || typeof block.Name !== "string") continue;
    const drive = {
      drive: typeof block.Alias === "string" && block.Alias ? block.Alias : block.Name,
    };
    put(f.storage.iopsRead, block, "RdReqs", 1, drive);
    put(f.storage.iopsWrite, block, "WrReqs", 1, drive);
    put(f.storage.readBytes, block, "RdBytes", 1, drive);
    put(f.storage.writeBytes, block, "WrBytes", 1, drive);
    put(f.storage.readTimes, block, "RdTimes", NS, drive);
    put(f.storage.writeTimes, block, "WrTimes", NS, drive);
    put(f.storage.flushRequests, block, "FlReqs", 1, drive);
    put(f.storage.flushTimes, block, "FlTimes", NS, drive);
  }

  for (const net of asArray(stats.Net)) {
    if (net.NameSet !== true || typeof net.Name !== "string") continue;
    const iface = net.AliasSet === true && typeof net.Alias === "string" ? net.Alias : net.Name;
    const labels = { interface: iface };
    put(f.network.traffic, net, "RxBytes", 1, { interface: iface, type: "rx" });
    put(f.network.receiveBytes, net, "RxBytes", 1, labels);
    put(f.network.traffic, net, "TxBytes", 1, { interface: iface, type: "tx" });
    put(f.network.transmitBytes, net, "TxBytes", 1, labels);
    put(f.network.receivePackets, net, "RxPkts", 1, labels);
    put(f.network.transmitPackets, net, "TxPkts", 1, labels);
    put(f.network.receiveErrors, net, "RxErrs", 1, labels);
    put(f.network.transmitErrors, net, "TxErrs", 1, labels);
    put(f.network.receiveDropped, net, "RxDrop", 1, labels);
    put(f.network.transmitDropped, net, "TxDrop", 1, labels);
  }

  for (const fs of filesystems) {
    const labels = {
      ...base,
      disk_name: fs.diskName,
      mount_point: fs.mountPoint,
      file_system_type: fs.fileSystemType,
    };
    exp.sample(f.filesystem.capacity, labels, fs.totalBytes);
    exp.sample(f.filesystem.used, labels, fs.usedBytes);
  }

  const job = asObject(stats.MigrateDomainJobInfo);
  put(f.migration.total, job, "DataTotal");
  put(f.migration.remaining, job, "DataRemaining");
  put(f.migration.processed, job, "DataProcessed");
  put(f.migration.dirtyRate, job, "MemDirtyRate");
  put(f.migration.transferRate, job, "MemoryBps");
}

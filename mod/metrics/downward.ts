/**
 * Downward metrics, as KubeVirt gives them to a guest with the `downwardMetrics` device:
 * vhostmd's XML (`<metrics><metric type=... context="host|vm">...`), made of the node's
 * facts (`/proc/stat`, `/proc/meminfo`, `/proc/vmstat`, the CPUs' physical packages) and
 * the VM's statistics from its launcher, in KubeVirt's names, types, units and layout, and
 * the request a guest sends for them over the virtio-serial channel.
 *
 * @module
 */

/** One metric of vhostmd's XML. */
export interface DownwardMetric {
  /** vhostmd's value type. */
  type: "real64" | "int64" | "uint64" | "string";
  /** The node's or the VM's. */
  context: "host" | "vm";
  /** KubeVirt's name (`TotalCPUTime`, `FreePhysicalMemory`, ...). */
  name: string;
  /** The value as vhostmd writes it (reals with six decimals). */
  value: string;
  /** `s`, `KiB`, or none. */
  unit?: string;
}

type Json = Record<string, unknown>;

function metric(
  context: "host" | "vm",
  name: string,
  value: number | string,
  type: DownwardMetric["type"],
  unit?: string,
): DownwardMetric {
  const text = type === "real64" ? (value as number).toFixed(6) : String(value);
  return { type, context, name, value: text, ...(unit ? { unit } : {}) };
}

/** What the node's files say, read by {@linkcode readHostFacts}. */
export interface HostFacts {
  /** `/proc/stat`. */
  stat: string;
  /** `/proc/meminfo`. */
  meminfo: string;
  /** `/proc/vmstat`. */
  vmstat: string;
  /** Each CPU's `topology/physical_package_id`. */
  packageIds: string[];
  /** The page size, bytes. */
  pageSize: number;
  /** Seconds since the epoch. */
  now: number;
}

/** Reads the node's facts under `root` (`/` unless told); a file it cannot read is empty. */
export async function readHostFacts(root = ""): Promise<HostFacts> {
  const read = (path: string) => Deno.readTextFile(`${root}${path}`).catch(() => "");
  const cpus: string[] = [];
  try {
    // Read synchronously: Deno 2.9.3 may close a node:net socket's descriptor twice, and a
    // directory's read on another thread must not fall in between (docs/compatibility.md).
    for (const entry of Deno.readDirSync(`${root}/sys/devices/system/cpu`)) {
      if (/^cpu\d+$/.test(entry.name)) cpus.push(entry.name);
    }
  } catch { /* no /sys: no CPU count */ }
  const packageIds = (await Promise.all(
    cpus.map((cpu) => read(`/sys/devices/system/cpu/${cpu}/topology/physical_package_id`)),
  )).map((id) => id.trim()).filter((id) => id !== "");
  // The kernel's page size (Deno has no getpagesize), from this process's mappings, once.
  pageKiB ??= Number(
    /^KernelPageSize:\s+(\d+) kB/m.exec(await read("/proc/self/smaps"))?.[1] ?? 4,
  );
  return {
    stat: await read("/proc/stat"),
    meminfo: await read("/proc/meminfo"),
    vmstat: await read("/proc/vmstat"),
    packageIds,
    pageSize: pageKiB * 1024,
    now: Math.floor(Date.now() / 1000),
  };
}

/** The kernel's page size, KiB, once read. */
let pageKiB: number | undefined;

/** `/proc/stat`'s clock ticks per second (USER_HZ on Linux). */
const USER_HZ = 100;

/** The node's metrics, as KubeVirt's host collector gives them. */
export function hostDownwardMetrics(facts: HostFacts): DownwardMetric[] {
  const out: DownwardMetric[] = [];
  if (facts.packageIds.length > 0) {
    out.push(metric("host", "NumberOfPhysicalCPUs", new Set(facts.packageIds).size, "int64"));
  }
  const cpu = /^cpu\s+(\d+)\s+(\d+)\s+(\d+)/m.exec(facts.stat);
  if (cpu) {
    const seconds = (Number(cpu[1]) + Number(cpu[2]) + Number(cpu[3])) / USER_HZ;
    out.push(metric("host", "TotalCPUTime", seconds, "real64", "s"));
  }
  const kib = (field: string) =>
    Number(new RegExp(`^${field}:\\s+(\\d+)`, "m").exec(facts.meminfo)?.[1] ?? 0);
  if (facts.meminfo !== "") {
    const [free, swapFree, total, swapTotal] = ["MemFree", "SwapFree", "MemTotal", "SwapTotal"]
      .map(kib);
    const [buffers, cached, swapCached] = ["Buffers", "Cached", "SwapCached"].map(kib);
    out.push(
      metric("host", "FreePhysicalMemory", free, "uint64", "KiB"),
      metric("host", "FreeVirtualMemory", free + swapFree, "uint64", "KiB"),
      metric(
        "host",
        "MemoryAllocatedToVirtualServers",
        total - free - buffers - cached,
        "uint64",
        "KiB",
      ),
      metric(
        "host",
        "UsedVirtualMemory",
        total + swapTotal - free - cached - buffers - swapCached,
        "uint64",
        "KiB",
      ),
    );
  }
  if (facts.vmstat !== "") {
    const pages = (field: string) =>
      Number(new RegExp(`^${field}\\s+(\\d+)`, "m").exec(facts.vmstat)?.[1] ?? 0);
    out.push(
      metric("host", "PagedInMemory", pages("pswpin") * facts.pageSize / 1024, "uint64", "KiB"),
      metric("host", "PagedOutMemory", pages("pswpout") * facts.pageSize / 1024, "uint64", "KiB"),
    );
  }
  out.push(metric("host", "Time", facts.now, "int64", "s"));
  return out;
}

/**
 * The whole report for one VM: the node's name and kind, the launcher's QEMU version, the
 * VM's CPU time and vCPU count and its memory (from its launcher's `DomainStats` JSON), and
 * the node's metrics.
 */
export function downwardMetrics(
  o: {
    nodeName: string;
    qemuVersion: string;
    stats: Record<string, unknown>;
    host: DownwardMetric[];
  },
): DownwardMetric[] {
  const vcpus = Array.isArray(o.stats.Vcpu) ? o.stats.Vcpu as Json[] : [];
  const cpuNs = vcpus.reduce((sum, v) => sum + (typeof v.Time === "number" ? v.Time : 0), 0);
  const memory = (o.stats.Memory ?? {}) as Json;
  const balloon = typeof memory.ActualBalloon === "number" ? memory.ActualBalloon : 0;
  const nrVirtCpu = typeof o.stats.NrVirtCpu === "number" ? o.stats.NrVirtCpu : vcpus.length;
  return [
    metric("host", "HostName", o.nodeName, "string"),
    metric("host", "HostSystemInfo", "linux", "string"),
    metric("host", "VirtualizationVendor", "kubevirt.io", "string"),
    metric("host", "VirtProductInfo", o.qemuVersion, "string"),
    metric("vm", "TotalCPUTime", cpuNs / 1e9, "real64", "s"),
    metric("vm", "ResourceProcessorLimit", nrVirtCpu, "uint64"),
    metric("vm", "PhysicalMemoryAllocatedToVirtualSystem", balloon, "uint64", "KiB"),
    // No active ballooning: the balloon's size is the limit, as KubeVirt reports it.
    metric("vm", "ResourceMemoryLimit", balloon, "uint64", "KiB"),
    ...o.host,
  ];
}

function escapeXml(text: string): string {
  return text.replaceAll("&", "&amp;").replaceAll("<", "&lt;").replaceAll(">", "&gt;")
    .replaceAll('"', "&#34;").replaceAll("'", "&#39;");
}

/** vhostmd's XML of `metrics`, laid out as KubeVirt's (two-space indents), no end mark. */
export function downwardMetricsXml(metrics: DownwardMetric[]): string {
  const lines = ["<metrics>"];
  for (const m of metrics) {
    const unit = m.unit ? ` unit="${escapeXml(m.unit)}"` : "";
    lines.push(
      `  <metric type="${m.type}" context="${m.context}"${unit}>`,
      `    <name>${escapeXml(m.name)}</name>`,
      `    <value>${escapeXml(m.value)}</value>`,
      "  </metric>",
    );
  }
  lines.push("</metrics>");
  return lines.join("\n");
}

/** What the guest gets when its metrics cannot be had (KubeVirt's words). */
export const EMPTY_DOWNWARD_METRICS =
  "<metrics><!-- host metrics not available --><!-- VM metrics not available --></metrics>";

/** The answer to a request that is not one. */
export const INVALID_DOWNWARD_REQUEST = "INVALID REQUEST\n\n";

/**
 * Whether `line` (a request's first line, before its blank line) asks for the metrics:
 * `GET /metrics/XML`, a query allowed, as KubeVirt's server reads it.
 */
export function isDownwardMetricsRequest(line: string): boolean {
  const [method, uri, ...rest] = line.split(" ");
  if (method !== "GET" || uri === undefined || rest.length > 0) return false;
  if (!uri.startsWith("/")) return false;
  return uri.split("?")[0] === "/metrics/XML";
}

/** The size of vhostmd's metrics disk, as KubeVirt's launcher makes it (256 KiB). */
export const VHOSTMD_DISK_SIZE = 262_144;
/** The longest body KubeVirt's reader takes (the disk's size less 24 bytes). */
const VHOSTMD_MAX_BODY = VHOSTMD_DISK_SIZE - 24;

/** What is written to a vhostmd metrics disk, in the order it is written. */
export interface VhostmdWrite {
  /** The header with its flag set: readers skip the disk while it is being written. */
  locked: Uint8Array;
  /** The XML and its newline, written after the locked header. */
  body: Uint8Array;
  /** The header again with the flag cleared, written last. */
  unlocked: Uint8Array;
}

/**
 * vhostmd's disk layout of `xml`, as KubeVirt writes the `downwardMetrics` volume's disk:
 * a 16-byte big-endian header (`mvbd`, a busy flag, the byte sum of the body, its length)
 * then the body, the XML and a newline. Throws when the body would not fit.
 */
export function vhostmdWrite(xml: string): VhostmdWrite {
  const body = new TextEncoder().encode(`${xml}\n`);
  if (body.length > VHOSTMD_MAX_BODY) {
    throw new Error(
      `the downward metrics (${body.length} bytes) do not fit the vhostmd disk's ${VHOSTMD_MAX_BODY}`,
    );
  }
  let checksum = 0;
  for (const b of body) checksum = (checksum + b) | 0;
  const header = (flag: number) => {
    const bytes = new Uint8Array(16);
    bytes.set(new TextEncoder().encode("mvbd"));
    const view = new DataView(bytes.buffer);
    view.setInt32(4, flag);
    view.setInt32(8, checksum);
    view.setInt32(12, body.length);
    return bytes;
  };
  return { locked: header(1), body, unlocked: header(0) };
}

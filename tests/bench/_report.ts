/**
 * The benchmark's report: the machine it ran on, and one item per row (metric, virtnode's
 * figure, the floor of the same run, the ratio, the target, KubeVirt's own of the same run),
 * as markdown and as JSON.
 *
 * @module
 */

/** One row of the results. */
export interface Row {
  /** Scenario number of the issue (1..7), for readers of the JSON. */
  scenario: number;
  metric: string;
  /** virtnode's figure; undefined when the scenario did not run or failed. */
  value?: number;
  unit: string;
  floor?: number;
  /** A rate: bigger is better, so the ratio is floor ÷ virtnode. */
  higherIsBetter?: boolean;
  /** What the floor is made of. */
  floorNote?: string;
  /** The project's target, as text (e.g. "≤ 1.2× floor"). */
  target?: string;
  /** Whether the target is met; undefined when there is none. */
  met?: boolean;
  /** KubeVirt's own binary's figure measured in the same run (same unit as `value`). */
  kubevirt?: number;
  /** Which of KubeVirt's binaries `kubevirt` is (e.g. "virt-handler"). */
  kubevirtLabel?: string;
  /** A published KubeVirt figure, shown where none was measured in the run. */
  publicFigure?: string;
  /** A short remark printed after the table. */
  note?: string;
}

/** The machine and software a run used. */
export interface Environment {
  date: string;
  nproc: number;
  cpuModel: string;
  memTotalMiB: number;
  deno: string;
  v8: string;
  libvirt: string;
  qemu?: string;
  kvmDevice: boolean;
  /** The domain type the QEMU guests ran with ("kvm" means /dev/kvm was used). */
  qemuDomainType?: string;
  loadAtStart: string;
  loadAtEnd?: string;
  kernel: string;
}

/** Reads what {@linkcode Environment} needs from /proc and the runtime. */
export function environment(libvirt: string): Environment {
  const cpuinfo = readOr("/proc/cpuinfo");
  const meminfo = readOr("/proc/meminfo");
  const kvm = (() => {
    try {
      return Deno.statSync("/dev/kvm").isCharDevice === true;
    } catch {
      return false;
    }
  })();
  return {
    date: new Date().toISOString(),
    nproc: navigator.hardwareConcurrency,
    cpuModel: /^model name\s*:\s*(.*)$/m.exec(cpuinfo)?.[1]?.trim() ?? "unknown",
    memTotalMiB: Math.round(Number(/^MemTotal:\s+(\d+)/m.exec(meminfo)?.[1] ?? 0) / 1024),
    deno: Deno.version.deno,
    v8: Deno.version.v8,
    libvirt,
    kvmDevice: kvm,
    loadAtStart: loadAverage(),
    kernel: Deno.osRelease(),
  };
}

/** The 1, 5 and 15 minute load averages, as /proc/loadavg prints them. */
export function loadAverage(): string {
  return readOr("/proc/loadavg").split(" ").slice(0, 3).join(" ");
}

function readOr(path: string): string {
  try {
    return Deno.readTextFileSync(path);
  } catch {
    return "";
  }
}

function fmt(v: number | undefined, unit: string): string {
  if (v === undefined || Number.isNaN(v)) return "—";
  if (unit === "" && Number.isInteger(v)) return String(v);
  const digits = Math.abs(v) >= 100 ? 0 : Math.abs(v) >= 10 ? 1 : 2;
  const n = v.toFixed(digits);
  return unit ? `${n} ${unit}` : n;
}

/** How many times the floor (virtnode ÷ floor; floor ÷ virtnode for rates), if both exist. */
export function ratio(row: Row): number | undefined {
  if (row.value === undefined || row.floor === undefined || !row.floor || !row.value) {
    return undefined;
  }
  return row.higherIsBetter ? row.floor / row.value : row.value / row.floor;
}

/** virtnode ÷ KubeVirt's measured figure (KubeVirt ÷ virtnode for rates), if both exist. */
export function kubevirtRatio(row: Row): number | undefined {
  if (row.value === undefined || !row.kubevirt || !row.value) return undefined;
  return row.higherIsBetter ? row.kubevirt / row.value : row.value / row.kubevirt;
}

function kubevirtCell(row: Row): string {
  if (row.kubevirt === undefined) {
    return row.publicFigure ? `not measured; published: ${row.publicFigure}` : "—";
  }
  const r = kubevirtRatio(row);
  return `${fmt(row.kubevirt, row.unit)} (${row.kubevirtLabel ?? "KubeVirt"})${
    r === undefined ? "" : `, ${r.toFixed(2)}×`
  }`;
}

/**
 * One row as a list item: a list wraps at the docs' width where a table of six columns
 * cannot.
 */
function rowItem(row: Row): string {
  const parts = [`**${fmt(row.value, row.unit)}**`];
  if (row.floor !== undefined) {
    const r = ratio(row);
    parts.push(
      `floor ${fmt(row.floor, row.unit)}${row.floorNote ? ` (${row.floorNote})` : ""}${
        r === undefined ? "" : `, ${r.toFixed(2)}×`
      }`,
    );
  }
  if (row.target) {
    parts.push(`target ${row.target}${row.met === undefined ? "" : row.met ? " ✅" : " ❌"}`);
  }
  if (row.kubevirt !== undefined || row.publicFigure) {
    parts.push(`KubeVirt's own ${kubevirtCell(row)}`);
  }
  return `- ${row.metric}: ${parts.join("; ")}`;
}

/** The results and the environment as markdown. */
export function markdown(
  env: Environment,
  rows: Row[],
  extras: { title: string; durationS: number; options: string; notes: string[] },
): string {
  const lines = [
    `# ${extras.title}`,
    "",
    `- date: ${env.date}`,
    `- machine: ${env.nproc} CPUs (nproc), ${env.cpuModel}, ${env.memTotalMiB} MiB memory, Linux ${env.kernel}`,
    `- software: Deno ${env.deno} (V8 ${env.v8}), libvirt ${env.libvirt}${
      env.qemu ? `, QEMU ${env.qemu}` : ""
    }`,
    `- /dev/kvm: ${env.kvmDevice ? "present" : "absent"}; QEMU guests ran as domain type ${
      env.qemuDomainType ?? "— (QEMU scenario not run)"
    } (${env.qemuDomainType === "kvm" ? "KVM used" : "KVM not used"})`,
    `- load average: ${env.loadAtStart} at start, ${env.loadAtEnd ?? "?"} at end`,
    `- options: ${extras.options}; run took ${extras.durationS.toFixed(0)} s`,
    "",
    "Each row: virtnode's figure in bold; the floor measured in the same run, and virtnode ÷",
    "floor; the target; KubeVirt's own figure in the same run, and virtnode ÷ KubeVirt.",
    "",
  ];
  for (const row of rows) lines.push(rowItem(row));
  const notes = [
    ...rows.filter((r) => r.note).map((r) => `${r.metric}: ${r.note}`),
    ...extras.notes,
  ];
  if (notes.length) {
    lines.push("", "Notes:", "");
    for (const n of notes) lines.push(`- ${n}`);
  }
  return lines.join("\n") + "\n";
}

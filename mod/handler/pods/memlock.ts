/**
 * Locked-memory limits for a launcher pod's virtqemud and QEMU, as KubeVirt v1.7.0's
 * virt-handler sets them (`isolation.AdjustResources` and `AdjustQemuProcessMemoryLimits`).
 *
 * A guest with a VFIO device (a host device, a GPU or an SR-IOV interface), a realtime vCPU
 * or SEV has all its memory pinned, which counts against `RLIMIT_MEMLOCK`. A pod's processes
 * cannot raise their own hard limit, so the handler does it from the host:
 *
 * - before the domain is defined: the launcher's child `virtqemud` (which hands its limit to
 *   the QEMU it starts) gets KubeVirt's launcher memory overhead (times the CR's
 *   `additionalGuestMemoryOverheadRatio`) plus the guest's memory (`memory.guest`, else the
 *   memory request);
 * - on a migration target, once the domain arrives (and before a device is plugged into a
 *   running guest): QEMU itself, a child of the launcher's parent (virt-launcher-monitor, the
 *   subreaper QEMU is left with), gets the overhead plus the most memory the guest may grow
 *   to (`memory.maxGuest`, else the request).
 *
 * Processes are found as KubeVirt finds them, by parent PID and the command name in
 * `/proc/<pid>/stat` (`virtqemud`; `qemu-system*` or `qemu-kvm*`).
 *
 * @module
 */
import { parseQuantity, type VirtualMachineInstance } from "../../api/mod.ts";
import { setMemlockLimit } from "../../../ffi/mod.ts";
import { launcherMemoryOverhead } from "../target_hotplug.ts";

/** One process of the host's process table. */
export interface ProcessEntry {
  /** Its PID. */
  pid: number;
  /** Its parent's PID. */
  ppid: number;
  /** Its command name (`comm`, at most 15 characters). */
  command: string;
}

/** How the limits are found and set; the defaults are the host's. */
export interface MemlockOptions {
  /** The process table's root (default `/proc`). */
  procRoot?: string;
  /** Sets a process's soft and hard limit (default `prlimit(2)`). */
  setLimit?: (pid: number, bytes: number) => void;
  /** The KubeVirt CR's `additionalGuestMemoryOverheadRatio`. */
  ratio?: string;
}

/** Sets the limit, failing in virt-handler's words. */
function setLimit(options: MemlockOptions, pid: number, bytes: number): void {
  try {
    (options.setLimit ?? setMemlockLimit)(pid, bytes);
  } catch (error) {
    throw new Error(
      `failed to set process ${pid} memlock rlimit to ${bytes}: ${(error as Error).message}`,
      { cause: error },
    );
  }
}

/** A limit that was set: on which process, to how many bytes. */
export interface MemlockSet {
  /** The process. */
  pid: number;
  /** Its command name. */
  command: string;
  /** The soft and hard limit, in bytes. */
  bytes: number;
}

/** Whether the VMI pins its memory: a VFIO device, a realtime vCPU or SEV (KubeVirt's test). */
export function needsLockedMemory(vmi: VirtualMachineInstance): boolean {
  const domain = vmi.spec.domain;
  const devices = domain.devices as Record<string, unknown>;
  const listed = (name: string) => Array.isArray(devices[name]) && (devices[name] as []).length > 0;
  if (listed("hostDevices") || listed("gpus")) return true;
  if ((domain.devices.interfaces ?? []).some((i) => i.sriov !== undefined && i.sriov !== null)) {
    return true;
  }
  const cpu = domain.cpu as { realtime?: unknown } | undefined;
  if (cpu?.realtime !== undefined && cpu.realtime !== null) return true;
  const security = domain.launchSecurity as { sev?: unknown; snp?: unknown } | undefined | null;
  return Boolean(security && (security.sev != null || security.snp != null));
}

/** A quantity of the VMI's memory spec or requests, in bytes; undefined when absent. */
function memory(value: unknown): number | undefined {
  return typeof value === "string" || typeof value === "number" ? parseQuantity(value) : undefined;
}

/** Bytes rounded up to whole kilobytes, in bytes (a Quantity's `ScaledValue(Kilo)` and back). */
function wholeKilobytes(bytes: number): number {
  return Math.ceil(bytes / 1000) * 1000;
}

function requestedMemory(vmi: VirtualMachineInstance): number {
  return memory(
    (vmi.spec.domain.resources?.requests as Record<string, unknown> | undefined)
      ?.memory,
  ) ?? 0;
}

/** virtqemud's limit: the launcher's overhead plus the guest's memory at boot. */
export function virtqemudMemlockBytes(vmi: VirtualMachineInstance, ratio?: string): number {
  const guest = memory(vmi.spec.domain.memory?.guest) ?? requestedMemory(vmi);
  return launcherMemoryOverhead(vmi, ratio) + wholeKilobytes(guest);
}

/** QEMU's limit: the launcher's overhead plus the most memory the guest may grow to. */
export function qemuMemlockBytes(vmi: VirtualMachineInstance, ratio?: string): number {
  const most = memory((vmi.spec.domain.memory as { maxGuest?: unknown } | undefined)?.maxGuest) ??
    requestedMemory(vmi);
  return launcherMemoryOverhead(vmi, ratio) + wholeKilobytes(most);
}

/** Parses one `/proc/<pid>/stat`; undefined for a line that is not one. */
export function parseProcStat(text: string): ProcessEntry | undefined {
  // The command name may hold spaces and ")": it ends at the last ")".
  const open = text.indexOf(" (");
  const close = text.lastIndexOf(")");
  if (open < 0 || close < open) return undefined;
  const pid = Number(text.slice(0, open));
  const ppid = Number(text.slice(close + 2).split(" ")[1]);
  if (!Number.isInteger(pid) || !Number.isInteger(ppid)) return undefined;
  return { pid, ppid, command: text.slice(open + 2, close) };
}

/** The host's processes (those that exit while being read are left out). */
export async function readProcesses(procRoot = "/proc"): Promise<ProcessEntry[]> {
  const out: ProcessEntry[] = [];
  for await (const entry of Deno.readDir(procRoot)) {
    if (!/^\d+$/.test(entry.name)) continue;
    try {
      const parsed = parseProcStat(await Deno.readTextFile(`${procRoot}/${entry.name}/stat`));
      if (parsed) out.push(parsed);
    } catch {
      // Gone since the folder was listed.
    }
  }
  return out;
}

const QEMU_PREFIXES = ["qemu-system", "qemu-kvm"];

/**
 * Sets the limit `bytesOf` gives on the process `find` picks from the host's, for a VMI that
 * pins its memory; undefined when it pins none or `find` picks none.
 */
async function adjust(
  vmi: VirtualMachineInstance,
  options: MemlockOptions,
  find: (processes: ProcessEntry[]) => ProcessEntry | undefined,
  bytesOf: (vmi: VirtualMachineInstance, ratio?: string) => number,
): Promise<MemlockSet | undefined> {
  if (!needsLockedMemory(vmi)) return undefined;
  const found = find(await readProcesses(options.procRoot));
  if (!found) return undefined;
  const bytes = bytesOf(vmi, options.ratio);
  setLimit(options, found.pid, bytes);
  return { pid: found.pid, command: found.command, bytes };
}

/**
 * Sets virtqemud's limit for a VMI that pins its memory, before its domain is defined;
 * `launcherPid` is the launcher's (the process listening on its socket). Undefined when the
 * VMI does not pin memory or no virtqemud runs under the launcher yet (KubeVirt goes on then).
 */
export function adjustVirtqemudMemlock(
  vmi: VirtualMachineInstance,
  launcherPid: number,
  options: MemlockOptions = {},
): Promise<MemlockSet | undefined> {
  return adjust(
    vmi,
    options,
    (processes) => processes.find((p) => p.ppid === launcherPid && p.command === "virtqemud"),
    virtqemudMemlockBytes,
  );
}

/** QEMU among the children of the launcher's parent; throws when there is none. */
function qemuOf(processes: ProcessEntry[], launcherPid: number): ProcessEntry {
  const launcher = processes.find((p) => p.pid === launcherPid);
  if (!launcher) throw new Error(`no process ${launcherPid} (the launcher) found`);
  const children = processes.filter((p) => p.ppid === launcher.ppid);
  for (const prefix of QEMU_PREFIXES) {
    const qemu = children.find((p) => p.command.startsWith(prefix));
    if (qemu) return qemu;
  }
  throw new Error(`no QEMU process found under process ${launcher.ppid} child processes`);
}

/**
 * Sets QEMU's limit for a VMI that pins its memory (undefined when it does not). QEMU is a
 * child of the launcher's parent. Throws when the launcher or its QEMU cannot be found.
 */
export function adjustQemuMemlock(
  vmi: VirtualMachineInstance,
  launcherPid: number,
  options: MemlockOptions = {},
): Promise<MemlockSet | undefined> {
  return adjust(vmi, options, (processes) => qemuOf(processes, launcherPid), qemuMemlockBytes);
}

/**
 * Where a running QEMU's threads may run, what virt-handler does after a dedicated-CPU VMI's
 * domain starts (`handleHousekeeping`): libvirt pins the vCPUs and the emulator thread,
 * and then
 * - with `realtime`, the mask's vCPU threads run under `SCHED_FIFO` priority 1 (pod-less,
 *   libvirt set it already from the domain's `<vcpusched>`; KubeVirt's launcher writes none);
 * - with `isolateEmulatorThread`, every thread that is no vCPU goes to the housekeeping
 *   CPUs (KubeVirt moves them into its `housekeeping` cgroup): also the threads libvirt
 *   does not pin, such as the thread context QEMU preallocates huge pages with, which
 *   starts on every CPU of the memory's NUMA node;
 * - the KVM PIT's kernel thread (`kvm-pit/<qemu pid>`) takes vCPU 0's CPUs, and with
 *   `realtime` also `SCHED_FIFO` priority 2, one above the vCPUs.
 *
 * vCPU threads are QEMU's `CPU <n>/KVM`, and `CPU <n>/TCG` under software emulation (which
 * KubeVirt does not run). The process is found by its domain's name (`-name guest=<name>`).
 *
 * @module
 */
import {
  getAffinity,
  processStartTime,
  SCHED_FIFO,
  setAffinity,
  setScheduler,
} from "../../ffi/mod.ts";

/** What `placeQemuThreads` calls, so that a test can stand in for the kernel. */
export interface ThreadCalls {
  /** Where procfs is: `/proc`. */
  procRoot: string;
  /** The CPUs a thread may run on (`sched_getaffinity`). */
  getAffinity(tid: number): number[];
  /** Lets a thread run on `cpus` only (`sched_setaffinity`). */
  setAffinity(tid: number, cpus: readonly number[]): void;
  /** Sets a thread's policy and priority (`sched_setscheduler`). */
  setScheduler(tid: number, policy: number, priority: number): void;
}

const KERNEL: ThreadCalls = {
  procRoot: "/proc",
  getAffinity,
  setAffinity,
  setScheduler,
};

const VCPU_THREAD = /^CPU (\d+)\/(KVM|TCG)$/;

function readText(path: string): string | undefined {
  try {
    return Deno.readTextFileSync(path);
  } catch {
    return undefined;
  }
}

/**
 * The PID of the QEMU running domain `name` (its `-name guest=<name>,…`), if any; only
 * processes `accept` takes count (a launcher pod's own, where another pod could start a
 * process of that name).
 */
export function findQemuPid(
  name: string,
  options: { procRoot?: string; accept?: (pid: number) => boolean } = {},
): number | undefined {
  const procRoot = options.procRoot ?? "/proc";
  const wanted = `guest=${name},`;
  for (const entry of Deno.readDirSync(procRoot)) {
    if (!/^\d+$/.test(entry.name)) continue;
    if (options.accept && !options.accept(Number(entry.name))) continue;
    const args = readText(`${procRoot}/${entry.name}/cmdline`)?.split("\0") ?? [];
    const at = args.indexOf("-name");
    if (at >= 0 && args[at + 1]?.startsWith(wanted) && /qemu/.test(args[0] ?? "")) {
      return Number(entry.name);
    }
  }
  return undefined;
}

/**
 * Finds a domain's QEMU once and keeps it while that process lives (its PID and start time),
 * so that placing its threads on every sync does not read every process's command line.
 */
export class QemuLocator {
  readonly #known = new Map<string, { pid: number; start: string }>();

  /**
   * The QEMU of domain `name` for `key` (a VMI), and whether it is another process than the
   * one the last call for `key` found; undefined while none runs.
   */
  locate(
    key: string,
    name: string,
    accept?: (pid: number) => boolean,
  ): { pid: number; fresh: boolean } | undefined {
    const known = this.#known.get(key);
    if (known && processStartTime(known.pid) === known.start) {
      return { pid: known.pid, fresh: false };
    }
    const pid = findQemuPid(name, { accept });
    const start = pid === undefined ? undefined : processStartTime(pid);
    if (pid === undefined || start === undefined) {
      this.#known.delete(key);
      return undefined;
    }
    this.#known.set(key, { pid, start });
    return { pid, fresh: true };
  }

  /** Forgets `key`'s QEMU (its VMI is gone). */
  forget(key: string): void {
    this.#known.delete(key);
  }
}

/** A process's threads by name: thread ID -> `comm`. */
function threadsOf(pid: number, procRoot: string): Map<number, string> {
  const out = new Map<number, string>();
  for (const entry of Deno.readDirSync(`${procRoot}/${pid}/task`)) {
    const comm = readText(`${procRoot}/${pid}/task/${entry.name}/comm`);
    if (comm !== undefined) out.set(Number(entry.name), comm.trim());
  }
  return out;
}

/** The KVM PIT kernel thread of QEMU `pid` (`kvm-pit/<pid>`), if KVM made one. */
function pitThread(pid: number, procRoot: string): number | undefined {
  const wanted = `kvm-pit/${pid}`;
  for (const entry of Deno.readDirSync(procRoot)) {
    if (!/^\d+$/.test(entry.name)) continue;
    if (readText(`${procRoot}/${entry.name}/comm`)?.trim() === wanted) return Number(entry.name);
  }
  return undefined;
}

/** How {@linkcode placeQemuThreads} places a QEMU's threads. */
export interface ThreadPlan {
  /** The housekeeping CPUs (the emulator's), with `isolateEmulatorThread`; none: left alone. */
  housekeeping?: readonly number[];
  /** Whether the VMI is realtime (the PIT thread then gets FIFO 2). */
  realtime: boolean;
  /** Which vCPUs run under FIFO priority 1 (the realtime mask's); none: left alone. */
  fifo?: (vcpu: number) => boolean;
  /**
   * Whether to look for the PIT thread (every process is read for it): true unless told,
   * false once it was placed for this QEMU (virt-handler places it once, before Running).
   */
  pit?: boolean;
}

/** What {@linkcode placeQemuThreads} did. */
export interface ThreadPlacement {
  /** Threads moved to the housekeeping CPUs (already there: left alone). */
  moved: number[];
  /** The PIT thread, when there is one. */
  pit?: number;
}

/**
 * Places QEMU `pid`'s threads as the module doc says; `housekeeping` is the emulator's CPU
 * set (none: `isolateEmulatorThread` is off). Idempotent. Throws `ErrnoError` when the
 * kernel refuses a change.
 */
export function placeQemuThreads(
  pid: number,
  plan: ThreadPlan,
  calls: ThreadCalls = KERNEL,
): ThreadPlacement {
  const threads = threadsOf(pid, calls.procRoot);
  const moved: number[] = [];
  let vcpu0: number | undefined;
  for (const [tid, comm] of threads) {
    const vcpu = VCPU_THREAD.exec(comm);
    if (vcpu) {
      if (vcpu[1] === "0") vcpu0 = tid;
      if (plan.fifo?.(Number(vcpu[1]))) calls.setScheduler(tid, SCHED_FIFO, 1);
      continue;
    }
    if (!plan.housekeeping) continue;
    const now = calls.getAffinity(tid);
    if (
      now.length === plan.housekeeping.length && now.every((c, i) => c === plan.housekeeping![i])
    ) {
      continue;
    }
    calls.setAffinity(tid, plan.housekeeping);
    moved.push(tid);
  }
  const pit = plan.pit === false ? undefined : pitThread(pid, calls.procRoot);
  if (pit !== undefined) {
    if (plan.realtime) calls.setScheduler(pit, SCHED_FIFO, 2);
    if (vcpu0 !== undefined) calls.setAffinity(pit, calls.getAffinity(vcpu0));
  }
  return { moved, ...(pit !== undefined ? { pit } : {}) };
}

/**
 * Threads' CPU affinity and scheduling policy (`sched_setaffinity(2)`,
 * `sched_setscheduler(2)`), as virt-handler sets them for the threads of a VM with
 * dedicated or realtime CPUs. A thread is named by its thread ID (a `/proc/<pid>/task`
 * entry). Failures throw {@linkcode ErrnoError}.
 *
 * @module
 */

import { c, check } from "./_libc.ts";

/** `SCHED_FIFO`, the first-in first-out realtime policy. */
export const SCHED_FIFO = 1;

/** Bytes of the CPU masks passed to the kernel: 1024 CPUs, glibc's `cpu_set_t`. */
const MASK_BYTES = 128;

/** Sets thread `tid`'s policy and realtime priority (`sched_setscheduler(2)`). */
export function setScheduler(tid: number, policy: number, priority: number): void {
  const param = new Int32Array([priority]);
  check(
    c().sched_setscheduler(tid, policy, new Uint8Array(param.buffer)),
    `Cannot set the scheduling policy ${policy} (priority ${priority}) of thread ${tid}`,
  );
}

/** The CPUs thread `tid` may run on, ascending (`sched_getaffinity(2)`). */
export function getAffinity(tid: number): number[] {
  const mask = new Uint8Array(MASK_BYTES);
  check(
    c().sched_getaffinity(tid, BigInt(MASK_BYTES), mask),
    `Cannot read the CPU affinity of thread ${tid}`,
  );
  const cpus: number[] = [];
  for (let cpu = 0; cpu < MASK_BYTES * 8; cpu++) {
    if (mask[cpu >> 3] & (1 << (cpu & 7))) cpus.push(cpu);
  }
  return cpus;
}

/** Lets thread `tid` run on `cpus` only (`sched_setaffinity(2)`). */
export function setAffinity(tid: number, cpus: readonly number[]): void {
  const mask = new Uint8Array(MASK_BYTES);
  for (const cpu of cpus) {
    if (!Number.isInteger(cpu) || cpu < 0 || cpu >= MASK_BYTES * 8) {
      throw new RangeError(`CPU ${cpu} is outside 0-${MASK_BYTES * 8 - 1}`);
    }
    mask[cpu >> 3] |= 1 << (cpu & 7);
  }
  check(
    c().sched_setaffinity(tid, BigInt(MASK_BYTES), mask),
    `Cannot set the CPU affinity of thread ${tid} to ${cpus.join(",")}`,
  );
}

/**
 * Processes: naming one with a pidfd (`pidfd_open(2)`), which no later process that reuses
 * its PID answers to, signalling it through that pidfd and telling whether it has exited;
 * a process's start time, which tells it from a later one with its PID; and keeping the
 * agent's descriptors from the processes it starts (close-on-exec); and setting another
 * process's locked-memory limit (`prlimit(2)`). Failures throw
 * {@linkcode ErrnoError}.
 *
 * @module
 */

import { ErrnoError } from "./errors.ts";
import { c, check, errnoError } from "./_libc.ts";

/** `close_range(2)`'s flag that marks instead of closing (Linux 5.11). */
const CLOSE_RANGE_CLOEXEC = 1 << 2;

/**
 * Marks every descriptor from `first` on close-on-exec, so that a process started next
 * inherits none of them. Deno's Node compatibility layer (which grpc-js uses) opens its
 * sockets without `O_CLOEXEC`: without this, every child would hold the parent's
 * listening sockets and connections. Throws {@linkcode ErrnoError}.
 */
export function closeOnExecFrom(first = 3): void {
  if (c().close_range(first, 0xffffffff, CLOSE_RANGE_CLOEXEC) !== 0) {
    throw errnoError(`Cannot mark descriptors from ${first} on close-on-exec`);
  }
}

/** `RLIMIT_MEMLOCK`: the bytes a process may lock in memory (VFIO pins the guest's). */
const RLIMIT_MEMLOCK = 8;

/**
 * Sets both the soft and the hard `RLIMIT_MEMLOCK` of process `pid` to `bytes`
 * (`prlimit(2)`, which needs `CAP_SYS_RESOURCE` to raise a hard limit). Throws
 * {@linkcode ErrnoError} (`ESRCH` when no such process exists).
 */
export function setMemlockLimit(pid: number, bytes: number): void {
  const limit = new BigUint64Array([BigInt(bytes), BigInt(bytes)]);
  check(
    c().prlimit64(pid, RLIMIT_MEMLOCK, new Uint8Array(limit.buffer), null),
    `Cannot set the locked-memory limit of process ${pid} to ${bytes} bytes`,
  );
}

/** Signal number of `SIGKILL`, for {@linkcode pidfdSendSignal}. */
export const SIGKILL = 9;
/**
 * A process's start time in clock ticks after boot (field 22 of `/proc/<pid>/stat`): with
 * the PID it names one process, telling it from a later one that reused the PID.
 * Undefined when the process is gone.
 */
export function processStartTime(pid: number): string | undefined {
  let stat: string;
  try {
    stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
  } catch {
    return undefined;
  }
  // Field 2, the command name, may hold spaces and ")": count from after its last ")".
  return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[22 - 3];
}

/** Signal number of `SIGTERM`, for {@linkcode pidfdSendSignal}. */
export const SIGTERM = 15;

/**
 * Opens a pidfd (`pidfd_open(2)`, Linux 5.3) for the process `pid`: a descriptor that
 * names that one process for as long as it is open, even after its PID is reused. Close it
 * with {@linkcode close}; it is close-on-exec. Throws {@linkcode ErrnoError} (`ESRCH` when
 * no such process exists).
 */
export function pidfdOpen(pid: number): number {
  return check(c().pidfd_open(pid, 0), `Cannot open a pidfd for process ${pid}`);
}

/**
 * Sends `signal` (a number, e.g. {@linkcode SIGTERM}; 0 only checks) to the process a
 * pidfd names (`pidfd_send_signal(2)`). Never reaches another process that reused the
 * PID. Throws {@linkcode ErrnoError} (`ESRCH` once the process has exited).
 */
export function pidfdSendSignal(pidfd: number, signal: number): void {
  check(
    c().pidfd_send_signal(pidfd, signal, null, 0),
    `Cannot send signal ${signal} through pidfd ${pidfd}`,
  );
}

const POLLIN = 0x1;

/**
 * Whether the process a pidfd names has exited (its pidfd polls readable), without
 * waiting. True for a zombie too: it has exited, whoever reaps it.
 */
export function pidfdExited(pidfd: number): boolean {
  const pollfd = new Uint8Array(8); // struct pollfd { int fd; short events; short revents; }
  const view = new DataView(pollfd.buffer);
  view.setInt32(0, pidfd, true);
  view.setInt16(4, POLLIN, true);
  check(c().poll(pollfd, 1n, 0), `Cannot poll pidfd ${pidfd}`);
  const revents = view.getInt16(6, true);
  if (revents & 0x20 /* POLLNVAL */) {
    throw new ErrnoError(`Cannot poll pidfd ${pidfd}`, 9, "Bad file descriptor");
  }
  return (revents & POLLIN) !== 0;
}

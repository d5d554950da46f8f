/**
 * The libc library the FFI layer's libc calls go through, private to `ffi/`: the symbol
 * table, opened on first use, and the helpers every call site shares (a C string of a path,
 * errno as an {@linkcode ErrnoError}).
 *
 * All calls through it are synchronous FFI calls on the calling thread, so errno (which is
 * per thread) is read on the thread that failed, right after the failing call.
 *
 * @module
 */

import { ErrnoError } from "./errors.ts";

const P = "pointer" as const;
const B = "buffer" as const;
const I = "i32" as const;
const U = "u32" as const;

const LIBC_SYMBOLS = {
  __errno_location: { parameters: [], result: P },
  strerror: { parameters: [I], result: P },
  open: { parameters: [B, I, U], result: I },
  close: { parameters: [I], result: I },
  setns: { parameters: [I, I], result: I },
  unshare: { parameters: [I], result: I },
  mount: { parameters: [B, B, B, "u64", B], result: I },
  umount2: { parameters: [B, I], result: I },
  fchownat: { parameters: [I, B, U, U, I], result: I },
  syscall: { parameters: ["i64", "i64", B, B, "u64"], result: "i64" },
  socket: { parameters: [I, I, I], result: I },
  connect: { parameters: [I, B, U], result: I },
  getsockopt: { parameters: [I, I, I, B, B], result: I },
  close_range: { parameters: [U, U, I], result: I },
  pidfd_open: { parameters: [I, U], result: I },
  prlimit64: { parameters: [I, I, B, B], result: I },
  sched_setscheduler: { parameters: [I, I, B], result: I },
  sched_getaffinity: { parameters: [I, "u64", B], result: I },
  sched_setaffinity: { parameters: [I, "u64", B], result: I },
  pidfd_send_signal: { parameters: [I, I, P, U], result: I },
  poll: { parameters: [B, "u64", I], result: I },
  bind: { parameters: [I, B, U], result: I },
  setsockopt: { parameters: [I, I, I, B, U], result: I },
  recvfrom: { parameters: [I, B, "u64", I, B, B], result: "i64" },
  sendto: { parameters: [I, B, "u64", I, B, U], result: "i64" },
  write: { parameters: [I, B, "u64"], result: "i64" },
  read: { parameters: [I, B, "u64"], result: "i64" },
  ioctl: { parameters: [I, "u64", B], result: I },
  if_nametoindex: { parameters: [B], result: U },
  eventfd: { parameters: [U, I], result: I },
  fstat: { parameters: [I, B], result: I },
  fchdir: { parameters: [I], result: I },
  statx: { parameters: [I, B, I, U, B], result: I },
  ftruncate: { parameters: [I, "i64"], result: I },
  fchmod: { parameters: [I, U], result: I },
  fstatfs: { parameters: [I, B], result: I },
  renameat2: { parameters: [I, B, I, B, U], result: I },
  mknodat: { parameters: [I, B, U, "u64"], result: I },
  mkdirat: { parameters: [I, B, U], result: I },
  lgetxattr: { parameters: [B, B, B, "u64"], result: "i64" },
  lsetxattr: { parameters: [B, B, B, "u64", I], result: I },
  lremovexattr: { parameters: [B, B], result: I },
  open_tree: { name: "syscall", parameters: ["i64", "i64", B, "u64"], result: "i64" },
  bpf: { name: "syscall", parameters: ["i64", "i64", B, "u64"], result: "i64" },
  move_mount: {
    name: "syscall",
    parameters: ["i64", "i64", B, "i64", B, "u64"],
    result: "i64",
  },
  mount_setattr: {
    name: "syscall",
    parameters: ["i64", "i64", B, "u64", B, "u64"],
    result: "i64",
  },
} as const;

let libc: Deno.DynamicLibrary<typeof LIBC_SYMBOLS> | null = null;

/** The libc symbols, the library opened on first use. */
export function c(): Deno.DynamicLibrary<typeof LIBC_SYMBOLS>["symbols"] {
  libc ??= Deno.dlopen("libc.so.6", LIBC_SYMBOLS);
  return libc.symbols;
}

/** UTF-8, for paths and names handed to libc. */
export const encoder = new TextEncoder();

/** `s` as a NUL-terminated C string. */
export function cpath(s: string): Uint8Array<ArrayBuffer> {
  const bytes = encoder.encode(s);
  const out = new Uint8Array(bytes.length + 1);
  out.set(bytes);
  return out;
}

/** Reads errno of this thread and builds the error. Call right after the failing call. */
export function errnoError(action: string): ErrnoError {
  const sym = c();
  const errno = new Deno.UnsafePointerView(sym.__errno_location()!).getInt32(0);
  const description = Deno.UnsafePointerView.getCString(sym.strerror(errno)!);
  return new ErrnoError(action, errno, description);
}

/** Gives `rc`, or throws errno as an {@linkcode ErrnoError} for `action` when it is negative. */
export function check(rc: number, action: string): number {
  if (rc < 0) throw errnoError(action);
  return rc;
}

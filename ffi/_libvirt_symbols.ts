/**
 * Raw libvirt symbol table for `Deno.dlopen`, and the loader that turns a missing library
 * into a startup error naming the Debian package. Private to `ffi/`.
 *
 * @module
 */

import { LibvirtLoadError } from "./errors.ts";

/** The soname libvirt is loaded by; a plain name keeps `deno compile`d binaries portable. */
export const LIBVIRT_SONAME = "libvirt.so.0";
/** The soname of libvirt's QEMU-specific API (guest agent commands). */
export const LIBVIRT_QEMU_SONAME = "libvirt-qemu.so.0";

const P = "pointer" as const;
const B = "buffer" as const;
const I = "i32" as const;
const U = "u32" as const;

/** Symbols used by the call worker (synchronous calls) and the main thread (events). */
export const LIBVIRT_SYMBOLS = {
  // Errors (per OS thread).
  virGetLastError: { parameters: [], result: P },
  virResetLastError: { parameters: [], result: "void" },
  virSetErrorFunc: { parameters: [P, "function"], result: "void" },
  virGetVersion: { parameters: [B, B, B], result: I },

  // Event loop (process-wide).
  virEventRegisterDefaultImpl: { parameters: [], result: I },
  virEventRunDefaultImpl: { parameters: [], result: I, nonblocking: true },
  virEventAddTimeout: { parameters: [I, "function", P, P], result: I },
  virEventUpdateTimeout: { parameters: [I, I], result: "void" },

  // Connection.
  virConnectOpen: { parameters: [B], result: P },
  virConnectOpenReadOnly: { parameters: [B], result: P },
  virConnectClose: { parameters: [P], result: I },
  virConnectRef: { parameters: [P], result: I },
  virConnectGetVersion: { parameters: [P, B], result: I },
  virConnectGetCapabilities: { parameters: [P], result: P },
  virConnectGetDomainCapabilities: { parameters: [P, B, B, B, B, U], result: P },
  virConnectBaselineHypervisorCPU: { parameters: [P, B, B, B, B, B, U, U], result: P },
  virConnectSetKeepAlive: { parameters: [P, I, U], result: I },
  virConnectRegisterCloseCallback: { parameters: [P, "function", P, P], result: I },
  virConnectUnregisterCloseCallback: { parameters: [P, "function"], result: I },
  virConnectIsAlive: { parameters: [P], result: I },
  virConnectDomainEventRegisterAny: { parameters: [P, P, I, "function", P, P], result: I },
  virConnectDomainEventDeregisterAny: { parameters: [P, I], result: I },
  virConnectListAllDomains: { parameters: [P, B, U], result: I },
  virConnectGetAllDomainStats: { parameters: [P, U, B, U], result: I },
  virDomainStatsRecordListFree: { parameters: [P], result: "void" },
  virDomainListGetStats: { parameters: [B, U, B, U], result: I },
  virNodeGetCPUMap: { parameters: [P, P, P, U], result: I },

  // Domains.
  virDomainDefineXML: { parameters: [P, B], result: P },
  virDomainCreateXML: { parameters: [P, B, U], result: P },
  virDomainLookupByName: { parameters: [P, B], result: P },
  virDomainLookupByUUIDString: { parameters: [P, B], result: P },
  virDomainFree: { parameters: [P], result: I },
  virDomainGetVcpusFlags: { parameters: [P, U], result: I },
  virDomainGetVcpuPinInfo: { parameters: [P, I, B, I, U], result: I },
  virDomainStartDirtyRateCalc: { parameters: [P, I, U], result: I },
  virDomainGetName: { parameters: [P], result: P },
  virDomainGetUUIDString: { parameters: [P, B], result: I },
  virDomainGetID: { parameters: [P], result: U },
  virDomainGetState: { parameters: [P, B, B, U], result: I },
  virDomainGetXMLDesc: { parameters: [P, U], result: P },
  virDomainCreateWithFlags: { parameters: [P, U], result: I },
  virDomainShutdownFlags: { parameters: [P, U], result: I },
  virDomainDestroyFlags: { parameters: [P, U], result: I },
  virDomainUndefineFlags: { parameters: [P, U], result: I },
  virDomainSuspend: { parameters: [P], result: I },
  virDomainResume: { parameters: [P], result: I },
  virDomainReset: { parameters: [P, U], result: I },
  virDomainReboot: { parameters: [P, U], result: I },
  virDomainAttachDeviceFlags: { parameters: [P, B, U], result: I },
  virDomainDetachDeviceFlags: { parameters: [P, B, U], result: I },
  virDomainUpdateDeviceFlags: { parameters: [P, B, U], result: I },
  virDomainSetVcpusFlags: { parameters: [P, U, U], result: I },
  virDomainPinVcpuFlags: { parameters: [P, U, B, I, U], result: I },
  virDomainCoreDumpWithFormat: { parameters: [P, B, U, U], result: I },
  virDomainSetTime: { parameters: [P, "i64", U, U], result: I },
  virDomainFSFreeze: { parameters: [P, P, U, U], result: I },
  virDomainFSThaw: { parameters: [P, P, U, U], result: I },
  virDomainScreenshot: { parameters: [P, P, U, U], result: P },
  virStreamNew: { parameters: [P, U], result: P },
  virStreamRecv: { parameters: [P, B, "usize"], result: I },
  virStreamFinish: { parameters: [P], result: I },
  virStreamAbort: { parameters: [P], result: I },
  virStreamFree: { parameters: [P], result: I },

  // Migration.
  virDomainMigrateToURI3: { parameters: [P, B, P, U, U], result: I },
  virDomainGetJobStats: { parameters: [P, B, B, B, U], result: I },
  virDomainAbortJob: { parameters: [P], result: I },
  virDomainMigrateSetMaxDowntime: { parameters: [P, "u64", U], result: I },
  virDomainMigrateStartPostCopy: { parameters: [P, U], result: I },
  virTypedParamsAddString: { parameters: [B, B, B, B, B], result: I },
  virTypedParamsAddULLong: { parameters: [B, B, B, B, "u64"], result: I },
  virTypedParamsAddInt: { parameters: [B, B, B, B, I], result: I },
  virTypedParamsFree: { parameters: [P, I], result: "void" },
} as const;

/** libc's `free`, for strings and arrays libvirt hands back. */
export const LIBC_FREE_SYMBOLS = {
  free: { parameters: [P], result: "void" },
} as const;

const LIBC_DL_SYMBOLS = {
  dlopen: { parameters: [B, I], result: P },
  dlsym: { parameters: [P, B], result: P },
} as const;

const RTLD_NOW = 0x2;
const RTLD_NOLOAD = 0x4;

/**
 * Stops libvirt from printing every error to stderr (its default error handler): errors
 * reach callers as typed errors instead. The handler installed is libvirt's own
 * `virResetError`, called as `handler(userData = NULL, error)`, which returns at once
 * for a NULL argument; a C function keeps worker threads from calling into JavaScript.
 */
export function silenceDefaultErrorHandler(lib: LibvirtLibrary, path: string): void {
  const dl = Deno.dlopen("libc.so.6", LIBC_DL_SYMBOLS);
  try {
    const handle = dl.symbols.dlopen(cstr(path), RTLD_NOW | RTLD_NOLOAD);
    if (handle === null) return;
    const resetError = dl.symbols.dlsym(handle, cstr("virResetError"));
    if (resetError !== null) lib.symbols.virSetErrorFunc(null, resetError);
  } finally {
    dl.close();
  }
}

/** Symbols of `libvirt-qemu.so.0`. */
export const LIBVIRT_QEMU_SYMBOLS = {
  virDomainQemuAgentCommand: { parameters: [P, B, I, U], result: P },
} as const;

/** An opened libvirt. */
export type LibvirtLibrary = Deno.DynamicLibrary<typeof LIBVIRT_SYMBOLS>;
/** An opened libvirt-qemu. */
export type LibvirtQemuLibrary = Deno.DynamicLibrary<typeof LIBVIRT_QEMU_SYMBOLS>;
/** libc's `free`. */
export type LibcFreeLibrary = Deno.DynamicLibrary<typeof LIBC_FREE_SYMBOLS>;

/** Opens libvirt, or throws {@linkcode LibvirtLoadError} naming the Debian package. */
export function loadLibvirt(path: string = LIBVIRT_SONAME): LibvirtLibrary {
  try {
    return Deno.dlopen(path, LIBVIRT_SYMBOLS);
  } catch (cause) {
    throw new LibvirtLoadError(path, "libvirt0", cause);
  }
}

/** Opens libvirt-qemu, or throws {@linkcode LibvirtLoadError} naming the Debian package. */
export function loadLibvirtQemu(path: string = LIBVIRT_QEMU_SONAME): LibvirtQemuLibrary {
  try {
    return Deno.dlopen(path, LIBVIRT_QEMU_SYMBOLS);
  } catch (cause) {
    throw new LibvirtLoadError(path, "libvirt0", cause);
  }
}

/** Opens libc for `free`. */
export function loadLibcFree(): LibcFreeLibrary {
  return Deno.dlopen("libc.so.6", LIBC_FREE_SYMBOLS);
}

const encoder = new TextEncoder();

/** A NUL-terminated copy of `s` for a `buffer` parameter; `null` stays `null`. */
export function cstr(s: string): Uint8Array<ArrayBuffer>;
/** A NUL-terminated copy of `s`, or `null`. */
export function cstr(s: string | null | undefined): Uint8Array<ArrayBuffer> | null;
export function cstr(s: string | null | undefined): Uint8Array<ArrayBuffer> | null {
  if (s === null || s === undefined) return null;
  const bytes = encoder.encode(s);
  const out = new Uint8Array(bytes.length + 1);
  out.set(bytes);
  return out;
}

/** Reads a C string; `null` for a null pointer. */
export function readCString(ptr: Deno.PointerValue): string | null {
  return ptr === null ? null : Deno.UnsafePointerView.getCString(ptr);
}

/**
 * Typed errors of the FFI layer: libvirt failures, a missing library, and libc errno.
 *
 * @module
 */

/**
 * The text of a thrown value for a log line, a condition or an RPC's answer: an `Error`'s
 * message, anything else as `String()` gives it. The one place this rule is written.
 */
export function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** What libvirt reported about a failed call (copied out of its per-thread `virError`). */
export interface LibvirtErrorDetails {
  /** `virErrorNumber`, e.g. 42 (`VIR_ERR_NO_DOMAIN`). */
  code: number;
  /** `virErrorDomain`: the part of libvirt that raised the error. */
  domain: number;
  /** `virErrorLevel`: 1 warning, 2 error. */
  level: number;
  /** libvirt's human-readable message. */
  message: string;
}

/** Names of the `virErrorNumber` codes callers most often branch on. */
export const LIBVIRT_ERROR_CODES: Readonly<Record<string, number>> = Object.freeze({
  VIR_ERR_OK: 0,
  VIR_ERR_INTERNAL_ERROR: 1,
  VIR_ERR_NO_MEMORY: 2,
  VIR_ERR_NO_SUPPORT: 3,
  VIR_ERR_NO_CONNECT: 5,
  VIR_ERR_INVALID_CONN: 6,
  VIR_ERR_INVALID_DOMAIN: 7,
  VIR_ERR_INVALID_ARG: 8,
  VIR_ERR_OPERATION_FAILED: 9,
  VIR_ERR_XML_ERROR: 27,
  VIR_ERR_DOM_EXIST: 28,
  VIR_ERR_XML_DETAIL: 35,
  VIR_ERR_SYSTEM_ERROR: 38,
  VIR_ERR_RPC: 39,
  VIR_ERR_NO_DOMAIN: 42,
  VIR_ERR_OPERATION_INVALID: 55,
  VIR_ERR_CONFIG_UNSUPPORTED: 67,
  VIR_ERR_OPERATION_TIMEOUT: 68,
  VIR_ERR_ARGUMENT_UNSUPPORTED: 74,
  VIR_ERR_OPERATION_UNSUPPORTED: 84,
  VIR_ERR_AGENT_UNRESPONSIVE: 86,
  VIR_ERR_AGENT_UNSYNCED: 97,
});

/**
 * A failed libvirt call. The message names the action and carries libvirt's own text:
 * `Cannot define domain: libvirt: XML error: ...`.
 */
export class LibvirtError extends Error {
  /** `virErrorNumber` (see {@linkcode LIBVIRT_ERROR_CODES}). */
  readonly code: number;
  /** `virErrorDomain`. */
  readonly domain: number;
  /** `virErrorLevel`. */
  readonly level: number;
  /** libvirt's message alone. */
  readonly libvirtMessage: string;
  /** The failed action, e.g. `Cannot start domain "vm1"`. */
  readonly action: string;

  /** Builds the error from the failed action and what libvirt reported. */
  constructor(action: string, details: LibvirtErrorDetails, options?: ErrorOptions) {
    super(`${action}: libvirt: ${details.message}`, options);
    this.name = "LibvirtError";
    this.code = details.code;
    this.domain = details.domain;
    this.level = details.level;
    this.libvirtMessage = details.message;
    this.action = action;
  }

  /** The `VIR_ERR_*` name of {@linkcode code} when it is a well-known one. */
  get codeName(): string | undefined {
    return Object.entries(LIBVIRT_ERROR_CODES).find(([, v]) => v === this.code)?.[0];
  }
}

/** The libvirt shared library could not be loaded; names the Debian package to install. */
export class LibvirtLoadError extends Error {
  /** The path or soname that failed to load. */
  readonly library: string;
  /** The Debian package that provides it. */
  readonly debianPackage: string;

  /** Builds the error from the library, its package and the dlopen failure. */
  constructor(library: string, debianPackage: string, cause: unknown) {
    const detail = errorText(cause);
    super(
      `Cannot load ${library}: install the Debian package "${debianPackage}": ${detail}`,
      { cause },
    );
    this.name = "LibvirtLoadError";
    this.library = library;
    this.debianPackage = debianPackage;
  }
}

/** Linux errno names by number (x86_64). */
export const ERRNO_NAMES: Readonly<Record<number, string>> = Object.freeze({
  1: "EPERM",
  2: "ENOENT",
  3: "ESRCH",
  4: "EINTR",
  5: "EIO",
  6: "ENXIO",
  7: "E2BIG",
  8: "ENOEXEC",
  9: "EBADF",
  10: "ECHILD",
  11: "EAGAIN",
  12: "ENOMEM",
  13: "EACCES",
  14: "EFAULT",
  15: "ENOTBLK",
  16: "EBUSY",
  17: "EEXIST",
  18: "EXDEV",
  19: "ENODEV",
  20: "ENOTDIR",
  21: "EISDIR",
  22: "EINVAL",
  23: "ENFILE",
  24: "EMFILE",
  25: "ENOTTY",
  26: "ETXTBSY",
  27: "EFBIG",
  28: "ENOSPC",
  29: "ESPIPE",
  30: "EROFS",
  31: "EMLINK",
  32: "EPIPE",
  36: "ENAMETOOLONG",
  38: "ENOSYS",
  39: "ENOTEMPTY",
  40: "ELOOP",
  61: "ENODATA",
  88: "ENOTSOCK",
  92: "ENOPROTOOPT",
  95: "EOPNOTSUPP",
  97: "EAFNOSUPPORT",
  98: "EADDRINUSE",
  104: "ECONNRESET",
  110: "ETIMEDOUT",
  111: "ECONNREFUSED",
});

/** A failed libc call: `Cannot mount "/a" on "/b": EPERM: Operation not permitted`. */
export class ErrnoError extends Error {
  /** The errno value. */
  readonly errno: number;
  /** Its name (`EPERM`, `ELOOP`, ...), or `E<number>` for unnamed ones. */
  readonly code: string;
  /** The failed action. */
  readonly action: string;
  /** The system's description (`strerror`). */
  readonly description: string;

  /** Builds the error from the failed action, errno and the system's description. */
  constructor(action: string, errno: number, description: string, options?: ErrorOptions) {
    const code = ERRNO_NAMES[errno] ?? `E${errno}`;
    super(`${action}: ${code}: ${description}`, options);
    this.name = "ErrnoError";
    this.errno = errno;
    this.code = code;
    this.action = action;
    this.description = description;
  }
}

/**
 * A call on a worker thread that did not end in time:
 * `Cannot prepare the host disks: no answer within 20000 ms`. The call may still be running
 * (a thread stuck in a system call cannot be stopped) and may take effect later.
 */
export class CallTimeoutError extends Error {
  /** The action that timed out. */
  readonly action: string;
  /** How long it was given, ms. */
  readonly timeoutMs: number;

  /** Builds the error from the action and the time it was given. */
  constructor(action: string, timeoutMs: number, options?: ErrorOptions) {
    super(`${action}: no answer within ${timeoutMs} ms`, options);
    this.name = "CallTimeoutError";
    this.action = action;
    this.timeoutMs = timeoutMs;
  }
}

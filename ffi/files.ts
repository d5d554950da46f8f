/**
 * Descriptors and files, and paths beneath a root: `open(2)` and `close(2)` with their
 * flags; `openat2(2)` beneath a directory, where neither `..` nor a symlink leads out of
 * it ({@linkcode openBeneath}); and what is done to a file through such a descriptor or
 * beneath a directory the caller trusts without following a symlink: changing its owner,
 * writing or creating it whole, making a block device node, its identity (`fstat(2)`),
 * its extended attributes and the free space of its file system. `beneath.ts` builds
 * sockets and directories beneath a root on these. Failures throw {@linkcode ErrnoError}.
 *
 * @module
 */

import { c, check, cpath, encoder, errnoError } from "./_libc.ts";

/** `open(2)` flags used here. */
export const O_RDONLY = 0;
/** `open(2)`: write only. */
export const O_WRONLY = 1;
/** `open(2)`: read and write. */
export const O_RDWR = 2;
/** `open(2)`: must be a directory. */
export const O_DIRECTORY = 0o200000;
/** `open(2)`: do not follow a final symlink. */
export const O_NOFOLLOW = 0o400000;
/** `open(2)`: close on exec. */
export const O_CLOEXEC = 0o2000000;
/** `open(2)`: a path-only descriptor. */
export const O_PATH = 0o10000000;

/** `openat2(2)` resolve flag: no crossing of mount points. */
export const RESOLVE_NO_XDEV = 0x01;
/** `openat2(2)` resolve flag: no magic links (`/proc/<pid>/fd/*` and the like). */
export const RESOLVE_NO_MAGICLINKS = 0x02;
/** `openat2(2)` resolve flag: no symlinks at all. */
export const RESOLVE_NO_SYMLINKS = 0x04;
/** `openat2(2)` resolve flag: stay beneath the directory. */
export const RESOLVE_BENEATH = 0x08;
/** `openat2(2)` resolve flag: treat the directory as `/`. */
export const RESOLVE_IN_ROOT = 0x10;

/** `*at(2)`: the current directory. */
export const AT_FDCWD: number = -100;
/** `*at(2)`: do not follow a final symlink. */
export const AT_SYMLINK_NOFOLLOW = 0x100;
/** `*at(2)`: operate on the descriptor itself when the path is empty. */
export const AT_EMPTY_PATH = 0x1000;

const SYS_OPENAT2_X86_64 = 437;

/** Opens `path` (`open(2)`), returning a file descriptor; close it with {@linkcode close}. */
export function open(path: string, flags: number, mode = 0): number {
  return check(c().open(cpath(path), flags, mode), `Cannot open "${path}"`);
}

/** Closes a file descriptor. */
export function close(fd: number): void {
  check(c().close(fd), `Cannot close file descriptor ${fd}`);
}

/** `fchownat(2)`; with {@linkcode AT_SYMLINK_NOFOLLOW} a symlink itself changes owner. */
export function fchownat(
  dirfd: number,
  path: string,
  owner: { uid: number; gid: number },
  flags = 0,
): void {
  check(
    c().fchownat(dirfd, cpath(path), owner.uid >>> 0, owner.gid >>> 0, flags),
    `Cannot change owner of "${path}" to ${owner.uid}:${owner.gid}`,
  );
}

/** Options of {@linkcode openBeneath}. */
export interface OpenBeneathOptions {
  /** `open(2)` flags; `O_PATH` unless told (`O_CLOEXEC` is always added). */
  flags?: number;
  /** Mode for created files. */
  mode?: number;
  /**
   * `RESOLVE_*` flags; unless told `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
   * RESOLVE_NO_MAGICLINKS`, so neither `..` nor any symlink can lead out of the root.
   */
  resolve?: number;
}

/** Opens a directory as a root for {@linkcode openBeneath}; close it with {@linkcode close}. */
export function openRoot(root: string): number {
  return open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
}

/**
 * Opens `path` relative to the directory `rootFd` with `openat2(2)` (x86_64 syscall 437),
 * refusing anything that would leave the root: `..` past it fails with EXDEV, a symlink
 * with ELOOP. Returns a file descriptor; close it with {@linkcode close}.
 */
export function openBeneath(
  rootFd: number,
  path: string,
  options: OpenBeneathOptions = {},
): number {
  const how = new BigUint64Array(3); // struct open_how { u64 flags; u64 mode; u64 resolve; }
  how[0] = BigInt((options.flags ?? O_PATH) | O_CLOEXEC);
  how[1] = BigInt(options.mode ?? 0);
  how[2] = BigInt(
    options.resolve ?? (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS),
  );
  const rc = c().syscall(
    BigInt(SYS_OPENAT2_X86_64),
    BigInt(rootFd),
    cpath(path),
    new Uint8Array(how.buffer),
    BigInt(how.byteLength),
  );
  return check(Number(rc), `Cannot open "${path}" beneath its root`);
}

/**
 * Changes the owner of `path` beneath `root` without following any symlink on the way:
 * the path is opened with {@linkcode openBeneath} and the descriptor itself changes owner.
 */
export function chownBeneath(root: string, path: string, uid: number, gid: number): void {
  const rootFd = openRoot(root);
  try {
    const fd = openBeneath(rootFd, path);
    try {
      fchownat(fd, "", { uid, gid }, AT_EMPTY_PATH);
    } finally {
      close(fd);
    }
  } finally {
    close(rootFd);
  }
}

/** Options of {@linkcode writeFileBeneath}. */
export interface WriteBeneathOptions {
  /** The file's mode; 0o600 unless told. */
  mode?: number;
  /** The file's owner; the caller's unless told. */
  owner?: { uid: number; gid: number };
}

/**
 * Writes `data` to `name` in the directory `dir` (a path the caller trusts, e.g. a
 * {@linkcode openDirectoryInRoot} result) whole or not at all: a new file is created
 * beside it without following any symlink (`O_EXCL` beneath `dir`), written, given its
 * owner through its descriptor, and renamed over `name` (a symlink there is replaced, not
 * followed).
 */
export function writeFileBeneath(
  dir: string,
  name: string,
  data: string | Uint8Array,
  options: WriteBeneathOptions = {},
): void {
  if (name.includes("/") || name === "." || name === "..") {
    throw new Error(`Invalid file name ${JSON.stringify(name)}`);
  }
  const bytes = typeof data === "string" ? encoder.encode(data) : new Uint8Array(data);
  const temp = `.${name}.${crypto.randomUUID().slice(0, 8)}.tmp`;
  const dirFd = openRoot(dir);
  try {
    const fd = openBeneath(dirFd, temp, {
      flags: O_WRONLY | 0o100 /* O_CREAT */ | 0o200, /* O_EXCL */
      mode: options.mode ?? 0o600,
    });
    let renamed = false;
    try {
      for (let done = 0; done < bytes.length;) {
        const chunk = bytes.subarray(done);
        done += check(
          Number(c().write(fd, new Uint8Array(chunk), BigInt(chunk.length))),
          `Cannot write "${name}"`,
        );
      }
      if (options.owner) fchownat(fd, "", options.owner, AT_EMPTY_PATH);
      Deno.renameSync(`${dir}/${temp}`, `${dir}/${name}`);
      renamed = true;
    } finally {
      c().close(fd);
      if (!renamed) {
        try {
          Deno.removeSync(`${dir}/${temp}`);
        } catch { /* never created, or gone */ }
      }
    }
  } finally {
    close(dirFd);
  }
}

/** Options of {@linkcode createFileBeneath}. */
export interface CreateBeneathOptions {
  /** The file's length: a sparse file of this many bytes (0 unless told). */
  size?: number;
  /** The file's mode; 0o600 unless told. */
  mode?: number;
  /** The file's owner; the caller's unless told. */
  owner?: { uid: number; gid: number };
}

/**
 * Creates `name` in the directory `dir` (a path the caller trusts, e.g. a
 * {@linkcode openDirectoryInRoot} result) whole or not at all, and never over anything
 * there: a new file is made beside it without following any symlink (`O_EXCL` beneath
 * `dir`), sized (`ftruncate`, sparse), given its owner through its descriptor, and renamed to
 * `name` only if nothing has that name (`renameat2(RENAME_NOREPLACE)`). Returns false, with
 * nothing changed, when `name` exists (a file, a directory or a planted symlink alike).
 */
export function createFileBeneath(
  dir: string,
  name: string,
  options: CreateBeneathOptions = {},
): boolean {
  if (name.includes("/") || name === "." || name === "..") {
    throw new Error(`Invalid file name ${JSON.stringify(name)}`);
  }
  const temp = `.${name}.${crypto.randomUUID().slice(0, 8)}.tmp`;
  const dirFd = openRoot(dir);
  try {
    const fd = openBeneath(dirFd, temp, {
      flags: O_WRONLY | 0o100 /* O_CREAT */ | 0o200, /* O_EXCL */
      mode: options.mode ?? 0o600,
    });
    let renamed = false;
    try {
      check(c().ftruncate(fd, BigInt(options.size ?? 0)), `Cannot size "${name}"`);
      // The mode as asked, whatever the process's umask.
      check(c().fchmod(fd, options.mode ?? 0o600), `Cannot set the mode of "${name}"`);
      if (options.owner) fchownat(fd, "", options.owner, AT_EMPTY_PATH);
      const rc = c().renameat2(dirFd, cpath(temp), dirFd, cpath(name), 1 /* RENAME_NOREPLACE */);
      if (rc < 0) {
        const error = errnoError(`Cannot rename to "${name}"`);
        if (error.code === "EEXIST") return false;
        throw error;
      }
      renamed = true;
      return true;
    } finally {
      c().close(fd);
      if (!renamed) {
        try {
          Deno.removeSync(`${dir}/${temp}`);
        } catch { /* never created, or gone */ }
      }
    }
  } finally {
    close(dirFd);
  }
}

/**
 * The extended attribute `name` of `path` itself (`lgetxattr(2)`: a final symlink is not
 * followed), as text without a trailing NUL; undefined when the file has no such attribute.
 */
export function getXattr(path: string, name: string): string | undefined {
  const bytes = getXattrBytes(path, name);
  return bytes && new TextDecoder().decode(bytes).replace(/\0+$/, "");
}

/**
 * The extended attribute `name` of `path` itself as bytes (`lgetxattr(2)`: a final symlink
 * is not followed); undefined when the file has no such attribute.
 */
export function getXattrBytes(path: string, name: string): Uint8Array | undefined {
  const buf = new Uint8Array(4096);
  const n = Number(c().lgetxattr(cpath(path), cpath(name), buf, BigInt(buf.length)));
  if (n < 0) {
    const error = errnoError(`Cannot read ${name} of "${path}"`);
    if (error.code === "ENODATA") return undefined;
    throw error;
  }
  return buf.slice(0, n);
}

/** Sets the extended attribute `name` of `path` itself (`lsetxattr(2)`, no final symlink). */
export function setXattrBytes(path: string, name: string, value: Uint8Array): void {
  const bytes = new Uint8Array(value);
  check(
    c().lsetxattr(cpath(path), cpath(name), bytes, BigInt(bytes.length), 0),
    `Cannot set ${name} of "${path}"`,
  );
}

/** Removes the extended attribute `name` of `path` itself; one it does not have is no error. */
export function removeXattr(path: string, name: string): void {
  if (c().lremovexattr(cpath(path), cpath(name)) === 0) return;
  const error = errnoError(`Cannot remove ${name} of "${path}"`);
  if (error.code !== "ENODATA") throw error;
}

/** The bytes an unprivileged user may still write on the file system of `fd` (`fstatfs(2)`). */
export function availableBytes(fd: number): bigint {
  const buf = new Uint8Array(120); // x86_64 struct statfs
  check(c().fstatfs(fd, buf), `Cannot read the file system of descriptor ${fd}`);
  const view = new DataView(buf.buffer);
  return view.getBigUint64(8, true) /* f_bsize */ * view.getBigUint64(32, true); /* f_bavail */
}

/**
 * Makes the block device node `name` in the directory `dir` (a path the caller trusts) for
 * the device `rdev` (`st_rdev`), with `mode`'s permission bits, never following a symlink
 * (`mknodat` fails with EEXIST on anything already there).
 */
export function mknodBlockBeneath(dir: string, name: string, rdev: bigint, mode: number): void {
  if (name.includes("/") || name === "." || name === "..") {
    throw new Error(`Invalid file name ${JSON.stringify(name)}`);
  }
  const dirFd = openRoot(dir);
  try {
    check(
      c().mknodat(dirFd, cpath(name), 0o060000 /* S_IFBLK */ | (mode & 0o777), rdev),
      `Cannot make the block device "${name}"`,
    );
  } finally {
    close(dirFd);
  }
}

/** `st_dev`, `st_ino`, mode, owner and `st_rdev` of a descriptor (`fstat(2)`; x86_64's `struct stat`). */
export function fileIdentity(
  fd: number,
): { dev: bigint; ino: bigint; mode: number; uid: number; gid: number; rdev: bigint } {
  const st = new Uint8Array(144);
  check(c().fstat(fd, st), `Cannot stat file descriptor ${fd}`);
  const view = new DataView(st.buffer);
  return {
    dev: view.getBigUint64(0, true),
    ino: view.getBigUint64(8, true),
    mode: view.getUint32(24, true),
    uid: view.getUint32(28, true),
    gid: view.getUint32(32, true),
    rdev: view.getBigUint64(40, true),
  };
}

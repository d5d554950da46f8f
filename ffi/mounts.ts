/**
 * Mounts. The agent's own bind mount and unmount ({@linkcode bindMount},
 * {@linkcode umount2}), which follow their paths: only for paths the agent owns (a network
 * namespace pinned in its run directory). And the mounts a pod's files take part in, made
 * and removed through descriptors, never through a path a pod controls: a detached clone
 * of a file inside a root (`open_tree`), attached beneath a process's root
 * ({@linkcode attachMountBeneath}, `move_mount`) and detached again
 * ({@linkcode detachMountBeneath}); {@linkcode bindContainerFile} binds a container's file
 * into a launcher's mount namespace with them. Those that change namespace run in
 * `runInMountNamespace`'s child (`mntns.ts`). Failures throw {@linkcode ErrnoError}.
 *
 * @module
 */

import { ErrnoError } from "./errors.ts";
import { c, check, cpath, errnoError } from "./_libc.ts";
import {
  AT_EMPTY_PATH,
  close,
  fileIdentity,
  O_CLOEXEC,
  O_DIRECTORY,
  O_PATH,
  O_RDONLY,
  O_WRONLY,
  open,
  openBeneath,
  openRoot,
  RESOLVE_BENEATH,
  RESOLVE_IN_ROOT,
  RESOLVE_NO_MAGICLINKS,
  RESOLVE_NO_SYMLINKS,
} from "./files.ts";
import { CLONE_FS, CLONE_NEWNS, unshare } from "./namespaces.ts";

/** `mount(2)` flag: ignore set-user-ID bits. */
export const MS_NOSUID = 2;
/** `mount(2)` flag: no device files. */
export const MS_NODEV = 4;
/** `mount(2)` flag: bind mount. */
export const MS_BIND = 4096;
/** `mount(2)` flag: recursive (with bind or propagation changes). */
export const MS_REC = 16384;
/** `umount2(2)` flag: lazy detach. */
export const MNT_DETACH = 2;

/**
 * Bind-mounts `source` on `target` (`mount(2)` with `MS_BIND`; `recursive` adds `MS_REC`),
 * both paths followed: for paths the agent owns (a network namespace pinned in its run
 * directory), never for one a pod controls.
 */
export function bindMount(source: string, target: string, options: { recursive?: boolean } = {}) {
  const flags = MS_BIND | (options.recursive ? MS_REC : 0);
  check(
    c().mount(cpath(source), cpath(target), null, BigInt(flags), null),
    `Cannot mount "${source}" on "${target}"`,
  );
}

/** `umount2(2)`; pass {@linkcode MNT_DETACH} for a lazy unmount. */
export function umount2(target: string, flags = 0): void {
  check(c().umount2(cpath(target), flags), `Cannot unmount "${target}"`);
}

const SYS_OPEN_TREE = 428;
const SYS_MOVE_MOUNT = 429;
const SYS_MOUNT_SETATTR = 442;
const OPEN_TREE_CLONE = 1;
const MOVE_MOUNT_F_EMPTY_PATH = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH = 0x40;
const MOUNT_ATTR_RDONLY = 0x1;
const UMOUNT_NOFOLLOW = 0x8;

const STATX_MNT_ID = 0x1000;

/** The ID of the mount a descriptor's file is on (`statx(STATX_MNT_ID)`, Linux 5.8). */
export function mountIdOf(fd: number): bigint {
  const buf = new Uint8Array(256); // struct statx
  check(
    c().statx(fd, cpath(""), AT_EMPTY_PATH, STATX_MNT_ID, buf),
    `Cannot read the mount of file descriptor ${fd}`,
  );
  return new DataView(buf.buffer).getBigUint64(144, true); // stx_mnt_id
}

const S_IFMT = 0o170000;
const S_IFREG = 0o100000;
const S_IFDIR = 0o040000;

/**
 * A detached bind mount (`open_tree(OPEN_TREE_CLONE)`, Linux 5.2) of the regular file
 * `path` inside the root `rootFd` names, resolved as if that root were `/`
 * (`RESOLVE_IN_ROOT`: the root's own symlinks are followed, none leads out of it, no magic
 * link is followed), read-only when asked (`mount_setattr`). The descriptor can be attached
 * in another mount namespace with {@linkcode attachMountBeneath}; close it with
 * {@linkcode close}. `root` names the root in errors.
 */
function detachedBindMountAt(
  rootFd: number,
  path: string,
  options: { readonly: boolean; directory?: boolean },
  root: string,
): number {
  const source = openBeneath(rootFd, path, {
    flags: O_PATH,
    resolve: RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
  });
  try {
    const kind = fileIdentity(source).mode & S_IFMT;
    if (options.directory && kind !== S_IFDIR) {
      throw new ErrnoError(`Cannot bind "${path}" of ${root}`, 20, "Not a directory");
    }
    if (!options.directory && kind !== S_IFREG) {
      throw new ErrnoError(`Cannot bind "${path}" of ${root}`, 21, "Not a regular file");
    }
    const tree = Number(
      c().open_tree(
        BigInt(SYS_OPEN_TREE),
        BigInt(source),
        cpath(""),
        BigInt(OPEN_TREE_CLONE | O_CLOEXEC | AT_EMPTY_PATH),
      ),
    );
    check(tree, `Cannot clone a mount of "${path}" of ${root}`);
    if (options.readonly) {
      const attr = new BigUint64Array([BigInt(MOUNT_ATTR_RDONLY), 0n, 0n, 0n]); // struct mount_attr
      const rc = Number(
        c().mount_setattr(
          BigInt(SYS_MOUNT_SETATTR),
          BigInt(tree),
          cpath(""),
          BigInt(AT_EMPTY_PATH),
          new Uint8Array(attr.buffer),
          BigInt(attr.byteLength),
        ),
      );
      if (rc < 0) {
        const error = errnoError(`Cannot make the mount of "${path}" read-only`);
        c().close(tree);
        throw error;
      }
    }
    return tree;
  } finally {
    close(source);
  }
}

/**
 * Attaches a detached mount onto `<dir>/<name>` of the calling thread's mount namespace:
 * `dir` is resolved inside the root `rootFd` names (a process's `/proc/<pid>/root`, opened
 * before entering its namespace: a container's root, not the namespace's), `name` beneath `dir` without
 * following a symlink, made as an empty file when missing. A target that already carries
 * a mount (its mount differs from its directory's) is left alone: gives false then.
 */
export function attachMountBeneath(
  tree: number,
  rootFd: number,
  dir: string,
  name: string,
  directory = false,
): boolean {
  if (name.includes("/") || name === "" || name === "." || name === "..") {
    throw new Error(`Invalid file name ${JSON.stringify(name)}`);
  }
  const dirFd = openBeneath(rootFd, dir, {
    flags: O_PATH | O_DIRECTORY,
    resolve: RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
  });
  try {
    const strict = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    try {
      close(openBeneath(dirFd, name, { flags: O_PATH, resolve: strict }));
    } catch (error) {
      if (!(error instanceof ErrnoError && error.errno === 2)) throw error;
      if (directory) {
        // mkdirat never follows a link in the last component (one there is EEXIST).
        check(c().mkdirat(dirFd, cpath(name), 0o755), `Cannot make "${dir}/${name}"`);
      } else {
        const created = openBeneath(dirFd, name, {
          flags: O_WRONLY | 0o100 /* O_CREAT */ | 0o200, /* O_EXCL */
          mode: 0o644,
          resolve: strict,
        });
        close(created);
      }
    }
    const target = openBeneath(dirFd, name, { flags: O_PATH, resolve: strict });
    try {
      const kind = fileIdentity(target).mode & S_IFMT;
      if (directory && kind !== S_IFDIR) {
        throw new ErrnoError(`Cannot mount on "${dir}/${name}"`, 20, "Not a directory");
      }
      if (!directory && kind !== S_IFREG) {
        throw new ErrnoError(`Cannot mount on "${dir}/${name}"`, 21, "Not a regular file");
      }
      if (mountIdOf(target) !== mountIdOf(dirFd)) return false;
      check(
        Number(
          c().move_mount(
            BigInt(SYS_MOVE_MOUNT),
            BigInt(tree),
            cpath(""),
            BigInt(target),
            cpath(""),
            BigInt(MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH),
          ),
        ),
        `Cannot attach the mount on "${dir}/${name}"`,
      );
      return true;
    } finally {
      close(target);
    }
  } finally {
    close(dirFd);
  }
}

/**
 * Lazily unmounts `<dir>/<name>` (resolved inside the root `rootFd` names) of the calling
 * thread's mount namespace when it carries a mount (see {@linkcode attachMountBeneath});
 * gives false when there is none (or no file).
 */
export function detachMountBeneath(rootFd: number, dir: string, name: string): boolean {
  let dirFd: number;
  try {
    dirFd = openBeneath(rootFd, dir, {
      flags: O_PATH | O_DIRECTORY,
      resolve: RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
    });
  } catch (error) {
    if (error instanceof ErrnoError && error.errno === 2) return false;
    throw error;
  }
  try {
    let target: number;
    try {
      target = openBeneath(dirFd, name, {
        flags: O_PATH,
        resolve: RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
      });
    } catch (error) {
      if (error instanceof ErrnoError && error.errno === 2) return false;
      throw error;
    }
    try {
      if (mountIdOf(target) === mountIdOf(dirFd)) return false;
    } finally {
      close(target);
    }
    // umount2 takes a path: from inside the directory, its last part never followed.
    check(c().fchdir(dirFd), `Cannot enter "${dir}"`);
    check(
      c().umount2(cpath(name), MNT_DETACH | UMOUNT_NOFOLLOW),
      `Cannot unmount "${dir}/${name}"`,
    );
    return true;
  } finally {
    close(dirFd);
  }
}

/** What {@linkcode bindContainerFile} binds where. */
export interface ContainerFileBind {
  /** A process of the container whose file is bound (a container-disk server). */
  containerPid: number;
  /** The file's path inside that container's root (its symlinks followed inside it). */
  sourcePath: string;
  /** A process of the mount namespace the file is bound into (the launcher). */
  targetPid: number;
  /** The directory there (resolved inside that namespace's root). */
  targetDir: string;
  /** The file's name in it (made when missing, never followed). */
  targetName: string;
  /** Read-only mount. */
  readonly: boolean;
  /**
   * Binds a directory (a claim's root, for a memory dump) instead of a file; the target is
   * made as a directory.
   */
  directory?: boolean;
  /**
   * A process of the namespace where the container's root is mounted (the node's: 1 for a
   * handler in a pod with the host's PID namespace); this process's own unless told.
   */
  hostPid?: number;
  /**
   * Resolve `sourcePath` in the container's own mount namespace, its volumes included (a
   * claim the kubelet mounted into it), rather than in its root's file system only.
   */
  inContainerNamespace?: boolean;
}

/** The mount point in `mountinfo` whose mount holds `root` of `dev`, and the rest of `root` below it. */
function hostPathOf(mountinfo: string, dev: string, root: string): string | undefined {
  let best: { mountPoint: string; root: string } | undefined;
  for (const line of mountinfo.split("\n")) {
    const f = line.split(" ");
    if (f.length < 5 || f[2] !== dev) continue;
    const mountRoot = f[3];
    if (root !== mountRoot && !root.startsWith(mountRoot === "/" ? "/" : `${mountRoot}/`)) continue;
    if (!best || mountRoot.length > best.root.length) best = { mountPoint: f[4], root: mountRoot };
  }
  if (!best) return undefined;
  const rest = root.slice(best.root === "/" ? 0 : best.root.length);
  const unescape = (p: string) =>
    p.replace(/\\([0-7]{3})/g, (_, o) => String.fromCharCode(parseInt(o, 8)));
  return unescape(`${best.mountPoint.replace(/\/$/, "")}${rest === "/" ? "" : rest}`) || "/";
}

/**
 * Opens the directory at `path`, a path the kernel printed (`mountinfo`), in the calling
 * thread's mount namespace with no symlink followed on the way: the kernel prints none, so
 * one there was planted afterwards, or lies under a mount made since over a part of the path
 * (which `mountinfo` still lists under its old path). Refused with ELOOP; `what` names the
 * directory in the error.
 */
function openPrintedPath(path: string, what: string): number {
  const top = openRoot("/");
  try {
    return openBeneath(top, path.replace(/^\/+/, "") || ".", {
      flags: O_PATH | O_DIRECTORY,
      resolve: RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    });
  } catch (error) {
    if (!(error instanceof ErrnoError)) throw error;
    throw new ErrnoError(
      `Cannot open ${what} at "${path}" without following a link`,
      error.errno,
      error.description,
      { cause: error },
    );
  } finally {
    close(top);
  }
}

/**
 * Binds a file of a container's root into another process's mount namespace, the way a
 * node agent hands a container-disk's image to its launcher, in the calling thread (meant
 * for the child of `runInMountNamespace`, which owns its threads' namespaces):
 * 1. the container's root is found where its mount lives (the `hostPid`'s namespace) from
 *    the container's `mountinfo`, as KubeVirt's isolation detector finds it, and opened with
 *    no symlink followed (a link on that path is refused); the file is resolved inside that
 *    root (`RESOLVE_IN_ROOT`, no magic links);
 * 2. a detached clone of it is made there (`open_tree`), read-only when asked;
 * 3. it is attached in the target's namespace ({@linkcode attachMountBeneath}).
 * Nothing is mounted in any other namespace. Gives true when mounted, false when the
 * target carried a mount already.
 */
export function bindContainerFile(o: ContainerFileBind): boolean {
  if (o.inContainerNamespace) return bindFromContainerNamespace(o);
  // Everything of the other namespaces is opened first, through this namespace's /proc:
  // PIDs name processes of this PID namespace, which another mount namespace's /proc may not show.
  const containerMounts = Deno.readTextFileSync(`/proc/${o.containerPid}/mountinfo`);
  const rootLine = containerMounts.split("\n").map((l) => l.split(" ")).find((f) => f[4] === "/");
  if (!rootLine) throw new Error(`Cannot find the root mount of process ${o.containerPid}`);
  const targetNs = open(`/proc/${o.targetPid}/ns/mnt`, O_RDONLY | O_CLOEXEC);
  const targetRoot = openRoot(`/proc/${o.targetPid}/root`);
  const hostNs = o.hostPid === undefined
    ? undefined
    : open(`/proc/${o.hostPid}/ns/mnt`, O_RDONLY | O_CLOEXEC);
  try {
    unshare(CLONE_FS);
    if (hostNs !== undefined) {
      check(c().setns(hostNs, CLONE_NEWNS), "Cannot enter the host's mount namespace");
    }
    const hostMounts = Deno.readTextFileSync("/proc/thread-self/mountinfo");
    const root = hostPathOf(hostMounts, rootLine[2], rootLine[3]);
    if (!root) {
      throw new Error(`Cannot find where the root of process ${o.containerPid} is mounted`);
    }
    const rootFd = openPrintedPath(root, `the root of process ${o.containerPid}`);
    let tree: number;
    try {
      tree = detachedBindMountAt(
        rootFd,
        o.sourcePath,
        { readonly: o.readonly, directory: o.directory },
        `the root of process ${o.containerPid}`,
      );
    } finally {
      close(rootFd);
    }
    try {
      check(c().setns(targetNs, CLONE_NEWNS), `Cannot enter the mount namespace of ${o.targetPid}`);
      return attachMountBeneath(tree, targetRoot, o.targetDir, o.targetName, o.directory);
    } finally {
      close(tree);
    }
  } finally {
    close(targetNs);
    close(targetRoot);
    if (hostNs !== undefined) close(hostNs);
  }
}

/**
 * {@linkcode bindContainerFile} with the file resolved in the container's own mount
 * namespace: the thread enters it (its root becomes the container's), clones the file there
 * as if its root were `/`, then enters the target's namespace and attaches the clone.
 */
function bindFromContainerNamespace(o: ContainerFileBind): boolean {
  const sourceNs = open(`/proc/${o.containerPid}/ns/mnt`, O_RDONLY | O_CLOEXEC);
  // The container's root as its process sees it (a chroot's too), opened before entering.
  const sourceRoot = openRoot(`/proc/${o.containerPid}/root`);
  const targetNs = open(`/proc/${o.targetPid}/ns/mnt`, O_RDONLY | O_CLOEXEC);
  const targetRoot = openRoot(`/proc/${o.targetPid}/root`);
  try {
    unshare(CLONE_FS);
    check(
      c().setns(sourceNs, CLONE_NEWNS),
      `Cannot enter the mount namespace of ${o.containerPid}`,
    );
    // Entered, the namespace's mounts may be cloned (open_tree wants them to be this
    // thread's); the file is found from the container's root, its volumes' mounts included.
    const tree = detachedBindMountAt(
      sourceRoot,
      o.sourcePath,
      { readonly: o.readonly, directory: o.directory },
      `the root of process ${o.containerPid}`,
    );
    try {
      check(c().setns(targetNs, CLONE_NEWNS), `Cannot enter the mount namespace of ${o.targetPid}`);
      return attachMountBeneath(tree, targetRoot, o.targetDir, o.targetName, o.directory);
    } finally {
      close(tree);
    }
  } finally {
    close(sourceNs);
    close(sourceRoot);
    close(targetNs);
    close(targetRoot);
  }
}

/**
 * Persistent volumes in KubeVirt mode, the handler's part. The kubelet mounts a filesystem
 * claim into the launcher pod at `/var/run/kubevirt-private/vmi-disks/<volume>` and gives a
 * block claim as the device `/dev/<volume>`. KubeVirt's launcher reads a filesystem claim as
 * a host disk: the handler rewrites each such volume into a `hostDisk` of
 * `<that directory>/disk.img` (`DiskOrCreate`, sized from the claim) in the spec it hands the
 * launcher, and creates the image file when it is missing, inside the launcher's root, as
 * KubeVirt's handler does. The same creation serves a user's own `DiskOrCreate` host disks.
 *
 * Every path is resolved inside the launcher's root (`/proc/<pid>/root`): the directory as
 * if that root were `/`, the image itself beneath it with no symlink followed, and it is
 * created whole under a temporary name and renamed only if nothing has its name by then.
 *
 * That work runs on worker threads (`_host_disks_worker.ts`), each call with a timeout: a
 * claim's file system that stops answering (a hung NFS server) stalls a worker in
 * `openat2` or `fstatfs`, and the VMI's sync fails with a timeout, never the handler's event
 * loop.
 *
 * @module
 */
import { basename, dirname } from "node:path";
import {
  type ClaimInfo,
  parseQuantity,
  Paths,
  type VirtualMachineInstance,
  type Volume,
} from "../api/mod.ts";
import {
  availableBytes,
  CallWorker,
  close,
  createFileBeneath,
  ErrnoError,
  errorText,
  fchownat,
  fileIdentity,
  O_PATH,
  openBeneath,
  openDirectoryInRoot,
  openRoot,
  WorkerPool,
} from "../../ffi/mod.ts";

/** Where the launcher pod has each filesystem claim mounted. */
export const VMI_DISKS_DIR = `${Paths.VirtPrivateDir}/vmi-disks`;
/** The image file on a filesystem claim. */
export const DISK_IMAGE = "disk.img";
/**
 * Where the launcher finds a hotplugged volume (KubeVirt's launcher view): `<volume>.img`,
 * a block volume's device node, or a memory dump claim's directory `<volume>`.
 */
export const LAUNCHER_HOTPLUG_DIR = "/var/run/kubevirt/hotplug-disks";
/** Bytes left free on a claim when its image is created (KubeVirt's default). */
export const MINIMUM_RESERVE_BYTES = 131_072;
/** How much smaller than asked a claim may be and still get an image filling it, percent. */
export const TOLERATED_LESS_SPACE_PERCENT = 10;
/** The user KubeVirt's launcher image runs QEMU as (`qemu`). */
export const QEMU_USER = 107;
/** How long {@linkcode prepareHostDisks} waits for its worker unless told, ms. */
export const HOST_DISKS_TIMEOUT_MS = 20_000;
/** Most worker threads at once: as many calls may hang on dead mounts before more queue. */
const HOST_DISK_WORKERS = 4;

const MIB = 1024 * 1024;
const S_IFMT = 0o170000;
const S_IFREG = 0o100000;
const S_IFBLK = 0o060000;

/** A volume the handler cannot give the launcher; `field` is the VMI field to fix. */
export class VolumeError extends Error {
  /** The JSON path of the volume, e.g. `spec.volumes[1]`. */
  readonly field: string;
  /** What is wrong with it: the message without the field. */
  readonly detail: string;
  /** Creates `<field>: <message>`. */
  constructor(field: string, message: string, options?: ErrorOptions) {
    super(`${field}: ${message}`, options);
    this.name = "VolumeError";
    this.field = field;
    this.detail = message;
  }
}

/** The claim a volume reads (a DataVolume's has the DataVolume's name), or undefined. */
export function claimNameOf(volume: Volume): string | undefined {
  return volume.persistentVolumeClaim?.claimName ?? volume.dataVolume?.name;
}

/** virt-controller's claim info for the volume `name`, from `status.volumeStatus`. */
export function claimInfoOf(vmi: VirtualMachineInstance, name: string): ClaimInfo | undefined {
  return vmi.status?.volumeStatus?.find((s) => s.name === name)?.persistentVolumeClaimInfo;
}

/** Whether the volume is hotplugged (the spec says so, or its status names an attachment pod). */
export function isHotplugVolume(vmi: VirtualMachineInstance, volume: Volume): boolean {
  if (
    volume.persistentVolumeClaim?.hotpluggable || volume.dataVolume?.hotpluggable ||
    volume.memoryDump?.hotpluggable
  ) return true;
  return vmi.status?.volumeStatus?.some((s) => s.name === volume.name && s.hotplugVolume) ??
    false;
}

/**
 * The image size a filesystem claim gets, in bytes: what it requests, unless the bound
 * volume is smaller, then the volume's capacity; aligned down to 1 MiB.
 */
export function claimImageSize(info: ClaimInfo, field: string): number {
  const request = info.requests?.storage;
  const capacity = info.capacity?.storage;
  let bytes: number;
  if (request !== undefined && capacity !== undefined) {
    bytes = Math.min(parseQuantity(request), parseQuantity(capacity));
  } else if (request !== undefined || capacity !== undefined) {
    bytes = parseQuantity((request ?? capacity)!);
  } else {
    throw new VolumeError(
      field,
      `the claim "${info.claimName ?? "?"}" states no storage capacity or request`,
    );
  }
  const aligned = Math.floor(bytes / MIB) * MIB;
  if (aligned < MIB) {
    throw new VolumeError(field, `the claim's size (${bytes} bytes) is below 1 MiB`);
  }
  return aligned;
}

/**
 * The VMI as its launcher gets it: every filesystem claim (`persistentVolumeClaim` or
 * `dataVolume`, not hotplugged, not a virtiofs share) becomes a `DiskOrCreate` host disk at
 * `/var/run/kubevirt-private/vmi-disks/<volume>/disk.img` of the claim's size, shared when
 * the claim is `ReadWriteMany`. Block claims stay as they are (the launcher finds the
 * device). A claim virt-controller has written no info for yet is a {@linkcode VolumeError}
 * naming it. The VMI given is not changed; without claims it is returned as it is.
 */
export function replaceClaimsByHostDisks(vmi: VirtualMachineInstance): VirtualMachineInstance {
  const volumes = vmi.spec.volumes ?? [];
  if (!volumes.some((v) => claimNameOf(v) !== undefined)) return vmi;
  const shares = new Set(
    ((vmi.spec.domain.devices.filesystems ?? []) as { name?: string }[]).map((f) => f.name),
  );
  const replaced = volumes.map((volume, index) => {
    const claim = claimNameOf(volume);
    if (claim === undefined || isHotplugVolume(vmi, volume) || shares.has(volume.name)) {
      return volume;
    }
    const field = `spec.volumes[${index}]`;
    const info = claimInfoOf(vmi, volume.name);
    if (!info) {
      const what = volume.dataVolume ? `the DataVolume "${claim}"` : `the claim "${claim}"`;
      throw new VolumeError(
        field,
        `${what} of volume "${volume.name}" is not known yet: virt-controller writes its ` +
          `claim info to status.volumeStatus once the PersistentVolumeClaim "${claim}" exists`,
      );
    }
    if (info.volumeMode === "Block") return volume;
    const bytes = claimImageSize(info, field);
    return {
      name: volume.name,
      hostDisk: {
        path: `${VMI_DISKS_DIR}/${volume.name}/${DISK_IMAGE}`,
        type: "DiskOrCreate" as const,
        capacity: String(bytes),
        shared: info.accessModes?.includes("ReadWriteMany") ?? false,
      },
    };
  });
  return { ...vmi, spec: { ...vmi.spec, volumes: replaced } };
}

/** An image made smaller than asked, within {@linkcode TOLERATED_LESS_SPACE_PERCENT}. */
export interface ToleratedDisk {
  /** The volume's name. */
  volume: string;
  /** The bytes asked for. */
  expected: number;
  /** The bytes the image got. */
  found: number;
}

/** What {@linkcode prepareHostDisks} did. */
export interface PreparedHostDisks {
  /** The image files it created, as the launcher sees them. */
  created: string[];
  /** Images made smaller than asked (KubeVirt records `ToleratedSmallPV` for each). */
  tolerated: ToleratedDisk[];
  /** Existing images and block devices handed to the runtime user. */
  chowned: string[];
}

/** Options of {@linkcode prepareHostDisks}. */
export interface PrepareHostDisksOptions {
  /** The launcher's root (`/proc/<pid>/root`), or any directory standing for it. */
  root: string;
  /** The user QEMU runs as (`status.runtimeUser`); 0 is root. */
  runtimeUser: number;
  /** Bytes to leave free on a claim. Default {@linkcode MINIMUM_RESERVE_BYTES}. */
  reserveBytes?: number;
  /** Percent a claim may fall short. Default {@linkcode TOLERATED_LESS_SPACE_PERCENT}. */
  toleratePercent?: number;
  /**
   * {@linkcode prepareHostDisks} only: give up after this many milliseconds. Default
   * {@linkcode HOST_DISKS_TIMEOUT_MS}.
   */
  timeoutMs?: number;
}

function codeOf(error: unknown): string | undefined {
  return error instanceof ErrnoError ? error.code : undefined;
}

/** What {@linkcode hostDisksOutcome} gives: the result, or what was thrown, as clonable data. */
export type HostDisksOutcome =
  | { ok: true; done: PreparedHostDisks }
  | {
    ok: false;
    error: {
      message: string;
      field?: string;
      action?: string;
      errno?: number;
      description?: string;
    };
  };

/** The operations of the host disk workers. */
interface HostDiskOps {
  prepareHostDisks(vmi: VirtualMachineInstance, options: PrepareHostDisksOptions): HostDisksOutcome;
}

let workers: WorkerPool<HostDiskOps> | undefined;

/**
 * Makes the launcher's host disks ready (see {@linkcode prepareHostDisksSync}) on a worker
 * thread, so that a claim whose file system stopped answering stalls that thread only;
 * rejects with `CallTimeoutError` after `options.timeoutMs`, with {@linkcode VolumeError} or
 * `ErrnoError` as the work itself failed. A call that timed out may still finish later,
 * and only creates what a later call would.
 */
export async function prepareHostDisks(
  vmi: VirtualMachineInstance,
  options: PrepareHostDisksOptions,
): Promise<PreparedHostDisks> {
  workers ??= new WorkerPool<HostDiskOps>({
    min: 0,
    max: HOST_DISK_WORKERS,
    growAfterMs: 0,
    newWorker: () =>
      new CallWorker({
        module: new URL("./_host_disks_worker.ts", import.meta.url),
        name: "host disk worker",
      }),
  });
  const key = `${vmi.metadata.namespace}/${vmi.metadata.name}`;
  const outcome = await workers.call(
    "prepareHostDisks",
    [vmi, options],
    `Cannot prepare the host disks of "${key}" in "${options.root}"`,
    { timeoutMs: options.timeoutMs ?? HOST_DISKS_TIMEOUT_MS },
  );
  if (outcome.ok) return outcome.done;
  const e = outcome.error;
  if (e.field !== undefined) throw new VolumeError(e.field, e.message);
  if (e.errno !== undefined) {
    throw new ErrnoError(e.action ?? e.message, e.errno, e.description ?? "");
  }
  throw new Error(e.message);
}

/**
 * {@linkcode prepareHostDisksSync} with what it throws given back as data, for the worker
 * (`_host_disks_worker.ts`) to send to {@linkcode prepareHostDisks}.
 */
export function hostDisksOutcome(
  vmi: VirtualMachineInstance,
  options: PrepareHostDisksOptions,
): HostDisksOutcome {
  try {
    return { ok: true, done: prepareHostDisksSync(vmi, options) };
  } catch (error) {
    if (error instanceof VolumeError) {
      return { ok: false, error: { field: error.field, message: error.detail } };
    }
    if (error instanceof ErrnoError) {
      const { message, action, errno, description } = error;
      return { ok: false, error: { message, action, errno, description } };
    }
    return {
      ok: false,
      error: { message: errorText(error) },
    };
  }
}

/**
 * Makes the launcher's host disks ready before its domain is defined, on the VMI as
 * {@linkcode replaceClaimsByHostDisks} made it, on the calling thread (which a hung file
 * system stalls: the handler calls {@linkcode prepareHostDisks}):
 * - a `DiskOrCreate` image that is missing is created sparse, of its capacity (or of the
 *   space left, when that is at most the tolerated share short), owned by QEMU's user;
 *   an existing one is never resized or overwritten;
 * - with a non-root runtime user, an existing image and each block claim's `/dev/<volume>`
 *   are handed to that user.
 * A symlink where the image or device should be is refused, never followed.
 */
export function prepareHostDisksSync(
  vmi: VirtualMachineInstance,
  options: PrepareHostDisksOptions,
): PreparedHostDisks {
  const out: PreparedHostDisks = { created: [], tolerated: [], chowned: [] };
  const owner = options.runtimeUser !== 0 ? options.runtimeUser : QEMU_USER;
  for (const [index, volume] of (vmi.spec.volumes ?? []).entries()) {
    const field = `spec.volumes[${index}]`;
    if (volume.hostDisk?.type === "DiskOrCreate" && volume.hostDisk.path) {
      hostDisk(volume, field, owner, options, out);
    } else if (
      options.runtimeUser !== 0 && claimNameOf(volume) !== undefined &&
      !isHotplugVolume(vmi, volume) && claimInfoOf(vmi, volume.name)?.volumeMode === "Block"
    ) {
      const device = `dev/${volume.name}`;
      if (handTo(options.root, device, S_IFBLK, options.runtimeUser, field)) {
        out.chowned.push(`/${device}`);
      }
    }
  }
  return out;
}

/**
 * Gives `path` (relative to `root`, no symlink followed) to `user` if it is of the file
 * `type` and not theirs already; true if it changed hands. Without a user it only checks the
 * type. A missing path is an error.
 */
function handTo(
  root: string,
  path: string,
  type: number,
  user: number | undefined,
  field: string,
): boolean {
  const rootFd = openRoot(root);
  try {
    let fd: number;
    try {
      fd = openBeneath(rootFd, path, { flags: O_PATH });
    } catch (error) {
      const why = codeOf(error) === "ELOOP"
        ? "is a symlink, which the handler does not follow"
        : codeOf(error) === "ENOENT"
        ? "is not in the launcher pod"
        : (error as Error).message;
      throw new VolumeError(field, `/${path} ${why}`, { cause: error });
    }
    try {
      const id = fileIdentity(fd);
      if ((id.mode & S_IFMT) !== type) {
        throw new VolumeError(
          field,
          `/${path} is not a ${type === S_IFBLK ? "block device" : "regular file"}`,
        );
      }
      if (user === undefined || (id.uid === user && id.gid === user)) return false;
      fchownat(fd, "", { uid: user, gid: user }, 0x1000 /* AT_EMPTY_PATH */);
      return true;
    } finally {
      close(fd);
    }
  } finally {
    close(rootFd);
  }
}

function hostDisk(
  volume: Volume,
  field: string,
  owner: number,
  options: PrepareHostDisksOptions,
  out: PreparedHostDisks,
): void {
  const target = volume.hostDisk!.path;
  const dir = dirname(target);
  const name = basename(target);
  let opened;
  try {
    opened = openDirectoryInRoot(options.root, dir);
  } catch (error) {
    throw new VolumeError(
      field,
      codeOf(error) === "ENOENT"
        ? `the directory ${dir} of volume "${volume.name}" is not in the launcher pod (its ` +
          `claim is not mounted there)`
        : `cannot open ${dir} in the launcher pod: ${(error as Error).message}`,
      { cause: error },
    );
  }
  try {
    const dirFd = openRoot(opened.path);
    let existing: number | undefined;
    let available: bigint;
    try {
      try {
        existing = openBeneath(dirFd, name, { flags: O_PATH });
        close(existing);
      } catch (error) {
        if (codeOf(error) !== "ENOENT") {
          const why = codeOf(error) === "ELOOP"
            ? "is a symlink, which the handler does not follow"
            : (error as Error).message;
          throw new VolumeError(field, `${target} ${why}`, { cause: error });
        }
        existing = undefined;
      }
      available = availableBytes(dirFd);
    } finally {
      close(dirFd);
    }
    if (existing !== undefined) {
      // Never resized nor overwritten: it holds the guest's data.
      const user = options.runtimeUser !== 0 ? options.runtimeUser : undefined;
      if (handTo(opened.path, name, S_IFREG, user, field)) out.chowned.push(target);
      return;
    }
    const asked = parseQuantity(volume.hostDisk!.capacity ?? "0");
    if (!(asked > 0)) {
      throw new VolumeError(field, `hostDisk.capacity is required to create ${target}`);
    }
    const usable = Number(available) - (options.reserveBytes ?? MINIMUM_RESERVE_BYTES);
    let size = asked;
    if (asked > usable) {
      const tolerate = options.toleratePercent ?? TOLERATED_LESS_SPACE_PERCENT;
      if (asked * (100 - tolerate) / 100 > usable) {
        throw new VolumeError(
          field,
          `cannot create ${target}: ${asked} bytes asked, ${Math.max(0, usable)} available ` +
            `on the volume, more than ${tolerate} % short`,
        );
      }
      size = Math.max(0, usable);
      out.tolerated.push({ volume: volume.name, expected: asked, found: size });
    }
    const made = createFileBeneath(opened.path, name, {
      size,
      mode: 0o660,
      owner: { uid: owner, gid: owner },
    });
    if (made) out.created.push(target);
  } finally {
    opened.release();
  }
}

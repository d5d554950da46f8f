/**
 * KubeVirt mode's containerDisks: virt-controller gives the launcher pod a container per
 * containerDisk volume that runs KubeVirt's `container-disk` server, which only listens on
 * `disk_<n>.sock` in the pod's `container-disks` volume to keep the image's root alive.
 * The handler hands that image to the launcher, as KubeVirt's handler does:
 *
 * - the container-disk process is found from its socket (`SO_PEERCRED`), the socket opened
 *   beneath the pod's directory without following symlinks;
 * - the disk is `containerDisk.path` or the single file under `/disk` in that container's
 *   root, resolved inside the root (its symlinks cannot lead out of it);
 * - a read-only bind of it appears as `/var/run/kubevirt/container-disks/disk_<n>.img` in
 *   the launcher's mount namespace, where KubeVirt's launcher (or virtnode's) looks for it
 *   and puts its qcow2 overlay on it.
 *
 * KubeVirt's handler mounts in the node's mount namespace and lets the mount propagate into
 * the pod; virtnode clones the container's file in the namespace that holds its root (the
 * node's) and attaches the clone in the launcher's namespace only (`open_tree` and
 * `move_mount`, in a child process: `ffi/`), so no mount of a VMI's exists in the node's
 * namespace at all and none outlives its pod. What was mounted is recorded first
 * (`<run dir>/container-disk-mounts/<vmi uid>.json`, written whole: `writeFileDurably`), so a
 * restarted handler unmounts it; cleanup also removes the container-disk sockets, which ends
 * their servers. A record that cannot be read (torn by an older version's write) is set
 * aside and reported, and cleanup goes on with what the VMI's spec tells: the sockets its
 * containerDisks have in the pod; the mounts, in the launcher's namespace only, end with it.
 *
 * With KubeVirt's `ImageVolume` gate on, virt-controller gives the launcher pod each
 * containerDisk as a Kubernetes image volume and the launcher links it into place itself:
 * there is no server to find and nothing to mount, as in virt-handler. A pod made before the
 * gate was turned on (it has KubeVirt's `container-disk-binary` init container) is still
 * served the old way.
 *
 * @module
 */

import { join } from "node:path";
import {
  bindContainerFileInChild,
  ErrnoError,
  errorText,
  listenerPid,
  mountNamespaceOf,
  openDirectoryInRoot,
  openSocketBeneath,
  processStartTime,
  runInMountNamespace,
  setFileAside,
  writeFileDurably,
} from "../../../ffi/mod.ts";
import { type VirtualMachineInstance, vmiKey } from "../../api/mod.ts";
import { getLogger } from "../../log/mod.ts";
import { removeIfPresent } from "../../lifecycle/mod.ts";

const log = getLogger("handler", "container-disks");

/** Where the launcher finds a containerDisk (KubeVirt's launcher view). */
export const LAUNCHER_CONTAINER_DISK_DIR = "/var/run/kubevirt/container-disks";
/** The pod volume the container-disk servers and the launcher share. */
const POD_VOLUME = "volumes/kubernetes.io~empty-dir/container-disks";
/** The launcher's folder of kernel boot artifacts, and the kernel boot server's socket name. */
const KERNEL_BOOT = "kernel-boot";
/** The name KubeVirt gives the kernel boot container's volume. */
const KERNEL_BOOT_VOLUME = "kernel-boot-volume";
/** The folder of a containerDisk image that holds its disk (KubeVirt's fallback). */
const DISK_FOLDER = "/disk";
/** The init container virt-controller gives a launcher pod of bind-mounted containerDisks. */
const LEGACY_INIT_CONTAINER = "container-disk-binary";

/**
 * Whether the pod at `podDir` gets its containerDisks bind-mounted although image volumes
 * are on: the kubelet keeps a folder per container of the pod, and one of KubeVirt's
 * `container-disk-binary` init container marks a pod made before the gate.
 */
function madeBeforeImageVolumes(podDir: string): boolean {
  try {
    return Deno.lstatSync(join(podDir, "containers", LEGACY_INIT_CONTAINER)).isDirectory;
  } catch {
    return false;
  }
}

/** What a VMI's mounts were: enough for a restarted handler to undo them. */
interface MountRecord {
  /**
   * The launcher whose namespace holds the mounts, and its start time (PIDs get reused);
   * unknown when the record was inferred from the spec.
   */
  launcherPid?: number;
  launcherStart?: string;
  /** The mounted files, by path below {@linkcode LAUNCHER_CONTAINER_DISK_DIR}. */
  targets: string[];
  /** The container-disk sockets (the pod's directory and the path below it). */
  sockets: { podDir: string; path: string }[];
}

/** A containerDisk that cannot be handed to the launcher yet, or at all. */
export class ContainerDiskMountError extends Error {
  /** Creates `Cannot mount containerDisk "<volume>" of VMI "<key>": <detail>`. */
  constructor(key: string, volume: string, detail: string, options?: ErrorOptions) {
    super(`Cannot mount containerDisk "${volume}" of VMI "${key}": ${detail}`, options);
    this.name = "ContainerDiskMountError";
  }
}

/**
 * What cleanup may use when a VMI's record cannot be read: the VMI (its spec names the
 * containerDisks) and its pod's directory (where their sockets are), when known.
 */
export interface ContainerDiskCleanupHint {
  /** The VMI being cleaned up. */
  vmi: VirtualMachineInstance;
  /** The launcher pod's directory below the kubelet's pods directory. */
  podDir?: string;
}

/** The files a VMI's spec has mounted into its launcher, and the socket of each one's server. */
interface WantedFile {
  volume: string;
  /** The socket's path below the pod's directory. */
  socket: string;
  /** The path below {@linkcode LAUNCHER_CONTAINER_DISK_DIR}. */
  target: string;
  /** The file in the container's root; the single one in `/disk` when not given. */
  source?: string;
}

/** Every file the VMI's containerDisks and kernel boot container hand to its launcher. */
function wantedFiles(vmi: VirtualMachineInstance): WantedFile[] {
  const files: WantedFile[] = (vmi.spec.volumes ?? []).flatMap((v, i) =>
    v.containerDisk
      ? [{
        volume: v.name,
        socket: `${POD_VOLUME}/disk_${i}.sock`,
        target: `disk_${i}.img`,
        source: v.containerDisk.path,
      }]
      : []
  );
  const kernel = vmi.spec.domain.firmware?.kernelBoot?.container;
  if (kernel?.image) {
    // KubeVirt's kernel boot container: its kernel and initrd, each under its own name in
    // the launcher's `kernel-boot` folder, served on one socket.
    for (const path of [kernel.kernelPath, kernel.initrdPath]) {
      if (!path) continue;
      files.push({
        volume: KERNEL_BOOT_VOLUME,
        socket: `${POD_VOLUME}/${KERNEL_BOOT}.sock`,
        target: `${KERNEL_BOOT}/${path.slice(path.lastIndexOf("/") + 1)}`,
        source: path,
      });
    }
  }
  return files;
}

/** Why a parsed record is not one, or undefined. */
function invalidRecord(value: unknown): string | undefined {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    return "not a JSON object";
  }
  const r = value as Record<string, unknown>;
  if (r.launcherPid !== undefined && !Number.isInteger(r.launcherPid)) {
    return "launcherPid is not a number";
  }
  if (r.launcherStart !== undefined && typeof r.launcherStart !== "string") {
    return "launcherStart is not a string";
  }
  if (!Array.isArray(r.targets) || r.targets.some((t) => typeof t !== "string")) {
    return "targets is not a list of paths";
  }
  if (
    !Array.isArray(r.sockets) ||
    r.sockets.some((s) => typeof s?.podDir !== "string" || typeof s?.path !== "string")
  ) {
    return "sockets is not a list of {podDir, path}";
  }
  return undefined;
}

/** The mount namespace process that holds the node's mounts: PID 1's when we may enter it. */
function hostMountPid(): number | undefined {
  try {
    return mountNamespaceOf(1) === mountNamespaceOf("self") ? undefined : 1;
  } catch {
    return undefined; // not ours to enter (a sandbox's init): the node's is our own
  }
}

/** Mounts and unmounts the containerDisks of launcher pods; see the module doc. */
export class ContainerDiskMounts {
  readonly #recordDir: string;
  readonly #hostPid = hostMountPid();
  /** VMIs whose disks are mounted, by UID (saves a look at the record each sync). */
  readonly #mounted = new Set<string>();

  readonly #imageVolume: () => boolean;

  /**
   * Records go below `recordDir`; `imageVolume` is KubeVirt's `ImageVolume` gate, read at
   * each mount (default off).
   */
  constructor(recordDir: string, options: { imageVolume?: () => boolean } = {}) {
    this.#recordDir = recordDir;
    this.#imageVolume = options.imageVolume ?? (() => false);
  }

  #record(uid: string): string {
    return join(this.#recordDir, `${uid}.json`);
  }

  /**
   * Mounts every containerDisk of `vmi` into the launcher `launcherPid` of the pod at
   * `podDir`; gives `notReady` while a container-disk server has not started yet.
   */
  async mount(
    vmi: VirtualMachineInstance,
    podDir: string,
    launcherPid: number,
  ): Promise<"mounted" | "notReady"> {
    const uid = vmi.metadata.uid!;
    const wanted = wantedFiles(vmi);
    const kernel = vmi.spec.domain.firmware?.kernelBoot?.container;
    if ((wanted.length === 0 && !kernel?.image) || this.#mounted.has(uid)) return "mounted";
    // Image volumes: the launcher links its disks itself.
    if (this.#imageVolume() && !madeBeforeImageVolumes(podDir)) return "mounted";
    const key = vmiKey(vmi.metadata);
    const found: { volume: string; pid: number; source: string; target: string; socket: string }[] =
      [];
    const pids = new Map<string, number>();
    for (const file of wanted) {
      const pid = pids.get(file.socket) ?? await serverPid(podDir, file.socket);
      if (pid === undefined) return "notReady";
      pids.set(file.socket, pid);
      found.push({ ...file, pid, source: file.source ?? diskInFolder(key, file.volume, pid) });
    }
    if (kernel?.image && !pids.has(`${POD_VOLUME}/${KERNEL_BOOT}.sock`)) {
      // A kernel boot container that names no file still has to be serving.
      if ((await serverPid(podDir, `${POD_VOLUME}/${KERNEL_BOOT}.sock`)) === undefined) {
        return "notReady";
      }
    }
    const record: MountRecord = {
      launcherPid,
      launcherStart: processStartTime(launcherPid),
      targets: found.map((d) => d.target),
      sockets: [...new Set(found.map((d) => d.socket))].map((path) => ({ podDir, path })),
    };
    await writeFileDurably(this.#record(uid), JSON.stringify(record), {
      mode: 0o600,
      dirMode: 0o700,
    });
    if (kernel?.image) makeKernelBootFolder(launcherPid);
    for (const d of found) {
      const place = inLauncher(d.target);
      try {
        const mounted = await bindContainerFileInChild({
          containerPid: d.pid,
          sourcePath: d.source,
          targetPid: launcherPid,
          targetDir: place.dir,
          targetName: place.name,
          readonly: true,
          hostPid: this.#hostPid,
        });
        log.info(
          mounted ? "containerDisk mounted into the launcher" : "containerDisk was mounted",
          {
            key,
            uid,
            volume: d.volume,
            source: d.source,
          },
        );
      } catch (error) {
        throw new ContainerDiskMountError(key, d.volume, String(error), { cause: error });
      }
    }
    this.#mounted.add(uid);
    return "mounted";
  }

  /**
   * Undoes a VMI's mounts (when its launcher still runs) and removes its container-disk
   * sockets, which ends their servers; idempotent, and works from the record alone. A
   * record that cannot be read is set aside and logged, and `hint` stands in for it.
   */
  async unmount(uid: string, hint?: ContainerDiskCleanupHint): Promise<void> {
    this.#mounted.delete(uid);
    const file = this.#record(uid);
    let text: string;
    try {
      text = await Deno.readTextFile(file);
    } catch (error) {
      if (error instanceof Deno.errors.NotFound) return;
      throw error;
    }
    let record: MountRecord | undefined;
    let reason: string | undefined;
    try {
      const parsed: unknown = JSON.parse(text);
      reason = invalidRecord(parsed);
      if (reason === undefined) record = parsed as MountRecord;
    } catch (error) {
      reason = `not JSON: ${errorText(error)}`;
    }
    if (!record) {
      const movedTo = await setFileAside(file);
      record = inferredRecord(hint);
      log.error("Set aside unreadable containerDisk mount record {file}: {reason}", {
        uid,
        file,
        reason,
        movedTo,
        inferredSockets: record.sockets.map((s) => s.path),
      });
    }
    const launcherPid = record.launcherPid;
    const alive = launcherPid !== undefined && record.launcherStart !== undefined &&
      processStartTime(launcherPid) === record.launcherStart;
    if (alive) {
      await runInMountNamespace(
        launcherPid,
        record.targets.map((target) => ({ op: "unmountFile" as const, ...inLauncher(target) })),
      ).catch((error) => {
        // The launcher ended meanwhile: its namespace and mounts are gone with it.
        if (processStartTime(launcherPid) === record.launcherStart) throw error;
      });
    }
    for (const s of record.sockets) {
      let dir;
      try {
        dir = openDirectoryInRoot(s.podDir, s.path.slice(0, s.path.lastIndexOf("/")));
      } catch (error) {
        // The kubelet removed the pod's volume, and the sockets with it.
        if (error instanceof ErrnoError && error.code === "ENOENT") continue;
        throw error;
      }
      try {
        // unlink(2) never follows the last component.
        // A socket left in the pod's volume goes with the pod; the other sockets and the
        // record are still cleaned up.
        await removeIfPresent(`${dir.path}/${s.path.slice(s.path.lastIndexOf("/") + 1)}`)
          .catch((error) =>
            log.warn("Cannot remove the containerDisk socket {path}: {error}", {
              uid,
              path: s.path,
              error,
            })
          );
      } finally {
        dir.release();
      }
    }
    await removeIfPresent(this.#record(uid));
    log.info("containerDisks unmounted", { uid, launcherAlive: alive });
  }
}

/**
 * A record from what cleanup knows without one: the sockets of the VMI's containerDisks in
 * its pod. No launcher: its mounts are in its namespace only and go with it.
 */
function inferredRecord(hint: ContainerDiskCleanupHint | undefined): MountRecord {
  const files = hint ? wantedFiles(hint.vmi) : [];
  const podDir = hint?.podDir;
  return {
    targets: files.map((f) => f.target),
    sockets: podDir === undefined
      ? []
      : [...new Set(files.map((f) => f.socket))].map((path) => ({ podDir, path })),
  };
}

/** The PID of the container-disk server listening on a socket below the pod's directory. */
async function serverPid(podDir: string, socket: string): Promise<number | undefined> {
  let target;
  try {
    target = openSocketBeneath(podDir, socket);
  } catch {
    return undefined; // not there (yet)
  }
  try {
    return await listenerPid(target.path);
  } catch {
    return undefined; // not accepting yet, or not in time
  } finally {
    target.release();
  }
}

/** The single file under `/disk` of a container's root, resolved inside it. */
function diskInFolder(key: string, volume: string, pid: number): string {
  let dir;
  try {
    dir = openDirectoryInRoot(`/proc/${pid}/root`, DISK_FOLDER);
  } catch (error) {
    throw new ContainerDiskMountError(key, volume, `its image has no folder ${DISK_FOLDER}`, {
      cause: error,
    });
  }
  try {
    const names = [...Deno.readDirSync(dir.path)].map((e) => e.name);
    if (names.length !== 1) {
      throw new ContainerDiskMountError(
        key,
        volume,
        names.length === 0
          ? `no file found in folder ${DISK_FOLDER}, no disk present`
          : `more than one file found in folder ${DISK_FOLDER}, only one disk is allowed`,
      );
    }
    return `${DISK_FOLDER}/${names[0]}`;
  } finally {
    dir.release();
  }
}

/** The launcher's folder and file name of a recorded target (a path below the container-disks folder). */
function inLauncher(target: string): { dir: string; name: string } {
  const slash = target.lastIndexOf("/");
  return {
    dir: slash < 0
      ? LAUNCHER_CONTAINER_DISK_DIR
      : `${LAUNCHER_CONTAINER_DISK_DIR}/${target.slice(0, slash)}`,
    name: target.slice(slash + 1),
  };
}

/**
 * Makes the launcher's `kernel-boot` folder in its container-disks folder (inside its root,
 * no link followed), as KubeVirt's handler does before it mounts the kernel and initrd.
 */
function makeKernelBootFolder(launcherPid: number): void {
  const dir = openDirectoryInRoot(`/proc/${launcherPid}/root`, LAUNCHER_CONTAINER_DISK_DIR);
  try {
    Deno.mkdirSync(`${dir.path}/${KERNEL_BOOT}`, { mode: 0o755 });
  } catch (error) {
    if (!(error instanceof Deno.errors.AlreadyExists)) throw error;
  } finally {
    dir.release();
  }
}

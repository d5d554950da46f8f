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
 * (`<run dir>/container-disk-mounts/<vmi uid>.json`), so a restarted handler unmounts it;
 * cleanup also removes the container-disk sockets, which ends their servers.
 *
 * @module
 */

import { join } from "node:path";
import {
  bindContainerFileInChild,
  listenerPid,
  mountNamespaceOf,
  openDirectoryInRoot,
  openSocketBeneath,
  processStartTime,
  runInMountNamespace,
} from "../../ffi/mod.ts";
import { type VirtualMachineInstance, vmiKey } from "../api/mod.ts";
import { getLogger } from "../log/mod.ts";

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

/** What a VMI's mounts were: enough for a restarted handler to undo them. */
interface MountRecord {
  /** The launcher whose namespace holds the mounts, and its start time (PIDs get reused). */
  launcherPid: number;
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

  /** Records go below `recordDir`. */
  constructor(recordDir: string) {
    this.#recordDir = recordDir;
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
    const disks = (vmi.spec.volumes ?? []).flatMap((v, i) =>
      v.containerDisk ? [{ volume: v.name, index: i, path: v.containerDisk.path }] : []
    );
    const kernel = vmi.spec.domain.firmware?.kernelBoot?.container;
    if ((disks.length === 0 && !kernel?.image) || this.#mounted.has(uid)) return "mounted";
    const key = vmiKey(vmi.metadata);
    const found: { volume: string; pid: number; source: string; target: string; socket: string }[] =
      [];
    for (const disk of disks) {
      const socket = `${POD_VOLUME}/disk_${disk.index}.sock`;
      const pid = serverPid(podDir, socket);
      if (pid === undefined) return "notReady";
      found.push({
        volume: disk.volume,
        pid,
        source: disk.path ?? diskInFolder(key, disk.volume, pid),
        target: `disk_${disk.index}.img`,
        socket,
      });
    }
    if (kernel?.image) {
      // KubeVirt's kernel boot container: its kernel and initrd, each under its own name
      // in the launcher's `kernel-boot` folder.
      const socket = `${POD_VOLUME}/${KERNEL_BOOT}.sock`;
      const pid = serverPid(podDir, socket);
      if (pid === undefined) return "notReady";
      for (const path of [kernel.kernelPath, kernel.initrdPath]) {
        if (!path) continue;
        found.push({
          volume: KERNEL_BOOT_VOLUME,
          pid,
          source: path,
          target: `${KERNEL_BOOT}/${path.slice(path.lastIndexOf("/") + 1)}`,
          socket,
        });
      }
    }
    const record: MountRecord = {
      launcherPid,
      launcherStart: processStartTime(launcherPid),
      targets: found.map((d) => d.target),
      sockets: [...new Set(found.map((d) => d.socket))].map((path) => ({ podDir, path })),
    };
    await Deno.mkdir(this.#recordDir, { recursive: true, mode: 0o700 });
    await Deno.writeTextFile(this.#record(uid), JSON.stringify(record), { mode: 0o600 });
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
   * sockets, which ends their servers; idempotent, and works from the record alone.
   */
  async unmount(uid: string): Promise<void> {
    this.#mounted.delete(uid);
    let record: MountRecord;
    try {
      record = JSON.parse(await Deno.readTextFile(this.#record(uid)));
    } catch (error) {
      if (error instanceof Deno.errors.NotFound) return;
      throw error;
    }
    const alive = record.launcherStart !== undefined &&
      processStartTime(record.launcherPid) === record.launcherStart;
    if (alive) {
      await runInMountNamespace(
        record.launcherPid,
        record.targets.map((target) => ({ op: "unmountFile" as const, ...inLauncher(target) })),
      ).catch((error) => {
        // The launcher ended meanwhile: its namespace and mounts are gone with it.
        if (processStartTime(record.launcherPid) === record.launcherStart) throw error;
      });
    }
    for (const s of record.sockets) {
      const dir = openDirectoryInRoot(s.podDir, s.path.slice(0, s.path.lastIndexOf("/")));
      try {
        // unlink(2) never follows the last component.
        await Deno.remove(`${dir.path}/${s.path.slice(s.path.lastIndexOf("/") + 1)}`).catch(
          () => {},
        );
      } finally {
        dir.release();
      }
    }
    await Deno.remove(this.#record(uid)).catch(() => {});
    log.info("containerDisks unmounted", { uid, launcherAlive: alive });
  }
}

/** The PID of the container-disk server listening on a socket below the pod's directory. */
function serverPid(podDir: string, socket: string): number | undefined {
  let target;
  try {
    target = openSocketBeneath(podDir, socket);
  } catch {
    return undefined; // not there (yet)
  }
  try {
    return listenerPid(target.path);
  } catch {
    return undefined; // not accepting yet
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

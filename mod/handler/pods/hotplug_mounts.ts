/**
 * KubeVirt mode's hotplugged volumes (`virtctl addvolume`): virt-api adds the volume to the
 * running VMI's spec, virt-controller starts an attachment pod (`hp-volume-*`) on the node
 * with the claim mounted at `/<volume>` and KubeVirt's `container-disk` server listening on
 * `hp.sock` in the pod's `hotplug-disks` volume, and names the pod in the volume's status.
 * The handler then hands the claim's `disk.img` to the launcher, as KubeVirt's handler does:
 *
 * - the attachment pod's process is found from `hp.sock` (`SO_PEERCRED`), the socket opened
 *   beneath the pod's directory without following symlinks;
 * - `/<volume>/disk.img` is resolved in that container's own mount namespace, where the
 *   kubelet mounted the claim, as if its root were `/` (no link leads out of it);
 * - a read-write bind of it appears as `/var/run/kubevirt/hotplug-disks/<volume>.img` in the
 *   launcher's mount namespace only (`open_tree` and `move_mount` in a child process), given
 *   to QEMU's user; KubeVirt's launcher attaches it to the running domain once the volume's
 *   phase is `MountedToPod`.
 *
 * A block claim's device node is made in the launcher's hotplug directory and let into its
 * devices cgroup: `devices.allow` under cgroup v1, and under cgroup v2 a device program of
 * the launcher's rules plus the device in place of the one attached (`device_cgroup_v2.ts`).
 *
 * A volume gone from the spec (`removevolume`) is unmounted once the launcher has detached
 * it, and the file removed. What is mounted is recorded first
 * (`<run dir>/hotplug-volume-mounts/<vmi uid>.json`, written whole: `writeFileDurably`), so a
 * restarted handler neither mounts twice nor forgets a mount; cleanup unmounts whatever the
 * record holds. A record that cannot be read (torn by an older version's write) is set aside
 * and reported, and counts as none: the mounts and devices it named are in the launcher's
 * namespace and cgroup only, and end with it.
 *
 * The attachment pod's UID from the volume's status becomes part of a path below the
 * kubelet's pods directory, so it must be a UID (RFC 4122's form, as the apiserver makes
 * them); any other value fails that volume's mount with a {@linkcode HotplugMountError}.
 *
 * @module
 */
import { join } from "node:path";
import {
  bindContainerFileInChild,
  chownBeneath,
  close,
  errorText,
  fileIdentity,
  listenerPid,
  mknodBlockBeneath,
  O_DIRECTORY,
  O_PATH,
  openBeneath,
  openDirectoryInRoot,
  openRoot,
  openSocketBeneath,
  processStartTime,
  runInMountNamespace,
  setFileAside,
  writeFileDurably,
} from "../../../ffi/mod.ts";
import { type VirtualMachineInstance, vmiKey } from "../../api/mod.ts";
import { getLogger } from "../../log/mod.ts";
import { DISK_IMAGE, isHotplugVolume, LAUNCHER_HOTPLUG_DIR, QEMU_USER } from "../../storage/mod.ts";
import { type DeviceRule, LAUNCHER_DEVICE_RULES, setDeviceRules } from "./device_cgroup_v2.ts";
import { removeIfPresent } from "../../lifecycle/mod.ts";

const log = getLogger("handler", "hotplug");

/** The attachment pod's socket, below its directory. */
const ATTACH_SOCKET = "volumes/kubernetes.io~empty-dir/hotplug-disks/hp.sock";

/** A pod UID as the apiserver makes them (RFC 4122, lowercase hex). */
const POD_UID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** What a VMI's hotplug mounts are: enough for a restarted handler to undo them. */
interface HotplugRecord {
  /** The launcher whose namespace holds the mounts, and its start time (PIDs get reused). */
  launcherPid: number;
  launcherStart?: string;
  /** The mounted volumes, by name. */
  volumes: string[];
  /** The block volumes among them, with their device (`major:minor`) let into the launcher. */
  devices?: Record<string, string>;
  /** The memory dump volumes among them: the claim's directory, mounted at `<volume>`. */
  directories?: string[];
}

/** A hotplugged volume that cannot be handed to the launcher. */
export class HotplugMountError extends Error {
  /** Creates `Cannot mount hotplugged volume "<volume>" of VMI "<key>": <detail>`. */
  constructor(key: string, volume: string, detail: string, options?: ErrorOptions) {
    super(`Cannot mount hotplugged volume "${volume}" of VMI "${key}": ${detail}`, options);
    this.name = "HotplugMountError";
  }
}

/** The hotplugged volumes of a VMI that have an attachment pod, its pod's UID, and whether block. */
function attached(
  vmi: VirtualMachineInstance,
): { volume: string; podUid: string; block: boolean; directory: boolean }[] {
  const inSpec = new Set((vmi.spec.volumes ?? []).map((v) => v.name));
  return (vmi.status?.volumeStatus ?? []).flatMap((s) => {
    const podUid = s.hotplugVolume?.attachPodUID;
    if (!podUid || !inSpec.has(s.name)) return [];
    return [{
      volume: s.name,
      podUid,
      block: s.persistentVolumeClaimInfo?.volumeMode === "Block",
      // A memory dump's claim is mounted whole, a directory the launcher writes the dump to.
      directory: s.memoryDumpVolume !== undefined,
    }];
  });
}

/** Why a parsed record is not one, or undefined. */
function invalidRecord(value: unknown): string | undefined {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    return "not a JSON object";
  }
  const r = value as Record<string, unknown>;
  if (!Number.isInteger(r.launcherPid)) return "launcherPid is not a number";
  if (r.launcherStart !== undefined && typeof r.launcherStart !== "string") {
    return "launcherStart is not a string";
  }
  if (!Array.isArray(r.volumes) || r.volumes.some((v) => typeof v !== "string")) {
    return "volumes is not a list of names";
  }
  if (
    r.devices !== undefined &&
    (typeof r.devices !== "object" || r.devices === null ||
      Object.values(r.devices).some((d) => typeof d !== "string"))
  ) {
    return "devices is not a map of volume to device";
  }
  return undefined;
}

/** The VMI's own claims (not hotplugged), whose device nodes the kubelet put in the launcher's `/dev`. */
function ownBlockClaims(vmi: VirtualMachineInstance): string[] {
  return (vmi.spec.volumes ?? []).filter((v) =>
    (v.persistentVolumeClaim || v.dataVolume) && !isHotplugVolume(vmi, v)
  ).map((v) => v.name);
}

/** Mounts and unmounts the hotplugged volumes of launcher pods; see the module doc. */
export class HotplugMounts {
  readonly #recordDir: string;
  readonly #podsDir: string;
  /** Each VMI's record, once read or written (by UID). */
  readonly #records = new Map<string, HotplugRecord>();

  /** Records go below `recordDir`; attachment pods are below `podsDir`. */
  constructor(recordDir: string, podsDir: string) {
    this.#recordDir = recordDir;
    this.#podsDir = podsDir;
  }

  #path(uid: string): string {
    return join(this.#recordDir, `${uid}.json`);
  }

  async #read(uid: string): Promise<HotplugRecord | undefined> {
    const cached = this.#records.get(uid);
    if (cached) return cached;
    const file = this.#path(uid);
    let text: string;
    try {
      text = await Deno.readTextFile(file);
    } catch (error) {
      if (error instanceof Deno.errors.NotFound) return undefined;
      throw error;
    }
    let reason: string;
    try {
      const parsed: unknown = JSON.parse(text);
      const why = invalidRecord(parsed);
      if (why === undefined) {
        this.#records.set(uid, parsed as HotplugRecord);
        return parsed as HotplugRecord;
      }
      reason = why;
    } catch (error) {
      reason = `not JSON: ${errorText(error)}`;
    }
    const movedTo = await setFileAside(file);
    log.error("Set aside unreadable hotplug mount record {file}: {reason}", {
      uid,
      file,
      reason,
      movedTo,
    });
    return undefined;
  }

  async #write(uid: string, record: HotplugRecord): Promise<void> {
    if (record.volumes.length === 0) {
      this.#records.delete(uid);
      await removeIfPresent(this.#path(uid));
      return;
    }
    await writeFileDurably(this.#path(uid), JSON.stringify(record), {
      mode: 0o600,
      dirMode: 0o700,
    });
    this.#records.set(uid, record);
  }

  /** The volumes of the VMI mounted into its launcher now. */
  async mounted(uid: string): Promise<ReadonlySet<string>> {
    return new Set((await this.#read(uid))?.volumes ?? []);
  }

  /**
   * Mounts each hotplugged volume of `vmi` whose attachment pod serves its socket into the
   * launcher `launcherPid`; a pod not serving yet is looked at on a later sync.
   */
  async mount(vmi: VirtualMachineInstance, launcherPid: number): Promise<void> {
    const uid = vmi.metadata.uid!;
    const key = vmiKey(vmi.metadata);
    const launcherStart = processStartTime(launcherPid);
    let record = await this.#read(uid);
    if (record && record.launcherStart !== launcherStart) {
      record = undefined; // another launcher's mounts went with its namespace
    }
    let refused: HotplugMountError | undefined;
    for (const { volume, podUid, block, directory } of attached(vmi)) {
      if (record?.volumes.includes(volume)) continue;
      if (!POD_UID.test(podUid)) {
        // Never a path from it: the other volumes go on, this one fails the sync.
        refused ??= new HotplugMountError(
          key,
          volume,
          `its attachPodUID ${JSON.stringify(podUid)} is not a pod UID`,
        );
        continue;
      }
      if (block) {
        const device = attachmentDevice(`${this.#podsDir}/${podUid}`, volume);
        if (device === undefined) continue;
        record = {
          launcherPid,
          launcherStart,
          volumes: [...(record?.volumes ?? []), volume],
          devices: { ...record?.devices, [volume]: deviceName(device.rdev) },
        };
        await this.#write(uid, record);
        try {
          giveBlockDevice(launcherPid, volume, device, {
            claims: ownBlockClaims(vmi),
            hotplugged: Object.values(record.devices ?? {}),
          });
        } catch (error) {
          // The mount's own error is thrown below; one left mounted is logged.
          await this.#unmountVolumes(launcherPid, [volume], launcherStart, record.devices)
            .catch((undoError) =>
              log.warn("Cannot undo the hotplug mount of {volume}: {error}", {
                uid,
                volume,
                error: undoError,
              })
            );
          const { [volume]: _, ...devices } = record.devices ?? {};
          record = { ...record, volumes: record.volumes.filter((v) => v !== volume), devices };
          await this.#write(uid, record);
          throw new HotplugMountError(key, volume, String(error), { cause: error });
        }
        log.info("Hotplugged block volume made in the launcher", { key, uid, volume, podUid });
        continue;
      }
      const pid = await attachmentPid(`${this.#podsDir}/${podUid}`);
      if (pid === undefined) continue;
      // Recorded first: a restart in between unmounts what may be there.
      record = {
        ...record,
        launcherPid,
        launcherStart,
        volumes: [...(record?.volumes ?? []), volume],
        ...(directory ? { directories: [...(record?.directories ?? []), volume] } : {}),
      };
      await this.#write(uid, record);
      const target = mountName(volume, directory);
      try {
        await bindContainerFileInChild({
          containerPid: pid,
          sourcePath: directory ? `/${volume}` : `/${volume}/${DISK_IMAGE}`,
          inContainerNamespace: true,
          targetPid: launcherPid,
          targetDir: LAUNCHER_HOTPLUG_DIR,
          targetName: target,
          readonly: false,
          directory,
        });
        const dir = openDirectoryInRoot(`/proc/${launcherPid}/root`, LAUNCHER_HOTPLUG_DIR);
        try {
          chownBeneath(dir.path, target, QEMU_USER, QEMU_USER);
        } finally {
          dir.release();
        }
      } catch (error) {
        record = {
          ...record,
          volumes: record.volumes.filter((v) => v !== volume),
          directories: record.directories?.filter((v) => v !== volume),
        };
        // The mount's own error is thrown below; one left mounted is logged.
        await this.#unmountVolumes(launcherPid, [volume], undefined, {}, [], [volume])
          .catch((undoError) =>
            log.warn("Cannot undo the hotplug mount of {volume}: {error}", {
              uid,
              volume,
              error: undoError,
            })
          );
        await this.#write(uid, record);
        throw new HotplugMountError(key, volume, String(error), { cause: error });
      }
      log.info("Hotplugged volume mounted into the launcher", { key, uid, volume, podUid });
    }
    if (refused) throw refused;
  }

  /** Unmounts each mounted volume no longer in the VMI's spec (the launcher detached it). */
  async unplug(vmi: VirtualMachineInstance): Promise<void> {
    const uid = vmi.metadata.uid!;
    const record = await this.#read(uid);
    if (!record) return;
    const inSpec = new Set((vmi.spec.volumes ?? []).map((v) => v.name));
    const gone = record.volumes.filter((v) => !inSpec.has(v));
    if (gone.length === 0) return;
    await this.#unmountVolumes(
      record.launcherPid,
      gone,
      record.launcherStart,
      record.devices,
      ownBlockClaims(vmi),
      record.directories,
    );
    const devices = Object.fromEntries(
      Object.entries(record.devices ?? {}).filter(([v]) => inSpec.has(v)),
    );
    await this.#write(uid, {
      ...record,
      volumes: record.volumes.filter((v) => inSpec.has(v)),
      devices,
      directories: record.directories?.filter((v) => inSpec.has(v)),
    });
    log.info("Hotplugged volumes unmounted from the launcher", {
      key: vmiKey(vmi.metadata),
      uid,
      volumes: gone,
    });
  }

  /** Unmounts every recorded volume of the VMI (its cleanup); idempotent. */
  async unmountAll(uid: string): Promise<void> {
    const record = await this.#read(uid);
    if (!record) return;
    await this.#unmountVolumes(
      record.launcherPid,
      record.volumes,
      record.launcherStart,
      record.devices,
      [],
      record.directories,
    );
    await this.#write(uid, { ...record, volumes: [], devices: {}, directories: [] });
  }

  /**
   * Unmounts and removes `<volume>.img` (a memory dump's directory `<volume>`) in the
   * launcher's namespace while it runs; a block volume's device node is removed and its
   * device shut out of the launcher's cgroup.
   */
  async #unmountVolumes(
    launcherPid: number,
    volumes: string[],
    launcherStart = processStartTime(launcherPid),
    devices: Record<string, string> = {},
    claims: readonly string[] = [],
    directories: readonly string[] = [],
  ): Promise<void> {
    if (launcherStart === undefined || processStartTime(launcherPid) !== launcherStart) return;
    const remaining = Object.entries(devices).filter(([v]) => !volumes.includes(v))
      .map(([, d]) => d);
    for (const v of volumes) {
      if (devices[v] !== undefined) {
        takeBlockDevice(launcherPid, v, devices[v], { claims, hotplugged: remaining });
      }
    }
    const files = volumes.filter((v) => devices[v] === undefined);
    if (files.length === 0) return;
    await runInMountNamespace(
      launcherPid,
      files.map((v) => ({
        op: "unmountFile" as const,
        dir: LAUNCHER_HOTPLUG_DIR,
        name: mountName(v, directories.includes(v)),
      })),
    ).catch((error) => {
      // The launcher ended meanwhile: its namespace and mounts are gone with it.
      if (processStartTime(launcherPid) === launcherStart) throw error;
    });
    let dir;
    try {
      dir = openDirectoryInRoot(`/proc/${launcherPid}/root`, LAUNCHER_HOTPLUG_DIR);
    } catch {
      return;
    }
    try {
      for (const v of files) {
        // Unmounted already: an empty mount point left in the launcher's dir is harmless.
        const name = mountName(v, directories.includes(v));
        await removeIfPresent(`${dir.path}/${name}`).catch((error) =>
          log.warn("Cannot remove the hotplug mount point {volume}: {error}", { volume: v, error })
        );
      }
    } finally {
      dir.release();
    }
  }
}

/**
 * The name a volume is mounted at in the launcher's hotplug directory, as KubeVirt's
 * launcher looks for it: `<volume>.img`, or the directory `<volume>` of a memory dump.
 */
function mountName(volume: string, directory: boolean): string {
  return directory ? volume : `${volume}.img`;
}

/** The PID of the attachment pod's server on `hp.sock` below the pod's directory. */
async function attachmentPid(podDir: string): Promise<number | undefined> {
  let socket;
  try {
    socket = openSocketBeneath(podDir, ATTACH_SOCKET);
  } catch {
    return undefined; // not there (yet)
  }
  try {
    return await listenerPid(socket.path);
  } catch {
    return undefined; // not accepting yet, or not in time
  } finally {
    socket.release();
  }
}

/** The attachment pod's volume holding each block claim's device node, below its directory. */
const ATTACH_DEVICES = "volumes/kubernetes.io~empty-dir/hotplug-disks";
const S_IFMT = 0o170000;
const S_IFBLK = 0o060000;

/**
 * The block device the kubelet gave the attachment pod for `volume`: the single node in
 * `hotplug-disks/<volume>/` of the pod's directory, reached without following a symlink;
 * undefined while it is not there.
 */
function attachmentDevice(
  podDir: string,
  volume: string,
): { rdev: bigint; mode: number } | undefined {
  let dir;
  try {
    dir = openDirectoryBeneath(podDir, `${ATTACH_DEVICES}/${volume}`);
  } catch {
    return undefined; // not there (yet)
  }
  try {
    const names = [...Deno.readDirSync(dir.path)].map((e) => e.name);
    if (names.length !== 1) return undefined;
    const id = identityBeneath(dir.path, names[0]);
    if ((id.mode & S_IFMT) !== S_IFBLK) {
      throw new Error(`${ATTACH_DEVICES}/${volume}/${names[0]} is not a block device`);
    }
    return { rdev: id.rdev, mode: id.mode };
  } finally {
    dir.release();
  }
}

/** `major:minor` of a Linux `st_rdev`. */
function deviceName(rdev: bigint): string {
  const major = ((rdev >> 8n) & 0xfffn) | ((rdev >> 32n) & ~0xfffn);
  const minor = (rdev & 0xffn) | ((rdev >> 12n) & ~0xffn);
  return `${major}:${minor}`;
}

/**
 * Which cgroup holds a process's device rules, from its `/proc/<pid>/cgroup`: its devices
 * controller's (v1, also on a hybrid host) or, with none, its cgroup v2 one (whose rules
 * are an eBPF program). The path is relative to the hierarchy's root.
 */
export function deviceCgroupOf(procCgroup: string): { version: 1 | 2; path: string } {
  const lines = procCgroup.split("\n");
  const v1 = lines.find((l) => l.split(":")[1]?.split(",").includes("devices"));
  if (v1) return { version: 1, path: v1.split(":").slice(2).join(":") };
  const v2 = lines.find((l) => l.startsWith("0::"));
  if (!v2) throw new Error("the process is in no devices cgroup, v1 or v2");
  const path = v2.slice(3);
  if (path.startsWith("/..")) {
    throw new Error(`its cgroup "${path}" is outside the handler's cgroup namespace`);
  }
  return { version: 2, path };
}

/** The launcher's device cgroup directory in the host's tree, and its version. */
function launcherDeviceCgroup(pid: number): { version: 1 | 2; dir: string } {
  const { version, path } = deviceCgroupOf(Deno.readTextFileSync(`/proc/${pid}/cgroup`));
  // The path is the host's (cgroup v1 gives containers no cgroup namespace), so it is
  // looked up in the host's cgroup tree, through PID 1's root: a handler in a pod has only
  // its own container's cgroup at /sys/fs/cgroup. Where PID 1's root cannot be opened
  // (a sandbox's), the handler runs on the host and its own tree is the host's.
  const root = version === 1 ? hostDevicesCgroups() : hostUnifiedCgroups();
  return { version, dir: `${root}${path === "/" ? "" : path}` };
}

let devicesCgroupRoot: string | undefined;

/** The host's devices cgroup tree, seen through PID 1's root where it can be opened. */
function hostDevicesCgroups(): string {
  if (devicesCgroupRoot === undefined) {
    const viaInit = "/proc/1/root/sys/fs/cgroup/devices";
    try {
      Deno.statSync(viaInit);
      devicesCgroupRoot = viaInit;
    } catch {
      devicesCgroupRoot = "/sys/fs/cgroup/devices";
    }
  }
  return devicesCgroupRoot;
}

let unifiedRoot: string | undefined;

/**
 * The host's cgroup2 hierarchy (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a hybrid
 * host), from PID 1's mount table and through its root where that can be opened, as the
 * v1 tree above.
 */
function hostUnifiedCgroups(): string {
  if (unifiedRoot === undefined) {
    let viaInit = true;
    let table: string;
    try {
      table = Deno.readTextFileSync("/proc/1/mountinfo");
      Deno.statSync("/proc/1/root/sys/fs/cgroup");
    } catch {
      viaInit = false;
      table = Deno.readTextFileSync("/proc/self/mountinfo");
    }
    const line = table.split("\n").find((l) => l.split(" - ")[1]?.startsWith("cgroup2 "));
    if (!line) throw new Error("the host mounts no cgroup2 hierarchy for the launcher's devices");
    unifiedRoot = `${viaInit ? "/proc/1/root" : ""}${line.split(" ")[4]}`;
  }
  return unifiedRoot;
}

/**
 * The device rules of a launcher under cgroup v2: KubeVirt's defaults, the device of each
 * of the VMI's own block claims (`/dev/<volume>`, which the kubelet made; looked at inside
 * the launcher's root, no symlink followed, and nothing else of its `/dev`), and the
 * hotplugged ones.
 */
function launcherDeviceRules(
  pid: number,
  claims: readonly string[],
  hotplugged: readonly string[],
): DeviceRule[] {
  const rules = [...LAUNCHER_DEVICE_RULES];
  const block = (name: string) => {
    const [major, minor] = name.split(":").map(Number);
    rules.push({ type: "b", major, minor, access: "rwm" });
  };
  if (claims.length > 0) {
    const dev = openDirectoryInRoot(`/proc/${pid}/root`, "/dev");
    try {
      for (const claim of claims) {
        let id;
        try {
          id = identityBeneath(dev.path, claim);
        } catch {
          continue; // a filesystem claim, or none
        }
        if ((id.mode & S_IFMT) === S_IFBLK) block(deviceName(id.rdev));
      }
    } finally {
      dev.release();
    }
  }
  hotplugged.forEach(block);
  return rules;
}

/** Lets the launcher's cgroup use the block `device` (`major:minor`) of `hotplugged`. */
function allowBlockDevice(
  pid: number,
  device: string,
  devices: { claims: readonly string[]; hotplugged: readonly string[] },
): void {
  const cgroup = launcherDeviceCgroup(pid);
  if (cgroup.version === 1) {
    Deno.writeTextFileSync(`${cgroup.dir}/devices.allow`, `b ${device} rwm`);
  } else setDeviceRules(cgroup.dir, launcherDeviceRules(pid, devices.claims, devices.hotplugged));
}

/** Shuts the block `device` out of the launcher's cgroup; `remaining` stay allowed. */
function denyBlockDevice(
  pid: number,
  device: string,
  devices: { claims: readonly string[]; hotplugged: readonly string[] },
): void {
  const cgroup = launcherDeviceCgroup(pid);
  if (cgroup.version === 1) Deno.writeTextFileSync(`${cgroup.dir}/devices.deny`, `b ${device} rwm`);
  else setDeviceRules(cgroup.dir, launcherDeviceRules(pid, devices.claims, devices.hotplugged));
}

/**
 * Makes `<volume>` in the launcher's hotplug directory the block device node of `device`
 * (inside the launcher's root, no symlink followed), lets the launcher's cgroup use it and
 * gives it to QEMU's user, as KubeVirt's handler does.
 */
function giveBlockDevice(
  pid: number,
  volume: string,
  device: { rdev: bigint; mode: number },
  devices: { claims: readonly string[]; hotplugged: readonly string[] },
): void {
  const dir = openDirectoryInRoot(`/proc/${pid}/root`, LAUNCHER_HOTPLUG_DIR);
  try {
    try {
      mknodBlockBeneath(dir.path, volume, device.rdev, device.mode & 0o777);
    } catch (error) {
      // One a restart left: the same device is fine, anything else is not.
      const id = identityBeneath(dir.path, volume);
      if ((id.mode & S_IFMT) !== S_IFBLK || id.rdev !== device.rdev) throw error;
    }
    allowBlockDevice(pid, deviceName(device.rdev), devices);
    chownBeneath(dir.path, volume, QEMU_USER, QEMU_USER);
  } finally {
    dir.release();
  }
}

/** Removes a block volume's node from the launcher and shuts its device out of its cgroup. */
function takeBlockDevice(
  pid: number,
  volume: string,
  device: string,
  remaining: { claims: readonly string[]; hotplugged: readonly string[] },
): void {
  try {
    const dir = openDirectoryInRoot(`/proc/${pid}/root`, LAUNCHER_HOTPLUG_DIR);
    try {
      Deno.removeSync(`${dir.path}/${volume}`); // unlink(2) never follows the last component
    } catch {
      /* gone */
    } finally {
      dir.release();
    }
    denyBlockDevice(pid, device, remaining);
  } catch (error) {
    // The launcher ended meanwhile: its cgroup and root are gone with it.
    if (processStartTime(pid) !== undefined) throw error;
  }
}

/** Mode and device of `name` in the directory `dir`, the name itself never followed. */
function identityBeneath(dir: string, name: string): { mode: number; rdev: bigint } {
  const dirFd = openRoot(dir);
  try {
    const fd = openBeneath(dirFd, name, { flags: O_PATH });
    try {
      return fileIdentity(fd);
    } finally {
      close(fd);
    }
  } finally {
    close(dirFd);
  }
}

/** A directory below `root` reached with no symlink on the way (the pod's own directory). */
function openDirectoryBeneath(root: string, path: string): { path: string; release(): void } {
  const rootFd = openRoot(root);
  let fd: number;
  try {
    fd = openBeneath(rootFd, path, { flags: O_PATH | O_DIRECTORY });
  } finally {
    close(rootFd);
  }
  return { path: `/proc/self/fd/${fd}`, release: () => close(fd) };
}

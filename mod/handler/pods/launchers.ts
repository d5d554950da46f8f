/**
 * KubeVirt mode's {@linkcode LauncherProvider}: virt-controller creates a launcher pod
 * per VMI and the kubelet runs it; the handler starts and stops nothing. It finds the
 * pod's cmd socket below the kubelet's pods directory, for the pods `status.activePods`
 * names on this node, and records it in the VMI's ghost record before the first call.
 *
 * The pod controls what is in its volume. The socket is therefore opened beneath the
 * pod's directory without following any symlink and dialled through that descriptor
 * (`/proc/self/fd/<fd>`), which also keeps the address short: the kubelet's volume
 * paths are longer than a unix socket address allows (108 bytes).
 *
 * Before the handler's first call to a pod's launcher it opens the pod's notify pipe
 * ({@linkcode NotifyPipes}), so the launcher's domain events reach the handler.
 *
 * @module
 */
import { join } from "node:path";
import {
  DOWNWARD_METRICS_CHANNEL_DIR,
  DOWNWARD_METRICS_DISK,
  DOWNWARD_METRICS_DISK_DIR,
  DOWNWARD_METRICS_SOCKET,
  launcherSocketDirOnHost,
  Paths,
  SocketNames,
  type VirtualMachineInstance,
  vmiPrivateDir,
} from "../../api/mod.ts";
import type { PodNetworkTarget } from "../../network/mod.ts";
import { placeQemuThreads, QemuLocator, realtimeMask } from "../../cpus/mod.ts";
import { domainNameOf } from "../../domain/mod.ts";
import { aborted } from "../../lifecycle/mod.ts";
import { getLogger } from "../../log/mod.ts";
import {
  type BeneathSocket,
  getAffinity,
  NotASocketError,
  openDirectoryInRoot,
  openRegularFileBeneath,
  openSocketBeneath,
} from "../../../ffi/mod.ts";
import { NotifyPipes } from "./notify_pipes.ts";
import type { NotifyHandlers } from "../notify_server.ts";
import { ContainerDiskMounts } from "./container_disk_mounts.ts";
import { HotplugMounts } from "./hotplug_mounts.ts";
import { claimLauncherDevices } from "./device_ownership.ts";
import {
  adjustQemuMemlock,
  adjustVirtqemudMemlock,
  type MemlockOptions,
  needsLockedMemory,
} from "./memlock.ts";
import type { GhostRecordStore } from "../ghost_records.ts";
import type { DialResolver } from "../launcher_clients.ts";
import {
  claimInfoOf,
  prepareHostDisks,
  replaceClaimsByHostDisks,
  TOLERATED_LESS_SPACE_PERCENT,
} from "../../storage/mod.ts";
import {
  type DiskEventRecorder,
  type LauncherProvider,
  launchersOfGhostRecords,
  type LauncherStart,
  type MigrationSourceDir,
} from "../launcher_provider.ts";
import { migrationPorts, proxyKey, type ProxyTarget } from "../../migration/mod.ts";

const log = getLogger("handler", "pod-launchers");

/**
 * How soon a VMI whose pod socket has not appeared is looked at again, ms (nothing
 * watches the kubelet's directories for it).
 */
export const POD_SOCKET_POLL_MS = 250;

/** A pod UID as the kubelet names its directory. */
const POD_UID = /^[0-9a-zA-Z-]+$/;

/** Options of {@linkcode PodLaunchers}. */
export interface PodLaunchersOptions {
  /** This node's name: only pods on it are looked at. */
  nodeName: string;
  /** The ghost record store the handler keeps. */
  ghosts: GhostRecordStore;
  /** The kubelet's pods directory (`/var/lib/kubelet/pods`). */
  podsDir: string;
  /**
   * Where the messages of launcher pods go, through each pod's pipe (a launcher that
   * shares the handler's mount namespace dials the handler's notify socket instead).
   */
  notify: NotifyHandlers;
  /** Where the containerDisk mounts of each VMI are recorded. */
  mountRecordDir: string;
  /** Where the hotplugged volume mounts of each VMI are recorded. */
  hotplugRecordDir: string;
  /**
   * The cluster's `useEmulation`, read at each use: only then may a launcher lack
   * `/dev/kvm` (default: it may, as if emulation were on).
   */
  emulation?: () => boolean;
  /** KubeVirt's `ImageVolume` gate, read at each use: containerDisks come as image volumes. */
  imageVolume?: () => boolean;
  /** The CR's `additionalGuestMemoryOverheadRatio`, read at each use (see memlock.ts). */
  memoryOverheadRatio?: () => string | undefined;
  /** Where the host's process table is (default `/proc`; tests give a fixture). */
  procRoot?: string;
  /** Sets a process's locked-memory limit (default `prlimit(2)`; tests record it). */
  setMemlockLimit?: (pid: number, bytes: number) => void;
}

/** Launchers as the pods virt-controller creates. */
export class PodLaunchers implements LauncherProvider {
  /** For logs. */
  readonly name = "kubevirt";
  /** virt-controller schedules VMIs and owns `Ready` here. */
  /** Each pod's socket is dialled by the handler's monitor, as KubeVirt's handler does. */
  readonly watchesLaunchers = false;
  /** See {@linkcode POD_SOCKET_POLL_MS}. */
  readonly notReadyRequeueMs: number = POD_SOCKET_POLL_MS;
  readonly #o: PodLaunchersOptions;
  readonly #pipes: NotifyPipes;
  /** The launcher socket whose devices were handed to the runtime user, per VMI. */
  readonly #claimed = new Map<string, string>();
  /** The launcher socket whose virtqemud got its locked-memory limit, per VMI. */
  readonly #memlocked = new Map<string, string>();
  /** Each dedicated-CPU VMI's QEMU, found once (mod/cpus). */
  readonly #qemus = new QemuLocator();
  readonly #disks: ContainerDiskMounts;
  readonly #hotplug: HotplugMounts;

  /** Creates the provider; it only looks, so nothing starts. */
  constructor(options: PodLaunchersOptions) {
    this.#o = options;
    this.#disks = new ContainerDiskMounts(options.mountRecordDir, {
      imageVolume: options.imageVolume,
    });
    this.#hotplug = new HotplugMounts(options.hotplugRecordDir, options.podsDir);
    this.#pipes = new NotifyPipes({
      handlers: options.notify,
      dialResolver: this.dialResolver,
    });
  }

  /** The ghost record's socket, else the socket of an active pod of the VMI on this node. */
  socketOf(vmi: VirtualMachineInstance): Promise<string | undefined> {
    const ghost = this.#o.ghosts.get(vmi.metadata.uid!);
    if (ghost) return Promise.resolve(ghost.socketFile);
    for (const [podUid, node] of Object.entries(vmi.status?.activePods ?? {})) {
      if (node !== this.#o.nodeName || !POD_UID.test(podUid)) continue;
      const socket = join(launcherSocketDirOnHost(podUid, this.#o.podsDir), SocketNames.Launcher);
      try {
        // Only a real socket reached without a symlink counts as the launcher's.
        this.dialResolver(socket).release();
      } catch {
        continue; // not there yet, or not something the handler may dial
      }
      return Promise.resolve(socket);
    }
    return Promise.resolve(undefined);
  }

  /** See {@linkcode LauncherProvider.launcherPodGone}. */
  launcherPodGone(vmi: VirtualMachineInstance): Promise<boolean> {
    for (const [podUid, node] of Object.entries(vmi.status?.activePods ?? {})) {
      if (node !== this.#o.nodeName || !POD_UID.test(podUid)) continue;
      try {
        // Whether it is there, not what it holds: a link is not followed.
        Deno.lstatSync(launcherSocketDirOnHost(podUid, this.#o.podsDir));
        return Promise.resolve(false);
      } catch {
        // This pod's folder is gone; another active pod may still have one.
      }
    }
    return Promise.resolve(true);
  }

  /**
   * Opens a launcher pod's socket beneath the pod's directory, following no symlink: a
   * pod that replaced its socket or a directory on the way with a link gets no connection.
   */
  readonly dialResolver: DialResolver = (socketFile) => {
    const prefix = `${this.#o.podsDir}/`;
    const rest = socketFile.startsWith(prefix) ? socketFile.slice(prefix.length) : "";
    const slash = rest.indexOf("/");
    const podUid = rest.slice(0, Math.max(0, slash));
    if (slash < 0 || !POD_UID.test(podUid)) {
      throw new Error(`Cannot dial "${socketFile}": not a socket below the kubelet's pods`);
    }
    return openSocketBeneath(`${prefix}${podUid}`, rest.slice(slash + 1));
  };

  /**
   * Finds the pod's socket, records it and opens the pod's notify pipe; starts nothing
   * (the pod is virt-controller's).
   */
  async start(vmi: VirtualMachineInstance): Promise<LauncherStart> {
    const uid = vmi.metadata.uid!;
    const socket = await this.socketOf(vmi);
    if (!socket) return { absent: "the launcher pod's socket has not appeared yet" };
    if (!this.#o.ghosts.get(uid)) {
      await this.#o.ghosts.add({
        name: vmi.metadata.name,
        namespace: vmi.metadata.namespace!,
        socketFile: socket,
        uid,
      });
    }
    const runtimeUser = vmi.status?.runtimeUser ?? 0;
    if (runtimeUser !== 0 && this.#claimed.get(uid) !== socket) {
      // Before the domain is defined: QEMU opens them as this user. A failure is the
      // sync's (it retries), so no domain starts that could not open its devices.
      const pid = await this.#pipes.launcherPid(socket);
      const devices = claimLauncherDevices(`/proc/${pid}/root`, runtimeUser, {
        emulation: this.#o.emulation?.() ?? true,
      });
      this.#claimed.set(uid, socket);
      log.debug("Launcher devices handed to the runtime user", { uid, pid, runtimeUser, devices });
    }
    if (needsLockedMemory(vmi) && this.#memlocked.get(uid) !== socket) {
      // Before the domain is defined: virtqemud hands its limit to the QEMU it starts. A
      // failure is the sync's (it retries), as virt-handler's "failed to adjust resources".
      const pid = await this.#pipes.launcherPid(socket);
      let set;
      try {
        set = await adjustVirtqemudMemlock(vmi, pid, this.#memlockOptions());
      } catch (error) {
        throw new Error(`failed to adjust resources: ${(error as Error).message}`, {
          cause: error,
        });
      }
      if (set) {
        this.#memlocked.set(uid, socket);
        log.info("Locked-memory limit set for the launcher's virtqemud", { uid, ...set });
      }
    }
    if (!this.#pipes.has(uid, socket)) {
      try {
        await this.#pipes.open(
          { uid, namespace: vmi.metadata.namespace!, name: vmi.metadata.name },
          socket,
          runtimeUser,
        );
      } catch (error) {
        // Calls still work without it; the next sync tries again.
        log.warn("No notify pipe for the launcher pod yet: {error}", {
          namespace: vmi.metadata.namespace,
          name: vmi.metadata.name,
          uid,
          error,
        });
      }
    }
    return { socket };
  }

  /** The pod's directory of a launcher socket below the kubelet's pods directory. */
  #podDir(socket: string): string {
    const rest = socket.slice(this.#o.podsDir.length + 1);
    return `${this.#o.podsDir}/${rest.slice(0, rest.indexOf("/"))}`;
  }

  /**
   * Binds each containerDisk from its container into the launcher (see
   * `ContainerDiskMounts`), then creates the missing images of its host disks and filesystem
   * claims and hands its disks to a non-root runtime user (see `prepareHostDisks`); `vmi` is
   * {@linkcode PodLaunchers.forLauncher}'s.
   */
  async prepareDisks(
    vmi: VirtualMachineInstance,
    record: DiskEventRecorder,
  ): Promise<"ready" | "notReady"> {
    const volumes = vmi.spec.volumes ?? [];
    const runtimeUser = vmi.status?.runtimeUser ?? 0;
    const containerDisks = volumes.some((v) => v.containerDisk) ||
      Boolean(vmi.spec.domain.firmware?.kernelBoot?.container?.image);
    const hostDisks = volumes.some((v) =>
      v.hostDisk?.type === "DiskOrCreate" ||
      (runtimeUser !== 0 && claimInfoOf(vmi, v.name)?.volumeMode === "Block")
    );
    if (!containerDisks && !hostDisks) return "ready";
    const socket = await this.socketOf(vmi);
    if (!socket) return "notReady";
    const pid = await this.#pipes.launcherPid(socket);
    if (containerDisks) {
      const done = await this.#disks.mount(vmi, this.#podDir(socket), pid);
      if (done !== "mounted") return "notReady";
    }
    if (hostDisks) {
      const done = await prepareHostDisks(vmi, { root: `/proc/${pid}/root`, runtimeUser });
      for (const t of done.tolerated) {
        record(
          "Normal",
          "ToleratedSmallPV",
          `PV size too small: expected ${t.expected} B, found ${t.found} B. Using it anyway, ` +
            `it is within ${TOLERATED_LESS_SPACE_PERCENT} % toleration`,
        );
      }
      if (done.created.length > 0 || done.chowned.length > 0) {
        log.info("Host disks prepared in the launcher pod", {
          namespace: vmi.metadata.namespace,
          name: vmi.metadata.name,
          uid: vmi.metadata.uid,
          created: done.created,
          chowned: done.chowned,
        });
      }
    }
    return "ready";
  }

  /** Mounts the VMI's attached hotplug volumes into its launcher (see `HotplugMounts`). */
  async hotplug(vmi: VirtualMachineInstance): Promise<void> {
    if (!vmi.status?.volumeStatus?.some((s) => s.hotplugVolume?.attachPodUID)) return;
    const socket = await this.socketOf(vmi);
    if (socket) await this.#hotplug.mount(vmi, await this.#pipes.launcherPid(socket));
  }

  /**
   * The target launcher's virtqemud socket and QEMU's incoming sockets, in its pod's
   * `/var/run/libvirt` and `/var/run/kubevirt/migrationproxy`, each folder opened inside the
   * launcher's root and the socket beneath it with no link followed, per connection.
   */
  async migrationTargets(vmi: VirtualMachineInstance): Promise<ProxyTarget[]> {
    const socket = await this.socketOf(vmi);
    if (!socket) throw new Error("the VMI has no launcher on this node yet");
    const root = `/proc/${await this.#pipes.launcherPid(socket)}/root`;
    const at = (dir: string, name: string, fallback?: string) => () => {
      const folder = openDirectoryInRoot(root, dir);
      try {
        try {
          return Promise.resolve(openSocketBeneath(folder.path, name));
        } catch (error) {
          if (!fallback || !(error instanceof NotASocketError)) throw error;
          return Promise.resolve(openSocketBeneath(folder.path, fallback));
        }
      } finally {
        folder.release();
      }
    };
    const uid = vmi.metadata.uid!;
    return [
      // virtqemud's socket; a launcher image with the monolithic libvirtd has libvirt-sock
      // (a virtqemud-sock link to it is not followed).
      { port: 0, open: at("/var/run/libvirt", "virtqemud-sock", "libvirt-sock") },
      ...migrationPorts(vmi.status?.migrationMethod === "BlockMigration").map((port) => ({
        port,
        open: at(`${Paths.VirtShareDir}/migrationproxy`, `${proxyKey(uid, port)}-source.sock`),
      })),
    ];
  }

  /**
   * The source launcher's `/var/run/kubevirt/migrationproxy`, made when missing and opened
   * inside its root; the sockets belong to its QEMU's user when the VMI runs as non-root.
   */
  async migrationSourceDir(vmi: VirtualMachineInstance): Promise<MigrationSourceDir> {
    const socket = await this.socketOf(vmi);
    if (!socket) throw new Error("the VMI has no launcher on this node yet");
    const root = `/proc/${await this.#pipes.launcherPid(socket)}/root`;
    const share = openDirectoryInRoot(root, Paths.VirtShareDir);
    try {
      // mkdir makes no link's target: an entry of that name, link or not, is left as it is.
      await Deno.mkdir(`${share.path}/migrationproxy`, { mode: 0o755 }).catch((error) => {
        if (!(error instanceof Deno.errors.AlreadyExists)) throw error;
      });
    } finally {
      share.release();
    }
    const user = vmi.status?.runtimeUser ?? 0;
    const dir = openDirectoryInRoot(root, `${Paths.VirtShareDir}/migrationproxy`);
    // Root's folder, or the launcher's own: KubeVirt's launcher makes it as a migration
    // target and gives it to its QEMU user, so a VMI that migrated here once leaves it so.
    // Nobody else may write to it. Its entries are never followed (the proxy binds, changes
    // and removes its sockets beneath the folder opened here), so a launcher that swaps
    // them reaches nothing of the host's.
    const folder = Deno.statSync(dir.path);
    if ((folder.uid !== 0 && folder.uid !== user) || (folder.mode! & 0o022) !== 0) {
      dir.release();
      throw new Error(
        `Cannot use the launcher's ${Paths.VirtShareDir}/migrationproxy: it belongs to uid ` +
          `${folder.uid} with mode 0${(folder.mode! & 0o777).toString(8)}, not to root or ` +
          `the launcher's user (${user}), writable by its owner alone`,
      );
    }
    return {
      baseDir: root + Paths.VirtShareDir,
      socketDir: dir.path,
      owner: user !== 0 ? { uid: user, gid: user } : undefined,
      release: () => dir.release(),
    };
  }

  /**
   * The CPUs the target's launcher may run on: its container's cpuset, as the kernel
   * applies it to the launcher process (`sched_getaffinity`).
   */
  async dedicatedCpus(vmi: VirtualMachineInstance): Promise<number[] | undefined> {
    const socket = await this.socketOf(vmi);
    return socket ? getAffinity(await this.#pipes.launcherPid(socket)) : undefined;
  }

  /** The launcher's root, found from its socket's peer. */
  async launcherRoot(vmi: VirtualMachineInstance): Promise<string | undefined> {
    const socket = await this.socketOf(vmi);
    return socket ? `/proc/${await this.#pipes.launcherPid(socket)}/root` : undefined;
  }

  #memlockOptions(): MemlockOptions {
    return {
      ratio: this.#o.memoryOverheadRatio?.(),
      procRoot: this.#o.procRoot,
      setLimit: this.#o.setMemlockLimit,
    };
  }

  /**
   * A migration target's QEMU, once the domain arrived, gets the locked-memory limit for the
   * most memory its guest may grow to, so a device can be plugged into it later (see
   * memlock.ts); undefined when the VMI pins no memory. Throws when QEMU cannot be found.
   */
  async lockQemuMemory(
    vmi: VirtualMachineInstance,
  ): Promise<{ pid: number; command: string; bytes: number } | undefined> {
    if (!needsLockedMemory(vmi)) return undefined;
    const socket = await this.socketOf(vmi);
    if (!socket) throw new Error("the VMI has no launcher on this node yet");
    return await adjustQemuMemlock(
      vmi,
      await this.#pipes.launcherPid(socket),
      this.#memlockOptions(),
    );
  }

  /**
   * virt-handler's housekeeping beside KubeVirt's launcher, which pins the vCPUs and the
   * emulator thread and sets no scheduling policy: the realtime mask's vCPU threads get
   * `SCHED_FIFO` 1, every other thread the emulator's CPUs (`isolateEmulatorThread`), the KVM
   * PIT thread vCPU 0's CPUs. Only QEMU processes in the launcher's PID namespace count.
   */
  async placeThreads(vmi: VirtualMachineInstance): Promise<void> {
    const cpu = vmi.spec.domain.cpu;
    if (cpu?.dedicatedCpuPlacement !== true) return;
    const socket = await this.socketOf(vmi);
    if (!socket) return;
    const launcher = await this.#pipes.launcherPid(socket);
    const pidNs = (pid: number) => {
      try {
        return Deno.readLinkSync(`/proc/${pid}/ns/pid`);
      } catch {
        return undefined;
      }
    };
    const own = pidNs(launcher);
    if (own === undefined) return;
    const qemu = this.#qemus.locate(
      vmi.metadata.uid!,
      domainNameOf(vmi.metadata.namespace!, vmi.metadata.name),
      (candidate) => pidNs(candidate) === own,
    );
    // No QEMU yet: the domain starts with a later sync, which comes here again.
    if (!qemu) return;
    const { pid, fresh } = qemu;
    const realtime = cpu.realtime !== undefined;
    const placed = placeQemuThreads(pid, {
      // libvirt pinned QEMU's main thread to the emulator's CPUs.
      housekeeping: cpu.isolateEmulatorThread === true ? getAffinity(pid) : undefined,
      realtime,
      fifo: realtime ? realtimeMask(cpu.realtime?.mask) : undefined,
      pit: fresh,
    });
    if (placed.moved.length > 0 || fresh) {
      log.info("QEMU threads placed", {
        namespace: vmi.metadata.namespace,
        name: vmi.metadata.name,
        qemu: pid,
        housekeeping: placed.moved,
        pit: placed.pit,
      });
    }
  }

  /** The VMI's hotplugged volumes mounted into its launcher. */
  hotplugMounted(uid: string): Promise<ReadonlySet<string>> {
    return this.#hotplug.mounted(uid);
  }

  /** Unmounts the hotplugged volumes gone from the VMI's spec. */
  async unplug(vmi: VirtualMachineInstance): Promise<void> {
    await this.#hotplug.unplug(vmi);
  }

  /** Filesystem claims as the host disks KubeVirt's launcher reads (`replaceClaimsByHostDisks`). */
  forLauncher(vmi: VirtualMachineInstance): VirtualMachineInstance {
    return replaceClaimsByHostDisks(vmi);
  }

  /**
   * Opens `name` in the VMI's `/var/run/kubevirt-private/<uid>` inside its launcher's root
   * (the launcher found from its socket's peer credentials), never through a link out of it.
   */
  async openPrivateSocket(vmi: VirtualMachineInstance, name: string): Promise<BeneathSocket> {
    const socket = await this.socketOf(vmi);
    if (!socket) throw new Error("the VMI has no launcher on this node yet");
    const pid = await this.#pipes.launcherPid(socket);
    const dir = openDirectoryInRoot(`/proc/${pid}/root`, vmiPrivateDir(vmi.metadata.uid!));
    try {
      return openSocketBeneath(dir.path, name);
    } finally {
      dir.release();
    }
  }

  /**
   * Opens the downward metrics channel KubeVirt's launcher gives QEMU, in the launcher's
   * `/var/run/kubevirt-private/downwardmetrics-channel`, never through a link out of it.
   */
  openDownwardMetricsChannel(vmi: VirtualMachineInstance): Promise<BeneathSocket> {
    return this.#inLauncherDir(
      vmi,
      DOWNWARD_METRICS_CHANNEL_DIR,
      (dir) => openSocketBeneath(dir, DOWNWARD_METRICS_SOCKET),
    );
  }

  /** Opens the launcher's vhostmd disk, found inside its root, for writing in place. */
  openDownwardMetricsDisk(vmi: VirtualMachineInstance): Promise<Deno.FsFile> {
    return this.#inLauncherDir(
      vmi,
      DOWNWARD_METRICS_DISK_DIR,
      (dir) => openRegularFileBeneath(dir, DOWNWARD_METRICS_DISK),
    );
  }

  /**
   * Gives `open` the directory `path` of the VMI's launcher, opened inside the launcher's
   * root (the launcher found from its socket's peer credentials), held open while it runs.
   */
  async #inLauncherDir<T>(
    vmi: VirtualMachineInstance,
    path: string,
    open: (dir: string) => T,
  ): Promise<T> {
    const socket = await this.socketOf(vmi);
    if (!socket) throw new Error("the VMI has no launcher on this node yet");
    const pid = await this.#pipes.launcherPid(socket);
    const dir = openDirectoryInRoot(`/proc/${pid}/root`, path);
    try {
      return open(dir.path);
    } finally {
      dir.release();
    }
  }

  /**
   * The launcher pod's network namespace (`/proc/<launcher pid>/ns/net`, the launcher found
   * from its socket's peer credentials) and its `/var/run/kubevirt-private`, opened inside
   * the launcher's root without leaving it.
   */
  async podNetwork(vmi: VirtualMachineInstance): Promise<PodNetworkTarget | undefined> {
    const socket = await this.socketOf(vmi);
    if (!socket) return undefined;
    const pid = await this.#pipes.launcherPid(socket);
    return {
      netns: `/proc/${pid}/ns/net`,
      owner: vmi.status?.runtimeUser ?? 0,
      openLauncherDir: () => openDirectoryInRoot(`/proc/${pid}/root`, Paths.VirtPrivateDir),
    };
  }

  /** None: the launcher pod's taps are in the pod, and nothing of them is left outside. */
  adoptedPodNetwork(): Promise<PodNetworkTarget | undefined> {
    return Promise.resolve(undefined);
  }

  /** Nothing: the pod's network namespace ends with the pod. */
  releasePodNetwork(): Promise<void> {
    return Promise.resolve();
  }

  /** Closes the pod's notify pipe; the pod ends with the VMI, by virt-controller and the kubelet. */
  async stop(vmi: VirtualMachineInstance): Promise<void> {
    this.#claimed.delete(vmi.metadata.uid!);
    this.#memlocked.delete(vmi.metadata.uid!);
    this.#qemus.forget(vmi.metadata.uid!);
    // What stands in for an unreadable mount record: the sockets of the spec's containerDisks.
    const socket = this.#o.ghosts.get(vmi.metadata.uid!)?.socketFile;
    const podDir = socket?.startsWith(`${this.#o.podsDir}/`) ? this.#podDir(socket) : undefined;
    await this.#disks.unmount(vmi.metadata.uid!, { vmi, podDir });
    await this.#hotplug.unmountAll(vmi.metadata.uid!);
    await this.#pipes.close(vmi.metadata.uid!);
  }

  /** Every ghost record's launcher. */
  adoptable(): { uid: string; socket: string; namespace: string; name: string }[] {
    return launchersOfGhostRecords(this.#o.ghosts);
  }

  /** The pipes relay in the background; closes them when `signal` aborts. */
  async run(signal: AbortSignal): Promise<void> {
    await aborted(signal);
    await this.#pipes.closeAll();
  }
}

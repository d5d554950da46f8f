/**
 * The seam between the controller and the two ways launchers come to exist.
 *
 * - KubeVirt mode ({@linkcode PodLaunchers}): virt-controller creates a launcher pod per
 *   VMI; the handler only finds the pod's cmd socket under the kubelet's pods directory.
 * - Pod-less mode ({@linkcode PodlessLaunchers}): no pods; the handler starts launchers
 *   on this host itself and plays the small part of virt-controller it needs
 *   (scheduling Pending VMIs to this node, the `Ready` condition).
 *
 * Everything after "where is this VMI's launcher socket" is the same code: the
 * controller never asks which mode it runs in, only what the provider can do; the one
 * part only pod-less mode has, virt-controller's, is an optional {@linkcode ControllerStandIn}.
 * Both providers write a VMI's ghost record before the handler's first call to its
 * launcher (pod-less: before the launcher is even started).
 *
 * @module
 */
import type { VirtualMachineOptions } from "../proto/mod.ts";
import type {
  ClaimInfo,
  VirtualMachineInstance,
  VirtualMachineInstanceStatus,
} from "../api/mod.ts";
import type { PodNetworkTarget } from "../network/mod.ts";
import type { Runnable } from "../lifecycle/mod.ts";
import type { GhostRecordStore } from "./ghost_records.ts";
import type { DialResolver } from "./launcher_clients.ts";
import type { BeneathSocket } from "../../ffi/mod.ts";
import type { ProxyTarget } from "../migration/mod.ts";

/** Records an Event about the VMI whose disks are being prepared. */
export type DiskEventRecorder = (
  type: "Normal" | "Warning",
  reason: string,
  message: string,
) => void;

/** What {@linkcode LauncherProvider.start} found. */
export type LauncherStart =
  /**
   * The launcher exists (or is starting); its cmd socket is or will be here. `synced` is
   * there when the provider also synced the domain it was given, as `SyncVirtualMachine`
   * would (`error` when that failed); without it, the caller syncs over the cmd socket.
   */
  | { socket: string; synced?: { error?: string } }
  /** No launcher yet, and none can be had now; the provider wakes the key when that changes. */
  | { waiting: string }
  /** No launcher yet (KubeVirt mode: the pod's socket has not appeared). */
  | { absent: string };

/** Where a migration's source sockets go; see {@linkcode LauncherProvider.migrationSourceDir}. */
export interface MigrationSourceDir {
  /** The launcher's `/var/run/kubevirt` as the handler reaches it. */
  baseDir: string;
  /** The folder of the sockets, when not `<baseDir>/migrationproxy` made by the proxy. */
  socketDir?: string;
  /** Who owns the sockets (the user the launcher's libvirt runs as), if not root. */
  owner?: { uid: number; gid: number };
  /** Lets go of what the paths need (a descriptor). */
  release(): void;
}

/** Finds, starts and stops a VMI's launcher: what the controller asks of every launcher. */
export interface LauncherLocator {
  /** How soon to look at a VMI again whose launcher socket has not appeared, ms. */
  readonly notReadyRequeueMs: number;
  /** The cmd socket of the VMI's launcher if one is known; starts nothing. */
  socketOf(vmi: VirtualMachineInstance): Promise<string | undefined>;
  /**
   * KubeVirt mode: whether the launcher pod that never made its socket is gone from this
   * node (none of the VMI's active pods here has its sockets folder on the host any more,
   * as virt-handler's `FindPodDirOnHost` finds). A provider without pods leaves it out.
   */
  launcherPodGone?(vmi: VirtualMachineInstance): Promise<boolean>;
  /**
   * Makes sure the VMI has a launcher (pod-less: starts one) and records its ghost record.
   * With `sync`, a provider that starts the launcher itself may sync the domain in the same
   * step (pod-less: one control round trip to the launcher host) and say so in `synced`.
   */
  start(
    vmi: VirtualMachineInstance,
    sync?: { vmi: VirtualMachineInstance; options?: VirtualMachineOptions },
  ): Promise<LauncherStart>;
  /** Ends the VMI's launcher once its domain is gone and removes what it left on the node. */
  stop(vmi: VirtualMachineInstance): Promise<void>;
  /** The root of the VMI's launcher (`/proc/<pid>/root`), where there is one to look in. */
  launcherRoot(vmi: VirtualMachineInstance): Promise<string | undefined>;
}

/** A VMI's disks as its launcher gets them, at the start and while it runs. */
export interface LauncherVolumes {
  /**
   * Hands the VMI's disks that need the node's help to its launcher before the domain is
   * defined (KubeVirt mode: containerDisks bound from their containers into the launcher);
   * `notReady` while the pod's containers have not started yet.
   */
  prepareDisks(
    vmi: VirtualMachineInstance,
    record: DiskEventRecorder,
  ): Promise<"ready" | "notReady">;
  /**
   * The VMI as the launcher gets it (KubeVirt mode: filesystem claims become the host
   * disks KubeVirt's launcher reads); `prepareDisks` and the sync get this. May throw a
   * volume error naming the field.
   */
  forLauncher(vmi: VirtualMachineInstance): VirtualMachineInstance;
  /**
   * The folder, in the launcher's view, a memory dump volume's dump goes into; none: its
   * folder in the launcher's hotplug directory (KubeVirt's launcher pod).
   */
  memoryDumpFolder?(vmi: VirtualMachineInstance, volume: string): string | undefined;
  /**
   * Hands the running VMI's newly attached hotplug volumes to its launcher (KubeVirt mode:
   * from their attachment pods).
   */
  hotplug(vmi: VirtualMachineInstance): Promise<void>;
  /** The names of the VMI's hotplugged volumes mounted into its launcher now. */
  hotplugMounted(uid: string): Promise<ReadonlySet<string>>;
  /** Takes back the hotplugged volumes gone from the spec, once the launcher detached them. */
  unplug(vmi: VirtualMachineInstance): Promise<void>;
}

/** What the node does beside a running launcher after each sync. */
export interface LauncherHousekeeping {
  /**
   * After a sync of a running dedicated-CPU VMI, places its QEMU's threads as virt-handler's
   * housekeeping does (mod/cpus); none: the launcher does it (virtnode's, pod-less).
   */
  placeThreads?(vmi: VirtualMachineInstance): Promise<void>;
  /**
   * KubeVirt mode: on a migration target, once the domain arrived, QEMU gets the
   * locked-memory limit for the most memory a VMI that pins its memory (VFIO, realtime,
   * SEV) may grow to, as virt-handler sets it; undefined when the VMI pins none. Throws when
   * QEMU cannot be found. None: virtnode's launcher needs no limit from the node.
   */
  lockQemuMemory?(vmi: VirtualMachineInstance): Promise<{ pid: number; bytes: number } | undefined>;
}

/** Where a VMI's pod network lives on this node. */
export interface LauncherPodNetwork {
  /**
   * Where the VMI's pod network is: its namespace, the launcher's private directory, the
   * owner of what is made there (pod-less: the namespace is made now, with its address).
   * Undefined while there is no pod to look in yet (KubeVirt mode: no launcher socket).
   */
  podNetwork(vmi: VirtualMachineInstance): Promise<PodNetworkTarget | undefined>;
  /**
   * After a handler restart, the pod network of a VMI whose domain runs, where its set-up
   * has a step left on the node (pod-less: a tap left in the host's namespace joins the
   * pod); undefined where nothing is left (a launcher pod's taps are in the pod).
   */
  adoptedPodNetwork(vmi: VirtualMachineInstance): Promise<PodNetworkTarget | undefined>;
  /**
   * Gives back what the VMI's pod network holds on the node once its domain is gone
   * (pod-less: the namespace, its address, unused taps); a pod's goes with the pod.
   */
  releasePodNetwork(vmi: VirtualMachineInstance): Promise<void>;
}

/** The launcher sockets a migration's proxies carry connections to and from. */
export interface MigrationEndpoints {
  /**
   * The sockets of the VMI's migration target launcher that this node's target listeners
   * carry connections to: its libvirt's (port 0), then QEMU's incoming socket for each
   * direct-migration port (`migrationproxy/<uid>-<port>-source.sock` in the launcher's
   * `/var/run/kubevirt`), each opened where it lies when a connection comes.
   */
  migrationTargets(vmi: VirtualMachineInstance): Promise<ProxyTarget[]>;
  /**
   * Where the migration source's proxy sockets go for the VMI's launcher: its
   * `/var/run/kubevirt` as the handler reaches it (`baseDir`), or the `migrationproxy`
   * folder itself opened beneath the launcher's root (`socketDir`); `release` once the
   * sockets are closed and removed.
   */
  migrationSourceDir(vmi: VirtualMachineInstance): Promise<MigrationSourceDir>;
  /**
   * The host CPUs a dedicated-CPU VMI's target launcher has, which the source pins the
   * migrating domain to: its container's cpuset (KubeVirt mode), or what the launcher
   * host's pool gave it (pod-less); none while unknown.
   */
  dedicatedCpus(vmi: VirtualMachineInstance): Promise<number[] | undefined>;
}

/** How the handler as a whole reaches launchers: dialling, adopting, their sockets. */
export interface LauncherAccess {
  /**
   * The provider learns itself when a launcher ends or hangs, so the handler need not dial
   * each launcher's socket (pod-less mode: the launcher host reports ends and is pinged).
   */
  readonly watchesLaunchers: boolean;
  /** How the handler reaches a launcher's socket file (safely, where others control it). */
  readonly dialResolver: DialResolver;
  /** Launchers that run from before this handler's start, to ask for their domains. */
  adoptable(): { uid: string; socket: string; namespace: string; name: string }[];
  /**
   * Opens a socket of the VMI's private directory (`virt-serial0`, `virt-vnc`) without
   * following a link on the way; throws a clear error when there is none.
   */
  openPrivateSocket(vmi: VirtualMachineInstance, name: string): Promise<BeneathSocket>;
  /**
   * Opens the socket QEMU listens on for the VMI's downward metrics channel (the
   * `downwardMetrics` device), the same way; throws a clear error when there is none.
   */
  openDownwardMetricsChannel(vmi: VirtualMachineInstance): Promise<BeneathSocket>;
  /**
   * Opens the vhostmd disk of the VMI's `downwardMetrics` volume, which the launcher made,
   * for writing in place without following a link; where launchers make none (pod-less
   * mode refuses the volume) there is no such member.
   */
  openDownwardMetricsDisk?(vmi: VirtualMachineInstance): Promise<Deno.FsFile>;
}

/** What the handler knows in virt-controller's stead (pod-less mode). */
export interface StandInFacts {
  /** The claim info of the VMI's hotplugged volumes found on this host, by name. */
  hotplugClaims?: ReadonlyMap<string, ClaimInfo>;
  /** The launcher's interface on the pod network, as virt-controller names it. */
  podInterfaceName: string;
  /**
   * What the VMI's readiness probe says, as the kubelet would put it in the launcher pod's
   * `Ready` condition; absent when it has none.
   */
  readiness?: { ready: boolean; message: string };
}

/**
 * virt-controller's part for this node's VMIs, which the handler plays where none runs
 * (pod-less mode; only that mode's provider has one). With it the handler schedules
 * Pending VMIs to this node, owns their `Ready` condition and volume status entries,
 * fails a VMI its cleanup left without a launcher, and takes the finalizer off a final VMI.
 */
export interface ControllerStandIn {
  /**
   * What virt-controller (and the kubelet, through the launcher pod) would know of the VMI,
   * for its status, given whether its guest runs and its pod address; asked at each sync.
   */
  facts(vmi: VirtualMachineInstance, guest: { running: boolean; address?: string }): StandInFacts;
  /** The status of a Pending VMI once virt-controller placed it on `node` at `now`. */
  scheduledStatus(
    vmi: VirtualMachineInstance,
    node: string,
    now: string,
  ): VirtualMachineInstanceStatus;
}

/**
 * One mode's launchers, every part of them: KubeVirt mode's pods or pod-less mode's
 * launcher host. Each user takes the parts it needs (the VMI controller: locator, volumes
 * and pod network; the migration sides: endpoints).
 */
export interface LauncherProvider
  extends
    Runnable,
    LauncherLocator,
    LauncherVolumes,
    LauncherHousekeeping,
    LauncherPodNetwork,
    MigrationEndpoints,
    LauncherAccess {
  /** virt-controller's part, where the handler plays it (pod-less mode). */
  readonly standIn?: ControllerStandIn;
}

/** The launchers a ghost record store names, as {@linkcode LauncherProvider.adoptable} gives them. */
export function launchersOfGhostRecords(
  ghosts: GhostRecordStore,
): { uid: string; socket: string; namespace: string; name: string }[] {
  return ghosts.list().map((r) => ({
    uid: r.uid,
    socket: r.socketFile,
    namespace: r.namespace,
    name: r.name,
  }));
}

/**
 * Names and values KubeVirt defines: phases, condition types and reasons, label and
 * annotation keys, and the default paths its node components use. Values are KubeVirt's
 * own, so that virtnode and KubeVirt components can share objects and sockets.
 *
 * @module
 */

/** API group of KubeVirt's core objects. */
export const KUBEVIRT_GROUP = "kubevirt.io";
/** API version of KubeVirt's core objects. */
export const KUBEVIRT_VERSION = "v1";
/** The KubeVirt release whose components virtnode speaks with and whose behaviour it follows. */
export const KUBEVIRT_RELEASE = "v1.7.0";
/** `apiVersion` of a VirtualMachineInstance. */
export const KUBEVIRT_API_VERSION = `${KUBEVIRT_GROUP}/${KUBEVIRT_VERSION}`;
/** `kind` of a VirtualMachineInstance. */
export const VMI_KIND = "VirtualMachineInstance";
/** Plural resource name of VirtualMachineInstances. */
export const VMI_RESOURCE = "virtualmachineinstances";
/** `kind` of a VirtualMachineInstanceMigration. */
export const VMIM_KIND = "VirtualMachineInstanceMigration";
/** Plural resource name of VirtualMachineInstanceMigrations. */
export const VMIM_RESOURCE = "virtualmachineinstancemigrations";
/** Plural resource name of VirtualMachines. */
export const VM_RESOURCE = "virtualmachines";

/** Grace period KubeVirt applies when `spec.terminationGracePeriodSeconds` is unset. */
export const DEFAULT_GRACE_PERIOD_SECONDS = 30;

/** VMI phases (`status.phase`). */
export const VmiPhase = {
  Unset: "",
  Pending: "Pending",
  Scheduling: "Scheduling",
  Scheduled: "Scheduled",
  Running: "Running",
  Succeeded: "Succeeded",
  Failed: "Failed",
  WaitingForSync: "WaitingForSync",
  Unknown: "Unknown",
} as const;
/** A VMI phase. */
export type VmiPhase = typeof VmiPhase[keyof typeof VmiPhase];

/** Whether a phase is final: the VMI will not run again. */
export function isFinalPhase(phase: VmiPhase | undefined): boolean {
  return phase === VmiPhase.Succeeded || phase === VmiPhase.Failed;
}

/** VMI condition types (`status.conditions[].type`). */
export const ConditionType = {
  Provisioning: "Provisioning",
  Ready: "Ready",
  Synchronized: "Synchronized",
  Paused: "Paused",
  AgentConnected: "AgentConnected",
  AccessCredentialsSynchronized: "AccessCredentialsSynchronized",
  UnsupportedAgent: "AgentVersionNotSupported",
  LiveMigratable: "LiveMigratable",
  StorageLiveMigratable: "StorageLiveMigratable",
  HotVCPUChange: "HotVCPUChange",
  HotMemoryChange: "HotMemoryChange",
  VolumesChange: "VolumesChange",
  DataVolumesReady: "DataVolumesReady",
  MigrationRequired: "MigrationRequired",
  EvictionRequested: "EvictionRequested",
  SoftwareEmulation: "SoftwareEmulation",
} as const;
/** A VMI condition type. */
export type ConditionType = typeof ConditionType[keyof typeof ConditionType];

/** Reasons KubeVirt puts on VMI conditions. */
export const ConditionReason = {
  // Paused condition
  PausedByUser: "PausedByUser",
  PausedIOError: "PausedIOError",
  PausedByMigrationMonitor: "PausedByMigrationMonitor",
  // Ready condition
  PodTerminating: "PodTerminating",
  PodNotExists: "PodNotExists",
  PodConditionMissing: "PodConditionMissing",
  GuestNotRunning: "GuestNotRunning",
  // the kubelet's pod Ready reason when a container (a probe) is not ready
  ContainersNotReady: "ContainersNotReady",
  // LiveMigratable condition
  DisksNotMigratable: "DisksNotLiveMigratable",
  InterfaceNotMigratable: "InterfaceNotLiveMigratable",
  HotplugNotMigratable: "HotplugNotLiveMigratable",
  CPUModeNotMigratable: "CPUModeLiveMigratable",
  VirtIOFSNotMigratable: "VirtIOFSNotLiveMigratable",
  HostDeviceNotMigratable: "HostDeviceNotLiveMigratable",
  SEVNotMigratable: "SEVNotLiveMigratable",
  SecureExecutionNotMigratable: "SecureExecutionNotLiveMigratable",
  TDXNotMigratable: "TDXNotLiveMigratable",
  NoTSCFrequencyNotMigratable: "NoTSCFrequencyNotLiveMigratable",
  HypervPassthroughNotMigratable: "HypervPassthroughNotLiveMigratable",
  PRNotMigratable: "PersistentReservationNotLiveMigratable",
  NotMigratable: "NotMigratable",
  // DataVolumesReady condition
  AllDVsReady: "AllDVsReady",
  NotAllDVsReady: "NotAllDVsReady",
} as const;
/** A VMI condition reason. */
export type ConditionReason = typeof ConditionReason[keyof typeof ConditionReason];

/** Live migration modes (`status.migrationState.mode`). */
export const MigrationMode = {
  PreCopy: "PreCopy",
  PostCopy: "PostCopy",
} as const;

/** Label and annotation keys KubeVirt uses on VMIs, pods and nodes. */
export const Labels = {
  /** Marks KubeVirt resources; value names the component. */
  App: "kubevirt.io",
  /** On VMIs: the node running the VMI (CRDs have no field selectors). */
  NodeName: "kubevirt.io/nodeName",
  /** On VMIs: the node running a migration target. */
  MigrationTargetNodeName: "kubevirt.io/migrationTargetNodeName",
  /** On nodes: `"true"` when the node can take new VMIs. */
  NodeSchedulable: "kubevirt.io/schedulable",
  /** On pods: the UID of the VMI a launcher pod belongs to. */
  CreatedBy: "kubevirt.io/created-by",
  /** On pods: marks a migration target pod. */
  MigrationJobUID: "kubevirt.io/migrationJobUID",
  /** On VMIs: the launcher image is outdated. */
  OutdatedLauncherImage: "kubevirt.io/outdatedLauncherImage",
  /** On nodes: CPU model labels are this prefix plus the model name. */
  CpuModelPrefix: "cpu-model.node.kubevirt.io/",
  /** On nodes: CPU feature labels are this prefix plus the feature name. */
  CpuFeaturePrefix: "cpu-feature.node.kubevirt.io/",
  /** On nodes: CPU vendor label prefix. */
  CpuVendorPrefix: "cpu-vendor.node.kubevirt.io/",
  /** On nodes: host-model CPU label prefix. */
  HostModelCpuPrefix: "host-model-cpu.node.kubevirt.io/",
  /** On nodes: host-model required features label prefix. */
  HostModelRequiredFeaturesPrefix: "host-model-required-features.node.kubevirt.io/",
  /** On nodes: supported Hyper-V enlightenments label prefix. */
  HypervPrefix: "hyperv.node.kubevirt.io/",
  /** On nodes: supported machine type label prefix. */
  MachineTypePrefix: "machine-type.node.kubevirt.io/",
  /** On nodes: CPU timer label prefix. */
  CpuTimerPrefix: "cpu-timer.node.kubevirt.io/",
} as const;

/** Annotation keys KubeVirt uses. */
export const Annotations = {
  /** On nodes: the last virt-handler heartbeat (RFC 3339). */
  Heartbeat: "kubevirt.io/heartbeat",
  /** On pods: the VMI (domain) name a launcher pod runs. */
  Domain: "kubevirt.io/domain",
  /** On nodes: tells the node labeller to leave the node alone. */
  LabellerSkipNode: "node-labeller.kubevirt.io/skip-node",
} as const;

/** Finalizers KubeVirt sets on VMIs. */
export const Finalizers = {
  VirtualMachineInstance: "kubevirt.io/foregroundDeleteVirtualMachine",
  DeprecatedVirtualMachineInstance: "foregroundDeleteVirtualMachine",
  VirtualMachineController: "kubevirt.io/virtualMachineControllerFinalize",
  /** On migrations: virt-controller's, until the migration's end is written to the VMI. */
  Migration: "kubevirt.io/migrationJobFinalize",
} as const;

/** VirtualMachineInstanceMigration phases (`status.phase`), in their order. */
export const VmimPhases = {
  Unset: "",
  Pending: "Pending",
  Scheduling: "Scheduling",
  Scheduled: "Scheduled",
  PreparingTarget: "PreparingTarget",
  TargetReady: "TargetReady",
  Running: "Running",
  Succeeded: "Succeeded",
  Failed: "Failed",
} as const;

/** KubeVirt's cluster-wide migration defaults (`pkg/virt-config`), for what no policy sets. */
export const MIGRATION_DEFAULTS = {
  bandwidthPerMigration: "0Mi",
  completionTimeoutPerGiB: 150,
  progressTimeout: 150,
  unsafeMigrationOverride: false,
  allowAutoConverge: false,
  allowPostCopy: false,
  parallelMigrationsPerCluster: 5,
  parallelOutboundMigrationsPerNode: 2,
} as const;

/** Multifd connections KubeVirt's handler asks for when the CPU is not limited. */
export const PARALLEL_MIGRATION_THREADS = 8;

/** Extended resources KubeVirt's device plugins advertise. */
export const DeviceResources = {
  Kvm: "devices.kubevirt.io/kvm",
  Tun: "devices.kubevirt.io/tun",
  VhostNet: "devices.kubevirt.io/vhost-net",
} as const;

/** Default paths of KubeVirt's node components. */
export const Paths = {
  /** Directory shared between virt-handler and virt-launcher. */
  VirtShareDir: "/var/run/kubevirt",
  /** virt-handler's private directory. */
  VirtPrivateDir: "/var/run/kubevirt-private",
  /** Ghost records: one JSON file per VMI a handler manages. */
  GhostRecordDir: "/var/run/kubevirt-private/ghost-records",
  /** Launcher command sockets in pod-less layouts (one subdirectory per VMI UID). */
  LauncherSocketDir: "/var/run/kubevirt/sockets",
  /** Writable disk data of a launcher (containerDisk overlays and the like). */
  EphemeralDiskDir: "/var/run/kubevirt-ephemeral-disks",
  /** Where containerDisk images are found. */
  ContainerDiskDir: "/var/run/kubevirt/container-disks",
  /** The kubelet's pods directory; launcher sockets live under it in KubeVirt mode. */
  KubeletPodsDir: "/var/lib/kubelet/pods",
} as const;

/** Socket and file names KubeVirt uses. */
export const SocketNames = {
  /** The launcher's cmd socket once the domain manager is up. */
  Launcher: "launcher-sock",
  /** The launcher's cmd socket during start-up. */
  LauncherInit: "launcher-init-sock",
  /** The handler's notify server socket, in `Paths.VirtShareDir`. */
  DomainNotify: "domain-notify.sock",
  /** The notify proxy socket inside a launcher pod. */
  DomainNotifyPipe: "domain-notify-pipe.sock",
  /** The serial console socket of port 0, in the VMI's private dir. */
  Serial0: "virt-serial0",
  /** The VNC socket, in the VMI's private dir. */
  Vnc: "virt-vnc",
} as const;

/** The downward metrics channel's folder inside a KubeVirt launcher. */
export const DOWNWARD_METRICS_CHANNEL_DIR = "/var/run/kubevirt-private/downwardmetrics-channel";
/** The virtio-serial port a guest reads its downward metrics from (vhostmd's name). */
export const DOWNWARD_METRICS_PORT = "org.github.vhostmd.1";
/** The downward metrics channel's socket (in that folder; in pod-less mode, the VMI's). */
export const DOWNWARD_METRICS_SOCKET = "downwardmetrics.sock";
/** Where KubeVirt's launcher makes the `downwardMetrics` volume's vhostmd disk. */
export const DOWNWARD_METRICS_DISK_DIR = "/var/run/kubevirt-private/downwardapi-disks";
/** The vhostmd disk's file name in {@linkcode DOWNWARD_METRICS_DISK_DIR}. */
export const DOWNWARD_METRICS_DISK = "vhostmd0";
/**
 * The channel's socket in a VMI's run folder, where virtnode's own launcher puts it: no
 * longer than the serial console's name, so that the longest socket path a pod-less
 * handler makes stays what it was.
 */
export const DOWNWARD_METRICS_VMI_SOCKET = "virt-dmetric";

/** How many USB devices a client may redirect into one VMI at a time (KubeVirt's number). */
export const USB_CLIENT_PASSTHROUGH_SLOTS = 4;

/** The socket of redirected USB port `slot` (0 to 3), in the VMI's private dir. */
export function usbRedirSocket(slot: number): `virt-usbredir-${number}` {
  return `virt-usbredir-${slot}`;
}

/** The longest path a unix socket address holds, in bytes (`sun_path`, less its NUL). */
export const MAX_SOCKET_PATH = 107;

/** The private directory of one VMI: `/var/run/kubevirt-private/<uid>`. */
export function vmiPrivateDir(uid: string, base: string = Paths.VirtPrivateDir): string {
  return `${base}/${uid}`;
}

/**
 * The launcher socket directory inside a launcher pod's volume as the handler sees it:
 * `<kubelet pods dir>/<pod uid>/volumes/kubernetes.io~empty-dir/sockets`.
 */
export function launcherSocketDirOnHost(
  podUid: string,
  podsDir: string = Paths.KubeletPodsDir,
): string {
  return `${podsDir}/${podUid}/volumes/kubernetes.io~empty-dir/sockets`;
}

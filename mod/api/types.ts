/**
 * The parts of KubeVirt's `kubevirt.io/v1` VirtualMachineInstance that virtnode reads
 * and writes. Field names and JSON shapes follow KubeVirt's API exactly, so an object
 * read from the apiserver can be used as-is.
 *
 * @module
 */

import type { ConditionType, VmiPhase } from "./constants.ts";

/** A Kubernetes resource quantity as it appears in JSON: `"2Gi"`, `"500m"` or a number. */
export type Quantity = string | number;

/** The subset of Kubernetes `ObjectMeta` virtnode uses. */
export interface ObjectMeta {
  /** The object's name, unique within its namespace. */
  name: string;
  /** The object's namespace. */
  namespace?: string;
  /** The unique ID the apiserver gave the object; a re-created object gets a new one. */
  uid?: string;
  /** The version of the object the apiserver stored; an update sends it back. */
  resourceVersion?: string;
  /** Incremented by the apiserver on each change of `spec`. */
  generation?: number;
  /** When the object was created (RFC 3339). */
  creationTimestamp?: string | null;
  /** When deletion was asked for (RFC 3339); set while finalizers remain. */
  deletionTimestamp?: string | null;
  /** Seconds the object has to stop once its deletion was asked for. */
  deletionGracePeriodSeconds?: number | null;
  /** Labels, for selecting objects. */
  labels?: Record<string, string>;
  /** Annotations: non-identifying data about the object. */
  annotations?: Record<string, string>;
  /** What must be done before the apiserver deletes the object. */
  finalizers?: string[];
  /** The objects this one belongs to, e.g. the VirtualMachine of a VMI. */
  ownerReferences?: unknown[];
}

/** `spec.domain.cpu.features[]`: a CPU feature and how the guest CPU treats it. */
export interface CpuFeature {
  /** The feature's name as libvirt knows it, e.g. `pcid`. */
  name: string;
  /** libvirt policy: `force`, `require` (default), `optional`, `disable`, `forbid`. */
  policy?: "force" | "require" | "optional" | "disable" | "forbid";
}

/** `spec.domain.cpu`. */
export interface Cpu {
  /** Number of cores per socket. */
  cores?: number;
  /** Number of virtual CPU sockets. */
  sockets?: number;
  /** Number of threads per core. */
  threads?: number;
  /** Most sockets the VMI can reach through CPU hotplug. */
  maxSockets?: number;
  /** `host-model`, `host-passthrough` or a named libvirt model such as `Skylake-Server`. */
  model?: string;
  /** CPU features to turn on or off in the guest. */
  features?: CpuFeature[];
  /** Pin each virtual CPU to a host CPU of its own. */
  dedicatedCpuPlacement?: boolean;
  /** Give QEMU's emulator thread a host CPU of its own (with dedicated placement). */
  isolateEmulatorThread?: boolean;
  /**
   * How the guest's NUMA topology maps to the host's: with `guestMappingPassthrough`, the
   * guest gets one NUMA node per host node its dedicated CPUs are on.
   */
  numa?: { guestMappingPassthrough?: Record<string, never> };
  /**
   * Real-time tuning: the vCPUs of `mask` (a libvirt vCPU set such as `0-3,^1`; every
   * vCPU when empty) run under `SCHED_FIFO`.
   */
  realtime?: { mask?: string };
}

/** `spec.domain.memory`. */
export interface Memory {
  /** Memory the guest sees; the memory request unless given. */
  guest?: Quantity;
  /** Most memory the guest can reach through memory hotplug. */
  maxGuest?: Quantity;
  /** Back the guest's memory with huge pages of `pageSize`, e.g. `2Mi` or `1Gi`. */
  hugepages?: { pageSize?: string };
  /** Memory to reserve in the pod on top of the computed virtualization overhead. */
  reservedOverhead?: unknown;
}

/** `spec.domain.resources`. */
export interface ResourceRequirements {
  /** Resources the VMI's pod requests, e.g. `cpu` and `memory`. */
  requests?: Record<string, Quantity>;
  /** Resource limits of the VMI's pod. */
  limits?: Record<string, Quantity>;
  /** Put the virtualization overhead in the memory limit only, not in the request. */
  overcommitGuestOverhead?: boolean;
}

/** `spec.domain.firmware`. */
export interface Firmware {
  /** The UUID the guest sees (SMBIOS system UUID). */
  uuid?: string;
  /** The serial number the guest sees (SMBIOS). */
  serial?: string;
  /** Boot with BIOS or EFI, and their options. */
  bootloader?: {
    bios?: { useSerial?: boolean };
    efi?: { secureBoot?: boolean; persistent?: boolean };
  };
  /** Boot a kernel and initrd taken from a container image. */
  kernelBoot?: KernelBoot;
  /** ACPI tables to give the guest. */
  acpi?: unknown;
}

/** A Hyper-V enlightenment that is on or off (`enabled` defaults to true). */
export interface FeatureState {
  /** Whether the feature is on; defaults to true. */
  enabled?: boolean;
}

/** `spec.domain.features.hyperv`. */
export interface FeatureHyperv {
  /** Tells the guest to turn off its watchdog timeouts. */
  relaxed?: FeatureState;
  /** Paravirtualized handling of interrupts (virtual APIC). */
  vapic?: FeatureState;
  /** Spinlock retries before the guest notifies the hypervisor (`spinlocks`). */
  spinlocks?: FeatureState & { spinlocks?: number };
  /** Virtual processor index, for the guest to identify its virtual CPUs. */
  vpindex?: FeatureState;
  /** Virtual processor run time, for better time accounting in the guest. */
  runtime?: FeatureState;
  /** The synthetic interrupt controller. */
  synic?: FeatureState;
  /** Synthetic timers of the interrupt controller; `direct` for direct mode. */
  synictimer?: FeatureState & { direct?: FeatureState };
  /** Lets the guest reset the VM through Hyper-V; needs `synic`. */
  reset?: FeatureState;
  /** The hypervisor vendor ID the guest sees (`vendorid`). */
  vendorid?: FeatureState & { vendorid?: string };
  /** TSC and APIC frequencies for the guest, for better clock handling. */
  frequencies?: FeatureState;
  /** Notifies the guest of TSC frequency changes. */
  reenlightenment?: FeatureState;
  /** Paravirtualized TLB flushes. */
  tlbflush?: FeatureState;
  /** Paravirtualized inter-processor interrupts. */
  ipi?: FeatureState;
  /** Enlightened VMCS, for faster nested virtualization. */
  evmcs?: FeatureState;
}

/** `spec.domain.features`. */
export interface Features {
  /** ACPI in the guest; on unless turned off. */
  acpi?: FeatureState;
  /** The APIC; `endOfInterrupt` turns on paravirtualized end of interrupt. */
  apic?: FeatureState & { endOfInterrupt?: boolean };
  /** System Management Mode, which EFI secure boot needs. */
  smm?: FeatureState;
  /** Hyper-V enlightenments, for Windows guests. */
  hyperv?: FeatureHyperv;
  /** Turns on every Hyper-V enlightenment the host supports. */
  hypervPassthrough?: FeatureState;
  /** KVM features; `hidden` hides the KVM signature from the guest. */
  kvm?: { hidden?: boolean };
  /** Tells the guest that the host supports paravirtualized spinlocks. */
  pvspinlock?: FeatureState;
}

/** `spec.domain.clock.timer.*`: `present` defaults to true. */
export interface Timer {
  /** Whether the guest gets the timer; defaults to true. */
  present?: boolean;
  /** What to do with missed ticks: `delay`, `catchup`, `merge` or `discard`. */
  tickPolicy?: string;
  /** What the timer follows, e.g. `guest` or `wall`. */
  track?: string;
}

/** `spec.domain.clock`: exactly one of `utc` or `timezone`. */
export interface Clock {
  /** Keep the guest clock in UTC, with an optional offset in seconds. */
  utc?: { offsetSeconds?: number };
  /** Keep the guest clock in this timezone, e.g. `Europe/Berlin`. */
  timezone?: string;
  /** The timers the guest gets. */
  timer?: {
    hpet?: Timer;
    kvm?: Timer;
    pit?: Timer;
    rtc?: Timer;
    hyperv?: Timer;
  };
}

/** Disk buses KubeVirt knows. */
export type DiskBus = "virtio" | "sata" | "scsi" | "usb";

/** `spec.domain.devices.disks[]`: one of `disk`, `cdrom` or `lun` (default `disk`). */
export interface Disk {
  /** The disk's name; the volume of the same name backs it. */
  name: string;
  /** Attach as a disk: bus, read-only, PCI address. */
  disk?: { bus?: DiskBus; readonly?: boolean; pciAddress?: string };
  /** Attach as a CD-ROM: bus, read-only, tray state. */
  cdrom?: { bus?: DiskBus; readonly?: boolean; tray?: "open" | "closed" };
  /** Attach as a SCSI LUN: bus, read-only, persistent reservation. */
  lun?: { bus?: DiskBus; readonly?: boolean; reservation?: boolean };
  /** The disk's place in the boot order; lower boots first. */
  bootOrder?: number;
  /** The serial number the guest sees. */
  serial?: string;
  /** libvirt cache mode: `none`, `writethrough` or `writeback`. */
  cache?: "none" | "writethrough" | "writeback";
  /** libvirt I/O mode, e.g. `native` or `threads`. */
  io?: string;
  /** Give the disk an I/O thread of its own. */
  dedicatedIOThread?: boolean;
  /** A tag the guest finds with the disk's address in the config drive metadata. */
  tag?: string;
  /** Logical and physical block sizes the guest sees. */
  blockSize?: unknown;
  /** Whether other VMIs may attach the disk too. */
  shareable?: boolean;
  /** What happens on an I/O error, e.g. `stop` (the default) or `report`. */
  errorPolicy?: string;
}

/** `spec.domain.devices.interfaces[]`. */
export interface Interface {
  /** The interface's name; the network of the same name backs it. */
  name: string;
  /** The NIC model the guest sees, e.g. `virtio` or `e1000`. */
  model?: string;
  /** The interface's MAC address. */
  macAddress?: string;
  /** The interface's place in the boot order (network boot). */
  bootOrder?: number;
  /** The interface's PCI address in the guest. */
  pciAddress?: string;
  /** Connect to the network through a bridge. */
  bridge?: Record<string, never>;
  /** Connect to the pod network through NAT. */
  masquerade?: Record<string, never>;
  /** Pass an SR-IOV virtual function through. */
  sriov?: Record<string, never>;
  /** QEMU user-mode networking (KubeVirt's deprecated `slirp` binding). */
  slirp?: Record<string, never>;
  /** Connect to the pod network with passt (user-mode networking). */
  passt?: Record<string, never>;
  /** Connect to the network through a macvtap device. */
  macvtap?: Record<string, never>;
  /** Connect to the pod network with KubeVirt's core passt binding. */
  passtBinding?: Record<string, never>;
  /** Connect with a network binding plugin, by name. */
  binding?: { name: string };
  /** Ports to forward to the guest. */
  ports?: unknown[];
  /** Extra DHCP options for the guest. */
  dhcpOptions?: unknown;
  /** A tag the guest finds with the interface's address in the config drive metadata. */
  tag?: string;
  /** The NIC's ACPI index, which gives it a name that PCI changes do not alter. */
  acpiIndex?: number;
  /** The requested state, e.g. `absent` to unplug the interface. */
  state?: string;
}

/** `spec.domain.devices.watchdog`. */
export interface Watchdog {
  /** The watchdog's name. */
  name: string;
  /** An Intel 6300ESB watchdog, and what to do when it fires. */
  i6300esb?: { action?: "poweroff" | "reset" | "shutdown" };
  /** An s390x diag288 watchdog, and what to do when it fires. */
  diag288?: { action?: string };
}

/** `spec.domain.devices`. */
export interface Devices {
  /** The disks attached to the guest. */
  disks?: Disk[];
  /** The network interfaces of the guest. */
  interfaces?: Interface[];
  /** Attach a serial console; defaults to true. */
  autoattachSerialConsole?: boolean;
  /** Attach a graphics device and VNC; defaults to true. */
  autoattachGraphicsDevice?: boolean;
  /** Attach a memory balloon device; defaults to true. */
  autoattachMemBalloon?: boolean;
  /** Leave out the SCSI controller hotplugged disks attach to; defaults to false. */
  disableHotplug?: boolean;
  /** Add an interface on the pod network when none is given; defaults to true. */
  autoattachPodInterface?: boolean;
  /** Attach an input device; defaults to false. */
  autoattachInputDevice?: boolean;
  /** Attach a virtio random number generator. */
  rng?: Record<string, never>;
  /** The watchdog device. */
  watchdog?: Watchdog;
  /** GPUs to pass through. */
  gpus?: unknown[];
  /** Host devices to pass through. */
  hostDevices?: unknown[];
  /** Filesystems to share with the guest (virtiofs). */
  filesystems?: unknown[];
  /**
   * USB redirection from a client (`virtctl usbredir`): present, the guest gets four
   * redirected USB ports, each a socket in the VMI's private directory.
   */
  clientPassthrough?: Record<string, never>;
  /**
   * Downward metrics over virtio-serial: present, the guest reads the node's and the VM's
   * metrics (vhostmd's XML) from its `org.github.vhostmd.1` port.
   */
  downwardMetrics?: Record<string, never>;
  /** Input devices, e.g. a tablet. */
  inputs?: unknown[];
  /** A virtual TPM. */
  tpm?: unknown;
  /** A sound device. */
  sound?: unknown;
  /** The video device's type. */
  video?: unknown;
}

/** `spec.domain`. */
export interface DomainSpec {
  /** The guest CPU: topology, model, features, placement. */
  cpu?: Cpu;
  /** The guest memory. */
  memory?: Memory;
  /** Resource requests and limits of the VMI's pod. */
  resources?: ResourceRequirements;
  /** The machine type, e.g. `q35`. */
  machine?: { type?: string };
  /** Firmware: BIOS or EFI, UUID and serial. */
  firmware?: Firmware;
  /** Hypervisor features, e.g. ACPI and Hyper-V enlightenments. */
  features?: Features;
  /** The guest clock and timers. */
  clock?: Clock;
  /** The devices of the guest. */
  devices: Devices;
  /** SMBIOS chassis information the guest sees. */
  chassis?: unknown;
  /** How disks get I/O threads, e.g. `shared` or `auto`. */
  ioThreadsPolicy?: string;
  /** Confidential computing, e.g. AMD SEV. */
  launchSecurity?: unknown;
}

/** `spec.volumes[].containerDisk`: a disk image shipped in a container image. */
export interface ContainerDiskSource {
  /** The container image holding the disk image. */
  image: string;
  /** The disk image's path in the container image; looked for under `/disk` unless given. */
  path?: string;
  /** When to pull the image: `Always`, `IfNotPresent` or `Never`. */
  imagePullPolicy?: string;
  /** The secret with the credentials to pull the image. */
  imagePullSecret?: string;
}

/** `spec.domain.firmware.kernelBoot`. */
export interface KernelBoot {
  /** The kernel command line. */
  kernelArgs?: string;
  /** The image holding the kernel and initrd, and their paths in it. */
  container?: {
    image: string;
    kernelPath?: string;
    initrdPath?: string;
    imagePullPolicy?: string;
    imagePullSecret?: string;
  };
}

/** `spec.volumes[].hostDisk`: a raw image file on the node. */
export interface HostDisk {
  /** Path of the image file on the node. */
  path: string;
  /** `Disk` uses an existing image; `DiskOrCreate` creates it when missing. */
  type: "Disk" | "DiskOrCreate";
  /** Size of the image to create (`DiskOrCreate`). */
  capacity?: Quantity;
  /** Whether the image may be shared, e.g. for live migration. */
  shared?: boolean;
}

/** `spec.volumes[].persistentVolumeClaim`. */
export interface ClaimVolumeSource {
  /** The claim's name, in the VMI's namespace. */
  claimName: string;
  /** Whether the pod mounts the claim read-only. */
  readOnly?: boolean;
  /** Whether the volume is hotplugged rather than part of the pod. */
  hotpluggable?: boolean;
}

/** `status.volumeStatus[].persistentVolumeClaimInfo`, as virt-controller writes it. */
export interface ClaimInfo {
  /** The claim's name. */
  claimName?: string;
  /** The claim's access modes, e.g. `ReadWriteOnce`. */
  accessModes?: string[];
  /** `Filesystem` or `Block`. */
  volumeMode?: string;
  /** The bound volume's capacity (the claim's status). */
  capacity?: Record<string, Quantity>;
  /** What the claim requests (its spec). */
  requests?: Record<string, Quantity>;
  /** Whether the claim's data was preallocated. */
  preallocated?: boolean;
  /** The share of a filesystem volume its file system takes, e.g. `"0.055"`. */
  filesystemOverhead?: string;
}

/** `spec.volumes[].cloudInitNoCloud` and `cloudInitConfigDrive`. */
export interface CloudInitSource {
  /** The user data, as text. */
  userData?: string;
  /** The user data, base64-encoded. */
  userDataBase64?: string;
  /** The network configuration, as text. */
  networkData?: string;
  /** The network configuration, base64-encoded. */
  networkDataBase64?: string;
  /** A secret holding the user data. */
  secretRef?: { name: string };
  /** A secret holding the network configuration. */
  networkDataSecretRef?: { name: string };
}

/** `spec.volumes[]`: a name and exactly one source. */
export interface Volume {
  /** The volume's name; the disk of the same name uses it. */
  name: string;
  /** A disk image from a container image; writes are lost when the VMI stops. */
  containerDisk?: ContainerDiskSource;
  /** A blank disk of `capacity`, discarded when the VMI stops. */
  emptyDisk?: { capacity: Quantity };
  /** An image file on the node. */
  hostDisk?: HostDisk;
  /** A cloud-init NoCloud data source. */
  cloudInitNoCloud?: CloudInitSource;
  /** A cloud-init ConfigDrive data source. */
  cloudInitConfigDrive?: CloudInitSource;
  /** A PersistentVolumeClaim, as the kubelet mounts it into the launcher pod. */
  persistentVolumeClaim?: ClaimVolumeSource;
  /** A CDI DataVolume: its PersistentVolumeClaim has the DataVolume's name. */
  dataVolume?: { name: string; hotpluggable?: boolean };
  /** A PersistentVolumeClaim under a copy-on-write overlay discarded when the VMI stops. */
  ephemeral?: unknown;
  /** A ConfigMap, given to the guest as a disk. */
  configMap?: unknown;
  /** A Secret, given to the guest as a disk. */
  secret?: unknown;
  /** A service account's token, given to the guest as a disk. */
  serviceAccount?: unknown;
  /** Downward API fields, given to the guest as a disk. */
  downwardAPI?: unknown;
  /** A Windows sysprep answer file. */
  sysprep?: unknown;
  /** vhostmd's metrics disk, which the launcher makes and the node's handler fills. */
  downwardMetrics?: Record<string, never>;
  /** A claim a memory dump is written to (`virtctl memory-dump`), hotplugged by virt-controller. */
  memoryDump?: { claimName: string; hotpluggable?: boolean; readOnly?: boolean };
}

/** `spec.networks[]`. */
export interface Network {
  /** The network's name; the interface of the same name uses it. */
  name: string;
  /** The pod network; the CIDRs of the guest's side under masquerade. */
  pod?: { vmNetworkCIDR?: string; vmIPv6NetworkCIDR?: string };
  /**
   * A network through Multus: `networkName` names its NetworkAttachmentDefinition
   * (`<name>` in the VMI's namespace, or `<namespace>/<name>`); `default` makes it the
   * pod's default network in place of the pod network.
   */
  multus?: { networkName?: string; default?: boolean };
}

/** `spec` of a VirtualMachineInstance. */
export interface VirtualMachineInstanceSpec {
  /** The virtual hardware. */
  domain: DomainSpec;
  /** The storage the disks use. */
  volumes?: Volume[];
  /** The networks the interfaces connect to. */
  networks?: Network[];
  /** Seconds the guest has to shut down before it is killed. */
  terminationGracePeriodSeconds?: number;
  /** Labels a node must have to run the VMI. */
  nodeSelector?: Record<string, string>;
  /** The guest's hostname; the VMI's name unless given. */
  hostname?: string;
  /** The guest's subdomain: its name is `<hostname>.<subdomain>.<namespace>.svc`. */
  subdomain?: string;
  /** The CPU architecture, e.g. `amd64`. */
  architecture?: string;
  /** What to do with the VMI when its node is drained, e.g. `LiveMigrate`. */
  evictionStrategy?: string;
  /** Affinity rules for scheduling the VMI's pod. */
  affinity?: unknown;
  /** Node taints the VMI's pod tolerates. */
  tolerations?: unknown[];
  /** When the VMI is ready for traffic (its `Ready` condition waits for it). */
  readinessProbe?: Probe;
  /** When the VMI is alive: failing it fails the VMI. */
  livenessProbe?: Probe;
  /** Fields virtnode does not read, kept as received. */
  [extra: string]: unknown;
}

/** A VMI's readiness or liveness probe (KubeVirt's `v1.Probe`): one handler and its timing. */
export interface Probe {
  /** A command run in the guest through its agent; exit code 0 passes. */
  exec?: { command?: string[] };
  /** An HTTP GET of the VMI's address; a status from 200 to 399 passes. */
  httpGet?: {
    path?: string;
    port: number | string;
    host?: string;
    scheme?: string;
    httpHeaders?: { name: string; value: string }[];
  };
  /** A TCP connection to the VMI's address. */
  tcpSocket?: { port: number | string; host?: string };
  /** The guest agent answers `guest-ping`. */
  guestAgentPing?: Record<string, never>;
  /** Seconds after the guest starts before the first probe (0). */
  initialDelaySeconds?: number;
  /** Seconds a probe may take (1). */
  timeoutSeconds?: number;
  /** Seconds between probes (10). */
  periodSeconds?: number;
  /** Passes in a row after a failure that count as passing (1). */
  successThreshold?: number;
  /** Failures in a row that count as failing (3). */
  failureThreshold?: number;
}

/** `status.conditions[]`. */
export interface VmiCondition {
  /** The condition's type. */
  type: ConditionType;
  /** `True`, `False` or `Unknown`. */
  status: "True" | "False" | "Unknown";
  /** Why the condition is in its state, in CamelCase. */
  reason?: string;
  /** Why the condition is in its state, for people. */
  message?: string;
  /** When the condition was last checked. */
  lastProbeTime?: string | null;
  /** When the condition's status last changed. */
  lastTransitionTime?: string | null;
}

/** `status.interfaces[]`. */
export interface VmiNetworkInterface {
  /** The interface's name in the spec. */
  name?: string;
  /** The MAC address. */
  mac?: string;
  /** The primary IP address. */
  ipAddress?: string;
  /** Every IP address of the interface. */
  ipAddresses?: string[];
  /** The interface's name in the guest. */
  interfaceName?: string;
  /** Where the information comes from, e.g. `domain, guest-agent`. */
  infoSource?: string;
  /** The pod interface the guest interface is bound to. */
  podInterfaceName?: string;
  /** Number of queues of the interface. */
  queueCount?: number;
  /** The link state, `up` or `down`. */
  linkState?: string;
}

/** `status.guestOSInfo`. */
export interface GuestOsInfo {
  /** The OS name, e.g. `Fedora Linux`. */
  name?: string;
  /** The kernel release, e.g. `6.8.5-301.fc40.x86_64`. */
  kernelRelease?: string;
  /** The OS version, e.g. `40 (Cloud Edition)`. */
  version?: string;
  /** The OS name and version for display, e.g. `Fedora Linux 40 (Cloud Edition)`. */
  prettyName?: string;
  /** The OS version ID, e.g. `40`. */
  versionId?: string;
  /** The kernel version string, as `uname -v` prints it. */
  kernelVersion?: string;
  /** The machine architecture, e.g. `x86_64`. */
  machine?: string;
  /** The OS ID, e.g. `fedora`. */
  id?: string;
}

/** `status.volumeStatus[]`. */
export interface VolumeStatus {
  /** The volume's name. */
  name: string;
  /** The disk's device name in the guest, e.g. `vda`. */
  target: string;
  /** The phase of a hotplugged volume. */
  phase?: string;
  /** Why the volume is in its phase. */
  reason?: string;
  /** Why the volume is in its phase, for people. */
  message?: string;
  /** The volume's size in bytes. */
  size?: number;
  /** The checksum of a container disk image. */
  containerDiskVolume?: { checksum?: number };
  /** The pod a hotplugged volume is attached through. */
  hotplugVolume?: { attachPodName?: string; attachPodUID?: string };
  /** The claim's access modes, capacity and volume mode. */
  persistentVolumeClaimInfo?: ClaimInfo;
  /** A memory dump volume's progress (`virtctl memory-dump`). */
  memoryDumpVolume?: MemoryDumpVolumeStatus;
}

/** `status.volumeStatus[].memoryDumpVolume`: where a memory dump goes and when it ran. */
export interface MemoryDumpVolumeStatus {
  /** The claim the dump is written to. */
  claimName?: string;
  /** The dump's file name on the claim. */
  targetFileName?: string;
  /** When the dump started. */
  startTimestamp?: string;
  /** When the dump ended. */
  endTimestamp?: string;
}

/** `status.migrationState`. */
export interface MigrationState {
  /** When the migration started. */
  startTimestamp?: string | null;
  /** When the migration ended. */
  endTimestamp?: string | null;
  /** The node the VMI migrates to. */
  targetNode?: string;
  /** The target node's address for the migration. */
  targetNodeAddress?: string;
  /** The launcher pod on the target node. */
  targetPod?: string;
  /** The node the VMI migrates from. */
  sourceNode?: string;
  /** The launcher pod on the source node. */
  sourcePod?: string;
  /** The UID of the VirtualMachineInstanceMigration. */
  migrationUid?: string;
  /** Whether the migration completed. */
  completed?: boolean;
  /** Whether the migration failed. */
  failed?: boolean;
  /** Whether aborting the migration was asked for. */
  abortRequested?: boolean;
  /** How the abort went: `Succeeded`, `Failed` or `Aborting`. */
  abortStatus?: string;
  /** Why the migration failed. */
  failureReason?: string;
  /** How memory moves: `PreCopy` or `PostCopy`. */
  mode?: "PreCopy" | "PostCopy" | string;
  /** Whether the domain was seen on the target node. */
  targetNodeDomainDetected?: boolean;
  /** When the domain became ready on the target node. */
  targetNodeDomainReadyTimestamp?: string | null;
  /** The ports opened on the target node for the migration. */
  targetDirectMigrationNodePorts?: Record<string, number>;
  /** The CPUs of the target's launcher pod, for a VMI with dedicated CPUs. */
  targetCPUSet?: number[];
  /** The target host's NUMA topology (`cmd.v1.Topology` as JSON), for dedicated CPUs. */
  targetNodeTopology?: string;
  /** The migration's settings, as virt-controller chose them (the cluster's defaults otherwise). */
  migrationConfiguration?: MigrationConfiguration;
  /** What the target side reports (KubeVirt 1.6+ keeps it beside the flat fields). */
  targetState?: MigrationSideState;
  /** What the source side reports. */
  sourceState?: MigrationSideState;
}

/** `status.migrationState.sourceState` / `targetState`: one side of a migration. */
export interface MigrationSideState {
  /** The migration's UID. */
  migrationUID?: string;
  /** The side's node. */
  node?: string;
  /** The side's launcher pod. */
  pod?: string;
  /** The VMI's UID on that side. */
  virtualMachineInstanceUID?: string;
  /** The target's migration address. */
  nodeAddress?: string;
  /** The target's published ports. */
  directMigrationNodePorts?: Record<string, number>;
  /** Whether the domain was seen on the target. */
  domainDetected?: boolean;
  /** When the domain ran on the target. */
  domainReadyTimestamp?: string | null;
  /** Decentralized migrations only: the side's sync address. */
  syncAddress?: string;
  /** Anything else KubeVirt keeps there. */
  [field: string]: unknown;
}

/** KubeVirt's `MigrationConfiguration` (the KubeVirt CR's, or a migration policy's). */
export interface MigrationConfiguration {
  /** e.g. `0Mi`: no limit. */
  bandwidthPerMigration?: string | number;
  /** Seconds per GiB of guest memory before the migration is aborted. */
  completionTimeoutPerGiB?: number;
  /** Seconds without progress before the migration is aborted. */
  progressTimeout?: number;
  /** Migrate even where libvirt deems it unsafe. */
  unsafeMigrationOverride?: boolean;
  /** Let QEMU throttle the guest's vCPUs so that the migration converges. */
  allowAutoConverge?: boolean;
  /** Let the migration switch to post-copy. */
  allowPostCopy?: boolean;
  /** Let the migration pause the guest or go post-copy to finish. */
  allowWorkloadDisruption?: boolean;
  /** Migrations at once in the cluster. */
  parallelMigrationsPerCluster?: number;
  /** Migrations at once leaving one node. */
  parallelOutboundMigrationsPerNode?: number;
  /** Anything else KubeVirt keeps there. */
  [field: string]: unknown;
}

/** VirtualMachineInstanceMigration phases (`status.phase`). */
export type VmimPhase =
  | ""
  | "Pending"
  | "Scheduling"
  | "Scheduled"
  | "PreparingTarget"
  | "TargetReady"
  | "Running"
  | "Succeeded"
  | "Failed";

/** A `kubevirt.io/v1` VirtualMachineInstanceMigration. */
export interface VirtualMachineInstanceMigration {
  /** `kubevirt.io/v1`. */
  apiVersion?: string;
  /** `VirtualMachineInstanceMigration`. */
  kind?: string;
  /** The migration's metadata. */
  metadata: ObjectMeta;
  /** Which VMI to migrate, and where it may go. */
  spec: {
    /** The VMI's name, in the migration's namespace. */
    vmiName?: string;
    /** Labels the target node must have, beyond the VMI's own node selector. */
    addedNodeSelector?: Record<string, string>;
  };
  /** How the migration goes. */
  status?: {
    /** The migration's phase. */
    phase?: VmimPhase;
    /** When the migration entered each phase. */
    phaseTransitionTimestamps?: { phase: VmimPhase; phaseTransitionTimestamp: string }[];
    /** The VMI's migration state, copied. */
    migrationState?: MigrationState;
    /** The migration's conditions. */
    conditions?: {
      type: string;
      status: string;
      reason?: string;
      message?: string;
      lastProbeTime?: string | null;
      lastTransitionTime?: string | null;
    }[];
  };
}

/** `status` of a VirtualMachineInstance. */
export interface VirtualMachineInstanceStatus {
  /** The VMI's phase. */
  phase?: VmiPhase;
  /** Why the VMI is in its phase, e.g. `NodeUnresponsive`. */
  reason?: string;
  /** The node the VMI runs on. */
  nodeName?: string;
  /** The VMI's conditions. */
  conditions?: VmiCondition[];
  /** The guest's network interfaces. */
  interfaces?: VmiNetworkInterface[];
  /** When the VMI entered each phase. */
  phaseTransitionTimestamps?: { phase: VmiPhase; phaseTransitionTimestamp: string }[];
  /** The guest OS, as the guest agent reports it. */
  guestOSInfo?: GuestOsInfo;
  /** The state of each volume. */
  volumeStatus?: VolumeStatus[];
  /** The state of the latest live migration. */
  migrationState?: MigrationState;
  /** The VMI's launcher pods: node name by pod UID. */
  activePods?: Record<string, string>;
  /** The launcher image the VMI runs with. */
  launcherContainerImageVersion?: string;
  /** Whether the guest's filesystems are frozen, e.g. `frozen`. */
  fsFreezeStatus?: string;
  /** The machine type the domain runs with. */
  machine?: { type?: string };
  /** The QoS class of the launcher pod. */
  qosClass?: string;
  /** The user ID the launcher runs as. */
  runtimeUser?: number;
  /** The SELinux label of the launcher's root, or `none` on a node without SELinux. */
  selinuxContext?: string;
  /** How a migration reaches the target: `Unix` (through the launchers' sockets). */
  migrationTransport?: string;
  /** `LiveMigration`, or `BlockMigration` when some disk is local and copies along. */
  migrationMethod?: "LiveMigration" | "BlockMigration";
  /** What virt-controller chose for the VMI's placement, e.g. the TSC frequency in Hz. */
  topologyHints?: { tscFrequency?: number };
  /** The volumes a volume migration moved, by name. */
  migratedVolumes?: { volumeName: string }[];
  /** The guest's memory: at boot, now, and as last asked of the launcher (memory hotplug). */
  memory?: { guestAtBoot?: Quantity; guestCurrent?: Quantity; guestRequested?: Quantity };
  /** The vCPU topology the guest has now (CPU hotplug). */
  currentCPUTopology?: { sockets?: number; cores?: number; threads?: number };
}

/** A `kubevirt.io/v1` VirtualMachineInstance. */
export interface VirtualMachineInstance {
  /** `kubevirt.io/v1`. */
  apiVersion?: string;
  /** `VirtualMachineInstance`. */
  kind?: string;
  /** The VMI's metadata. */
  metadata: ObjectMeta;
  /** What the VMI should be. */
  spec: VirtualMachineInstanceSpec;
  /** What the VMI is; written by KubeVirt's controllers and the node's handler. */
  status?: VirtualMachineInstanceStatus;
}

/** How a VirtualMachine keeps its VMI: KubeVirt's run strategies. */
export type RunStrategy =
  | "Always"
  | "RerunOnFailure"
  | "Once"
  | "Manual"
  | "Halted"
  | "WaitAsReceiver";

/** `status.conditions[]` of a VirtualMachine: a VMI's, or one of the VM's own types. */
export type VmCondition = Omit<VmiCondition, "type"> & { type: string };

/** `status.stateChangeRequests[]` of a VirtualMachine (virtctl start, stop, restart). */
export interface StateChangeRequest {
  /** `Start` or `Stop`. */
  action: "Start" | "Stop";
  /** Options of the request, e.g. `{"paused": "true"}` for a start. */
  data?: Record<string, string>;
  /** The VMI a stop is for. */
  uid?: string;
}

/** `status.memoryDumpRequest` of a VirtualMachine (virtctl memory-dump). */
export interface MemoryDumpRequest {
  /** The claim the dump goes to. */
  claimName: string;
  /** `Associating`, `InProgress`, `Unmounting`, `Completed`, `Dissociating` or `Failed`. */
  phase: string;
  /** The request is to remove the claim's association. */
  remove?: boolean;
  /** When the dump began. */
  startTimestamp?: string;
  /** When it ended. */
  endTimestamp?: string;
  /** The dump's file name on the claim. */
  fileName?: string;
  /** Why it failed. */
  message?: string;
}

/** `status` of a VirtualMachine. */
export interface VirtualMachineStatus {
  /** A VMI exists. */
  created?: boolean;
  /** The VMI is Ready. */
  ready?: boolean;
  /** One word for people: `Stopped`, `Starting`, `Running`, `Stopping`, ... */
  printableStatus?: string;
  /** The VM's conditions: `Ready`, `Failure`, and those of its VMI. */
  conditions?: VmCondition[];
  /** Start and stop requests, first to be acted on first. */
  stateChangeRequests?: StateChangeRequest[];
  /** The memory dump asked for. */
  memoryDumpRequest?: MemoryDumpRequest;
  /** The VM generation the running VMI was made from. */
  observedGeneration?: number;
  /** The VM's current generation. */
  desiredGeneration?: number;
  /** The run strategy in force. */
  runStrategy?: RunStrategy;
}

/** A `kubevirt.io/v1` VirtualMachine: a VMI template and how to keep it running. */
export interface VirtualMachine {
  /** `kubevirt.io/v1`. */
  apiVersion?: string;
  /** `VirtualMachine`. */
  kind?: string;
  /** The VM's metadata. */
  metadata: ObjectMeta;
  /** What the VM should be. */
  spec: {
    /** Deprecated: true is `Always`, false `Halted`. */
    running?: boolean;
    /** How the VMI is kept. */
    runStrategy?: RunStrategy;
    /** The VMI to make. */
    template: {
      /** The VMI's labels and annotations. */
      metadata?: Partial<ObjectMeta>;
      /** The VMI's spec. */
      spec: VirtualMachineInstanceSpec;
    };
  };
  /** What the VM is; written by its controller. */
  status?: VirtualMachineStatus;
}

/** Whether `value` is a JSON object: not null, not an array. */
export function isJsonObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

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
  name: string;
  namespace?: string;
  uid?: string;
  resourceVersion?: string;
  generation?: number;
  creationTimestamp?: string | null;
  deletionTimestamp?: string | null;
  deletionGracePeriodSeconds?: number | null;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  finalizers?: string[];
  ownerReferences?: unknown[];
}

/** `spec.domain.cpu.features[]`: a CPU feature and how the guest CPU treats it. */
export interface CpuFeature {
  name: string;
  /** libvirt policy: `force`, `require` (default), `optional`, `disable`, `forbid`. */
  policy?: "force" | "require" | "optional" | "disable" | "forbid";
}

/** `spec.domain.cpu`. */
export interface Cpu {
  cores?: number;
  sockets?: number;
  threads?: number;
  maxSockets?: number;
  /** `host-model`, `host-passthrough` or a named libvirt model such as `Skylake-Server`. */
  model?: string;
  features?: CpuFeature[];
  dedicatedCpuPlacement?: boolean;
  isolateEmulatorThread?: boolean;
  numa?: unknown;
  realtime?: unknown;
}

/** `spec.domain.memory`. */
export interface Memory {
  guest?: Quantity;
  maxGuest?: Quantity;
  hugepages?: { pageSize?: string };
  reservedOverhead?: unknown;
}

/** `spec.domain.resources`. */
export interface ResourceRequirements {
  requests?: Record<string, Quantity>;
  limits?: Record<string, Quantity>;
  overcommitGuestOverhead?: boolean;
}

/** `spec.domain.firmware`. */
export interface Firmware {
  uuid?: string;
  serial?: string;
  bootloader?: {
    bios?: { useSerial?: boolean };
    efi?: { secureBoot?: boolean; persistent?: boolean };
  };
  kernelBoot?: unknown;
  acpi?: unknown;
}

/** A Hyper-V enlightenment that is on or off (`enabled` defaults to true). */
export interface FeatureState {
  enabled?: boolean;
}

/** `spec.domain.features.hyperv`. */
export interface FeatureHyperv {
  relaxed?: FeatureState;
  vapic?: FeatureState;
  spinlocks?: FeatureState & { spinlocks?: number };
  vpindex?: FeatureState;
  runtime?: FeatureState;
  synic?: FeatureState;
  synictimer?: FeatureState & { direct?: FeatureState };
  reset?: FeatureState;
  vendorid?: FeatureState & { vendorid?: string };
  frequencies?: FeatureState;
  reenlightenment?: FeatureState;
  tlbflush?: FeatureState;
  ipi?: FeatureState;
  evmcs?: FeatureState;
}

/** `spec.domain.features`. */
export interface Features {
  acpi?: FeatureState;
  apic?: FeatureState & { endOfInterrupt?: boolean };
  smm?: FeatureState;
  hyperv?: FeatureHyperv;
  hypervPassthrough?: FeatureState;
  kvm?: { hidden?: boolean };
  pvspinlock?: FeatureState;
}

/** `spec.domain.clock.timer.*`: `present` defaults to true. */
export interface Timer {
  present?: boolean;
  tickPolicy?: string;
  track?: string;
}

/** `spec.domain.clock`: exactly one of `utc` or `timezone`. */
export interface Clock {
  utc?: { offsetSeconds?: number };
  timezone?: string;
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
  name: string;
  disk?: { bus?: DiskBus; readonly?: boolean; pciAddress?: string };
  cdrom?: { bus?: DiskBus; readonly?: boolean; tray?: "open" | "closed" };
  lun?: { bus?: DiskBus; readonly?: boolean; reservation?: boolean };
  bootOrder?: number;
  serial?: string;
  /** libvirt cache mode: `none`, `writethrough` or `writeback`. */
  cache?: "none" | "writethrough" | "writeback";
  io?: string;
  dedicatedIOThread?: boolean;
  tag?: string;
  blockSize?: unknown;
  shareable?: boolean;
  errorPolicy?: string;
}

/** `spec.domain.devices.interfaces[]`. */
export interface Interface {
  name: string;
  model?: string;
  macAddress?: string;
  bootOrder?: number;
  pciAddress?: string;
  bridge?: Record<string, never>;
  masquerade?: Record<string, never>;
  sriov?: Record<string, never>;
  /** QEMU user-mode networking (KubeVirt's deprecated `slirp` binding). */
  slirp?: Record<string, never>;
  passt?: Record<string, never>;
  macvtap?: Record<string, never>;
  passtBinding?: Record<string, never>;
  binding?: { name: string };
  ports?: unknown[];
  dhcpOptions?: unknown;
  tag?: string;
  acpiIndex?: number;
  state?: string;
}

/** `spec.domain.devices.watchdog`. */
export interface Watchdog {
  name: string;
  i6300esb?: { action?: "poweroff" | "reset" | "shutdown" };
  diag288?: { action?: string };
}

/** `spec.domain.devices`. */
export interface Devices {
  disks?: Disk[];
  interfaces?: Interface[];
  autoattachSerialConsole?: boolean;
  autoattachGraphicsDevice?: boolean;
  autoattachMemBalloon?: boolean;
  autoattachPodInterface?: boolean;
  autoattachInputDevice?: boolean;
  rng?: Record<string, never>;
  watchdog?: Watchdog;
  gpus?: unknown[];
  hostDevices?: unknown[];
  filesystems?: unknown[];
  inputs?: unknown[];
  tpm?: unknown;
  sound?: unknown;
  video?: unknown;
}

/** `spec.domain`. */
export interface DomainSpec {
  cpu?: Cpu;
  memory?: Memory;
  resources?: ResourceRequirements;
  machine?: { type?: string };
  firmware?: Firmware;
  features?: Features;
  clock?: Clock;
  devices: Devices;
  chassis?: unknown;
  ioThreadsPolicy?: string;
  launchSecurity?: unknown;
}

/** `spec.volumes[].containerDisk`: a disk image shipped in a container image. */
export interface ContainerDiskSource {
  image: string;
  path?: string;
  imagePullPolicy?: string;
  imagePullSecret?: string;
}

/** `spec.volumes[].hostDisk`: a raw image file on the node. */
export interface HostDisk {
  path: string;
  type: "Disk" | "DiskOrCreate";
  capacity?: Quantity;
  shared?: boolean;
}

/** `spec.volumes[].cloudInitNoCloud` and `cloudInitConfigDrive`. */
export interface CloudInitSource {
  userData?: string;
  userDataBase64?: string;
  networkData?: string;
  networkDataBase64?: string;
  secretRef?: { name: string };
  networkDataSecretRef?: { name: string };
}

/** `spec.volumes[]`: a name and exactly one source. */
export interface Volume {
  name: string;
  containerDisk?: ContainerDiskSource;
  emptyDisk?: { capacity: Quantity };
  hostDisk?: HostDisk;
  cloudInitNoCloud?: CloudInitSource;
  cloudInitConfigDrive?: CloudInitSource;
  persistentVolumeClaim?: unknown;
  dataVolume?: unknown;
  ephemeral?: unknown;
  configMap?: unknown;
  secret?: unknown;
  serviceAccount?: unknown;
  downwardAPI?: unknown;
  sysprep?: unknown;
}

/** `spec.networks[]`. */
export interface Network {
  name: string;
  pod?: { vmNetworkCIDR?: string; vmIPv6NetworkCIDR?: string };
  multus?: unknown;
}

/** `spec` of a VirtualMachineInstance. */
export interface VirtualMachineInstanceSpec {
  domain: DomainSpec;
  volumes?: Volume[];
  networks?: Network[];
  terminationGracePeriodSeconds?: number;
  nodeSelector?: Record<string, string>;
  hostname?: string;
  subdomain?: string;
  architecture?: string;
  evictionStrategy?: string;
  affinity?: unknown;
  tolerations?: unknown[];
  [extra: string]: unknown;
}

/** `status.conditions[]`. */
export interface VmiCondition {
  type: ConditionType;
  status: "True" | "False" | "Unknown";
  reason?: string;
  message?: string;
  lastProbeTime?: string | null;
  lastTransitionTime?: string | null;
}

/** `status.interfaces[]`. */
export interface VmiNetworkInterface {
  name?: string;
  mac?: string;
  ipAddress?: string;
  ipAddresses?: string[];
  interfaceName?: string;
  infoSource?: string;
  podInterfaceName?: string;
  queueCount?: number;
  linkState?: string;
}

/** `status.guestOSInfo`. */
export interface GuestOsInfo {
  name?: string;
  kernelRelease?: string;
  version?: string;
  prettyName?: string;
  versionId?: string;
  kernelVersion?: string;
  machine?: string;
  id?: string;
}

/** `status.volumeStatus[]`. */
export interface VolumeStatus {
  name: string;
  target: string;
  phase?: string;
  reason?: string;
  message?: string;
  size?: number;
  containerDiskVolume?: { checksum?: number };
  hotplugVolume?: { attachPodName?: string; attachPodUID?: string };
  persistentVolumeClaimInfo?: unknown;
}

/** `status.migrationState`. */
export interface MigrationState {
  startTimestamp?: string | null;
  endTimestamp?: string | null;
  targetNode?: string;
  targetNodeAddress?: string;
  targetPod?: string;
  sourceNode?: string;
  sourcePod?: string;
  migrationUid?: string;
  completed?: boolean;
  failed?: boolean;
  abortRequested?: boolean;
  abortStatus?: string;
  failureReason?: string;
  mode?: "PreCopy" | "PostCopy" | string;
  targetNodeDomainDetected?: boolean;
  targetNodeDomainReadyTimestamp?: string | null;
  targetDirectMigrationNodePorts?: Record<string, number>;
}

/** `status` of a VirtualMachineInstance. */
export interface VirtualMachineInstanceStatus {
  phase?: VmiPhase;
  reason?: string;
  nodeName?: string;
  conditions?: VmiCondition[];
  interfaces?: VmiNetworkInterface[];
  phaseTransitionTimestamps?: { phase: VmiPhase; phaseTransitionTimestamp: string }[];
  guestOSInfo?: GuestOsInfo;
  volumeStatus?: VolumeStatus[];
  migrationState?: MigrationState;
  activePods?: Record<string, string>;
  launcherContainerImageVersion?: string;
  fsFreezeStatus?: string;
  machine?: { type?: string };
  qosClass?: string;
  runtimeUser?: number;
}

/** A `kubevirt.io/v1` VirtualMachineInstance. */
export interface VirtualMachineInstance {
  apiVersion?: string;
  kind?: string;
  metadata: ObjectMeta;
  spec: VirtualMachineInstanceSpec;
  status?: VirtualMachineInstanceStatus;
}

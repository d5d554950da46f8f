/**
 * The VM's storage on the node: pod-less mode's containerDisks read from OCI images on the
 * host into a content-addressed store (and the OCI image reader behind it), and KubeVirt
 * mode's persistent volumes: filesystem claims as the host disks KubeVirt's launcher reads,
 * their images created inside the launcher's root; pod-less mode's claims, found on the
 * host through their PersistentVolumes.
 *
 * @module
 */

export {
  ContainerDiskError,
  ContainerDiskStore,
  type ContainerDiskStoreOptions,
  imageFileName,
  type StoredDisk,
} from "./container_disks.ts";
export {
  layerTar,
  manifestLayers,
  OciImageError,
  type OciLayer,
  type OciSource,
  openArchive,
  openLayout,
  walkTar,
} from "./oci.ts";
export {
  claimImageSize,
  claimInfoOf,
  claimNameOf,
  DISK_IMAGE,
  isHotplugVolume,
  LAUNCHER_HOTPLUG_DIR,
  MINIMUM_RESERVE_BYTES,
  type PreparedHostDisks,
  prepareHostDisks,
  type PrepareHostDisksOptions,
  QEMU_USER,
  replaceClaimsByHostDisks,
  TOLERATED_LESS_SPACE_PERCENT,
  type ToleratedDisk,
  VMI_DISKS_DIR,
  VolumeError,
} from "./host_disks.ts";
export {
  type ClaimReader,
  type HostClaim,
  HostClaimError,
  resolveHostClaim,
} from "./podless_claims.ts";

/**
 * The VM's storage on the node: pod-less mode's containerDisks read from OCI images on the
 * host into a content-addressed store, and the OCI image reader behind it.
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

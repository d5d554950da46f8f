/**
 * The node side of the handler: the heartbeat (`kubevirt.io/schedulable`,
 * `kubevirt.io/heartbeat`, CPU manager labels), the node labeller (CPU models and
 * features, machine types, TSC, SEV/TDX from libvirt) and KubeVirt's permanent device
 * plugins (`devices.kubevirt.io/kvm|tun|vhost-net`) on the kubelet's v1beta1 API.
 *
 * @module
 */

export {
  CapabilitiesError,
  type CpuModelInfo,
  type DomainCapabilitiesInfo,
  type HostCapabilitiesInfo,
  hostModelCpuXml,
  type HostModelInfo,
  parseCpuFeatures,
  parseDomainCapabilities,
  parseHostCapabilities,
  type TscCounter,
} from "./capabilities.ts";
export {
  DEFAULT_BACKOFF_MS,
  DEFAULT_DEVICE_PLUGIN_DIR,
  DEFAULT_MAX_DEVICES,
  deviceIds,
  type DevicePluginConfig,
  DevicePluginError,
  DevicePluginManager,
  type DevicePluginManagerOptions,
  GenericDevicePlugin,
  PERMANENT_DEVICES,
  type PermanentDevice,
  pluginSocketName,
  preferredAllocation,
} from "./device_plugins.ts";
export {
  CPU_MANAGER_LABEL,
  DEFAULT_CPU_MANAGER_STATE_PATH,
  DEFAULT_CPU_MANAGER_STATE_PATHS,
  DEPRECATED_CPU_MANAGER_LABEL,
  Heartbeat,
  HeartbeatError,
  type HeartbeatOptions,
  type HeartbeatState,
  type NodeHeartbeatView,
  readCpuManagerEnabled,
  readNodeHeartbeat,
  rfc3339,
} from "./heartbeat.ts";
export {
  type CapabilitySource,
  type ComputedLabels,
  type ComputeLabelsOptions,
  computeNodeLabels,
  DEFAULT_OBSOLETE_CPU_MODELS,
  type GatheredCapabilities,
  gatherNodeLabelInfo,
  type GatherOptions,
  HOST_MODEL_OBSOLETE_REASON,
  isLabellerLabel,
  isValidLabel,
  LABELLER_LABEL_PREFIXES,
  LabellerLabels,
  type LabelRunResult,
  mergeLabellerLabels,
  type NodeLabelInfo,
  NodeLabeller,
  NodeLabellerError,
  type NodeLabellerOptions,
  sameLabels,
} from "./labeller.ts";
export {
  type CapabilityDocuments,
  capabilityDocuments,
  type CapabilityReader,
  CapabilityReadError,
  type ChildReadOptions,
  KUBEVIRT_LABELLER_DIR,
  type NodeServices,
  nodeServices,
  type NodeServicesOptions,
  readCapabilities,
  readCapabilitiesInChild,
  readCapabilityFiles,
} from "./services.ts";
export {
  discoverMediatedHostDevices,
  discoverPciHostDevices,
  discoverUsbHostDevices,
  HostDeviceConfiguration,
  type HostDeviceKeys,
  hostDevicePlugins,
  type HostDeviceSink,
  mdevDevicePlugin,
  mdevSelectors,
  type MediatedHostDevice,
  pciDevicePlugin,
  type PciHostDevice,
  pciSelectors,
  resourceEnvVar,
  usbDevicePlugin,
  usbDeviceSets,
  type UsbHostDevice,
} from "./host_devices.ts";
export {
  configureMdevTypes,
  desiredMdevTypes,
  DISABLE_MDEV_CONFIGURATION_GATE,
  externallyProvidedMdevTypes,
  type MdevTypesOptions,
  type MdevTypesResult,
} from "./mdev_types.ts";

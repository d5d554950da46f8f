/**
 * The handler's Prometheus metrics: the text format, the `kubevirt_vmi_*` families of each
 * VMI's domain statistics, and the handler's own families.
 *
 * @module
 */
export {
  Exposition,
  type FamilySpec,
  type Labels,
  type MetricType,
  sanitizeLabelName,
  TEXT_CONTENT_TYPE,
} from "./exposition.ts";
export { addVmiSamples, type GuestFilesystemStat, VMI_FAMILIES, vmiLabels } from "./vmi_metrics.ts";
export {
  type DownwardMetric,
  downwardMetrics,
  downwardMetricsXml,
  EMPTY_DOWNWARD_METRICS,
  hostDownwardMetrics,
  type HostFacts,
  INVALID_DOWNWARD_REQUEST,
  isDownwardMetricsRequest,
  readHostFacts,
  VHOSTMD_DISK_SIZE,
  type VhostmdWrite,
  vhostmdWrite,
} from "./downward.ts";
export {
  addHandlerSamples,
  HANDLER_FAMILIES,
  type HandlerSnapshot,
  VMI_QUEUE_NAME,
} from "./handler_metrics.ts";

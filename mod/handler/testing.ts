/**
 * The handler's parts as its tests reach them: the face, both modes' faces and test
 * exports, and the core's pieces that have tests of their own (the decision table, the
 * status computation, the migration predicates, the launcher clients, the notify server).
 * Only `tests/` imports this file.
 *
 * @module
 */
export * from "./mod.ts";
export * from "./pods/mod.ts";
export * from "./pods/testing.ts";
export * from "./podless/mod.ts";
export * from "./podless/testing.ts";
export { cleanUrlPath } from "./handler.ts";
export { type ControllerDeps, hotplugUnsettled, VmiController } from "./controller.ts";
export { LimitedBackoff, sriovInterfacesToPlug } from "./sriov_hotplug.ts";
export { interfacesToPlug, interfacesToUnplug } from "./nic_hotplug.ts";
export { decideSync, SyncAction, type SyncInput } from "./decide.ts";
export { GhostRecordError } from "./ghost_records.ts";
export { DownwardMetricsChannels, hasDownwardMetricsDevice } from "./downward_metrics.ts";
export { guestAgentSupport } from "./guest_agent_support.ts";
export {
  bindingPluginsMemory,
  cpuHotplugRefusal,
  launcherMemoryOverhead,
  memoryHotplugRefusal,
  vcpuCount,
} from "./target_hotplug.ts";
export {
  dialDirectly,
  LauncherCallError,
  LauncherClient,
  LauncherClients,
} from "./launcher_clients.ts";
export type { LauncherProvider } from "./launcher_provider.ts";
export {
  ALLOW_POD_BRIDGE_MIGRATION_ANNOTATION,
  type HostCpuSource,
  joinBlockers,
  migratability,
} from "./migratable.ts";
export {
  domainActiveOnTarget,
  domainMigrated,
  isMigrating,
  isMigrationDone,
  isMigrationInProgress,
  isMigrationSource,
  isMigrationTarget,
  migrationNeedsFinalization,
  notMigratable,
  omitEmptyMigrationState,
} from "./migration_state.ts";
export {
  type DomainNotification,
  type K8sEventNotification,
  notifyRefusals,
  NotifyServer,
} from "./notify_server.ts";
export { FailRetryManager } from "./retry_manager.ts";
export {
  computeStatus,
  guestAgentConnected,
  memoryDumpPath,
  phaseChangeEvent,
  type StatusInput,
  SYNC_FAILED_REASON,
  volumePhaseEvents,
} from "./status.ts";
export { hostTopology, topologyJson, virtualMachineOptions } from "./vm_options.ts";

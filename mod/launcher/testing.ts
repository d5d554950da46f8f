/**
 * The launcher's parts as its tests reach them: the converter's pieces, the domain reader,
 * the guest agent's parsers, the event forwarder and the migration helpers.
 * Only `tests/` imports this file.
 *
 * @module
 */
export * from "./mod.ts";
export {
  checkVmiSemantics,
  containerDiskFileName,
  ConversionError,
  type ConvertOptions,
  convertVmiToDomainXml,
  domainClusterOptions,
  generateDomainXml,
  hotplugDiskXml,
  InvalidFieldError,
  pinnedForTarget,
  UnsupportedFieldError,
  validateVmi,
  virtioMemDevice,
  VolumePreparationError,
} from "./converter.ts";
export { domainFromXml, parseXml } from "./domain_manager.ts";
export {
  checkCpuPlacement,
  cpuPlacement,
  hostNumaCellsOfOptions,
  realtimeVcpus,
} from "./converter_cpu_tune.ts";
export {
  CpuPool,
  dedicatedCpuCount,
  DedicatedCpusError,
  ownCpus,
  pinnedCpusOfDomainXml,
  threadSiblings,
} from "./cpu_pool.ts";
export {
  type AccessCredentialResult,
  AccessCredentials,
  credentialPlan,
} from "./access_credentials.ts";
export {
  agentReturn,
  emptyGuestAgentInfo,
  fsFreezeStatusFromAgent,
  GUEST_INFO_LIST_LIMIT,
  guestAgentInfoFromAgent,
  guestExecPid,
  guestExecStatus,
  guestFilesystemsFromAgent,
  guestInterfacesFromAgent,
  guestOsInfoFromAgent,
  guestUsersFromAgent,
} from "./guest_agent.ts";
export { MigrationMonitor, type MonitorOptions } from "./migration_monitor.ts";
export {
  endsIncomingMigration,
  IncomingMigration,
  startsIncomingMigration,
} from "./migration_target.ts";
export { prepareForQemuUser, qemuUserOfCapabilities } from "./qemu_user.ts";

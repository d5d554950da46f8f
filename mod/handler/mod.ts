/**
 * `virtnode handler`: the node agent's VMI side. {@linkcode Handler} assembles the
 * informer, the controller, the launcher clients and notify server, ghost records and
 * the launcher provider of its mode; the composition root runs it beside the node
 * services under one abort signal.
 *
 * What the code here keeps true (each has a test):
 * 1. Level-driven: a sync reads the current VMI and domain from the stores; events only
 *    wake a key. Syncing twice changes nothing the second time.
 * 2. One queue for VMI and domain events, keyed `namespace/name`; no key is processed by
 *    two workers at once; a failed sync requeues with per-key exponential backoff, and
 *    only the worker loop touches the queue ({@linkcode VmiController.reconcile} returns
 *    its decision).
 * 3. Expectations: after the handler writes a VMI it does not act on that key again
 *    until its informer has seen the write.
 * 4. A handler restart never stops a running VM: ghost records (one JSON file per VMI,
 *    written before the first launcher call, removed after cleanup) give back the UID and
 *    socket of VMIs the informer has not shown yet, and workers start only once the
 *    informer has listed.
 * 5. Every call out has a timeout; every failure of a sync is a `Synchronized=False`
 *    condition and a `SyncFailed` event, not only a log line.
 * 6. Bad input (an invalid spec, a corrupt ghost record, a malformed notify message) gets
 *    a clear error where the user looks and never crashes the handler or loses a VM.
 *
 * @module
 */
export {
  defaultMigrationAddress,
  DOMAIN_RESYNC_MS,
  Handler,
  type HandlerMigrationOptions,
  type HandlerOptions,
  handlerPaths,
  libvirtSocketOfUri,
  MIGRATION_INTERFACE,
  migrationNetworkAddress,
  podlessSocketPathProblem,
} from "./handler.ts";
export { MigrationSourceController, type MigrationSourceDeps } from "./migration_source.ts";
export {
  domainActiveOnTarget,
  domainMigrated,
  domainPausedFailedPostCopy,
  isMigrating,
  isMigrationDone,
  isMigrationInProgress,
  isMigrationSource,
  isMigrationTarget,
  migrationNeedsFinalization,
  migrationOptions,
  notMigratable,
} from "./migration_state.ts";
export {
  MigrationEvents,
  MigrationTargetController,
  type MigrationTargetDeps,
} from "./migration_target.ts";
export {
  MigrationAnnotations,
  PodlessMigrations,
  type PodlessMigrationsOptions,
  TARGET_READY_TIMEOUT_S,
  TARGET_SCHEDULABLE_TIMEOUT_S,
} from "./podless_migrations.ts";
export {
  ACPI_RESEND_MS,
  CACHE_NOT_SYNCED_REQUEUE_MS,
  type ControllerDeps,
  DEFAULT_WORKERS,
  DONE,
  OLDER_DOMAIN_REQUEUE_MS,
  type ReconcileResult,
  requeueAfter,
  sooner,
  VmiController,
} from "./controller.ts";
export { decideSync, SyncAction, type SyncDecision, type SyncInput } from "./decide.ts";
export { type GhostRecord, GhostRecordStore, type SetAsideFile } from "./ghost_records.ts";
export {
  type DiskEventRecorder,
  type LauncherProvider,
  launchersOfGhostRecords,
  type LauncherStart,
  type MigrationSourceDir,
} from "./launcher_provider.ts";
export { POD_SOCKET_POLL_MS, PodLaunchers, type PodLaunchersOptions } from "./pod_launchers.ts";
export {
  type HostSettings,
  LAUNCHER_STOP_EXTRA_MS,
  launcherHostId,
  PODLESS_NOT_READY_REQUEUE_MS,
  PodlessLaunchers,
  type PodlessLaunchersOptions,
} from "./podless_launchers.ts";
export {
  LAUNCHER_IDENTITY,
  LauncherSpawner,
  type LauncherSpawnerOptions,
  type LauncherSpec,
  type ProcessIdentity,
} from "./launcher_spawner.ts";
export { type HostExit, LauncherHostClient, LauncherHostError } from "./launcher_host_client.ts";
export {
  dialDirectly,
  type DialResolver,
  type DialTarget,
  LAUNCHER_TIMEOUTS,
  LauncherCallError,
  LauncherClient,
  LauncherClients,
  type LauncherClientsOptions,
} from "./launcher_clients.ts";
export {
  type DomainNotification,
  type K8sEventNotification,
  type NotifyHandlers,
  type NotifyRefusals,
  notifyRefusals,
  type NotifySender,
  NotifyServer,
  refuseDomain,
  refuseK8sEvent,
} from "./notify_server.ts";
export { MAX_PIPE_CONNECTIONS, NotifyPipes, type NotifyPipesOptions } from "./notify_pipes.ts";
export {
  type ComputedStatus,
  computeStatus,
  EventReason,
  nextPhase,
  type PhaseChange,
  type PhaseInputs,
  type StatusEvent,
  type StatusInput,
  SYNC_FAILED_REASON,
} from "./status.ts";
export { type AgentInfo, type AgentSupport, guestAgentSupport } from "./guest_agent_support.ts";
export {
  ALLOW_POD_BRIDGE_MIGRATION_ANNOTATION,
  type HostCpuSource,
  joinBlockers,
  type Migratability,
  migratability,
  type MigratableContext,
  type MigrationBlocker,
} from "./migratable.ts";

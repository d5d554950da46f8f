/**
 * libvirt's numbers, by their C names (values from libvirt 9.0's public headers).
 *
 * @module
 */

/** `virDomainState`: no state. */
export const VIR_DOMAIN_NOSTATE = 0;
/** `virDomainState`: running. */
export const VIR_DOMAIN_RUNNING = 1;
/** `virDomainState`: blocked on a resource. */
export const VIR_DOMAIN_BLOCKED = 2;
/** `virDomainState`: paused. */
export const VIR_DOMAIN_PAUSED = 3;
/** `virDomainState`: being shut down. */
export const VIR_DOMAIN_SHUTDOWN = 4;
/** `virDomainState`: shut off. */
export const VIR_DOMAIN_SHUTOFF = 5;
/** `virDomainState`: crashed. */
export const VIR_DOMAIN_CRASHED = 6;
/** `virDomainState`: suspended by guest power management. */
export const VIR_DOMAIN_PMSUSPENDED = 7;

/** `virDomainEventType`: defined. */
export const VIR_DOMAIN_EVENT_DEFINED = 0;
/** `virDomainEventType`: undefined. */
export const VIR_DOMAIN_EVENT_UNDEFINED = 1;
/** `virDomainEventType`: started. */
export const VIR_DOMAIN_EVENT_STARTED = 2;
/** `virDomainEventType`: suspended. */
export const VIR_DOMAIN_EVENT_SUSPENDED = 3;
/** `virDomainEventType`: resumed. */
export const VIR_DOMAIN_EVENT_RESUMED = 4;
/** `virDomainEventType`: stopped. */
export const VIR_DOMAIN_EVENT_STOPPED = 5;
/** `virDomainEventType`: shutdown. */
export const VIR_DOMAIN_EVENT_SHUTDOWN = 6;
/** `virDomainEventType`: PM suspended. */
export const VIR_DOMAIN_EVENT_PMSUSPENDED = 7;
/** `virDomainEventType`: crashed. */
export const VIR_DOMAIN_EVENT_CRASHED = 8;

/** `virDomainEventDefinedDetailType`: a new domain was defined. */
export const VIR_DOMAIN_EVENT_DEFINED_ADDED = 0;
/** `virDomainEventStartedDetailType`: started as an incoming migration. */
export const VIR_DOMAIN_EVENT_STARTED_MIGRATED = 1;
/** `virDomainEventSuspendedDetailType`: paused by the user or a job. */
export const VIR_DOMAIN_EVENT_SUSPENDED_PAUSED = 0;
/** `virDomainEventResumedDetailType`: resumed at the end of an incoming migration. */
export const VIR_DOMAIN_EVENT_RESUMED_MIGRATED = 1;
/** `virDomainEventCrashedDetailType`: the guest panicked. */
export const VIR_DOMAIN_EVENT_CRASHED_PANICKED = 0;

/** `virDomainEventID`: lifecycle. */
export const VIR_DOMAIN_EVENT_ID_LIFECYCLE = 0;
/** `virDomainEventID`: reboot. */
export const VIR_DOMAIN_EVENT_ID_REBOOT = 1;
/** `virDomainEventID`: IO error with reason. */
export const VIR_DOMAIN_EVENT_ID_IO_ERROR_REASON = 6;
/** `virDomainEventID`: device removed. */
export const VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED = 15;
/** `virDomainEventID`: a device was added to the guest. */
export const VIR_DOMAIN_EVENT_ID_DEVICE_ADDED = 19;
/** `virDomainEventID`: guest agent lifecycle. */
export const VIR_DOMAIN_EVENT_ID_AGENT_LIFECYCLE = 18;
/** `virDomainEventID`: a memory device's size changed (virtio-mem plugged or unplugged). */
export const VIR_DOMAIN_EVENT_ID_MEMORY_DEVICE_SIZE_CHANGE = 26;

/** `virDomainCreateFlags`: start paused. */
export const VIR_DOMAIN_START_PAUSED = 1 << 0;
/** `virDomainCreateFlags`: kill the guest when the connection closes. */
export const VIR_DOMAIN_START_AUTODESTROY = 1 << 1;
/** `virDomainDestroyFlagsValues`: SIGTERM only, never SIGKILL. */
export const VIR_DOMAIN_DESTROY_GRACEFUL = 1 << 0;
/** `virDomainModificationImpact`: change the running domain. */
export const VIR_DOMAIN_AFFECT_LIVE = 1 << 0;
/** `virDomainModificationImpact`: change the persistent definition. */
export const VIR_DOMAIN_AFFECT_CONFIG = 1 << 1;
/** `virDomainCoreDumpFormat`: the guest's memory as it is (KubeVirt's memory dumps). */
export const VIR_DOMAIN_CORE_DUMP_FORMAT_RAW = 0;
/** `virDomainCoreDumpFlags`: the guest's memory only, as an ELF core QEMU writes. */
export const VIR_DUMP_MEMORY_ONLY = 1 << 4;
/** `virDomainUndefineFlagsValues`: also remove NVRAM. */
export const VIR_DOMAIN_UNDEFINE_NVRAM = 1 << 2;
/** `virDomainUndefineFlagsValues`: also remove managed save. */
export const VIR_DOMAIN_UNDEFINE_MANAGED_SAVE = 1 << 0;
/** `virDomainShutdownFlagValues`: ACPI power button. */
export const VIR_DOMAIN_SHUTDOWN_ACPI_POWER_BTN = 1 << 0;
/** `virDomainShutdownFlagValues`: guest agent. */
export const VIR_DOMAIN_SHUTDOWN_GUEST_AGENT = 1 << 1;
/** `virDomainXMLFlags`: include secure information. */
export const VIR_DOMAIN_XML_SECURE = 1 << 0;
/** `virDomainXMLFlags`: the persistent (inactive) definition. */
export const VIR_DOMAIN_XML_INACTIVE = 1 << 1;
/** `virDomainXMLFlags`: what another host can define (a migration's destination XML). */
export const VIR_DOMAIN_XML_MIGRATABLE = 1 << 3;

/** `virConnectListAllDomainsFlags`: active domains. */
export const VIR_CONNECT_LIST_DOMAINS_ACTIVE = 1 << 0;
/** `virConnectListAllDomainsFlags`: inactive domains. */
export const VIR_CONNECT_LIST_DOMAINS_INACTIVE = 1 << 1;
/** `virConnectListAllDomainsFlags`: persistent domains. */
export const VIR_CONNECT_LIST_DOMAINS_PERSISTENT = 1 << 2;
/** `virConnectListAllDomainsFlags`: transient domains. */
export const VIR_CONNECT_LIST_DOMAINS_TRANSIENT = 1 << 3;

/** `virDomainStatsTypes`: state. */
export const VIR_DOMAIN_STATS_STATE = 1 << 0;
/** `virDomainStatsTypes`: total CPU. */
export const VIR_DOMAIN_STATS_CPU_TOTAL = 1 << 1;
/** `virDomainStatsTypes`: balloon. */
export const VIR_DOMAIN_STATS_BALLOON = 1 << 2;
/** `virDomainStatsTypes`: vCPUs. */
export const VIR_DOMAIN_STATS_VCPU = 1 << 3;
/** `virDomainStatsTypes`: interfaces. */
export const VIR_DOMAIN_STATS_INTERFACE = 1 << 4;
/** `virDomainStatsTypes`: block devices. */
export const VIR_DOMAIN_STATS_BLOCK = 1 << 5;
/** `virDomainStatsTypes`: the memory dirty rate last measured (`dirtyrate.*`). */
export const VIR_DOMAIN_STATS_DIRTYRATE = 1 << 9;
/** `virDomainDirtyRateStatus` (`dirtyrate.calc_status`): measured, the rate is in. */
export const VIR_DOMAIN_DIRTYRATE_MEASURED = 2;

/** `virConnectBaselineCPUFlags`: list all features. */
export const VIR_CONNECT_BASELINE_CPU_EXPAND_FEATURES = 1 << 0;
/** `virConnectBaselineCPUFlags`: drop non-migratable features. */
export const VIR_CONNECT_BASELINE_CPU_MIGRATABLE = 1 << 1;

/** `virDomainMigrateFlags`: live migration (the guest runs meanwhile). */
export const VIR_MIGRATE_LIVE = 1 << 0;
/** `virDomainMigrateFlags`: the source libvirt connects to the destination itself. */
export const VIR_MIGRATE_PEER2PEER = 1 << 1;
/** `virDomainMigrateFlags`: the data goes through libvirt's own connection. */
export const VIR_MIGRATE_TUNNELLED = 1 << 2;
/** `virDomainMigrateFlags`: the destination keeps the domain defined. */
export const VIR_MIGRATE_PERSIST_DEST = 1 << 3;
/** `virDomainMigrateFlags`: the source's definition goes once the migration succeeded. */
export const VIR_MIGRATE_UNDEFINE_SOURCE = 1 << 4;
/** `virDomainMigrateFlags`: the guest stays paused on the destination. */
export const VIR_MIGRATE_PAUSED = 1 << 5;
/** `virDomainMigrateFlags`: disks are copied whole (block migration). */
export const VIR_MIGRATE_NON_SHARED_DISK = 1 << 6;
/** `virDomainMigrateFlags`: disks are copied, their shared backing files not. */
export const VIR_MIGRATE_NON_SHARED_INC = 1 << 7;
/** `virDomainMigrateFlags`: migrate even if libvirt calls it unsafe (disk caches). */
export const VIR_MIGRATE_UNSAFE = 1 << 9;
/** `virDomainMigrateFlags`: slow the guest's vCPUs down when it dirties memory too fast. */
export const VIR_MIGRATE_AUTO_CONVERGE = 1 << 13;
/** `virDomainMigrateFlags`: allow switching to post-copy. */
export const VIR_MIGRATE_POSTCOPY = 1 << 15;
/** `virDomainMigrateFlags`: several connections for the memory. */
export const VIR_MIGRATE_PARALLEL = 1 << 17;

/** `virDomainGetJobStatsFlags`: the statistics of the job that completed last. */
export const VIR_DOMAIN_JOB_STATS_COMPLETED = 1 << 0;
/** `virDomainGetJobStatsFlags`: keep them for a later call. */
export const VIR_DOMAIN_JOB_STATS_KEEP_COMPLETED = 1 << 1;

/** `virDomainJobType`: no job. */
export const VIR_DOMAIN_JOB_NONE = 0;
/** `virDomainJobType`: a job with a known end. */
export const VIR_DOMAIN_JOB_BOUNDED = 1;
/** `virDomainJobType`: a job without a known end (a migration of a running guest). */
export const VIR_DOMAIN_JOB_UNBOUNDED = 2;
/** `virDomainJobType`: the job completed. */
export const VIR_DOMAIN_JOB_COMPLETED = 3;
/** `virDomainJobType`: the job failed. */
export const VIR_DOMAIN_JOB_FAILED = 4;
/** `virDomainJobType`: the job was cancelled. */
export const VIR_DOMAIN_JOB_CANCELLED = 5;

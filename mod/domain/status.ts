/**
 * Domain status as KubeVirt names it, and the mapping from libvirt's numeric
 * `virDomainState` and per-state reason enums to it, as KubeVirt's virt-launcher does.
 *
 * @module
 */

/** Domain lifecycle states, spelled as KubeVirt spells them (`LifeCycle`). */
export const LifeCycle = {
  NoState: "NoState",
  Running: "Running",
  Blocked: "Blocked",
  Paused: "Paused",
  /** libvirt's SHUTDOWN state ("being shut down"); KubeVirt calls it ShuttingDown. */
  Shutdown: "ShuttingDown",
  Shutoff: "Shutoff",
  Crashed: "Crashed",
  PMSuspended: "PMSuspended",
  /** The domain exists but its launcher cannot be reached. */
  Unknown: "Unknown",
} as const;
/** A domain lifecycle state. */
export type LifeCycle = typeof LifeCycle[keyof typeof LifeCycle];

/**
 * Reasons for the current state, spelled as KubeVirt spells them
 * (`StateChangeReason`). Several states share a spelling: `Unknown`, `User`,
 * `Crashed` and `FromSnapshot` appear under more than one state.
 */
export const StateChangeReason = {
  Unknown: "Unknown",
  // ShuttingDown
  User: "User",
  // Shutoff
  Shutdown: "Shutdown",
  Destroyed: "Destroyed",
  Migrated: "Migrated",
  Crashed: "Crashed",
  Panicked: "Panicked",
  Saved: "Saved",
  Failed: "Failed",
  FromSnapshot: "FromSnapshot",
  // NoState
  NonExistent: "NonExistent",
  // Paused
  PausedUnknown: "Unknown",
  PausedUser: "User",
  PausedMigration: "Migration",
  PausedSave: "Save",
  PausedDump: "Dump",
  PausedIOError: "IOError",
  PausedWatchdog: "Watchdog",
  PausedFromSnapshot: "FromSnapshot",
  PausedShuttingDown: "ShuttingDown",
  PausedSnapshot: "Snapshot",
  PausedCrashed: "Crashed",
  PausedStartingUp: "StartingUp",
  PausedPostcopy: "Postcopy",
  PausedPostcopyFailed: "PostcopyFailed",
} as const;
/** A state change reason. */
export type StateChangeReason = typeof StateChangeReason[keyof typeof StateChangeReason];

/** libvirt's `virDomainState`. */
export const VirDomainState = {
  NOSTATE: 0,
  RUNNING: 1,
  BLOCKED: 2,
  PAUSED: 3,
  SHUTDOWN: 4,
  SHUTOFF: 5,
  CRASHED: 6,
  PMSUSPENDED: 7,
} as const;

/** libvirt's `virDomainRunningReason`. */
export const VirDomainRunningReason = {
  UNKNOWN: 0,
  BOOTED: 1,
  MIGRATED: 2,
  RESTORED: 3,
  FROM_SNAPSHOT: 4,
  UNPAUSED: 5,
  MIGRATION_CANCELED: 6,
  SAVE_CANCELED: 7,
  WAKEUP: 8,
  CRASHED: 9,
  POSTCOPY: 10,
  POSTCOPY_FAILED: 11,
} as const;

/** libvirt's `virDomainPausedReason`. */
export const VirDomainPausedReason = {
  UNKNOWN: 0,
  USER: 1,
  MIGRATION: 2,
  SAVE: 3,
  DUMP: 4,
  IOERROR: 5,
  WATCHDOG: 6,
  FROM_SNAPSHOT: 7,
  SHUTTING_DOWN: 8,
  SNAPSHOT: 9,
  CRASHED: 10,
  STARTING_UP: 11,
  POSTCOPY: 12,
  POSTCOPY_FAILED: 13,
} as const;

/** libvirt's `virDomainShutdownReason`. */
export const VirDomainShutdownReason = { UNKNOWN: 0, USER: 1 } as const;

/** libvirt's `virDomainShutoffReason`. */
export const VirDomainShutoffReason = {
  UNKNOWN: 0,
  SHUTDOWN: 1,
  DESTROYED: 2,
  CRASHED: 3,
  MIGRATED: 4,
  SAVED: 5,
  FAILED: 6,
  FROM_SNAPSHOT: 7,
  DAEMON: 8,
} as const;

/** libvirt's `virDomainCrashedReason`. */
export const VirDomainCrashedReason = { UNKNOWN: 0, PANICKED: 1 } as const;

const STATES: readonly LifeCycle[] = [
  LifeCycle.NoState,
  LifeCycle.Running,
  LifeCycle.Blocked,
  LifeCycle.Paused,
  LifeCycle.Shutdown,
  LifeCycle.Shutoff,
  LifeCycle.Crashed,
  LifeCycle.PMSuspended,
];

const SHUTDOWN_REASONS: readonly StateChangeReason[] = [
  StateChangeReason.Unknown,
  StateChangeReason.User,
];

const SHUTOFF_REASONS: readonly StateChangeReason[] = [
  StateChangeReason.Unknown,
  StateChangeReason.Shutdown,
  StateChangeReason.Destroyed,
  StateChangeReason.Crashed,
  StateChangeReason.Migrated,
  StateChangeReason.Saved,
  StateChangeReason.Failed,
  StateChangeReason.FromSnapshot,
];

const CRASHED_REASONS: readonly StateChangeReason[] = [
  StateChangeReason.Unknown,
  StateChangeReason.Panicked,
];

const PAUSED_REASONS: readonly StateChangeReason[] = [
  StateChangeReason.PausedUnknown,
  StateChangeReason.PausedUser,
  StateChangeReason.PausedMigration,
  StateChangeReason.PausedSave,
  StateChangeReason.PausedDump,
  StateChangeReason.PausedIOError,
  StateChangeReason.PausedWatchdog,
  StateChangeReason.PausedFromSnapshot,
  StateChangeReason.PausedShuttingDown,
  StateChangeReason.PausedSnapshot,
  StateChangeReason.PausedCrashed,
  StateChangeReason.PausedStartingUp,
  StateChangeReason.PausedPostcopy,
  StateChangeReason.PausedPostcopyFailed,
];

/** A domain's status as KubeVirt reports it. */
export interface DomainState {
  /** The lifecycle state, e.g. `Running`. */
  status: LifeCycle;
  /** Why the domain is in that state, e.g. `Booted`. */
  reason: StateChangeReason;
}

/**
 * The KubeVirt lifecycle name of a libvirt `virDomainState` number. Numbers libvirt
 * may add later map to `NoState`.
 */
export function lifeCycleFromLibvirt(state: number): LifeCycle {
  return STATES[state] ?? LifeCycle.NoState;
}

/**
 * The KubeVirt reason name of a libvirt reason number, read in the enum of its state.
 * KubeVirt names no reasons for Running, Blocked, PMSuspended and NoState: those are
 * `Unknown`, as are reason numbers KubeVirt's tables do not list (KubeVirt yields an
 * empty string there; virtnode says `Unknown` so every status carries a named reason).
 */
export function reasonFromLibvirt(state: number, reason: number): StateChangeReason {
  const table = reasonTable(state);
  return table?.[reason] ?? StateChangeReason.Unknown;
}

/**
 * The reason a STOPPED lifecycle event's detail gives. libvirt numbers the details of that
 * event as its shutoff reasons less one (they have no "unknown"), so one table serves both.
 */
export function stoppedEventReason(detail: number): StateChangeReason {
  return SHUTOFF_REASONS[detail + 1] ?? StateChangeReason.Unknown;
}

/** libvirt's `(state, reason)` pair as KubeVirt's `{status, reason}`. */
export function domainStateFromLibvirt(state: number, reason: number): DomainState {
  return { status: lifeCycleFromLibvirt(state), reason: reasonFromLibvirt(state, reason) };
}

function reasonTable(state: number): readonly StateChangeReason[] | undefined {
  switch (state) {
    case VirDomainState.SHUTDOWN:
      return SHUTDOWN_REASONS;
    case VirDomainState.SHUTOFF:
      return SHUTOFF_REASONS;
    case VirDomainState.CRASHED:
      return CRASHED_REASONS;
    case VirDomainState.PAUSED:
      return PAUSED_REASONS;
    default:
      return undefined;
  }
}

/** Whether a lifecycle state means QEMU is (still) there. */
export function isDomainActive(status: LifeCycle): boolean {
  return status === LifeCycle.Running || status === LifeCycle.Blocked ||
    status === LifeCycle.Paused || status === LifeCycle.Shutdown ||
    status === LifeCycle.PMSuspended;
}

/** Whether a lifecycle state means the domain is down. */
export function isDomainDown(status: LifeCycle): boolean {
  return status === LifeCycle.Shutoff || status === LifeCycle.Crashed;
}

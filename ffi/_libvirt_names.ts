/**
 * Names for libvirt's numbered states, reasons and events, as in libvirt's headers
 * (`VIR_DOMAIN_EVENT_STARTED_BOOTED` -> "Started"/"Booted"). Private to `ffi/`.
 *
 * @module
 */

/** `virDomainState` names by number. */
export const DOMAIN_STATE_NAMES: readonly string[] = [
  "NoState",
  "Running",
  "Blocked",
  "Paused",
  "ShuttingDown",
  "Shutoff",
  "Crashed",
  "PMSuspended",
];

/** Reason names per `virDomainState`. */
export const DOMAIN_STATE_REASON_NAMES: readonly (readonly string[])[] = [
  ["Unknown"],
  [
    "Unknown",
    "Booted",
    "Migrated",
    "Restored",
    "FromSnapshot",
    "Unpaused",
    "MigrationCanceled",
    "SaveCanceled",
    "WakeUp",
    "Crashed",
    "Postcopy",
    "PostcopyFailed",
  ],
  ["Unknown"],
  [
    "Unknown",
    "User",
    "Migration",
    "Save",
    "Dump",
    "IOError",
    "Watchdog",
    "FromSnapshot",
    "ShuttingDown",
    "Snapshot",
    "Crashed",
    "StartingUp",
    "Postcopy",
    "PostcopyFailed",
  ],
  ["Unknown", "User"],
  [
    "Unknown",
    "Shutdown",
    "Destroyed",
    "Crashed",
    "Migrated",
    "Saved",
    "Failed",
    "FromSnapshot",
    "Daemon",
  ],
  ["Unknown", "Panicked"],
  ["Unknown"],
];

/** `virDomainEventType` names by number. */
export const LIFECYCLE_EVENT_NAMES: readonly string[] = [
  "Defined",
  "Undefined",
  "Started",
  "Suspended",
  "Resumed",
  "Stopped",
  "Shutdown",
  "PMSuspended",
  "Crashed",
];

/** Detail names per `virDomainEventType`. */
export const LIFECYCLE_DETAIL_NAMES: readonly (readonly string[])[] = [
  ["Added", "Updated", "Renamed", "FromSnapshot"],
  ["Removed", "Renamed"],
  ["Booted", "Migrated", "Restored", "FromSnapshot", "Wakeup"],
  [
    "Paused",
    "Migrated",
    "IOError",
    "Watchdog",
    "Restored",
    "FromSnapshot",
    "APIError",
    "Postcopy",
    "PostcopyFailed",
  ],
  ["Unpaused", "Migrated", "FromSnapshot", "Postcopy", "PostcopyFailed"],
  ["Shutdown", "Destroyed", "Crashed", "Migrated", "Saved", "Failed", "FromSnapshot"],
  ["Finished", "Guest", "Host"],
  ["Memory", "Disk"],
  ["Panicked", "Crashloaded"],
];

/** `virDomainEventIOErrorAction` names. */
export const IO_ERROR_ACTION_NAMES: readonly string[] = ["None", "Pause", "Report"];

/** Agent lifecycle states (index = number). */
export const AGENT_STATE_NAMES: readonly string[] = ["Unknown", "Connected", "Disconnected"];

/** Agent lifecycle reasons. */
export const AGENT_REASON_NAMES: readonly string[] = ["Unknown", "DomainStarted", "Channel"];

/** `virConnectCloseReason` names. */
export const CLOSE_REASON_NAMES: readonly string[] = ["Error", "EOF", "Keepalive", "Client"];

/** A name from a table, or `Unknown(<n>)` for numbers newer than the table. */
export function nameOf(table: readonly string[] | undefined, n: number): string {
  return table?.[n] ?? `Unknown(${n})`;
}

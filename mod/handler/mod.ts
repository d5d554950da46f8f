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
  Handler,
  type HandlerMigrationOptions,
  type HandlerOptions,
  libvirtSocketOfUri,
  migrationNetworkAddress,
  podlessSocketPathProblem,
} from "./handler.ts";
export { migrationOptions } from "./migration_state.ts";
export { type GhostRecord, GhostRecordStore, type SetAsideFile } from "./ghost_records.ts";
export type { HostCpuSource } from "./migratable.ts";

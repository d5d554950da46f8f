/**
 * What a VMI's status and its domain say about a live migration, as KubeVirt's
 * virt-handler reads them (`pkg/virt-handler/controller.go`, `migration-source.go`,
 * `migration-target.go`). Pure functions shared by the three controllers.
 *
 * @module
 */
import {
  ConditionType,
  Labels,
  MIGRATION_DEFAULTS,
  type MigrationConfiguration,
  type MigrationState,
  PARALLEL_MIGRATION_THREADS,
  parseQuantity,
  type VirtualMachineInstance,
} from "../api/mod.ts";
import { type Domain, LifeCycle, StateChangeReason } from "../domain/mod.ts";

/** The domain left its node by migration (Shutoff, reason Migrated). */
export function domainMigrated(domain: Domain | undefined): boolean {
  return domain?.status.status === LifeCycle.Shutoff &&
    domain.status.reason === StateChangeReason.Migrated;
}

/**
 * A migration of the VMI runs: its status says started and not ended, or its domain's
 * migration metadata does, or the domain is paused by the migration (KubeVirt's
 * `isMigrationInProgress`). The VMI controller leaves such a VMI to the migration's.
 */
export function isMigrationInProgress(
  vmi: VirtualMachineInstance | undefined,
  domain: Domain | undefined,
): boolean {
  const state = vmi?.status?.migrationState;
  if (state?.startTimestamp && !state.endTimestamp) return true;
  const meta = domain?.spec.metadata.kubevirt.migration;
  if (meta?.startTimestamp && !meta.endTimestamp) return true;
  return domain?.status.status === LifeCycle.Paused && (
    domain.status.reason === StateChangeReason.PausedMigration ||
    domain.status.reason === StateChangeReason.PausedStartingUp ||
    domain.status.reason === StateChangeReason.PausedPostcopy
  );
}

/** The migration is over: ended and either completed or failed (or there is none). */
export function isMigrationDone(state: MigrationState | undefined): boolean {
  return state === undefined || (!!state.endTimestamp && (!!state.completed || !!state.failed));
}

/** The migration started and has not ended (KubeVirt's `migrations.IsMigrating`). */
export function isMigrating(vmi: VirtualMachineInstance): boolean {
  const state = vmi.status?.migrationState;
  return !!state?.startTimestamp && !state.endTimestamp;
}

/**
 * Why the VMI may not migrate, in KubeVirt admission's words ("Cannot migrate VMI, Reason:
 * ..., Message: ..."), when its `LiveMigratable` condition is False; else undefined. Pod-less
 * mode fails a VMIM with it where no admission refused the VMIM (one created before the
 * handler's first look, or a cluster without KubeVirt's webhooks).
 */
export function notMigratable(vmi: VirtualMachineInstance): string | undefined {
  const c = vmi.status?.conditions?.find((c) => c.type === ConditionType.LiveMigratable);
  if (c?.status !== "False") return undefined;
  return `Cannot migrate VMI, Reason: ${c.reason ?? ""}, Message: ${c.message ?? ""}`;
}

/** The migration ended on the target but is not finalized yet. */
export function migrationNeedsFinalization(state: MigrationState | undefined): boolean {
  return !!state?.startTimestamp && !!state.endTimestamp && !state.completed && !state.failed;
}

/** This node is the source of the VMI's migration, and the target has published itself. */
export function isMigrationSource(vmi: VirtualMachineInstance, node: string): boolean {
  const state = vmi.status?.migrationState;
  return state !== undefined && state.sourceNode === node && vmi.status?.nodeName === node;
}

/** This node is the VMI's migration target (virt-controller's label names it). */
export function isMigrationTarget(vmi: VirtualMachineInstance, node: string): boolean {
  return vmi.metadata.labels?.[Labels.MigrationTargetNodeName] === node;
}

/** The domain is active on the target: Running, or paused by its user. */
export function domainActiveOnTarget(domain: Domain | undefined): boolean {
  if (!domain) return false;
  return domain.status.status === LifeCycle.Running ||
    (domain.status.status === LifeCycle.Paused &&
      domain.status.reason === StateChangeReason.PausedUser);
}

/** A post-copy migration failed, leaving the domain paused on a side that cannot go on. */
export function domainPausedFailedPostCopy(domain: Domain | undefined): boolean {
  return domain?.status.status === LifeCycle.Paused &&
    domain.status.reason === StateChangeReason.PausedPostcopyFailed;
}

/**
 * KubeVirt's `cmdclient.MigrationOptions` (Go field names: the launcher reads them so) from
 * the migration's configuration (virt-controller's, in the VMI's migration state; the
 * cluster's, `cluster`, when the VMI has none), KubeVirt's defaults for what it leaves out;
 * parallel connections as KubeVirt's handler asks for them (none with post-copy or a CPU
 * limit).
 */
export function migrationOptions(
  vmi: VirtualMachineInstance,
  cluster: MigrationConfiguration = MIGRATION_DEFAULTS,
): Record<string, unknown> {
  const c: MigrationConfiguration = {
    ...MIGRATION_DEFAULTS,
    ...(vmi.status?.migrationState?.migrationConfiguration ?? cluster),
  };
  const allowPostCopy = c.allowPostCopy === true;
  const options: Record<string, unknown> = {
    Bandwidth: String(c.bandwidthPerMigration ?? MIGRATION_DEFAULTS.bandwidthPerMigration),
    ProgressTimeout: Number(c.progressTimeout ?? MIGRATION_DEFAULTS.progressTimeout),
    CompletionTimeoutPerGiB: Number(
      c.completionTimeoutPerGiB ?? MIGRATION_DEFAULTS.completionTimeoutPerGiB,
    ),
    UnsafeMigration: c.unsafeMigrationOverride === true,
    AllowAutoConverge: c.allowAutoConverge === true,
    AllowPostCopy: allowPostCopy,
    // An older virt-controller leaves it unset: KubeVirt's handler then follows post-copy.
    AllowWorkloadDisruption: c.allowWorkloadDisruption ?? allowPostCopy,
  };
  const cpuLimit = (vmi.spec.domain.resources?.limits as Record<string, string> | undefined)
    ?.cpu;
  const limited = cpuLimit !== undefined && parseQuantity(cpuLimit) > 0;
  if (!limited && !allowPostCopy) options.ParallelMigrationThreads = PARALLEL_MIGRATION_THREADS;
  return options;
}

/** Drops the members Go's `omitempty` leaves out: false, "", 0, null, empty lists and maps. */
function dropZeros(o: Record<string, unknown>): void {
  for (const [key, value] of Object.entries(o)) {
    const empty = value === undefined || value === null || value === false || value === "" ||
      value === 0 || (Array.isArray(value) && value.length === 0) ||
      (typeof value === "object" && value !== null && Object.keys(value).length === 0);
    if (empty) delete o[key];
  }
}

/**
 * Leaves out of a VMI's `status.migrationState` what KubeVirt's Go types leave out when
 * they write it (every field there is `omitempty`: `false`, `""`, empty lists and maps, also
 * the fields of `sourceState` and `targetState`; a map's own entries stay). virt-controller
 * patches the migration state with a JSON patch that tests the state as Go read and wrote it
 * back: a `"failed": false` written by the handler fails that test, and the next migration
 * of the VMI never starts.
 */
export function omitEmptyMigrationState(vmi: VirtualMachineInstance): void {
  const state = vmi.status?.migrationState as Record<string, unknown> | undefined;
  if (!state) return;
  for (const side of ["sourceState", "targetState"]) {
    const struct = state[side];
    if (struct && typeof struct === "object") dropZeros(struct as Record<string, unknown>);
  }
  dropZeros(state);
}

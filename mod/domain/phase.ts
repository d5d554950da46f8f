/**
 * The VMI phase a domain's status implies, as a pure function, one branch per row
 * (KubeVirt's virt-handler, `pkg/virt-handler/vm.go`, where it computes the phase):
 *
 * | domain                              | reason                        | VMI phase |
 * |-------------------------------------|-------------------------------|-----------|
 * | none, VMI Scheduled or Running      | launcher not ready yet        | unchanged, look again soon |
 * | none, VMI Scheduled or Running      | launcher unresponsive         | Failed (WaitingForSync for a migration target) |
 * | none                                | launcher answers              | unchanged |
 * | Running, Blocked, PMSuspended       | any                           | Running |
 * | Paused                              | PostcopyFailed                | Failed |
 * | Paused                              | other                         | Running, with a Paused condition for the reason |
 * | Shutoff or Crashed                  | Crashed, Panicked             | Failed |
 * | Shutoff                             | Destroyed                     | Failed when the guest had an ACPI shutdown to answer (below) or after a failed post-copy migration, else Succeeded |
 * | Shutoff                             | Shutdown, Saved, FromSnapshot | Succeeded |
 * | Shutoff                             | Migrated, Unknown, Failed     | unchanged |
 * | NoState, ShuttingDown, others       |                               | unchanged |
 *
 * A final phase (Succeeded, Failed) never changes again; the caller keeps it.
 *
 * A destroyed domain counts as a failure when the guest had an ACPI shutdown to answer
 * (KubeVirt's `isACPIEnabled`): the VMI's `terminationGracePeriodSeconds` is unset or not
 * 0, and the domain has `<features><acpi/>`. A graceful stop of such a guest ends Shutdown;
 * Destroyed then means it was killed, whoever killed it (the end of a grace period, or
 * `virsh destroy`). Without ACPI a destroy is the only way to stop it, and ends Succeeded.
 *
 * @module
 */

import { ConditionReason, VmiPhase } from "../api/mod.ts";
import { LifeCycle, StateChangeReason } from "./status.ts";
import type { DomainState } from "./status.ts";

/** How the VMI's launcher answers. */
export type LauncherState = "notReady" | "unresponsive" | "responsive";

/** What {@linkcode vmiPhaseFromDomain} decides from. */
export interface PhaseInput {
  /** The domain's status, or undefined/null when the launcher reports no domain. */
  domain?: DomainState | null;
  /** The VMI's current `status.phase`. */
  vmiPhase: VmiPhase;
  /** Whether the launcher is still starting, answers, or stopped answering. */
  launcher: LauncherState;
  /** The VMI is the target of a live migration on this node. */
  isMigrationTarget?: boolean;
  /** The VMI's `spec.terminationGracePeriodSeconds`; undefined or null when unset. */
  terminationGracePeriodSeconds?: number | null;
  /** The domain has `<features><acpi/>`. */
  domainHasAcpi?: boolean;
  /** The VMI's last migration was post-copy and failed (`status.migrationState`). */
  postCopyMigrationFailed?: boolean;
}

/** What {@linkcode acpiShutdownApplies} decides from: a subset of {@linkcode PhaseInput}. */
export type AcpiFacts = Pick<PhaseInput, "terminationGracePeriodSeconds" | "domainHasAcpi">;

/**
 * Whether the guest had an ACPI shutdown to answer before its domain was destroyed
 * (KubeVirt's `isACPIEnabled`): the VMI's grace period is unset (KubeVirt's default of
 * 30 s applies) or not 0, and the domain has ACPI. KubeVirt also names an unset VMI value
 * with a grace period in the domain's metadata; an unset value counts already, so the
 * domain's metadata never changes the answer.
 */
export function acpiShutdownApplies(facts: AcpiFacts): boolean {
  const grace = facts.terminationGracePeriodSeconds;
  const graceful = grace === undefined || grace === null || grace !== 0;
  return graceful && facts.domainHasAcpi === true;
}

/** What {@linkcode vmiPhaseFromDomain} decides. */
export interface PhaseDecision {
  /** The phase the VMI should have. */
  phase: VmiPhase;
  /** Look at the VMI again soon (the launcher is not ready yet). */
  requeue: boolean;
  /** Set when the domain is paused: the domain's pause reason, for the Paused condition. */
  pausedReason?: StateChangeReason;
}

/**
 * The VMI phase implied by the domain's status, one branch per row of the table in
 * this module's doc. `domain` absent means the launcher reports no domain.
 */
export function vmiPhaseFromDomain(input: PhaseInput): PhaseDecision {
  const unchanged = { phase: input.vmiPhase, requeue: false };
  const domain = input.domain;

  if (!domain) {
    const scheduledOrRunning = input.vmiPhase === VmiPhase.Scheduled ||
      input.vmiPhase === VmiPhase.Running;
    if (!scheduledOrRunning) return unchanged;
    if (input.launcher === "notReady") return { phase: input.vmiPhase, requeue: true };
    if (input.launcher === "unresponsive") {
      return {
        phase: input.isMigrationTarget ? VmiPhase.WaitingForSync : VmiPhase.Failed,
        requeue: false,
      };
    }
    return unchanged;
  }

  switch (domain.status) {
    case LifeCycle.Running:
    case LifeCycle.Blocked:
    case LifeCycle.PMSuspended:
      return { phase: VmiPhase.Running, requeue: false };
    case LifeCycle.Paused:
      if (domain.reason === StateChangeReason.PausedPostcopyFailed) {
        return { phase: VmiPhase.Failed, requeue: false };
      }
      return { phase: VmiPhase.Running, requeue: false, pausedReason: domain.reason };
    case LifeCycle.Shutoff:
    case LifeCycle.Crashed:
      return phaseOfStoppedDomain(domain, input);
    default:
      return unchanged;
  }
}

function phaseOfStoppedDomain(domain: DomainState, input: PhaseInput): PhaseDecision {
  const unchanged = { phase: input.vmiPhase, requeue: false };
  switch (domain.reason) {
    case StateChangeReason.Crashed:
    case StateChangeReason.Panicked:
      return { phase: VmiPhase.Failed, requeue: false };
  }
  // The remaining rows name Shutoff only; a Crashed domain with another reason keeps
  // the phase.
  if (domain.status !== LifeCycle.Shutoff) return unchanged;
  switch (domain.reason) {
    case StateChangeReason.Destroyed:
      return {
        phase: acpiShutdownApplies(input) || input.postCopyMigrationFailed
          ? VmiPhase.Failed
          : VmiPhase.Succeeded,
        requeue: false,
      };
    case StateChangeReason.Shutdown:
    case StateChangeReason.Saved:
    case StateChangeReason.FromSnapshot:
      return { phase: VmiPhase.Succeeded, requeue: false };
    default:
      // Migrated, Unknown, Failed: the phase is not known from here.
      return unchanged;
  }
}

/**
 * The reason KubeVirt puts on the VMI's Paused condition for a domain pause reason, or
 * undefined when KubeVirt adds no condition. `Migration` only counts when the VMI is the
 * source of a migration that paused it; the caller decides that.
 */
export function pausedConditionReason(reason: StateChangeReason): ConditionReason | undefined {
  switch (reason) {
    case StateChangeReason.PausedUser:
      return ConditionReason.PausedByUser;
    case StateChangeReason.PausedIOError:
      return ConditionReason.PausedIOError;
    case StateChangeReason.PausedMigration:
      return ConditionReason.PausedByMigrationMonitor;
    default:
      return undefined;
  }
}

/**
 * What one sync of a VMI does, decided before anything is done: a pure function over
 * the VMI as the informer has it, the domain its launcher last reported, and how the
 * launcher answers. The controller reads, decides here, then acts; the decision is
 * what the unit test checks row by row and what the controller logs once per sync.
 *
 * The order follows KubeVirt's virt-handler (`pkg/virt-handler/vm.go`, its sync):
 *
 * | # | when                                                          | action     |
 * |---|---------------------------------------------------------------|------------|
 * | 1 | the VMI is Pending (or has no phase), the handler stands in for virt-controller, not being deleted | `schedule` |
 * | 2 | the VMI is Pending/Scheduling otherwise                       | `none`     |
 * | 3 | the VMI is gone, being deleted or in a final phase, and its domain is alive | `shutdown` |
 * | 4 | the same, the domain exists but is down                       | `delete`   |
 * | 5 | the same, no domain is left, or its launcher does not answer  | `cleanup` (a launcher that answers is asked to delete first, as KubeVirt's handler does) |
 * | 6 | the domain is paused because post-copy migration failed       | `destroy`  |
 * | 7 | the VMI is live and its status already agrees with the domain | `update`   |
 * | 8 | the VMI is live but its phase is about to change              | `none` (the status is written first; the spec is acted on in the next sync) |
 * | 9 | the VMI is live, its domain is down and says nothing of the phase (Shutoff: Failed, Unknown, Migrated) | `none` (a sync would call a launcher that is going with its domain; its exit or the next domain event decides) |
 *
 * A domain whose launcher is unresponsive counts as no domain (KubeVirt: its
 * `domainExists` is false when the launcher is unresponsive). "Alive" means the domain
 * exists and is neither Shutoff nor Crashed.
 *
 * @module
 */
import type { ControllerStandIn } from "./launcher_provider.ts";
import { isFinalPhase, type VirtualMachineInstance, VmiPhase } from "../api/mod.ts";
import {
  type Domain,
  isDomainAlive,
  type LauncherState,
  LifeCycle,
  StateChangeReason,
} from "../domain/mod.ts";
import { nextPhase } from "./status.ts";

/** The actions of one sync, in the order they are considered. */
export const SyncAction = {
  /** Pod-less mode: do virt-controller's scheduling step (Pending -> Scheduled on this node). */
  Schedule: "schedule",
  /** Graceful shutdown: ACPI, repeated, then kill after the grace period. */
  Shutdown: "shutdown",
  /** Kill the domain now (irrecoverable state). */
  Destroy: "destroy",
  /** Undefine the stopped domain. */
  Delete: "delete",
  /** Remove what the node keeps for the VMI: launcher, ghost record, local state. */
  Cleanup: "cleanup",
  /** Bring the domain to the VMI's spec (define and start it, or sync a running one). */
  Update: "update",
  /** Nothing to do; only the status is computed and written. */
  None: "none",
} as const;
/** One of {@linkcode SyncAction}'s values. */
export type SyncAction = typeof SyncAction[keyof typeof SyncAction];

/** What {@linkcode decideSync} decides from. */
export interface SyncInput {
  /** The VMI from the informer's cache, or its last known copy when it is gone. */
  vmi: VirtualMachineInstance;
  /** Whether the informer still has the VMI. */
  vmiExists: boolean;
  /** The domain its launcher last reported, if any. */
  domain: Domain | undefined;
  /** How the VMI's launcher answers. */
  launcher: LauncherState;
  /** virt-controller's part, where the handler plays it (pod-less mode): it schedules Pending VMIs. */
  standIn?: ControllerStandIn;
}

/** The result of {@linkcode decideSync}. */
export interface SyncDecision {
  /** What to do. */
  action: SyncAction;
  /** Why, in a few words, for the log line of this sync. */
  reason: string;
  /** Whether this sync computes and writes the VMI's status (not before it is scheduled). */
  writesStatus: boolean;
  /** The domain is paused by an IO error: the update resumes it (with backoff). */
  resumeAfterIOError?: boolean;
  /** `cleanup`: the launcher answers, so it is told to delete the domain first. */
  deleteFirst?: boolean;
}

function describeDomain(domain: Domain | undefined): string {
  if (!domain) return "no domain";
  const { status, reason } = domain.status;
  return reason ? `domain ${status} (${reason})` : `domain ${status}`;
}

/** Decides what one sync of a VMI does; see the module doc for the table. */
export function decideSync(input: SyncInput): SyncDecision {
  const { vmi, vmiExists, domain, launcher } = input;
  const phase = (vmi.status?.phase ?? VmiPhase.Unset) as VmiPhase;

  if (vmiExists && (phase === VmiPhase.Unset || phase === VmiPhase.Pending)) {
    if (input.standIn && !vmi.metadata.deletionTimestamp) {
      return {
        action: SyncAction.Schedule,
        reason: "VMI is Pending; scheduling it to this node",
        writesStatus: false,
      };
    }
    return { action: SyncAction.None, reason: "VMI is not scheduled yet", writesStatus: false };
  }
  if (vmiExists && phase === VmiPhase.Scheduling) {
    return {
      action: SyncAction.None,
      reason: "VMI is Scheduling; its launcher pod is not ready",
      writesStatus: false,
    };
  }

  const domainExists = domain !== undefined && launcher !== "unresponsive";
  const status = domainExists ? domain.status.status : undefined;
  const domainAlive = domainExists && isDomainAlive(domain);
  const seen = launcher === "unresponsive" && domain
    ? `${describeDomain(domain)}, launcher unresponsive`
    : describeDomain(domain);

  const why = !vmiExists
    ? "VMI is gone"
    : vmi.metadata.deletionTimestamp
    ? "VMI is being deleted"
    : isFinalPhase(phase)
    ? `VMI is ${phase}`
    : undefined;
  if (why) {
    // Shutting down or deleting a domain takes a launcher that answers; one that is gone
    // (its socket removed as it exited) has taken its domain with it, or left it for the
    // cleanup to remove. Calling it would only fail (SyncFailed after every crash).
    const reason = launcher === "responsive" ? `${why}; ${seen}` : `${why}; ${seen}, launcher gone`;
    if (launcher === "responsive" && domainAlive) {
      return { action: SyncAction.Shutdown, reason, writesStatus: true };
    }
    if (launcher === "responsive" && domainExists) {
      return { action: SyncAction.Delete, reason, writesStatus: true };
    }
    return {
      action: SyncAction.Cleanup,
      reason,
      writesStatus: true,
      ...(launcher === "responsive" ? { deleteFirst: true } : {}),
    };
  }

  if (
    domainExists && status === LifeCycle.Paused &&
    domain.status.reason === StateChangeReason.PausedPostcopyFailed
  ) {
    return { action: SyncAction.Destroy, reason: `${seen}: irrecoverable`, writesStatus: true };
  }

  const next = nextPhase(vmi, { domain: domainExists ? domain : undefined, launcher });
  if (next !== phase) {
    return {
      action: SyncAction.None,
      reason: `${seen}; phase ${phase || "<none>"} becomes ${next} first`,
      writesStatus: true,
    };
  }
  if (domainExists && !domainAlive) {
    // Defined and not started yet (the launcher's first report, its start under way):
    // nothing of it belongs in the status, and the Running write that follows the start
    // need not wait for an extra write's watch echo. A start that failed reports a reason.
    const starting = phase === VmiPhase.Scheduled && status === LifeCycle.Shutoff &&
      domain.status.reason === StateChangeReason.Unknown;
    return {
      action: SyncAction.None,
      reason: `VMI is ${phase}; ${seen}: waiting for the launcher's next report`,
      writesStatus: !starting,
    };
  }
  if (
    domainExists && status === LifeCycle.Paused &&
    domain.status.reason === StateChangeReason.PausedIOError
  ) {
    return {
      action: SyncAction.Update,
      reason: `${seen}; resuming it`,
      writesStatus: true,
      resumeAfterIOError: true,
    };
  }
  return { action: SyncAction.Update, reason: `VMI is ${phase}; ${seen}`, writesStatus: true };
}

/**
 * Private to `mod/handler/`: small readings of a VMI that several parts of the handler
 * need the same way.
 *
 * @module
 */
import {
  DEFAULT_GRACE_PERIOD_SECONDS,
  KUBEVIRT_API_VERSION,
  type VirtualMachineInstance,
  VMI_KIND,
  vmiKey,
} from "../api/mod.ts";
import type { Domain } from "../domain/mod.ts";
import type { EventRecorder } from "../kube/mod.ts";
import type { Logger } from "../log/mod.ts";
import { errorText } from "../../ffi/mod.ts";

/** The VMI's termination grace period in seconds (KubeVirt's default when unset). */
export function gracePeriodSeconds(vmi: VirtualMachineInstance): number {
  const g = vmi.spec?.terminationGracePeriodSeconds;
  return typeof g === "number" && g >= 0 ? g : DEFAULT_GRACE_PERIOD_SECONDS;
}

/** The UID of the VMI a domain belongs to (its KubeVirt metadata's, else its own). */
export function domainUid(domain: Domain | undefined): string | undefined {
  return domain?.spec.metadata.kubevirt.uid || domain?.metadata.uid || undefined;
}

/** An error's message, for an Event or a condition. */
export function describe(error: unknown): string {
  return errorText(error);
}

/**
 * Records an Event about the VMI. An Event never fails a sync, but one that is lost is said
 * in the log (a 403 would hide otherwise).
 */
export function recordVmiEvent(
  recorder: EventRecorder,
  log: Logger,
  vmi: VirtualMachineInstance,
  event: { type: "Normal" | "Warning"; reason: string; message: string },
): void {
  const ref = {
    apiVersion: KUBEVIRT_API_VERSION,
    kind: VMI_KIND,
    metadata: { name: vmi.metadata.name, namespace: vmi.metadata.namespace, uid: vmi.metadata.uid },
  };
  recorder.record(ref, event.type, event.reason, event.message).catch((error) =>
    log.warn("Cannot record event {reason}: {error}", {
      key: vmiKey(ref.metadata),
      reason: event.reason,
      error,
    })
  );
}

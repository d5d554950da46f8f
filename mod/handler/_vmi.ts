/**
 * Private to `mod/handler/`: small readings of a VMI that several parts of the handler
 * need the same way.
 *
 * @module
 */
import { DEFAULT_GRACE_PERIOD_SECONDS, type VirtualMachineInstance } from "../api/mod.ts";

/** The VMI's termination grace period in seconds (KubeVirt's default when unset). */
export function gracePeriodSeconds(vmi: VirtualMachineInstance): number {
  const g = vmi.spec?.terminationGracePeriodSeconds;
  return typeof g === "number" && g >= 0 ? g : DEFAULT_GRACE_PERIOD_SECONDS;
}

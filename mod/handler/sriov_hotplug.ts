/**
 * SR-IOV interfaces plugged into a running VMI, as KubeVirt v1.7.0's virt-handler drives it
 * in KubeVirt mode (`hotplugSriovInterfaces`). virt-controller puts a new SR-IOV interface
 * into a migration target's pod (an SR-IOV VF cannot be added to a running pod), and once the
 * VMI runs there, its status has the interface from Multus (`multus-status`) but not from the
 * domain. The handler then raises QEMU's locked-memory limit (the VF pins guest memory) and
 * asks the launcher to plug the pod's host devices (`HotplugHostDevices`), with virt-handler's
 * backoff per VMI: at once, then after 3 s, growing by 1.8 to at most 10 minutes, and never
 * again 5 hours after the first try; it is forgotten once every such interface is plugged.
 *
 * @module
 */
import type { VirtualMachineInstance } from "../api/mod.ts";
import { hasInfoSource, INFO_SOURCE_MULTUS } from "./status.ts";

const FIRST_STEP_MS = 3_000;
const FACTOR = 1.8;
const CAP_MS = 10 * 60_000;
const LIMIT_MS = 5 * 3600_000;

/** virt-handler's limited exponential backoff (KubeVirt's `executor.LimitedBackoff`). */
export class LimitedBackoff {
  readonly #now: () => number;
  readonly #until: number;
  #stepEnd = -Infinity;
  #next = FIRST_STEP_MS;

  /** Starts the backoff now; it allows nothing `limitMs` after. */
  constructor(now: () => number = Date.now, limitMs = LIMIT_MS) {
    this.#now = now;
    this.#until = now() + limitMs;
  }

  /** Whether a try may run now: the last step's wait is over and the limit not reached. */
  ready(): boolean {
    const now = this.#now();
    return now > this.#stepEnd && now < this.#until;
  }

  /** Records a try: the next may run after the current wait, which then grows. */
  step(): void {
    if (!this.ready()) return;
    this.#stepEnd = this.#now() + this.#next;
    this.#next = Math.min(this.#next * FACTOR, CAP_MS);
  }
}

/**
 * Whether the VMI has SR-IOV interfaces Multus reported in its pod that its domain does not
 * have yet: those with `multus-status` outnumber those with both it and `domain`.
 */
export function sriovInterfacesToPlug(vmi: VirtualMachineInstance): boolean {
  const sriov = new Set(
    (vmi.spec.domain.devices.interfaces ?? []).filter((i) => i.sriov != null).map((i) => i.name),
  );
  if (sriov.size === 0) return false;
  const entries = (vmi.status?.interfaces ?? []).filter((s) => s.name && sriov.has(s.name));
  const reported = entries.filter((s) => hasInfoSource(s.infoSource, INFO_SOURCE_MULTUS));
  const attached = reported.filter((s) => hasInfoSource(s.infoSource, "domain"));
  return reported.length !== attached.length;
}

/** The SR-IOV plugs of this node's running VMIs, each VMI with its own backoff. */
export class SriovHotplugs {
  readonly #backoffs = new Map<string, LimitedBackoff>();
  readonly #now: () => number;

  /** `now` is the clock (tests give their own). */
  constructor(now: () => number = Date.now) {
    this.#now = now;
  }

  /**
   * Runs `plug` for a VMI with SR-IOV interfaces to plug when its backoff allows (none
   * left to plug: its backoff is forgotten). Returns whether `plug` ran; rejects with its
   * error.
   */
  async sync(vmi: VirtualMachineInstance, plug: () => Promise<void>): Promise<boolean> {
    const uid = vmi.metadata.uid!;
    if (!sriovInterfacesToPlug(vmi)) {
      this.#backoffs.delete(uid);
      return false;
    }
    let backoff = this.#backoffs.get(uid);
    if (!backoff) this.#backoffs.set(uid, backoff = new LimitedBackoff(this.#now));
    if (!backoff.ready()) return false;
    try {
      await plug();
    } finally {
      backoff.step();
    }
    return true;
  }

  /** Forgets a VMI (its domain is gone from this node). */
  forget(uid: string): void {
    this.#backoffs.delete(uid);
  }
}

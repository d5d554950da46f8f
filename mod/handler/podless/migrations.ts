/**
 * Pod-less mode's stand-in for virt-controller's migration controller
 * (`pkg/virt-controller/watch/migration`): with no virt-controller and no launcher pods, the
 * handler of the node a VMI runs on drives each VirtualMachineInstanceMigration (VMIM) of
 * that VMI through KubeVirt's phases, one step per look, as virt-controller does:
 *
 * | phase           | moves on when                                                     |
 * |-----------------|-------------------------------------------------------------------|
 * | (none)          | no other migration of the VMI runs -> `Pending`                    |
 * | Pending         | the VMI runs, is LiveMigratable and a target node is chosen -> `Scheduling` |
 * | Scheduling      | the target node takes VMIs (`kubevirt.io/schedulable=true`) -> `Scheduled` |
 * | Scheduled       | the VMI names the migration and its target -> `PreparingTarget`     |
 * | PreparingTarget | the target's handler published its address -> `TargetReady`        |
 * | TargetReady     | the source's handler saw the migration start -> `Running`           |
 * | Running         | the target's handler completed it -> `Succeeded`                    |
 *
 * The target node is the node `spec.addedNodeSelector` names by `kubernetes.io/hostname`,
 * else the first (by name) other node that takes VMIs and carries every label of
 * `spec.addedNodeSelector`. The hand-off in `Scheduled` writes the VMI as virt-controller
 * does: a fresh `status.migrationState` (the migration's UID, source and target node, the
 * KubeVirt CR's migration configuration over KubeVirt's defaults) and the
 * `kubevirt.io/migrationTargetNodeName`
 * label, which the target's handler watches. Where virt-controller waits for a target pod,
 * this waits for the target's handler: one that does not publish its address within
 * `kubevirt.io/migrationPendingPodTimeoutSeconds` (900 s) fails the migration on the VMI; a
 * target node that does not take VMIs within `kubevirt.io/migrationUnschedulablePodTimeoutSeconds`
 * (300 s) fails the VMIM. A VMIM deleted while it runs asks the source to abort
 * (`abortRequested`); one deleted before the hand-off just fails.
 *
 * Every failure is the VMIM's phase `Failed` with the reason in an Event and in
 * `status.migrationState.failureReason`; once final, the VMI's migration state is copied
 * into the VMIM and KubeVirt's finalizer comes off.
 *
 * @module
 */
import {
  Finalizers,
  kubeTime,
  KUBEVIRT_API_VERSION,
  Labels,
  MIGRATION_DEFAULTS,
  type MigrationConfiguration,
  type MigrationState,
  type VirtualMachineInstance,
  type VirtualMachineInstanceMigration,
  type VirtualMachineInstanceStatus,
  VMI_RESOURCE,
  vmiKey,
  VMIM_KIND,
  VMIM_RESOURCE,
  type VmimPhase,
  VmimPhases,
} from "../../api/mod.ts";
import {
  type EventRecorder,
  Informer,
  isApiStatus,
  type KubeClient,
  type KubeObject,
  StatusWriter,
  WorkQueue,
} from "../../kube/mod.ts";
import { KUBEVIRT_DEFAULTS, type KubevirtConfig } from "../../config/mod.ts";
import { getLogger } from "../../log/mod.ts";
import type { Runnable } from "../../lifecycle/mod.ts";
import { DONE, type ReconcileResult, requeueAfter, runWorkers } from "../_workers.ts";
import { notMigratable, omitEmptyMigrationState } from "../migration_state.ts";
import { HOSTNAME_LABEL } from "./scheduler.ts";

const log = getLogger("handler", "podless-migrations");

/** KubeVirt's default wait for a target that is placed but not ready (its pending pod timeout). */
export const TARGET_READY_TIMEOUT_S = 900;
/** KubeVirt's default wait for a target node to take the VMI (its unschedulable pod timeout). */
export const TARGET_SCHEDULABLE_TIMEOUT_S = 300;
/** Annotations that change those waits on a VMIM, as KubeVirt reads them. */
export const MigrationAnnotations = {
  PendingTimeout: "kubevirt.io/migrationPendingPodTimeoutSeconds",
  UnschedulableTimeout: "kubevirt.io/migrationUnschedulablePodTimeoutSeconds",
} as const;
/** How soon a migration waiting for something is looked at again. */
const WAIT_MS = 1_000;

/** The part of a Node this reads. */
interface Node extends KubeObject {
  spec?: { unschedulable?: boolean };
}

/** Options of {@linkcode PodlessMigrations}. */
export interface PodlessMigrationsOptions {
  /** This node's name. */
  nodeName: string;
  /** The apiserver. */
  client: KubeClient;
  /** Records Events. */
  recorder: EventRecorder;
  /** Concurrent syncs. */
  workers?: number;
  /** The cluster's configuration in force (the KubeVirt CR's); KubeVirt's defaults unless told. */
  clusterConfig?: () => KubevirtConfig;
}

function isFinal(phase: VmimPhase | undefined): boolean {
  return phase === VmimPhases.Succeeded || phase === VmimPhases.Failed;
}

/** The phases before the VMI was handed to the target. */
function handedOff(phase: VmimPhase | undefined): boolean {
  return !["", VmimPhases.Pending, VmimPhases.Scheduling, VmimPhases.Scheduled].includes(
    phase ?? "",
  );
}

/** A positive whole number of seconds from an annotation, else `fallback`. */
function timeoutSeconds(vmim: VirtualMachineInstanceMigration, key: string, fallback: number) {
  const value = Number(vmim.metadata.annotations?.[key]);
  return Number.isInteger(value) && value > 0 ? value : fallback;
}

/** When the VMIM entered `phase`, ms since the epoch (now when unknown). */
function enteredAt(vmim: VirtualMachineInstanceMigration, phase: VmimPhase): number {
  const at = vmim.status?.phaseTransitionTimestamps?.findLast((t) => t.phase === phase);
  const ms = at ? Date.parse(at.phaseTransitionTimestamp) : NaN;
  return Number.isFinite(ms) ? ms : Date.now();
}

/** What one look at a VMIM decided. */
type Step =
  | { kind: "phase"; phase: VmimPhase; event?: [string, string]; state?: Partial<MigrationState> }
  | { kind: "fail"; reason: string; failVmi?: boolean }
  | { kind: "wait"; ms: number; why: string }
  /** Ask the source to abort (the VMIM is being deleted while the migration runs). */
  | { kind: "requestAbort" }
  /** Hand the VMI to the target: its migration state names this migration. */
  | { kind: "handOff" }
  | { kind: "done" };

/** Drives this node's VMIs' migrations; see the module doc. */
export class PodlessMigrations implements Runnable {
  /** For logs. */
  readonly name = "podless-migrations";
  readonly #o: PodlessMigrationsOptions;
  readonly #informer: Informer<VirtualMachineInstanceMigration>;
  readonly #queue = new WorkQueue<string>();
  readonly #vmims: StatusWriter<
    NonNullable<VirtualMachineInstanceMigration["status"]>,
    VirtualMachineInstanceMigration
  >;
  readonly #vmis: StatusWriter<VirtualMachineInstanceStatus, VirtualMachineInstance>;
  /** The phase last written for each migration (by UID), until the informer shows it. */
  readonly #written = new Map<string, VmimPhase>();

  /** Creates the controller; nothing runs until {@linkcode run}. */
  constructor(options: PodlessMigrationsOptions) {
    this.#o = options;
    this.#informer = new Informer<VirtualMachineInstanceMigration>(options.client, {
      path: `/apis/kubevirt.io/v1/${VMIM_RESOURCE}`,
      onError: (error) => log.warn("Migration watch interrupted, retrying: {error}", { error }),
    });
    const add = (vmim: VirtualMachineInstanceMigration) => this.#queue.add(vmiKey(vmim.metadata));
    this.#informer.addHandlers({
      onAdd: add,
      onUpdate: (_old, vmim) => add(vmim),
      onDelete: (vmim) => {
        this.#written.delete(vmim.metadata.uid!);
        add(vmim);
      },
    });
    this.#vmims = new StatusWriter(options.client, {
      groupVersionPath: "/apis/kubevirt.io/v1",
      plural: VMIM_RESOURCE,
      statusSubresource: true,
    });
    this.#vmis = new StatusWriter(options.client, {
      groupVersionPath: "/apis/kubevirt.io/v1",
      plural: VMI_RESOURCE,
      normalize: omitEmptyMigrationState,
    });
  }

  /** Wakes the migrations of a VMI whose state changed (its key is `namespace/name`). */
  vmiChanged(vmi: VirtualMachineInstance): void {
    for (const vmim of this.#informer.list()) {
      if (
        vmim.metadata.namespace === vmi.metadata.namespace &&
        vmim.spec.vmiName === vmi.metadata.name && !isFinalDone(vmim)
      ) {
        this.#queue.add(vmiKey(vmim.metadata));
      }
    }
  }

  /** Watches the migrations and works on them until `signal` aborts. */
  async run(signal: AbortSignal): Promise<void> {
    await Promise.all([
      this.#informer.run(signal),
      runWorkers(this.#queue, (key) => this.reconcile(key), {
        workers: this.#o.workers ?? 2,
        log,
        ready: this.#informer.waitForSync(),
      }, signal),
    ]);
  }

  /** One look at a migration. */
  async reconcile(key: string): Promise<ReconcileResult> {
    const vmim = this.#informer.get(key);
    if (!vmim?.spec.vmiName) return DONE;
    // As an expectation: a phase written is acted on once the watch brings it back.
    const written = this.#written.get(vmim.metadata.uid!);
    if (written !== undefined && written !== vmim.status?.phase) return DONE;
    this.#written.delete(vmim.metadata.uid!);
    const vmi = await this.#getVmi(vmim.metadata.namespace!, vmim.spec.vmiName);
    if (!this.#drives(vmim, vmi)) return DONE;
    if (!vmi) {
      // As virt-controller: a migration of a VMI that is gone goes too.
      await this.#vmims.removeFinalizer(vmim, Finalizers.Migration);
      await this.#o.client.request("DELETE", this.#path(vmim), undefined).catch((error) => {
        if (!isApiStatus(error, 404)) throw error;
      });
      return DONE;
    }
    if (isFinal(vmim.status?.phase)) {
      await this.#finish(vmim, vmi);
      return DONE;
    }
    const step = await this.#decide(vmim, vmi);
    return await this.#act(vmim, vmi, step);
  }

  /**
   * Whether this node's handler drives the migration: the node its VMI ran on when the
   * migration began (kept in the VMIM's own status from the first look).
   */
  #drives(vmim: VirtualMachineInstanceMigration, vmi: VirtualMachineInstance | undefined) {
    const source = vmim.status?.migrationState?.sourceNode ??
      (vmi?.status?.migrationState?.migrationUid === vmim.metadata.uid
        ? vmi?.status?.migrationState?.sourceNode
        : vmi?.status?.nodeName);
    return source === this.#o.nodeName;
  }

  /**
   * The next step, failures first (virt-controller's `updateStatus` order). It only reads
   * (the caches, the target node); `#act` writes.
   */
  async #decide(
    vmim: VirtualMachineInstanceMigration,
    vmi: VirtualMachineInstance,
  ): Promise<Step> {
    const phase = vmim.status?.phase ?? "";
    const state = vmi.status?.migrationState;
    const ours = state?.migrationUid === vmim.metadata.uid;
    const vmiPhase = vmi.status?.phase;
    if ((vmiPhase === "Succeeded" || vmiPhase === "Failed") && !(ours && state?.completed)) {
      return { kind: "fail", reason: "Migration failed vmi shutdown during migration." };
    }
    if (vmim.metadata.deletionTimestamp && !handedOff(phase)) {
      return { kind: "fail", reason: "Migration aborted before the target was handed the VMI." };
    }
    if (handedOff(phase) && !ours) {
      return {
        kind: "fail",
        reason: "The VMI's migration state names another migration: this one was superseded.",
      };
    }
    if (ours && state?.failed) {
      return {
        kind: "fail",
        reason: `source node reported migration failed${
          state.failureReason ? `: ${state.failureReason}` : ""
        }`,
      };
    }
    if (vmim.metadata.deletionTimestamp && ours && !state?.abortRequested) {
      if (phase === VmimPhases.Running) return { kind: "requestAbort" };
      return { kind: "wait", ms: WAIT_MS, why: "the abort is on its way to the source" };
    }
    switch (phase) {
      case VmimPhases.Unset: {
        const other = state?.migrationUid && !ours && !state.completed && !state.failed
          ? this.#informer.list().find((m) =>
            m.metadata.uid === state.migrationUid && !isFinal(m.status?.phase)
          )
          : undefined;
        if (other) {
          return {
            kind: "fail",
            reason:
              "VMI is not eligible for migration because another migration job is in progress.",
          };
        }
        return {
          kind: "phase",
          phase: VmimPhases.Pending,
          state: { sourceNode: this.#o.nodeName },
        };
      }
      case VmimPhases.Pending: {
        if (vmiPhase !== "Running") {
          return { kind: "wait", ms: WAIT_MS, why: "the VMI is not Running" };
        }
        const refused = notMigratable(vmi);
        if (refused) return { kind: "fail", reason: refused };
        const busy =
          this.#informer.list().filter((m) =>
            m.metadata.uid !== vmim.metadata.uid && handedOff(m.status?.phase) &&
            !isFinal(m.status?.phase) && m.status?.migrationState?.sourceNode === this.#o.nodeName
          ).length;
        if (busy >= this.#parallelOutbound()) {
          return {
            kind: "wait",
            ms: 5 * WAIT_MS,
            why: "outbound migrations of this node at their limit",
          };
        }
        const target = await this.#chooseTarget(vmim, vmi);
        if ("error" in target) return { kind: "fail", reason: target.error };
        return {
          kind: "phase",
          phase: VmimPhases.Scheduling,
          state: { sourceNode: this.#o.nodeName, targetNode: target.node },
        };
      }
      case VmimPhases.Scheduling: {
        const targetNode = vmim.status?.migrationState?.targetNode ?? "";
        if (await this.#takesVmis(targetNode)) {
          return { kind: "phase", phase: VmimPhases.Scheduled };
        }
        const limit = timeoutSeconds(
          vmim,
          MigrationAnnotations.UnschedulableTimeout,
          TARGET_SCHEDULABLE_TIMEOUT_S,
        );
        if (Date.now() - enteredAt(vmim, VmimPhases.Scheduling) > limit * 1000) {
          return {
            kind: "fail",
            reason: `target node "${targetNode}" did not take VMIs within ${limit}s`,
          };
        }
        return { kind: "wait", ms: WAIT_MS, why: `node "${targetNode}" does not take VMIs yet` };
      }
      case VmimPhases.Scheduled: {
        if (ours && state?.targetNode) return { kind: "phase", phase: VmimPhases.PreparingTarget };
        return { kind: "handOff" };
      }
      case VmimPhases.PreparingTarget: {
        if (state?.targetNodeAddress) return { kind: "phase", phase: VmimPhases.TargetReady };
        const limit = timeoutSeconds(
          vmim,
          MigrationAnnotations.PendingTimeout,
          TARGET_READY_TIMEOUT_S,
        );
        if (Date.now() - enteredAt(vmim, VmimPhases.PreparingTarget) > limit * 1000) {
          return {
            kind: "fail",
            failVmi: true,
            reason: `target node "${state?.targetNode}" did not get ready within ${limit}s`,
          };
        }
        return { kind: "wait", ms: WAIT_MS, why: "the target's handler has not published itself" };
      }
      // The VMI leaves this node's informer once the target takes it over: the migration
      // is looked at again on its own until it ends.
      case VmimPhases.TargetReady:
        return state?.startTimestamp
          ? { kind: "phase", phase: VmimPhases.Running }
          : { kind: "wait", ms: WAIT_MS, why: "the migration has not started" };
      case VmimPhases.Running:
        return state?.completed
          ? {
            kind: "phase",
            phase: VmimPhases.Succeeded,
            event: ["SuccessfulMigration", "Source node reported migration succeeded"],
          }
          : { kind: "wait", ms: WAIT_MS, why: "the migration runs" };
      default:
        return { kind: "done" };
    }
  }

  async #act(
    vmim: VirtualMachineInstanceMigration,
    vmi: VirtualMachineInstance,
    step: Step,
  ): Promise<ReconcileResult> {
    switch (step.kind) {
      case "done":
        return DONE;
      case "wait":
        log.debug("Migration waits: {why}", { key: vmiKey(vmim.metadata), why: step.why });
        return step.ms > 0 ? requeueAfter(step.ms, step.why) : DONE;
      case "requestAbort":
        await this.#writeVmi(vmi, (v) => {
          v.status!.migrationState!.abortRequested = true;
        });
        this.#record(vmim, "Normal", "MigrationAbortRequested", "Migration abort requested.");
        return requeueAfter(WAIT_MS, "the abort is on its way to the source");
      case "handOff":
        // The VMI's write comes back through its watch and wakes this migration.
        await this.#handOff(vmim, vmi);
        return DONE;
      case "phase":
        await this.#setPhase(vmim, step.phase, step.state);
        if (step.event) this.#record(vmim, "Normal", step.event[0], step.event[1]);
        return DONE;
      case "fail": {
        log.warn("Migration failed: {reason}", { key: vmiKey(vmim.metadata), reason: step.reason });
        if (step.failVmi && vmi.status?.migrationState?.migrationUid === vmim.metadata.uid) {
          const now = kubeTime();
          await this.#writeVmi(vmi, (v) => {
            const s = v.status!.migrationState!;
            s.startTimestamp ??= now;
            s.endTimestamp = now;
            s.failed = true;
            s.completed = true;
            s.failureReason = step.reason;
          });
        }
        // The source node too, which a migration failed at its first look has not had yet:
        // a pod-less node may write only the migrations that name it (deploy/podless-node.yaml).
        await this.#setPhase(vmim, VmimPhases.Failed, {
          sourceNode: this.#o.nodeName,
          failed: true,
          failureReason: step.reason,
        });
        this.#record(vmim, "Warning", "FailedMigration", step.reason);
        return DONE;
      }
    }
  }

  /** The target node; an error when there is none to take the VMI. */
  async #chooseTarget(
    vmim: VirtualMachineInstanceMigration,
    vmi: VirtualMachineInstance,
  ): Promise<{ node: string } | { error: string }> {
    const wanted = { ...(vmim.spec.addedNodeSelector ?? {}) };
    // The VMI's own selector names its current node in pod-less mode: only its other
    // labels bind the target.
    for (const [k, v] of Object.entries(vmi.spec.nodeSelector ?? {})) {
      if (k !== HOSTNAME_LABEL && !(k in wanted)) wanted[k] = v;
    }
    const named = wanted[HOSTNAME_LABEL];
    if (named === this.#o.nodeName) {
      return { error: `the target node "${named}" is the node the VMI runs on` };
    }
    // A node named outright is taken as it is (nodes a kubelet did not register may lack the
    // label): whether it takes VMIs is what the next phase waits for.
    if (named) return { node: named };
    const selector = Object.entries({ ...wanted, [Labels.NodeSchedulable]: "true" })
      .map(([k, v]) => `${k}=${v}`).join(",");
    const nodes = await this.#o.client.request<{ items: Node[] }>(
      "GET",
      `/api/v1/nodes?labelSelector=${encodeURIComponent(selector)}`,
      undefined,
    );
    const names = nodes.items.filter((n) => !n.spec?.unschedulable)
      .map((n) => n.metadata?.name ?? "")
      .filter((n) => n && n !== this.#o.nodeName).sort();
    if (names.length === 0) {
      return {
        error: `no other node takes VMIs with the labels ${selector} ` +
          "(pod-less mode: name one with spec.addedNodeSelector kubernetes.io/hostname)",
      };
    }
    return { node: names[0] };
  }

  /** Whether the node exists and takes VMIs (its handler's heartbeat says schedulable). */
  async #takesVmis(node: string): Promise<boolean> {
    try {
      const n = await this.#o.client.request<Node>(
        "GET",
        `/api/v1/nodes/${encodeURIComponent(node)}`,
        undefined,
      );
      return n.metadata?.labels?.[Labels.NodeSchedulable] === "true" && !n.spec?.unschedulable;
    } catch (error) {
      if (isApiStatus(error, 404)) return false;
      throw error;
    }
  }

  /** virt-controller's hand-off: the VMI names the migration and its target. */
  async #handOff(vmim: VirtualMachineInstanceMigration, vmi: VirtualMachineInstance) {
    const targetNode = vmim.status?.migrationState?.targetNode ?? "";
    const migrationConfiguration = this.#clusterConfiguration();
    await this.#writeVmi(vmi, (v) => {
      v.status!.migrationState = {
        migrationUid: vmim.metadata.uid,
        targetNode,
        sourceNode: v.status?.nodeName,
        migrationConfiguration,
      };
      v.metadata.labels = { ...v.metadata.labels, [Labels.MigrationTargetNodeName]: targetNode };
    });
    this.#record(
      vmim,
      "Normal",
      "PreparingTarget",
      `Migration target node "${targetNode}" is handed the VMI`,
    );
    log.info("Migration handed off to its target", {
      key: vmiKey(vmi.metadata),
      migration: vmim.metadata.name,
      target: targetNode,
    });
  }

  /**
   * The cluster's migration configuration: the KubeVirt CR's `spec.configuration.migrations`
   * over KubeVirt's defaults (MigrationPolicies are not read in pod-less mode),
   * `allowWorkloadDisruption` following `allowPostCopy` when unset.
   */
  /** Migrations at once leaving this node: the cluster's `parallelOutboundMigrationsPerNode`. */
  #parallelOutbound(): number {
    const n = Number(this.#clusterConfiguration().parallelOutboundMigrationsPerNode);
    return Number.isInteger(n) && n > 0 ? n : MIGRATION_DEFAULTS.parallelOutboundMigrationsPerNode;
  }

  #clusterConfiguration(): MigrationConfiguration {
    return { ...(this.#o.clusterConfig?.() ?? KUBEVIRT_DEFAULTS).migrations };
  }

  /** Once final: the VMI's migration state into the VMIM, and the finalizer off. */
  async #finish(vmim: VirtualMachineInstanceMigration, vmi: VirtualMachineInstance) {
    const state = vmi.status?.migrationState;
    if (state?.migrationUid === vmim.metadata.uid) {
      await this.#vmims.update(vmim, (s) => {
        s.migrationState = { ...s.migrationState, ...state };
      });
    }
    const fresh = this.#informer.get(vmiKey(vmim.metadata)) ?? vmim;
    await this.#vmims.removeFinalizer(fresh, Finalizers.Migration);
  }

  async #setPhase(
    vmim: VirtualMachineInstanceMigration,
    phase: VmimPhase,
    state?: Partial<MigrationState>,
  ): Promise<void> {
    const now = kubeTime();
    const r = await this.#vmims.update(vmim, (s) => {
      if (s.phase !== phase) {
        s.phase = phase;
        s.phaseTransitionTimestamps = [
          ...(s.phaseTransitionTimestamps ?? []),
          { phase, phaseTransitionTimestamp: now },
        ];
      }
      if (state) s.migrationState = { ...s.migrationState, ...state };
    });
    if (r.written) this.#written.set(vmim.metadata.uid!, phase);
    log.info("Migration {name} is {phase}", {
      namespace: vmim.metadata.namespace,
      name: vmim.metadata.name,
      phase,
    });
  }

  async #getVmi(namespace: string, name: string): Promise<VirtualMachineInstance | undefined> {
    try {
      return await this.#o.client.request<VirtualMachineInstance>(
        "GET",
        `/apis/kubevirt.io/v1/namespaces/${encodeURIComponent(namespace)}/${VMI_RESOURCE}/${
          encodeURIComponent(name)
        }`,
        undefined,
      );
    } catch (error) {
      if (isApiStatus(error, 404)) return undefined;
      throw error;
    }
  }

  async #writeVmi(vmi: VirtualMachineInstance, mutate: (v: VirtualMachineInstance) => void) {
    await this.#vmis.updateObject(vmi, (v) => {
      v.status ??= {};
      mutate(v);
    });
  }

  #path(vmim: VirtualMachineInstanceMigration): string {
    return `/apis/kubevirt.io/v1/namespaces/${
      encodeURIComponent(vmim.metadata.namespace!)
    }/${VMIM_RESOURCE}/${encodeURIComponent(vmim.metadata.name!)}`;
  }

  #record(
    vmim: VirtualMachineInstanceMigration,
    type: "Normal" | "Warning",
    reason: string,
    message: string,
  ) {
    const ref = {
      apiVersion: KUBEVIRT_API_VERSION,
      kind: VMIM_KIND,
      metadata: {
        namespace: vmim.metadata.namespace,
        name: vmim.metadata.name,
        uid: vmim.metadata.uid,
      },
    };
    this.#o.recorder.record(ref, type, reason, message).catch((error) =>
      log.warn("Cannot record event {reason}: {error}", { reason, error })
    );
  }
}

/** A final VMIM whose finalizer is off already: nothing left to do for it. */
function isFinalDone(vmim: VirtualMachineInstanceMigration): boolean {
  return isFinal(vmim.status?.phase) &&
    !(vmim.metadata.finalizers ?? []).includes(Finalizers.Migration);
}

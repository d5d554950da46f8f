/**
 * The migration target controller, as KubeVirt's virt-handler runs it on the node a VMI
 * migrates to (`pkg/virt-handler/migration-target.go`). It watches the VMIs labelled
 * `kubevirt.io/migrationTargetNodeName=<this node>` and, for the migration their status
 * names:
 *
 * 1. readies the target: the launcher (pod-less: served by this node's launcher host;
 *    KubeVirt mode: the target pod virt-controller made), its disks and pod network, then
 *    `SyncMigrationTarget`, then a TLS listener for each of the target launcher's sockets;
 * 2. publishes `status.migrationState.targetNodeAddress` and
 *    `targetDirectMigrationNodePorts`, which the source's handler waits for;
 * 3. follows the domain as it arrives: `targetNodeDomainDetected`, then
 *    `targetNodeDomainReadyTimestamp` once it runs (pod-less: its taps then join the pod's
 *    namespace), then, once the target launcher marks the migration's end, takes the VMI
 *    over (`status.nodeName` and the `kubevirt.io/nodeName` label become this node's);
 * 4. finalizes it: plugs the vCPUs and memory of a live CPU or memory change that
 *    virt-controller migrated the VMI for (`SyncVirtualMachineCPUs`, `SyncVirtualMachineMemory`,
 *    `status.currentCPUTopology`, `status.memory.guestRequested`, the `HotVCPUChange` and
 *    `HotMemoryChange` conditions and the pod-size labels, as virt-handler), then
 *    `FinalizeVirtualMachineMigration` and `completed`; at last it drops the
 *    target label; a failed migration's target is cleaned up instead (launcher, network,
 *    ghost record: the same cleanup as a deleted VMI's).
 *
 * Its queue is its own; domain events of the node wake it as they wake the VMI controller.
 *
 * @module
 */
import {
  ConditionType,
  kubeTime,
  Labels,
  type VirtualMachineInstance,
  type VirtualMachineInstanceStatus,
  vmiKey,
} from "../api/mod.ts";
import { type Domain, isDomainAlive } from "../domain/mod.ts";
import type { EventRecorder, Informer, StatusWriter, WorkQueue } from "../kube/mod.ts";
import { getLogger } from "../log/mod.ts";
import type { MigrationProxyManager } from "../migration/mod.ts";
import { podNetworkPlan, type PodNetworks } from "../network/mod.ts";
import type { LauncherClient, LauncherClients } from "./launcher_clients.ts";
import type { LauncherProvider } from "./launcher_provider.ts";
import {
  domainActiveOnTarget,
  domainPausedFailedPostCopy,
  isMigrating,
  isMigrationTarget,
  migrationNeedsFinalization,
} from "./migration_state.ts";
import { describe, domainUid } from "./_vmi.ts";
import { DONE, KeyedController, type ReconcileResult, requeueAfter, sooner } from "./_workers.ts";
import {
  hostTopology,
  interfaceDomainAttachment,
  type NumaCell,
  topologyJson,
} from "./vm_options.ts";
import {
  cpuHotplugRefusal,
  MEMORY_HOTPLUG_FAILED_REASON,
  MEMORY_OVERHEAD_RATIO_LABEL,
  memoryHotplugRefusal,
  POD_CPU_LIMITS_LABEL,
  POD_MEMORY_REQUESTS_LABEL,
} from "./target_hotplug.ts";
import { removeCondition, setCondition } from "./status.ts";

function hasCondition(vmi: VirtualMachineInstance, type: string): boolean {
  return vmi.status?.conditions?.some((c) => c.type === type) ?? false;
}

/** Drops the condition `type` from the VMI's status (status.ts's rule). */
function dropCondition(vmi: VirtualMachineInstance, type: string): void {
  if (vmi.status?.conditions) vmi.status.conditions = removeCondition(vmi.status.conditions, type);
}

const log = getLogger("handler", "migration-target");

/** How soon a target waiting for its launcher, disks or listeners is looked at again. */
export const TARGET_REQUEUE_MS = 1_000;

/** KubeVirt's Event reasons and messages of a migration. */
export const MigrationEvents = {
  PreparingTarget: "PreparingTarget",
  Migrating: "Migrating",
  Migrated: "Migrated",
  TargetPrepared: "VirtualMachineInstance Migration Target Prepared.",
  MigratingMessage: "VirtualMachineInstance is migrating.",
  AbortingMessage: "VirtualMachineInstance is aborting migration.",
} as const;

/** Everything the target controller works with; built by the handler. */
export interface MigrationTargetDeps {
  /** This node's name. */
  nodeName: string;
  /** The address the source's handler reaches this node's listeners at. */
  migrationAddress: string;
  /** The VMIs labelled as migrating to this node. */
  informer: Informer<VirtualMachineInstance>;
  /** This controller's queue. */
  queue: WorkQueue<string>;
  /** Where launchers come from. */
  provider: LauncherProvider;
  /** The cmd clients of the launchers. */
  launchers: LauncherClients;
  /** The node's domain store (what the launchers last reported), by key. */
  domains: ReadonlyMap<string, Domain>;
  /** Writes VMIs as virt-handler does (an Update of the whole object). */
  statusWriter: StatusWriter<VirtualMachineInstanceStatus, VirtualMachineInstance>;
  /** Records the VMIs' Events. */
  recorder: EventRecorder;
  /** The node's migration proxies. */
  proxy: MigrationProxyManager;
  /** Builds the VMIs' pod networks in their launchers' namespaces. */
  networks: PodNetworks;
  /** Removes what the node keeps for a VMI (the VMI controller's cleanup). */
  cleanup(vmi: VirtualMachineInstance): Promise<void>;
  /** The memory of each network binding plugin (the cluster's configuration); none unless told. */
  bindingMemoryOverheads?: () => Readonly<Record<string, string>>;
  /** Concurrent syncs. */
  workers?: number;
}

/** KubeVirt's MigrationTargetController; see the module doc. */
export class MigrationTargetController extends KeyedController {
  /** For logs. */
  readonly name = "migration-target";
  readonly #d: MigrationTargetDeps;
  /** The migration (UID) each VMI's target was readied for, by VMI UID. */
  readonly #prepared = new Map<string, string>();
  /** VMIs whose domain ran here once (pod-less: its taps joined the pod). */
  readonly #tapsMoved = new Set<string>();
  /** The last copy of VMIs that left the target informer, until looked at. */
  readonly #left = new Map<string, VirtualMachineInstance>();
  /** This host's NUMA topology, read once (for dedicated-CPU migrations). */
  #topology?: NumaCell[];

  /** Creates the controller and subscribes it to its informer. */
  constructor(deps: MigrationTargetDeps) {
    super({
      queue: deps.queue,
      workers: deps.workers ?? 2,
      log,
      recorder: deps.recorder,
      ready: () => deps.informer.waitForSync(),
    });
    this.#d = deps;
    deps.informer.addHandlers({
      onAdd: (vmi) => deps.queue.add(vmiKey(vmi.metadata)),
      onUpdate: (_old, vmi) => deps.queue.add(vmiKey(vmi.metadata)),
      onDelete: (vmi) => {
        const key = vmiKey(vmi.metadata);
        this.#left.set(key, vmi);
        deps.queue.add(key);
      },
    });
  }

  /** Whether the key's VMI is a migration target here (the VMI controller leaves it alone). */
  handles(key: string): boolean {
    const vmi = this.#d.informer.get(key);
    return vmi !== undefined && vmi.metadata.labels?.[Labels.NodeName] !== this.#d.nodeName;
  }

  /** One look at a key (KubeVirt's `execute`). */
  async reconcile(key: string): Promise<ReconcileResult> {
    const vmi = this.#d.informer.get(key);
    if (!vmi) return await this.#leftInformer(key);
    this.#left.delete(key);
    const uid = vmi.metadata.uid!;
    if (
      vmi.metadata.deletionTimestamp || vmi.status?.phase === "Succeeded" ||
      vmi.status?.phase === "Failed"
    ) {
      // virt-controller ends a target pod itself; a pod-less target is ended here.
      if (vmi.status?.nodeName !== this.#d.nodeName) await this.#cleanupTarget(vmi);
      return DONE;
    }
    const domain = this.#d.domains.get(key);
    if (domain && domainUid(domain) && domainUid(domain) !== uid) {
      log.info("Ignoring the domain of an older VMI with this name", { key, uid });
      return DONE;
    }
    const alive = isDomainAlive(domain);
    if (domain && !alive && !domainPausedFailedPostCopy(domain)) return DONE;
    if (!vmi.status?.migrationState || !isMigrationTarget(vmi, this.#d.nodeName)) return DONE;
    return await this.#sync(structuredClone(vmi), domain);
  }

  /** A VMI that left the target informer: its target goes unless the VMI is now this node's. */
  async #leftInformer(key: string): Promise<ReconcileResult> {
    const last = this.#left.get(key);
    this.#left.delete(key);
    if (!last) return DONE;
    const owner = last.metadata.labels?.[Labels.NodeName];
    if (owner === this.#d.nodeName && !last.metadata.deletionTimestamp) return DONE;
    await this.#cleanupTarget(last);
    return DONE;
  }

  async #sync(vmi: VirtualMachineInstance, domain: Domain | undefined): Promise<ReconcileResult> {
    const current = this.#d.informer.get(vmiKey(vmi.metadata))!;
    const state = vmi.status!.migrationState!;
    if (state.endTimestamp && (state.completed || state.failed)) {
      return await this.#finalCleanup(current, vmi, domain);
    }
    log.info("Migration target sync", {
      key: vmiKey(vmi.metadata),
      uid: vmi.metadata.uid,
      phase: vmi.status?.phase,
      domain: domain ? `${domain.status.status} (${domain.status.reason})` : "none",
    });
    let result: ReconcileResult = DONE;
    let syncError: unknown;
    try {
      result = await this.#processVmi(vmi);
    } catch (error) {
      syncError = error;
      this.record(vmi, "Warning", "SyncFailed", describe(error));
    }
    result = sooner(result, await this.#updateStatus(vmi, domain));
    await this.#write(current, vmi);
    if (syncError !== undefined) throw syncError;
    return result;
  }

  /** Readies the target, or finalizes a migration that ended. */
  async #processVmi(vmi: VirtualMachineInstance): Promise<ReconcileResult> {
    const state = vmi.status!.migrationState!;
    if (migrationNeedsFinalization(state)) {
      const client = await this.#client(vmi);
      if (!client) throw new Error("failed to finalize migration: the target launcher is gone");
      await this.#hotplugCpu(vmi, client).catch((error) =>
        this.#hotplugFailed(vmi, error, "failed to change vCPUs")
      );
      await this.#hotplugMemory(vmi, client).catch((error) =>
        this.#hotplugFailed(vmi, error, "failed to update guest memory")
      );
      // The volumes a volume migration moved are moved now.
      dropCondition(vmi, ConditionType.VolumesChange);
      delete vmi.status!.migratedVolumes;
      await client.finalizeVirtualMachineMigration(vmi, { interfaceMigration: {} });
      state.completed = true;
      return DONE;
    }
    if (vmi.status?.phase === "WaitingForSync") state.startTimestamp = undefined;
    if (isMigrating(vmi)) return DONE;
    const uid = vmi.metadata.uid!;
    const migrationUid = state.migrationUid ?? "";
    if (
      this.#prepared.get(uid) === migrationUid &&
      Object.keys(this.#d.proxy.targetListenerPorts(uid)).length > 0
    ) {
      return DONE;
    }
    const notReady = requeueAfter(TARGET_REQUEUE_MS, "the target launcher is not ready");
    const forLauncher = this.#d.provider.forLauncher(vmi);
    const record = (type: "Normal" | "Warning", reason: string, message: string) =>
      this.record(vmi, type, reason, message);
    if ((await this.#d.provider.prepareDisks(forLauncher, record)) === "notReady") {
      return notReady;
    }
    if (podNetworkPlan(vmi).length > 0) {
      const target = await this.#d.provider.podNetwork(vmi);
      if (!target) return notReady;
      await this.#d.networks.setup(vmi, target);
    }
    const client = await this.#client(vmi);
    if (!client) return notReady;
    await client.syncMigrationTarget(forLauncher, {
      interfaceDomainAttachment: interfaceDomainAttachment(vmi),
    });
    const targets = await this.#d.provider.migrationTargets(vmi);
    await this.#d.proxy.startTargetListener(uid, targets);
    this.#prepared.set(uid, migrationUid);
    this.record(vmi, "Normal", MigrationEvents.PreparingTarget, MigrationEvents.TargetPrepared);
    return DONE;
  }

  /**
   * virt-handler's `hotplugCPU`: with `HotVCPUChange` on the VMI, the target launcher plugs
   * the vCPUs the spec's topology counts and the status takes that topology; the condition
   * and the pod's CPU-limit label go whatever happens.
   */
  async #hotplugCpu(vmi: VirtualMachineInstance, client: LauncherClient): Promise<void> {
    try {
      if (!hasCondition(vmi, ConditionType.HotVCPUChange)) return;
      const refusal = cpuHotplugRefusal(vmi);
      if (refusal) throw new Error(refusal);
      await client.syncVirtualMachineCpus(vmi);
      const cpu = vmi.spec.domain.cpu ?? {};
      vmi.status!.currentCPUTopology = {
        ...vmi.status!.currentCPUTopology,
        sockets: cpu.sockets,
        cores: cpu.cores,
        threads: cpu.threads,
      };
      log.info("vCPUs plugged on the migration target", {
        uid: vmi.metadata.uid,
        sockets: cpu.sockets,
        cores: cpu.cores,
        threads: cpu.threads,
      });
    } finally {
      if (vmi.metadata.labels) delete vmi.metadata.labels[POD_CPU_LIMITS_LABEL];
      dropCondition(vmi, ConditionType.HotVCPUChange);
    }
  }

  /**
   * virt-handler's `hotplugMemory`: with `HotMemoryChange` on the VMI, and a target pod
   * whose memory request holds the new size, the target launcher sets the virtio-mem
   * device's requested size and `status.memory.guestRequested` follows; a plug the
   * launcher refuses leaves the condition False (virt-controller then asks for a restart).
   * The pod-size labels go whatever happens.
   */
  async #hotplugMemory(vmi: VirtualMachineInstance, client: LauncherClient): Promise<void> {
    try {
      if (!hasCondition(vmi, ConditionType.HotMemoryChange)) return;
      const refusal = memoryHotplugRefusal(vmi, this.#d.bindingMemoryOverheads?.() ?? {});
      if (refusal) {
        dropCondition(vmi, ConditionType.HotMemoryChange);
        throw new Error(refusal);
      }
      try {
        await client.syncVirtualMachineMemory(vmi);
      } catch (error) {
        vmi.status!.conditions = setCondition(vmi.status!.conditions ?? [], {
          type: ConditionType.HotMemoryChange,
          status: "False",
          reason: MEMORY_HOTPLUG_FAILED_REASON,
          message: "memory hotplug failed, the VM configuration is not supported",
        }, kubeTime());
        throw error;
      }
      dropCondition(vmi, ConditionType.HotMemoryChange);
      vmi.status!.memory = { ...vmi.status!.memory, guestRequested: vmi.spec.domain.memory?.guest };
      log.info("Guest memory plugged on the migration target", {
        uid: vmi.metadata.uid,
        guest: vmi.spec.domain.memory?.guest,
      });
    } finally {
      if (vmi.metadata.labels) {
        delete vmi.metadata.labels[POD_MEMORY_REQUESTS_LABEL];
        delete vmi.metadata.labels[MEMORY_OVERHEAD_RATIO_LABEL];
      }
    }
  }

  /** A failed plug: logged and a Warning Event, as virt-handler (its reason is the error). */
  #hotplugFailed(vmi: VirtualMachineInstance, error: unknown, message: string): void {
    log.error("failed to finalize migration: {error}", {
      uid: vmi.metadata.uid,
      error: describe(error),
    });
    this.record(vmi, "Warning", describe(error), message);
  }

  /** The target launcher's client once it answers; undefined while it is starting. */
  async #client(vmi: VirtualMachineInstance): Promise<LauncherClient | undefined> {
    const uid = vmi.metadata.uid!;
    const started = await this.#d.provider.start(vmi);
    if (!("socket" in started)) return undefined;
    const client = this.#d.launchers.getOrCreate(uid, started.socket);
    return (await this.#d.launchers.isReady(uid)) ? client : undefined;
  }

  /** What the target reports in the VMI's migration state (KubeVirt's `updateStatus`). */
  async #updateStatus(
    vmi: VirtualMachineInstance,
    domain: Domain | undefined,
  ): Promise<ReconcileResult> {
    const status = vmi.status!;
    const state = status.migrationState!;
    if (state.failed) return DONE;
    const now = kubeTime();
    if (domain && !state.targetNodeDomainDetected) {
      log.info("The target node received the migrated domain", { uid: vmi.metadata.uid });
      state.targetNodeDomainDetected = true;
      if (state.targetState) state.targetState.domainDetected = true;
      // So that a device can be plugged into the migrated guest later; a failure is told,
      // not fatal, as in virt-handler (whose Event has the error as its reason).
      try {
        const set = await this.#d.provider.lockQemuMemory?.(vmi);
        if (set) {
          log.info("Locked-memory limit set for the target's QEMU", {
            uid: vmi.metadata.uid,
            ...set,
          });
        }
      } catch (error) {
        this.record(
          vmi,
          "Warning",
          (error as Error).message,
          "Failed to update target node qemu memory limits during live migration",
        );
      }
    }
    if (domainActiveOnTarget(domain)) {
      await this.#moveTaps(vmi);
      if (!state.targetNodeDomainReadyTimestamp) {
        log.info("The target node received the running migrated domain", {
          uid: vmi.metadata.uid,
        });
        state.targetNodeDomainReadyTimestamp = now;
        if (state.targetState) state.targetState.domainReadyTimestamp = now;
        status.conditions = (status.conditions ?? []).filter((c) =>
          c.type !== ConditionType.MigrationRequired
        );
      }
    }
    const ended = domain?.spec.metadata.kubevirt.migration?.endTimestamp;
    if (domain && ended && !state.endTimestamp) this.#ackCompletion(vmi, domain, ended);
    if (isMigrating(vmi)) return DONE;
    const ports = this.#d.proxy.targetListenerPorts(vmi.metadata.uid!);
    if (Object.keys(ports).length === 0) {
      log.info("The target's migration listeners are not up yet, giving it time", {
        uid: vmi.metadata.uid,
      });
      return requeueAfter(TARGET_REQUEUE_MS, "the target's listeners are not up");
    }
    // Dedicated CPUs: the source's launcher pins the migrating domain to the target's CPUs
    // over this host's topology, which the target reports with its address, in the same
    // write (KubeVirt's reportDedicatedCPUSetForMigratingVMI and
    // reportTargetTopologyForMigratingVMI): without them the source is not told to go.
    let dedicatedCpus: number[] | undefined;
    if (vmi.spec.domain.cpu?.dedicatedCpuPlacement === true) {
      dedicatedCpus = await this.#d.provider.dedicatedCpus(vmi);
      if (!dedicatedCpus?.length) {
        return requeueAfter(TARGET_REQUEUE_MS, "the target's dedicated CPUs are not known yet");
      }
    }
    if (state.targetNodeAddress !== this.#d.migrationAddress) {
      this.record(
        vmi,
        "Normal",
        MigrationEvents.PreparingTarget,
        `Migration Target is listening at ${this.#d.migrationAddress}, on ports: ${
          Object.keys(ports).join(",")
        }`,
      );
      state.targetNodeAddress = this.#d.migrationAddress;
      state.targetDirectMigrationNodePorts = ports;
      if (state.targetState) {
        state.targetState.nodeAddress = this.#d.migrationAddress;
        state.targetState.directMigrationNodePorts = ports;
      }
    }
    if (dedicatedCpus) {
      state.targetCPUSet = dedicatedCpus;
      state.targetNodeTopology = topologyJson(this.#topology ??= hostTopology());
    }
    return DONE;
  }

  /** The migration ended here: the VMI becomes this node's (KubeVirt's `ackMigrationCompletion`). */
  #ackCompletion(vmi: VirtualMachineInstance, domain: Domain, ended: string): void {
    const status = vmi.status!;
    const state = status.migrationState!;
    state.startTimestamp ??= domain.spec.metadata.kubevirt.migration?.startTimestamp;
    state.endTimestamp = ended;
    vmi.metadata.labels = { ...vmi.metadata.labels, [Labels.NodeName]: this.#d.nodeName };
    if (vmi.metadata.annotations?.["kubevirt.io/evacuationSource"] !== undefined) {
      delete vmi.metadata.annotations["kubevirt.io/evacuationSource"];
    }
    delete vmi.metadata.labels[Labels.OutdatedLauncherImage];
    status.launcherContainerImageVersion = undefined;
    status.nodeName = this.#d.nodeName;
    (status as { evacuationNodeName?: string }).evacuationNodeName = undefined;
    status.migrationTransport = "Unix";
    this.record(
      vmi,
      "Normal",
      MigrationEvents.Migrated,
      `The VirtualMachineInstance migrated to node ${this.#d.nodeName}.`,
    );
    log.info("The target node detected that the migration has completed", {
      uid: vmi.metadata.uid,
    });
  }

  /** Pod-less: the taps libvirt opened in this node's namespace join the pod's, once. */
  async #moveTaps(vmi: VirtualMachineInstance): Promise<void> {
    const uid = vmi.metadata.uid!;
    if (this.#tapsMoved.has(uid) || podNetworkPlan(vmi).length === 0) return;
    const target = await this.#d.provider.podNetwork(vmi);
    if (target?.hostTap) await this.#d.networks.afterStart(vmi, target);
    this.#tapsMoved.add(uid);
  }

  /**
   * The migration is over (KubeVirt's `finalCleanup`): a failed one's target is cleaned up,
   * a completed one's launcher finalized; either way the target label comes off.
   */
  async #finalCleanup(
    current: VirtualMachineInstance,
    vmi: VirtualMachineInstance,
    domain: Domain | undefined,
  ): Promise<ReconcileResult> {
    const uid = vmi.metadata.uid!;
    const state = vmi.status!.migrationState!;
    if (domainPausedFailedPostCopy(domain) && vmi.status?.phase === "Running") {
      // The domain here is the only record of a failed post-copy until the VMI says so.
      return requeueAfter(TARGET_REQUEUE_MS, "a failed post-copy target waits for the VMI");
    }
    await this.#d.proxy.stopTargetListener(uid);
    if (state.failed) {
      await this.#cleanupTarget(vmi);
      log.info("Cleaned up the target of a failed migration", {
        uid,
        migration: state.migrationUid,
      });
    } else {
      const client = await this.#client(vmi);
      if (client) await client.finalizeVirtualMachineMigration(vmi, { interfaceMigration: {} });
    }
    vmi.metadata.labels = { ...vmi.metadata.labels };
    delete vmi.metadata.labels[Labels.MigrationTargetNodeName];
    if (vmi.metadata.annotations?.["kubevirt.io/create-migration-target"] !== undefined) {
      delete vmi.metadata.annotations["kubevirt.io/create-migration-target"];
    }
    await this.#write(current, vmi);
    this.#prepared.delete(uid);
    this.#tapsMoved.delete(uid);
    return DONE;
  }

  /**
   * Removes the target side of a VMI that does not run here: its launcher is told, then the
   * same cleanup as a deleted VMI's (pod-less: the launcher host forgets it, its namespace
   * and files go).
   */
  async #cleanupTarget(vmi: VirtualMachineInstance): Promise<void> {
    const uid = vmi.metadata.uid!;
    await this.#d.proxy.stopTargetListener(uid);
    const client = this.#d.launchers.get(uid);
    await client?.signalTargetPodCleanup(vmi).catch((error) =>
      log.warn("Failed to signal target pod cleanup: {error}, ignoring", { uid, error })
    );
    await this.#d.cleanup(vmi);
    this.#prepared.delete(uid);
    this.#tapsMoved.delete(uid);
  }

  /** Writes the VMI when its status or labels changed. */
  async #write(current: VirtualMachineInstance, vmi: VirtualMachineInstance): Promise<void> {
    await this.#d.statusWriter.updateObject(current, (o) => {
      o.status = vmi.status;
      o.metadata.labels = vmi.metadata.labels;
      o.metadata.annotations = vmi.metadata.annotations;
    });
  }
}

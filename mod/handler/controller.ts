/**
 * The VMI controller: one queue of `namespace/name` keys fed by the VMI informer and
 * by domain notifications. A worker takes a key and calls {@linkcode VmiController.reconcile},
 * which reads the current VMI and domain from the stores (events are only wake-ups),
 * decides with {@linkcode decideSync}, acts, writes the status, and returns what the
 * worker loop should do with the key: nothing, or look again after a while. A thrown
 * error requeues the key with per-key exponential backoff. Only the worker loop touches
 * the queue; event sources only add keys to it.
 *
 * Every failure of a sync becomes a `Synchronized=False` condition and a `SyncFailed`
 * Warning event before the error reaches the worker loop.
 *
 * @module
 */
import type { VirtualMachineOptions } from "../proto/mod.ts";
import {
  Finalizers,
  isFinalPhase,
  kubeTime,
  Labels,
  splitVmiKey,
  type VirtualMachineInstance,
  type VirtualMachineInstanceStatus,
  vmiKey,
  VmiPhase,
} from "../api/mod.ts";
import {
  type Domain,
  isDomainAlive,
  type LauncherState,
  LifeCycle,
  StateChangeReason,
} from "../domain/mod.ts";
import type {
  EventRecorder,
  Expectations,
  Informer,
  QueueStats,
  StatusWriter,
  WorkQueue,
} from "../kube/mod.ts";
import { isHotplugVolume } from "../storage/mod.ts";
import { KUBEVIRT_DEFAULTS, type KubevirtConfig } from "../config/mod.ts";
import { type AgentInfo, type AgentSupport, guestAgentSupport } from "./guest_agent_support.ts";
import { getLogger } from "../log/mod.ts";
import { decideSync, type SyncDecision } from "./decide.ts";
import type { GhostRecordStore } from "./ghost_records.ts";
import {
  LauncherCallError,
  type LauncherClient,
  type LauncherClients,
} from "./launcher_clients.ts";
import type {
  ControllerStandIn,
  LauncherHousekeeping,
  LauncherLocator,
  LauncherPodNetwork,
  LauncherVolumes,
} from "./launcher_provider.ts";
import { type HostCpuSource, usesHostModel } from "./migratable.ts";
import { podNetworkPlan, type PodNetworks, type PodNetworkTarget } from "../network/mod.ts";
import { FailRetryManager } from "./retry_manager.ts";
import { SriovHotplugs } from "./sriov_hotplug.ts";
import { interfacesToPlug, interfacesToUnplug } from "./nic_hotplug.ts";
import { launcherSelinuxContext, selinuxEnabled } from "../host/mod.ts";
import {
  computeStatus,
  EventReason,
  guestAgentConnected,
  type Hotplugged,
  hotplugWanted,
  memoryDumpPath,
  phaseChangeEvent,
  type StatusEvent,
  type StatusInput,
  volumePhaseEvents,
} from "./status.ts";
import { describe, domainUid, gracePeriodSeconds } from "./_vmi.ts";
import { domainMigrated, isMigrationInProgress } from "./migration_state.ts";
import { hostTopology, type NumaCell, virtualMachineOptions } from "./vm_options.ts";
import {
  DONE,
  KeyedController,
  type ReconcileResult,
  requeueAfter,
  sooner,
  type SyncCounts,
} from "./_workers.ts";

export { DONE, type ReconcileResult, requeueAfter, sooner };

const log = getLogger("handler", "controller");

/** How soon a VMI is looked at again when its launcher went away during its shutdown, ms. */
const LAUNCHER_GONE_REQUEUE_MS = 1_000;
/** How long a launcher pod may live without its socket before it counts as gone (KubeVirt's). */
const SOCKETLESS_LAUNCHER_MS = 3 * 60_000;

/** ACPI shutdown is sent again this often while the grace period runs (as KubeVirt does). */
export const ACPI_RESEND_MS = 5_000;
/** A key taken before the informer has listed is looked at again after this long. */
export const CACHE_NOT_SYNCED_REQUEUE_MS = 200;
/** After cleaning up an older VMI's domain under the same name, the new VMI waits this long. */
export const OLDER_DOMAIN_REQUEUE_MS = 1_000;
/** Concurrent syncs unless told (KubeVirt's handler threadiness). */
export const DEFAULT_WORKERS = 8;
/**
 * How long the first syncs wait for the labeller's first read of the host's CPU model.
 * virt-handler reads it before its VMI controller exists; the bound keeps VMs starting where
 * the labeller cannot read it (no libvirt yet), their migration conditions then deferred.
 */
export const HOST_CPU_WAIT_MS = 30_000;

/** Everything the controller works with; built by the handler. */
export interface ControllerDeps {
  /** This node's name. */
  nodeName: string;
  /** Where launchers come from (pod-less or launcher pods): the parts a sync uses. */
  provider: LauncherLocator & LauncherVolumes & LauncherHousekeeping & LauncherPodNetwork;
  /** virt-controller's part, where the handler plays it (pod-less mode only). */
  standIn?: ControllerStandIn;
  /** The VMIs of this node. */
  informer: Informer<VirtualMachineInstance>;
  /** The one queue of `namespace/name` keys. */
  queue: WorkQueue<string>;
  /** Writes the controller waits to see in its informer. */
  expectations: Expectations;
  /** Writes VMI status the way virt-handler does. */
  statusWriter: StatusWriter<VirtualMachineInstanceStatus, VirtualMachineInstance>;
  /** Records the VMIs' Events. */
  recorder: EventRecorder;
  /** The handler's memory across restarts. */
  ghosts: GhostRecordStore;
  /** The cmd clients of the launchers. */
  launchers: LauncherClients;
  /** Builds the VMIs' pod networks in their launchers' namespaces. */
  networks: PodNetworks;
  /** Concurrent syncs; {@linkcode DEFAULT_WORKERS} unless told. */
  workers?: number;
  /** Told once the workers run (the informer has listed). */
  onStarted?: () => void;
  /**
   * This node's host-model CPU as the labeller finds it; without one a host-model VMI is
   * not LiveMigratable, as KubeVirt's handler decides. Until the labeller has read it, a
   * host-model VMI's migration conditions are left as they are; once it has (and whenever
   * it changes), those VMIs are synced again. No source: the node has no host model.
   */
  hostCpu?: HostCpuSource;
  /** {@linkcode HOST_CPU_WAIT_MS} unless told (tests). */
  hostCpuWaitMs?: number;
  /** The clock of the SR-IOV plugs' backoff (tests give their own). */
  sriovClock?: () => number;
  /**
   * Whether another controller handles the key's VMI on this node (a migration's target
   * here: the VMI is another node's until the migration ends).
   */
  handledElsewhere?: (key: string) => boolean;
  /**
   * Stops a VMI's migration proxy listeners, source and target, when its local state goes
   * (KubeVirt's cleanup does this first); none when this node takes no part in migrations.
   */
  stopMigrationProxies?: (uid: string) => Promise<void>;
  /** The cluster's configuration in force (the KubeVirt CR's); KubeVirt's defaults unless told. */
  clusterConfig?: () => KubevirtConfig;
  /** Resolves once the cluster's configuration has been read (the KubeVirt CR listed). */
  configReady?: () => Promise<void>;
}

interface ShutdownState {
  startedMs: number;
  lastAcpiMs: number;
  graceSeconds: number;
}

function isPausedBy(domain: Domain | undefined, reason: StateChangeReason): boolean {
  return domain?.status.status === LifeCycle.Paused && domain.status.reason === reason;
}

/**
 * Resolves once `source` knows the host's CPU model (at once without a source, or when it
 * knows already), or after `ms` whatever it knows.
 */
function hostCpuKnown(source: HostCpuSource | undefined, ms: number): Promise<void> {
  if (!source || source.hostCpuModel !== undefined) return Promise.resolve();
  return new Promise((resolve) => {
    let off = () => {};
    const timer = setTimeout(() => done(), ms);
    const done = () => {
      clearTimeout(timer);
      off();
      resolve();
    };
    off = source.onHostCpuModel(() => {
      if (source.hostCpuModel !== undefined) done();
    });
  });
}

/** The VirtualMachineController of KubeVirt's virt-handler. */
export class VmiController extends KeyedController {
  /** For logs and errors. */
  readonly name = "vmi-controller";
  readonly #d: ControllerDeps;
  readonly #domains = new Map<string, Domain>();
  /** Last seen copy of VMIs the informer deleted, until cleanup is done. */
  readonly #deleted = new Map<string, VirtualMachineInstance>();
  /** KubeVirt mode: since when each launcher (by VMI UID) has been seen without its socket. */
  readonly #socketless = new Map<string, number>();
  readonly #shutdowns = new Map<string, ShutdownState>();
  /** The host's NUMA cells for the launchers' options, read once. */
  #topology?: NumaCell[];
  /** The spec (as JSON) last handed to SyncVirtualMachine, per UID. */
  readonly #synced = new Map<string, string>();
  /** What pod-less mode plugged into each running guest in place, by VMI UID. */
  readonly #plugged = new Map<string, Hotplugged>();
  readonly #ioRetry = new FailRetryManager();
  /** The SR-IOV plugs of running VMIs, each with virt-handler's backoff (KubeVirt mode). */
  readonly #sriov: SriovHotplugs;
  /** VMIs whose domain left this node by migration and was cleaned up here, by key. */
  readonly #migratedAway = new Map<string, string>();

  /** Creates the controller and subscribes it to the informer; nothing runs until {@linkcode run}. */
  constructor(deps: ControllerDeps) {
    const syncs = { success: 0, error: 0 };
    super({
      queue: deps.queue,
      workers: deps.workers ?? DEFAULT_WORKERS,
      log,
      recorder: deps.recorder,
      counts: syncs,
      // Before the informer has listed, a VMI missing from the cache would look deleted and
      // its running VM would be shut down; and, as virt-handler, no VMI is synced before the
      // cluster's configuration and the host's CPU model are read (a host-model VMI's first
      // Running status then already says whether it can migrate).
      ready: () =>
        Promise.all([
          deps.informer.waitForSync(),
          deps.configReady?.(),
          hostCpuKnown(deps.hostCpu, deps.hostCpuWaitMs ?? HOST_CPU_WAIT_MS),
        ]),
      onStarted: deps.onStarted,
    });
    this.syncs = syncs;
    this.#d = deps;
    this.#sriov = new SriovHotplugs(deps.sriovClock);
    deps.informer.addHandlers({
      onAdd: (vmi) => this.#vmiEvent(vmi),
      onUpdate: (_old, vmi) => this.#vmiEvent(vmi),
      onDelete: (vmi) => {
        const key = vmiKey(vmi.metadata);
        this.#deleted.set(key, vmi);
        // No write of ours can be observed for a deleted VMI: forget what we waited for.
        this.#d.expectations.delete(key);
        this.#d.queue.add(key);
      },
    });
    deps.hostCpu?.onHostCpuModel(() => this.#hostCpuModelChanged());
  }

  /** The VMIs whose migratability hangs on the host's CPU model are synced again. */
  #hostCpuModelChanged(): void {
    const model = this.#d.hostCpu?.hostCpuModel;
    let woken = 0;
    for (const vmi of this.#d.informer.list()) {
      if (!usesHostModel(vmi)) continue;
      this.#d.queue.add(vmiKey(vmi.metadata));
      woken++;
    }
    log.info("Host CPU model read: {model}; syncing the host-model VMIs again", {
      model: model || "none",
      vmis: woken,
    });
  }

  #vmiEvent(vmi: VirtualMachineInstance): void {
    const key = vmiKey(vmi.metadata);
    this.#d.expectations.setExpectations(key, 0, 0);
    this.#d.queue.add(key);
  }

  /** The domain store: what the launchers last reported. */
  get domains(): ReadonlyMap<string, Domain> {
    return this.#domains;
  }

  /** Domain notifications dropped because they carried no VMI UID. */
  foreignDomains = 0;

  /**
   * Records a domain notification and wakes its key. A domain without a VMI UID is
   * foreign, as KubeVirt's handler counts it: it is dropped (and counted), so it can
   * neither stand for the VMI of its name nor replace that VMI's real domain.
   */
  domainEvent(type: "ADDED" | "MODIFIED" | "DELETED", domain: Domain): void {
    const key = vmiKey(domain.metadata);
    if (!domainUid(domain)) {
      this.foreignDomains++;
      log.warn("Dropped a domain event without a VMI UID", { key, type });
      return;
    }
    // A launcher's last word on its domain is a MODIFIED event with a deletion timestamp
    // (KubeVirt's launcher sends it so; KubeVirt's handler counts it as no domain).
    if (type === "DELETED" || domain.metadata.deletionTimestamp) this.#domains.delete(key);
    else this.#domains.set(key, domain);
    this.#d.queue.add(key);
  }

  /** Forgets the domain of a UID whose launcher stopped answering, and wakes its key. */
  launcherGone(uid: string): void {
    for (const [key, domain] of this.#domains) {
      if (domainUid(domain) === uid) this.#domains.delete(key);
    }
    this.wakeUid(uid);
  }

  /** Wakes the key of a UID's VMI (its launcher became ready, or went away). */
  wakeUid(uid: string): void {
    const rec = this.#d.ghosts.get(uid);
    if (rec) this.#d.queue.add(vmiKey(rec));
  }

  /** Syncs done since start, by outcome (the handler's metrics). */
  readonly syncs: SyncCounts;

  /** The work queue's counters and timings (the handler's metrics). */
  queueStats(): QueueStats {
    return this.#d.queue.stats();
  }

  /**
   * One sync of a key: read the VMI and its domain, decide, act, write the status.
   * Throws (for backoff) when the action failed; the failure is on the VMI by then.
   */
  async reconcile(key: string): Promise<ReconcileResult> {
    if (!this.#d.informer.hasSynced()) {
      return requeueAfter(CACHE_NOT_SYNCED_REQUEUE_MS, "the VMI cache has not listed yet");
    }
    const cached = this.#d.informer.get(key);
    const vmiExists = cached !== undefined;
    // A VMI that left this node by migration and is back as a later migration's target is
    // this node's again; one that is gone is no one's. Either way its mark goes, before any
    // early return can keep it.
    if (!vmiExists || cached.status?.migrationState?.targetNode === this.#d.nodeName) {
      this.#migratedAway.delete(key);
    }
    if (!vmiExists && this.#d.handledElsewhere?.(key)) return DONE;
    if (vmiExists && !this.#d.expectations.satisfied(key)) return DONE;
    if (vmiExists) this.#deleted.delete(key);
    const domain = this.#domains.get(key);
    const vmi = cached ? structuredClone(cached) : this.#lastKnown(key, domain);
    if (!vmi) {
      // Nothing of this VMI is left on the node: a domain under its name is forgotten too.
      this.#domains.delete(key);
      return DONE;
    }
    const migration = await this.#migrationStep(key, vmi, vmiExists, domain);
    if (migration) return migration;

    if (vmiExists) {
      // Leftovers of an older VMI with this name whose domain is gone already: the key
      // belongs to the new VMI now, so nothing else would clean them up.
      for (const rec of this.#d.ghosts.findByKey(key)) {
        if (rec.uid === vmi.metadata.uid || domainUid(domain) === rec.uid) continue;
        log.info("Cleaning up after an older VMI with this name", { key, uid: rec.uid });
        await this.#processVmCleanup(this.#withUid(vmi, rec.uid));
      }
      // A domain of an older VMI with this name: clean it up first.
      const oldUid = domainUid(domain);
      if (domain && oldUid && oldUid !== vmi.metadata.uid) {
        log.info("Domain belongs to an older VMI with this name; cleaning it up first", {
          key,
          uid: oldUid,
        });
        await this.#sync(this.#withUid(vmi, oldUid), false, domain);
        return requeueAfter(OLDER_DOMAIN_REQUEUE_MS, "an older VMI's domain is being removed");
      }
    }
    return await this.#sync(vmi, vmiExists, domain);
  }

  /**
   * What a live migration asks of this controller before a sync (KubeVirt's `execute`):
   * a domain that left by migration is removed with what is left of the VMI here, and a
   * VMI whose migration runs, or whose domain went, is left alone. Undefined: sync.
   */
  async #migrationStep(
    key: string,
    vmi: VirtualMachineInstance,
    vmiExists: boolean,
    domain: Domain | undefined,
  ): Promise<ReconcileResult | undefined> {
    const uid = vmi.metadata.uid!;
    if (domainMigrated(domain) && domainUid(domain) === uid) {
      log.info("The domain migrated away: removing what is left of it here", { key, uid });
      await this.#deleteVm(vmi);
      if (vmiExists) this.#migratedAway.set(key, uid);
      return DONE;
    }
    if (vmiExists && this.#migratedAway.get(key) === uid) return DONE;
    if (vmiExists && !vmi.metadata.deletionTimestamp && isMigrationInProgress(vmi, domain)) {
      log.debug("Migration in progress; leaving the VMI to it", { key, uid });
      return DONE;
    }
    // The VMI moved to another node while its domain here has not said Migrated yet (its
    // event is on the way): nothing is stopped; that event brings the key back.
    const movedTo = this.#deleted.get(key)?.metadata.labels?.[Labels.NodeName];
    if (
      !vmiExists && movedTo && movedTo !== this.#d.nodeName &&
      !this.#deleted.get(key)?.metadata.deletionTimestamp && domain &&
      domainUid(domain) === uid && isDomainAlive(domain)
    ) {
      log.info("The VMI moved to {node}; waiting for its domain here to say Migrated", {
        key,
        uid,
        node: movedTo,
      });
      return DONE;
    }
    return undefined;
  }

  /** Deletes the domain and removes what is left of the VMI here, with no status write. */
  async #deleteVm(vmi: VirtualMachineInstance): Promise<void> {
    if ((await this.#launcherState(vmi)) === "responsive") await this.#processVmDelete(vmi);
    await this.#processVmCleanup(vmi);
  }

  /** Removes what the node keeps for a VMI (a migration's target cleans up with this too). */
  async cleanupLocal(vmi: VirtualMachineInstance): Promise<void> {
    await this.#processVmCleanup(vmi);
  }

  /** The VMI as last seen, for a key the informer no longer has; undefined when nothing is left. */
  #lastKnown(key: string, domain: Domain | undefined): VirtualMachineInstance | undefined {
    const last = this.#deleted.get(key);
    const uid = domainUid(domain) ?? last?.metadata.uid ?? this.#d.ghosts.lastKnownUid(key);
    if (!uid) return undefined;
    const { namespace, name } = splitVmiKey(key);
    const vmi = last ? structuredClone(last) : {
      metadata: { namespace, name, uid },
      spec: { domain: { devices: {} } },
    } as VirtualMachineInstance;
    vmi.metadata.uid = uid;
    return vmi;
  }

  #withUid(vmi: VirtualMachineInstance, uid: string): VirtualMachineInstance {
    return { ...vmi, metadata: { ...vmi.metadata, uid }, status: {} };
  }

  async #launcherState(vmi: VirtualMachineInstance): Promise<LauncherState> {
    const uid = vmi.metadata.uid!;
    if (!this.#d.launchers.get(uid)) {
      const socket = await this.#d.provider.socketOf(vmi);
      if (!socket) return await this.#withoutSocket(vmi);
      this.#socketless.delete(uid);
      this.#d.launchers.getOrCreate(uid, socket);
    }
    return await this.#d.launchers.state(uid);
  }

  /**
   * A launcher that has not made its socket, as virt-handler judges it: unresponsive once
   * its pod is gone from this node (a launcher that crashed at its start), or after 3
   * minutes without a socket; not ready until then.
   */
  async #withoutSocket(vmi: VirtualMachineInstance): Promise<LauncherState> {
    const uid = vmi.metadata.uid!;
    const gone = this.#d.provider.launcherPodGone;
    // Pod-less launchers are the handler's own to start: no pod to look for.
    if (!gone) return "notReady";
    if (vmi.status?.activePods && await gone.call(this.#d.provider, vmi)) {
      this.#socketless.delete(uid);
      return "unresponsive";
    }
    const since = this.#socketless.get(uid) ?? Date.now();
    this.#socketless.set(uid, since);
    if (Date.now() - since > SOCKETLESS_LAUNCHER_MS) {
      this.#socketless.delete(uid);
      return "unresponsive";
    }
    return "notReady";
  }

  /** Read, decide, act, report. */
  async #sync(
    vmi: VirtualMachineInstance,
    vmiExists: boolean,
    domain: Domain | undefined,
  ): Promise<ReconcileResult> {
    const key = vmiKey(vmi.metadata);
    const uid = vmi.metadata.uid!;
    if (!vmiExists) this.#socketless.delete(uid);
    const launcher = await this.#launcherState(vmi);
    const decision = decideSync({
      vmi,
      vmiExists,
      domain,
      launcher,
      standIn: this.#d.standIn,
    });
    const logged = { key, uid, action: decision.action, reason: decision.reason };
    if (decision.action === "none") log.debug("Sync: {action}, {reason}", logged);
    else log.info("Sync: {action}, {reason}", logged);

    if (decision.action === "schedule") {
      // Only a stand-in's sync decides so (virt-controller's scheduling step, this node's).
      const standIn = this.#d.standIn!;
      const now = kubeTime();
      await this.#writeStatus(
        vmi,
        (s) => standIn.scheduledStatus({ ...vmi, status: s }, this.#d.nodeName, now),
      );
      return DONE;
    }
    if (!decision.writesStatus) return DONE;

    const domainSeen = domain !== undefined && launcher !== "unresponsive" ? domain : undefined;
    let result: ReconcileResult = DONE;
    let syncError: unknown;
    try {
      result = await this.#act(decision, vmi, domainSeen);
    } catch (error) {
      syncError = error;
    }

    if (vmiExists) {
      // Pod-less, after a cleanup the launcher is gone for good, not still starting: a VMI
      // it left without a domain (its guest died unseen, e.g. while the handler was down)
      // is Failed, as virt-controller fails a VMI whose pod went, and its finalizer comes
      // off, instead of the VMI waiting for a launcher that never comes.
      const cleanedUp = decision.action === "cleanup" && syncError === undefined &&
        this.#d.standIn !== undefined;
      // virt-controller fails a Scheduled VMI whose pod went without an Event; the
      // handler's "crashed" is for a guest that ran.
      const neverRan = (vmi.status?.phase ?? VmiPhase.Unset) === VmiPhase.Scheduled;
      const podAddresses = await this.#d.networks.addresses(vmi);
      const { requeue, phase } = await this.#updateStatus(vmi, {
        domain: domainSeen,
        launcher: cleanedUp ? "unresponsive" : launcher,
        nodeName: this.#d.nodeName,
        standIn: this.#d.standIn?.facts(vmi, {
          running: guestRuns(domainSeen),
          address: [...podAddresses.values()][0]?.podIP,
        }),
        now: kubeTime(),
        syncError: syncError === undefined ? undefined : describe(syncError),
        podAddresses,
        selinuxContext: domainSeen ? await this.#selinuxContext(vmi) : undefined,
        hotplugMounted: hasHotplugVolumes(vmi)
          ? await this.#d.provider.hotplugMounted(vmi.metadata.uid!)
          : undefined,
        migratable: { hostCpuModel: this.#d.hostCpu ? this.#d.hostCpu.hostCpuModel : "" },
        clusterEvictionStrategy: this.#d.clusterConfig?.().evictionStrategy,
        agentSupport: guestAgentConnected(domainSeen) ? await this.#agentSupport(vmi) : undefined,
        hotplugged: this.#plugged.get(vmi.metadata.uid!),
      }, { phaseEvent: !(cleanedUp && neverRan) });
      result = sooner(result, requeue);
      if (syncError === undefined && domainSeen === undefined) {
        await this.#releaseFinalizer(vmi, phase);
      }
    }
    if (syncError !== undefined) {
      if (vmiExists) this.record(vmi, "Warning", EventReason.SyncFailed, describe(syncError));
      throw syncError;
    }
    return result;
  }

  /**
   * Whether the connected guest agent is supported (guest_agent_support.ts), from the
   * launcher's guest info as virt-handler asks for it at each sync while the agent is
   * connected; undefined when the launcher cannot say now (the condition stays as it is).
   */
  async #agentSupport(vmi: VirtualMachineInstance): Promise<AgentSupport | undefined> {
    const client = this.#d.launchers.get(vmi.metadata.uid!);
    if (!client) return undefined;
    try {
      const info = await client.guestQuery("GetGuestInfo") as AgentInfo;
      return guestAgentSupport(
        vmi,
        info,
        this.#d.clusterConfig?.().supportedGuestAgentVersions ??
          KUBEVIRT_DEFAULTS.supportedGuestAgentVersions,
      );
    } catch (error) {
      log.debug("Cannot read the guest agent's commands: {error}", {
        key: vmiKey(vmi.metadata),
        error,
      });
      return undefined;
    }
  }

  /**
   * `status.selinuxContext`, as KubeVirt's handler writes it once a domain runs (without it
   * virt-controller makes no hotplug attachment pod): `none` without SELinux, else the
   * launcher root's label; undefined when that cannot be read now (the next sync tries).
   */
  async #selinuxContext(vmi: VirtualMachineInstance): Promise<string | undefined> {
    if (!selinuxEnabled()) return "none";
    try {
      return launcherSelinuxContext(await this.#d.provider.launcherRoot(vmi));
    } catch (error) {
      log.warn("Cannot read the launcher's SELinux label: {error}", {
        uid: vmi.metadata.uid,
        error,
      });
      return undefined;
    }
  }

  /** Carries out a decision; returns when to look again. */
  async #act(
    decision: SyncDecision,
    vmi: VirtualMachineInstance,
    domain: Domain | undefined,
  ): Promise<ReconcileResult> {
    // The IO-error backoff learns of every sync: one without the failure counts toward recovery.
    const hold = this.#ioRetry.shouldDelay(
      vmi.metadata.uid!,
      decision.resumeAfterIOError === true,
    );
    switch (decision.action) {
      case "shutdown":
        return await this.#processVmShutdown(vmi);
      case "destroy":
        await this.#processVmDestroy(vmi);
        return DONE;
      case "delete":
        await this.#processVmDelete(vmi);
        return DONE;
      case "cleanup":
        // KubeVirt's handler asks a launcher that answers to delete the domain even when
        // it reports none (one that never started, or another's under the VMI's name).
        if (decision.deleteFirst) {
          // A launcher that went away since it last answered has nothing left to delete:
          // KubeVirt's handler, too, counts a disconnect as done and cleans up.
          await this.#processVmDelete(vmi).catch((error) => {
            if (!isDisconnect(error)) throw error;
            log.debug("Launcher gone before the delete: cleaning up", {
              key: vmiKey(vmi.metadata),
              uid: vmi.metadata.uid,
            });
          });
        }
        await this.#processVmCleanup(vmi);
        return DONE;
      case "update":
        if (hold.delay) return requeueAfter(hold.afterMs, "resume after IO error backs off");
        return await this.#processVmUpdate(vmi, domain);
      default:
        return DONE;
    }
  }

  /**
   * virt-controller's last step, for this node (pod-less mode): once a VMI is final and
   * its domain is gone, the finalizer virt-api put on it comes off, so a deleted VMI
   * goes away.
   */
  async #releaseFinalizer(vmi: VirtualMachineInstance, written?: VmiPhase): Promise<void> {
    if (!this.#d.standIn) return;
    const current = this.#d.informer.get(vmiKey(vmi.metadata));
    if (!current || current.metadata.uid !== vmi.metadata.uid) return;
    // The phase this sync wrote counts before its watch echo brings it to the cache.
    const phase = isFinalPhase(written) ? written : current.status?.phase;
    if (!isFinalPhase(phase)) return;
    if (await this.#d.statusWriter.removeFinalizer(current, Finalizers.VirtualMachineInstance)) {
      log.info("Finalizer {finalizer} removed: the VMI is {phase} and its domain is gone", {
        key: vmiKey(vmi.metadata),
        uid: vmi.metadata.uid,
        finalizer: Finalizers.VirtualMachineInstance,
        phase,
      });
    }
  }

  async #writeStatus(
    vmi: VirtualMachineInstance,
    mutate: (s: VirtualMachineInstanceStatus) => VirtualMachineInstanceStatus | void,
  ): Promise<boolean> {
    const key = vmiKey(vmi.metadata);
    const current = this.#d.informer.get(key);
    if (!current) return false;
    const r = await this.#d.expectations.expectingWrite(
      key,
      () => this.#d.statusWriter.update(current, mutate),
    );
    return r.written;
  }

  /**
   * Writes the computed status; asks to look again while the launcher is not ready. A
   * phase change gets KubeVirt's handler's Event unless `phaseEvent` is false (a write
   * made in virt-controller's stead).
   */
  async #updateStatus(
    vmi: VirtualMachineInstance,
    input: StatusInput,
    options: { phaseEvent: boolean },
  ): Promise<{ requeue: ReconcileResult; phase?: VmiPhase }> {
    let change: ReturnType<typeof computeStatus>["phaseChange"];
    let requeue = false;
    let volumeEvents: ReturnType<typeof volumePhaseEvents> = [];
    let statusEvents: StatusEvent[] = [];
    const written = await this.#writeStatus(vmi, (s) => {
      const r = computeStatus({ ...vmi, status: s }, input);
      change = r.phaseChange;
      requeue = r.requeue;
      volumeEvents = volumePhaseEvents(s?.volumeStatus, r.status.volumeStatus);
      statusEvents = r.events;
      return r.status;
    });
    if (written) {
      for (const ev of volumeEvents) this.record(vmi, "Normal", ev.reason, ev.message);
      for (const ev of statusEvents) this.record(vmi, ev.type, ev.reason, ev.message);
    }
    const key = vmiKey(vmi.metadata);
    if (written) log.debug("Status written", { key, phase: change?.to });
    if (written && change) {
      const ev = options.phaseEvent ? phaseChangeEvent(change) : undefined;
      if (ev) this.record(vmi, ev.type, ev.reason, ev.message);
      log.info("VMI phase changed from {from} to {to}", {
        namespace: vmi.metadata.namespace,
        name: vmi.metadata.name,
        uid: vmi.metadata.uid,
        from: change.from,
        to: change.to,
      });
    }
    return {
      requeue: requeue
        ? requeueAfter(this.#d.provider.notReadyRequeueMs, "the launcher is not ready yet")
        : DONE,
      phase: written ? change?.to : undefined,
    };
  }

  /**
   * The launcher client once its socket answers; otherwise when to look again. With
   * `sync`, the provider may sync the domain as it starts the launcher: `synced` says so.
   */
  async #ensureLauncher(
    vmi: VirtualMachineInstance,
    sync?: { vmi: VirtualMachineInstance; options?: VirtualMachineOptions },
  ): Promise<{ client: LauncherClient; synced?: { error?: string } } | ReconcileResult> {
    const uid = vmi.metadata.uid!;
    const started = await this.#d.provider.start(vmi, sync);
    if ("waiting" in started) return DONE; // the provider wakes the key
    const notReady = requeueAfter(this.#d.provider.notReadyRequeueMs, "launcher not ready");
    if ("absent" in started) return notReady;
    const client = this.#d.launchers.getOrCreate(uid, started.socket);
    if (started.synced) return { client, synced: started.synced };
    return (await this.#d.launchers.isReady(uid)) ? { client } : notReady;
  }

  /**
   * The VMI's pod network, built before its domain is defined (KubeVirt's order:
   * containerDisk, hotplug volumes, network, device ownership, then the sync). Undefined
   * when the VMI has no pod-network interface; `notReady` while its pod cannot be looked
   * into yet.
   */
  async #setupNetwork(
    vmi: VirtualMachineInstance,
  ): Promise<PodNetworkTarget | "notReady" | undefined> {
    if (podNetworkPlan(vmi).length === 0) return undefined;
    const target = await this.#d.provider.podNetwork(vmi);
    if (!target) return "notReady";
    await this.#d.networks.setup(vmi, target);
    return target;
  }

  /**
   * KubeVirt mode, as virt-handler's `setupNetwork` of a running VMI (nic_hotplug.ts): the
   * bindings of interfaces to plug are built in its pod (those built already, as on a
   * migration target, are left as they are), and those of absent interfaces the domain let
   * go of are taken down. A failure is a `NicHotplug` Warning Event and the sync goes on.
   */
  async #liveUpdateNetworks(vmi: VirtualMachineInstance, toPlug: string[]): Promise<void> {
    const gone = interfacesToUnplug(vmi);
    if (toPlug.length === 0 && gone.length === 0) return;
    try {
      const target = await this.#d.provider.podNetwork(vmi);
      if (!target) throw new Error("the VMI's launcher pod cannot be looked into yet");
      if (toPlug.length > 0) await this.#d.networks.setup(vmi, target, new Set(toPlug));
      if (gone.length > 0) await this.#d.networks.unplug(vmi, target, gone);
    } catch (error) {
      this.record(vmi, "Warning", "NicHotplug", describe(error));
      log.warn("Cannot change the networks of the running VMI: {error}", {
        key: vmiKey(vmi.metadata),
        plug: toPlug,
        unplug: gone.map((g) => g.name),
        error,
      });
    }
  }

  /** Pod-less mode, once the domain runs: its taps join the pod's namespace. */
  async #afterStart(vmi: VirtualMachineInstance, target: PodNetworkTarget | undefined) {
    if (target?.hostTap) await this.#d.networks.afterStart(vmi, target);
  }

  /** Brings the domain to the VMI's spec: define and start it, or resume it after an IO error. */
  async #processVmUpdate(
    vmi: VirtualMachineInstance,
    domain: Domain | undefined,
  ): Promise<ReconcileResult> {
    const uid = vmi.metadata.uid!;
    // The spec itself, not metadata.generation: KubeVirt's VMI CRD has no status
    // subresource, so every status write bumps the generation, and a Sync per status write
    // would call a launcher for nothing (and fail while its libvirt restarts).
    const alive = isDomainAlive(domain);
    const notReady = requeueAfter(this.#d.provider.notReadyRequeueMs, "launcher not ready");
    // KubeVirt's order: containerDisks, hotplug volumes, network, then the sync.
    let network: PodNetworkTarget | undefined;
    // Hotplugged volumes count as the spec does: a volume mounted into the launcher (its
    // phase then MountedToPod) is attached by the next sync.
    // KubeVirt mode: an interface Multus put into the pod that the domain lacks is plugged by
    // a sync, as a spec change is (nic_hotplug.ts).
    const toPlug = this.#d.standIn ? [] : interfacesToPlug(vmi);
    const spec = JSON.stringify(vmi.spec) + hotplugPhases(vmi) +
      (toPlug.length > 0 ? `\nplug ${toPlug.join(",")}` : "");
    if (alive) await this.#d.provider.hotplug(vmi);
    const forLauncher = this.#d.provider.forLauncher(vmi);
    if (!alive) {
      const record = (type: "Normal" | "Warning", reason: string, message: string) =>
        this.record(vmi, type, reason, message);
      if ((await this.#d.provider.prepareDisks(forLauncher, record)) === "notReady") {
        return notReady;
      }
      const built = await this.#setupNetwork(vmi);
      if (built === "notReady") return notReady;
      network = built;
    }
    // No domain runs: the provider may define and start it as it starts the launcher.
    this.#topology ??= hostTopology();
    const options = virtualMachineOptions(vmi, this.#topology, this.#d.clusterConfig?.());
    const ensured = await this.#ensureLauncher(vmi, alive ? undefined : { vmi, options });
    if (!("client" in ensured)) return ensured;
    const { client, synced } = ensured;
    if (synced) {
      if (synced.error !== undefined) {
        throw new LauncherCallError("SyncVirtualMachine", synced.error || "no message");
      }
      this.#synced.set(uid, spec);
      await this.#afterStart(vmi, network);
      if (!domain) {
        this.record(vmi, "Normal", EventReason.Created, "VirtualMachineInstance defined.");
      }
      return DONE;
    }
    if (isPausedBy(domain, StateChangeReason.PausedIOError)) {
      await client.unpauseVirtualMachine(vmi);
      this.record(vmi, "Normal", EventReason.Resumed, "VMI resumed after IO error");
      return DONE;
    }
    if (alive && !this.#synced.has(uid)) {
      // Adopted after a restart: the domain runs this spec already; do not disturb it
      // (what its network set-up left undone on the node is finished).
      this.#synced.set(uid, spec);
      if (podNetworkPlan(vmi).length > 0) {
        await this.#afterStart(vmi, await this.#d.provider.adoptedPodNetwork(vmi));
      }
      if (!hotplugUnsettled(vmi) && toPlug.length === 0) return DONE;
      // A volume added or removed while no handler ran is not in the domain yet (or still
      // is): that one change is carried out now.
      this.#synced.set(uid, "");
    }
    // A memory dump volume mounted and marked in progress: the launcher dumps to it
    // (asked on every sync until it is done, as KubeVirt's handler asks; the launcher takes
    // each file name once).
    if (alive) {
      for (const entry of vmi.status?.volumeStatus ?? []) {
        const path = memoryDumpPath(
          entry,
          this.#d.provider.memoryDumpFolder?.(vmi, entry.name),
        );
        if (path) await client.virtualMachineMemoryDump(vmi, path);
      }
    }
    if (alive && !this.#d.standIn) {
      await this.#liveUpdateNetworks(vmi, this.#synced.get(uid) !== spec ? toPlug : []);
    }
    if (alive && this.#d.standIn) await this.#hotplugInPlace(vmi, client);
    if (alive && !this.#d.standIn) await this.#hotplugSriov(vmi, client);
    if (alive && this.#synced.get(uid) === spec) {
      // virt-handler's housekeeping runs after every sync, the spec's unchanged ones too.
      await this.#d.provider.placeThreads?.(vmi);
      return DONE;
    }
    await client.syncVirtualMachine(forLauncher, options);
    await this.#d.provider.placeThreads?.(vmi);
    // The launcher detached what left the spec: its mounts can go.
    if (alive) await this.#d.provider.unplug(vmi);
    await this.#afterStart(vmi, network);
    if (!domain) {
      this.record(vmi, "Normal", EventReason.Created, "VirtualMachineInstance defined.");
    }
    this.#synced.set(uid, spec);
    return DONE;
  }

  /**
   * KubeVirt mode: SR-IOV interfaces Multus put into the running VMI's pod (a migration
   * target's) that its domain lacks are plugged, as virt-handler does (sriov_hotplug.ts):
   * QEMU's locked-memory limit first (a failure is a Warning Event whose reason is the
   * error, as there), then the launcher's `HotplugHostDevices`.
   */
  async #hotplugSriov(vmi: VirtualMachineInstance, client: LauncherClient): Promise<void> {
    const prefix = "failed to hot-plug SR-IOV interfaces";
    await this.#sriov.sync(vmi, async () => {
      try {
        await this.#d.provider.lockQemuMemory?.(vmi);
      } catch (error) {
        const text = describe(error);
        this.record(vmi, "Warning", text, text);
        throw new Error(`${prefix}: ${text}`, { cause: error });
      }
      try {
        await client.hotplugHostDevices(vmi);
      } catch (error) {
        throw new Error(`${prefix}: ${describe(error)}`, { cause: error });
      }
      log.info("SR-IOV interfaces plugged", { key: vmiKey(vmi.metadata), uid: vmi.metadata.uid });
    });
  }

  /**
   * Pod-less mode's part of a live CPU or memory change, played in place: virt-controller
   * changed the VMI's spec (the VM's template changed), and where KubeVirt migrates to a
   * target sized for it and the target's handler plugs it, the launcher plugs it here. The
   * status then shows the topology and the memory asked for; a memory plug that failed is
   * marked (`HotMemoryChange` False) and not tried again for the same size.
   */
  async #hotplugInPlace(vmi: VirtualMachineInstance, client: LauncherClient): Promise<void> {
    const uid = vmi.metadata.uid!;
    const wanted = hotplugWanted(vmi);
    const plugged = this.#plugged.get(uid) ?? {};
    const cpu = vmi.spec.domain.cpu;
    const topology = { sockets: cpu?.sockets, cores: cpu?.cores, threads: cpu?.threads };
    if (wanted.cpu && JSON.stringify(plugged.cpu) !== JSON.stringify(topology)) {
      await client.syncVirtualMachineCpus(vmi);
      this.#plugged.set(uid, { ...this.#plugged.get(uid), cpu: topology });
      log.info("vCPUs plugged in place", { key: vmiKey(vmi.metadata), uid, ...topology });
    }
    const guest = vmi.spec.domain.memory?.guest;
    if (
      wanted.memory && guest !== undefined && plugged.memoryGuest !== guest &&
      plugged.memoryFailed !== guest
    ) {
      try {
        await client.syncVirtualMachineMemory(vmi);
        this.#plugged.set(uid, { ...this.#plugged.get(uid), memoryGuest: guest });
        log.info("Guest memory plugged in place", { key: vmiKey(vmi.metadata), uid, guest });
      } catch (error) {
        this.#plugged.set(uid, { ...this.#plugged.get(uid), memoryFailed: guest });
        this.record(
          vmi,
          "Warning",
          "MemoryHotplugFailed",
          `memory hotplug failed: ${describe(error)}`,
        );
      }
    }
  }

  /** Graceful shutdown: ACPI every {@linkcode ACPI_RESEND_MS} until the grace period ends, then kill. */
  async #processVmShutdown(vmi: VirtualMachineInstance): Promise<ReconcileResult> {
    const key = vmiKey(vmi.metadata);
    const uid = vmi.metadata.uid!;
    const client = this.#d.launchers.get(uid);
    if (!client) throw new Error("no launcher client to shut the domain down with");
    const now = Date.now();
    let st = this.#shutdowns.get(uid);
    if (!st) {
      st = { startedMs: now, lastAcpiMs: 0, graceSeconds: gracePeriodSeconds(vmi) };
      this.#shutdowns.set(uid, st);
    }
    const graceMs = st.graceSeconds * 1000;
    try {
      if (now - st.startedMs >= graceMs) {
        log.info("Grace period expired, killing domain", { key, uid, grace: st.graceSeconds });
        await this.#processVmDestroy(vmi);
        return DONE;
      }
      if (now - st.lastAcpiMs >= ACPI_RESEND_MS) {
        await client.shutdownVirtualMachine(vmi);
        // As KubeVirt's handler: the first request only, so that a long grace period's
        // resends do not spend the Event spam filter's budget before the final Event.
        if (st.lastAcpiMs === 0) {
          this.record(vmi, "Normal", EventReason.ShuttingDown, "Signaled Graceful Shutdown");
        }
        st.lastAcpiMs = now;
        log.debug("Sent ACPI shutdown", {
          key,
          uid,
          elapsedMs: now - st.startedMs,
          grace: st.graceSeconds,
        });
      }
    } catch (error) {
      // A launcher ends once its domain is gone (KubeVirt's does, right after its final
      // event): a refused call then is the shutdown done, which the domain's last event
      // or the unresponsive check confirms.
      if (!isDisconnect(error)) throw error;
      log.info("Launcher gone while shutting its domain down; looking again shortly", {
        key,
        uid,
      });
      return requeueAfter(LAUNCHER_GONE_REQUEUE_MS, "the launcher went away during shutdown");
    }
    const remaining = graceMs - (now - st.startedMs);
    return requeueAfter(
      Math.min(ACPI_RESEND_MS, remaining),
      "graceful shutdown: resend ACPI or kill at the end of the grace period",
    );
  }

  async #processVmDestroy(vmi: VirtualMachineInstance): Promise<void> {
    const client = this.#d.launchers.get(vmi.metadata.uid!);
    if (!client) throw new Error("no launcher client to destroy the domain with");
    // Launcher and handler both end the domain; a launcher that exits during the call
    // has done what was asked (KubeVirt's handler, too, ignores the disconnect).
    await client.killVirtualMachine(vmi).catch(ignoreDisconnect);
    this.record(vmi, "Normal", EventReason.Deleted, "VirtualMachineInstance stopping");
  }

  async #processVmDelete(vmi: VirtualMachineInstance): Promise<void> {
    const client = this.#d.launchers.get(vmi.metadata.uid!);
    if (!client) throw new Error("no launcher client to delete the domain with");
    this.record(vmi, "Normal", EventReason.Deleted, "Signaled Deletion");
    await client.deleteVirtualMachine(vmi).catch(ignoreDisconnect);
  }

  /**
   * Removes what the node keeps for a VMI, in KubeVirt's order: the migration proxy's
   * listeners first, then the launcher, the pod network, the ghost record and local state,
   * the launcher client last.
   */
  async #processVmCleanup(vmi: VirtualMachineInstance): Promise<void> {
    const key = vmiKey(vmi.metadata);
    const uid = vmi.metadata.uid!;
    await this.#d.stopMigrationProxies?.(uid);
    // Close our connection before the launcher's server goes away: Deno 2.9.4+ can crash
    // in a process whose grpc-js client is connected while the peer shuts down.
    this.#d.launchers.remove(uid);
    await this.#d.provider.stop(vmi);
    // After the domain: its taps and DHCP sockets are gone, the namespace can go.
    await this.#d.provider.releasePodNetwork(vmi);
    await this.#d.networks.teardown(uid);
    await this.#d.ghosts.delete(uid);
    this.#shutdowns.delete(uid);
    this.#synced.delete(uid);
    this.#plugged.delete(uid);
    this.#ioRetry.forget(uid);
    this.#sriov.forget(uid);
    this.#deleted.delete(key);
    for (const [k, d] of this.#domains) if (domainUid(d) === uid) this.#domains.delete(k);
    if (!this.#d.informer.get(key)) this.#d.expectations.delete(key);
    this.#d.launchers.remove(uid);
    await this.#d.launchers.forgetMark(uid);
  }
}

/** Whether a launcher call failed because the launcher was gone or went during it. */
function isDisconnect(error: unknown): boolean {
  return error instanceof LauncherCallError && (error.unreachable || error.disconnected);
}

/**
 * Rethrows any failure but a connection that ended during the call (KubeVirt's
 * `IsDisconnected`); a launcher that could not be reached at all is still a failure.
 */
function ignoreDisconnect(error: unknown): void {
  if (!(error instanceof LauncherCallError && error.disconnected)) throw error;
}

/** Whether the VMI has a hotplugged volume, in its status or (not written there yet) its spec. */
function hasHotplugVolumes(vmi: VirtualMachineInstance): boolean {
  return (vmi.status?.volumeStatus ?? []).some((s) => s.hotplugVolume) ||
    (vmi.spec.volumes ?? []).some((v) => isHotplugVolume(vmi, v));
}

/**
 * Whether a hotplugged volume waits for the launcher: one in the spec that is not `Ready`,
 * or one out of the spec whose disk the domain still has (a target in its status).
 */
export function hotplugUnsettled(vmi: VirtualMachineInstance): boolean {
  const inSpec = new Set((vmi.spec.volumes ?? []).map((v) => v.name));
  return (vmi.status?.volumeStatus ?? []).some((s) =>
    s.hotplugVolume !== undefined &&
    (inSpec.has(s.name) ? s.phase !== "Ready" : s.target !== "")
  );
}

/** The phases of the VMI's hotplugged volumes, as text (part of what a sync is for). */
function hotplugPhases(vmi: VirtualMachineInstance): string {
  const phases = (vmi.status?.volumeStatus ?? []).filter((s) => s.hotplugVolume)
    .map((s) => `${s.name}=${s.phase ?? ""}`);
  return phases.length > 0 ? `\n${phases.join(",")}` : "";
}

/**
 * Whether the guest runs, as probes need it: its domain is running (or blocked, or
 * suspended to RAM), not paused, shut off or gone.
 */
function guestRuns(domain: Domain | undefined): boolean {
  const st = domain?.status.status;
  return st === LifeCycle.Running || st === LifeCycle.Blocked || st === LifeCycle.PMSuspended;
}

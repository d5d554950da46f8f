/**
 * The migration source controller, as KubeVirt's virt-handler runs it on the node a VMI
 * migrates from (`pkg/virt-handler/migration-source.go`). For a VMI of this node whose
 * `status.migrationState` names this node as the source, once the target's handler has
 * published its address and ports, it opens the source proxy sockets in the launcher's
 * `migrationproxy/` folder and asks the launcher to migrate (`MigrateVirtualMachine`, with
 * KubeVirt's options from the migration's configuration); an abort asked for on the VMI
 * becomes `CancelVirtualMachineMigration`. It copies what the launcher reports of the
 * migration (start, mode, failure, abort) from the domain's migration metadata into the
 * VMI, and closes the proxy once the migration is over.
 *
 * The VMI controller leaves a VMI alone while its migration runs; once the domain left by
 * migration (Shutoff, reason Migrated) it removes what is left here, and the target's
 * handler takes the VMI over.
 *
 * @module
 */
import {
  kubeTime,
  type VirtualMachineInstance,
  type VirtualMachineInstanceStatus,
  vmiKey,
  VmiPhase,
} from "../api/mod.ts";
import type { KubevirtConfig } from "../config/mod.ts";
import { type Domain, isDomainAlive } from "../domain/mod.ts";
import type {
  EventRecorder,
  Expectations,
  Informer,
  StatusWriter,
  WorkQueue,
} from "../kube/mod.ts";
import { getLogger } from "../log/mod.ts";
import type { MigrationProxyManager } from "../migration/mod.ts";
import type { LauncherClients } from "./launcher_clients.ts";
import type { LauncherProvider } from "./launcher_provider.ts";
import {
  isMigrationDone,
  isMigrationInProgress,
  isMigrationSource,
  migrationOptions,
} from "./migration_state.ts";
import { MigrationEvents } from "./migration_target.ts";
import { describe, domainUid } from "./_vmi.ts";
import { DONE, KeyedController, type ReconcileResult, requeueAfter } from "./_workers.ts";

const log = getLogger("handler", "migration-source");

/** How soon a source waiting for the target's ports or its launcher is looked at again. */
export const SOURCE_REQUEUE_MS = 1_000;
/** How long the target has to take the VMI over after the migration's end (KubeVirt's 60 s). */
export const TARGET_TAKEOVER_TIMEOUT_MS = 60_000;

/** Everything the source controller works with; built by the handler. */
export interface MigrationSourceDeps {
  /** This node's name. */
  nodeName: string;
  /** The VMIs of this node (the VMI controller's informer). */
  informer: Informer<VirtualMachineInstance>;
  /** This controller's queue. */
  queue: WorkQueue<string>;
  /** Writes this controller waits to see in its informer. */
  expectations: Expectations;
  /** Where launchers come from. */
  provider: LauncherProvider;
  /** The cmd clients of the launchers. */
  launchers: LauncherClients;
  /** The node's domain store, by key. */
  domains: ReadonlyMap<string, Domain>;
  /** Writes VMIs as virt-handler does. */
  statusWriter: StatusWriter<VirtualMachineInstanceStatus, VirtualMachineInstance>;
  /** Records the VMIs' Events. */
  recorder: EventRecorder;
  /** The node's migration proxies. */
  proxy: MigrationProxyManager;
  /** The cluster's configuration in force: its migrations, for a VMI without its own. */
  clusterConfig?: () => KubevirtConfig;
  /** Concurrent syncs. */
  workers?: number;
}

/** KubeVirt's MigrationSourceController; see the module doc. */
export class MigrationSourceController extends KeyedController {
  /** For logs. */
  readonly name = "migration-source";
  readonly #d: MigrationSourceDeps;

  /** Creates the controller and subscribes it to the node's VMI informer. */
  constructor(deps: MigrationSourceDeps) {
    super({
      queue: deps.queue,
      workers: deps.workers ?? 2,
      log,
      recorder: deps.recorder,
      ready: () => deps.informer.waitForSync(),
    });
    this.#d = deps;
    const wake = (vmi: VirtualMachineInstance) => {
      const key = vmiKey(vmi.metadata);
      deps.expectations.setExpectations(key, 0, 0);
      deps.queue.add(key);
    };
    deps.informer.addHandlers({
      onAdd: wake,
      onUpdate: (_old, vmi) => wake(vmi),
      onDelete: (vmi) => deps.queue.add(vmiKey(vmi.metadata)),
    });
  }

  /** One look at a key (KubeVirt's `execute`). */
  async reconcile(key: string): Promise<ReconcileResult> {
    const vmi = this.#d.informer.get(key);
    if (!vmi || vmi.metadata.deletionTimestamp) return DONE;
    if (vmi.status?.phase === VmiPhase.Succeeded || vmi.status?.phase === VmiPhase.Failed) {
      return DONE;
    }
    if (!this.#d.expectations.satisfied(key)) return DONE;
    const domain = this.#d.domains.get(key);
    if (domain && domainUid(domain) && domainUid(domain) !== vmi.metadata.uid) return DONE;
    const state = vmi.status?.migrationState;
    if (!state) return DONE;
    if (isMigrationDone(state)) {
      await this.#d.proxy.stopSourceListener(vmi.metadata.uid!);
      return DONE;
    }
    if (!isMigrationSource(vmi, this.#d.nodeName)) return DONE;
    return await this.#sync(vmi, structuredClone(vmi), domain);
  }

  async #sync(
    current: VirtualMachineInstance,
    vmi: VirtualMachineInstance,
    domain: Domain | undefined,
  ): Promise<ReconcileResult> {
    const key = vmiKey(vmi.metadata);
    log.info("Migration source sync", {
      key,
      uid: vmi.metadata.uid,
      phase: vmi.status?.phase,
      domain: domain ? `${domain.status.status} (${domain.status.reason})` : "none",
    });
    let result: ReconcileResult = DONE;
    let syncError: unknown;
    try {
      if (isDomainAlive(domain)) result = await this.#migrate(vmi, domain);
    } catch (error) {
      syncError = error;
      this.record(vmi, "Warning", "SyncFailed", describe(error));
    }
    const handover = this.#updateStatus(vmi, domain);
    if (handover.kind === "requeueAfter" && result.kind === "done") result = handover;
    await this.#d.expectations.expectingWrite(
      key,
      () => this.#d.statusWriter.update(current, () => vmi.status),
    );
    if (syncError !== undefined) throw syncError;
    return result;
  }

  /** Starts the migration, or cancels it when an abort was asked for (KubeVirt's `migrateVMI`). */
  async #migrate(vmi: VirtualMachineInstance, domain: Domain): Promise<ReconcileResult> {
    const uid = vmi.metadata.uid!;
    const state = vmi.status!.migrationState!;
    const socket = await this.#d.provider.socketOf(vmi);
    if (!socket) return requeueAfter(SOURCE_REQUEUE_MS, "the source launcher is not known yet");
    const client = this.#d.launchers.getOrCreate(uid, socket);
    const launcher = await this.#d.launchers.state(uid);
    if (launcher === "notReady") {
      return requeueAfter(SOURCE_REQUEUE_MS, "the source launcher is not ready");
    }
    if (launcher === "unresponsive") {
      throw new Error("Can not update a VirtualMachineInstance with unresponsive command server.");
    }
    if (state.abortRequested) {
      if (state.abortStatus === "Aborting" || state.abortStatus === "Succeeded") return DONE;
      await client.cancelVirtualMachineMigration(vmi);
      this.record(vmi, "Normal", MigrationEvents.Migrating, MigrationEvents.AbortingMessage);
      return DONE;
    }
    if (isMigrationInProgress(vmi, domain)) return DONE;
    if (!state.targetNodeAddress || !state.targetDirectMigrationNodePorts) {
      log.debug("Waiting for the target node to publish its migration ports", { uid });
      return requeueAfter(SOURCE_REQUEUE_MS, "waiting for the target's migration ports");
    }
    const dir = await this.#d.provider.migrationSourceDir(vmi);
    try {
      await this.#d.proxy.startSourceListener(
        uid,
        state.targetNodeAddress,
        state.targetDirectMigrationNodePorts,
        dir.baseDir,
        { socketDir: dir.socketDir, owner: dir.owner, release: dir.release },
      );
    } catch (error) {
      throw new Error(`failed to handle migration proxy: ${describe(error)}`, { cause: error });
    }
    const options = migrationOptions(vmi, this.#d.clusterConfig?.().migrations);
    log.info("Migration options matched", { uid, options: JSON.stringify(options) });
    await client.migrateVirtualMachine(this.#d.provider.forLauncher(vmi), options);
    this.record(vmi, "Normal", MigrationEvents.Migrating, MigrationEvents.MigratingMessage);
    return DONE;
  }

  /**
   * What the launcher reports of the migration goes into the VMI (KubeVirt's
   * `setMigrationProgressStatus`); a migration that ended without the target taking the VMI
   * over fails it.
   */
  #updateStatus(vmi: VirtualMachineInstance, domain: Domain | undefined): ReconcileResult {
    const status = vmi.status!;
    const state = status.migrationState!;
    const meta = domain?.spec.metadata.kubevirt.migration;
    if (meta && meta.uid === state.migrationUid) {
      if (meta.startTimestamp) state.startTimestamp = meta.startTimestamp;
      state.failed = meta.failed === true;
      if (meta.failed) {
        state.endTimestamp = meta.endTimestamp;
        state.failureReason = meta.failureReason;
        this.record(
          vmi,
          "Warning",
          MigrationEvents.Migrated,
          `VirtualMachineInstance migration uid ${meta.uid} failed. reason:${meta.failureReason}`,
        );
      }
      state.abortStatus = meta.abortStatus || undefined;
      if (meta.abortStatus === "Succeeded") state.endTimestamp = meta.endTimestamp;
      state.mode = meta.mode || undefined;
    }
    if (!state.targetNode) {
      status.phase = VmiPhase.Failed;
      state.completed = true;
      state.failed = true;
      state.endTimestamp ??= kubeTime();
      this.record(
        vmi,
        "Warning",
        MigrationEvents.Migrated,
        "The VirtualMachineInstance migrated to unknown host.",
      );
      return DONE;
    }
    if (state.endTimestamp && !state.targetNodeDomainReadyTimestamp && !state.failed) {
      const left = TARGET_TAKEOVER_TIMEOUT_MS - (Date.now() - Date.parse(state.endTimestamp));
      if (left > 0) return requeueAfter(Math.max(left, 5_000), "the target takes the VMI over");
      status.phase = VmiPhase.Failed;
      state.completed = true;
      state.failed = true;
      this.record(
        vmi,
        "Warning",
        MigrationEvents.Migrated,
        "The VirtualMachineInstance's domain was never observed on the target after the " +
          "migration completed within the timeout period.",
      );
    }
    return DONE;
  }
}

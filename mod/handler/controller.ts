/**
 * The VMI controller (seed 3.1): one queue of `namespace/name` keys fed by the
 * VMI informer and by domain notifications; `execute(key)` reads the current VMI
 * and domain from the stores (events are only wake-ups) and `sync()` decides in
 * the seed's order: shutdown, irrecoverable destroy, delete, cleanup, update,
 * nothing. Every failure becomes a `Synchronized=False` condition and a Warning
 * event, and the key is retried with backoff.
 *
 * @module
 */
import {
  DEFAULT_GRACE_PERIOD_SECONDS,
  isFinalPhase,
  Paths,
  type VirtualMachineInstance,
  type VirtualMachineInstanceStatus,
  VmiPhase,
} from "../api/mod.ts";
import { launcherSocketDirOnHost, SocketNames } from "../api/mod.ts";
import { type Domain, type LauncherState, LifeCycle, StateChangeReason } from "../domain/mod.ts";
import type {
  EventRecorder,
  Expectations,
  Informer,
  StatusWriter,
  WorkQueue,
} from "../kube/mod.ts";
import { getLogger } from "../log/mod.ts";
import type { GhostRecordStore } from "./ghost_records.ts";
import type { LauncherClient, LauncherClients } from "./launcher_clients.ts";
import type { LauncherSpawner } from "./launcher_spawner.ts";
import { FailRetryManager } from "./retry_manager.ts";
import { computeStatus, EventReason, phaseChangeEvent } from "./status.ts";

const log = getLogger("handler", "controller");

/** ACPI shutdown is sent again this often while the grace period runs (seed 3.1). */
export const ACPI_RESEND_MS = 5_000;

/** How a VMI's launcher socket is found. */
export type LauncherMode =
  | { kind: "podless"; spawner: LauncherSpawner; socketRoot: string }
  | {
    kind: "kubevirt";
    podsDir: string;
    /**
     * A short directory for links to launcher socket directories whose path is too
     * long for a unix socket address (108 bytes; the kubelet's pod volume paths are
     * longer than that).
     */
    linkDir: string;
  };

/** Longest unix socket path we dial directly (sun_path is 108 bytes with its NUL). */
const MAX_SOCKET_PATH = 100;

/** Everything the controller works with; built by the composition root. */
export interface ControllerDeps {
  nodeName: string;
  mode: LauncherMode;
  informer: Informer<VirtualMachineInstance>;
  queue: WorkQueue<string>;
  expectations: Expectations;
  statusWriter: StatusWriter<VirtualMachineInstanceStatus, VirtualMachineInstance>;
  recorder: EventRecorder;
  ghosts: GhostRecordStore;
  launchers: LauncherClients;
  /** Orphan domain removal after a dead launcher (pod-less: the handler plays the kubelet). */
  reapDomain?: (namespace: string, name: string, uid: string) => Promise<void>;
}

interface ShutdownState {
  startedMs: number;
  lastAcpiMs: number;
  graceSeconds: number;
}

function splitKey(key: string): [string, string] {
  const i = key.indexOf("/");
  return [key.slice(0, i), key.slice(i + 1)];
}

function domainUid(domain: Domain | undefined): string | undefined {
  return domain?.spec.metadata.kubevirt.uid || domain?.metadata.uid || undefined;
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** The VirtualMachineController of the seed. */
export class VmiController {
  readonly #d: ControllerDeps;
  readonly #domains = new Map<string, Domain>();
  /** Last seen copy of VMIs the informer deleted, until cleanup is done. */
  readonly #deleted = new Map<string, VirtualMachineInstance>();
  readonly #shutdowns = new Map<string, ShutdownState>();
  /** Generation last handed to SyncVirtualMachine, per UID. */
  readonly #synced = new Map<string, number>();
  readonly #ioRetry = new FailRetryManager();
  /** Keys waiting for a launcher start slot (pod-less mode). */
  readonly #waitingForSlot = new Set<string>();
  #workers: Promise<void>[] = [];

  constructor(deps: ControllerDeps) {
    this.#d = deps;
    deps.informer.addHandlers({
      onAdd: (vmi) => this.#vmiEvent(vmi),
      onUpdate: (_old, vmi) => this.#vmiEvent(vmi),
      onDelete: (vmi) => {
        const key = this.#key(vmi);
        this.#deleted.set(key, vmi);
        this.#vmiEvent(vmi);
      },
    });
  }

  #key(vmi: VirtualMachineInstance): string {
    return `${vmi.metadata.namespace}/${vmi.metadata.name}`;
  }

  #vmiEvent(vmi: VirtualMachineInstance): void {
    const key = this.#key(vmi);
    this.#d.expectations.setExpectations(key, 0, 0);
    this.#d.queue.add(key);
  }

  /** The domain store: what the launchers last reported. */
  get domains(): ReadonlyMap<string, Domain> {
    return this.#domains;
  }

  /** Records a domain notification and wakes its key. */
  domainEvent(type: "ADDED" | "MODIFIED" | "DELETED", domain: Domain): void {
    const key = `${domain.metadata.namespace}/${domain.metadata.name}`;
    if (type === "DELETED") this.#domains.delete(key);
    else this.#domains.set(key, domain);
    this.#d.queue.add(key);
  }

  /** Forgets the domain of a UID whose launcher stopped answering, and wakes its key. */
  launcherGone(uid: string): void {
    for (const [key, domain] of this.#domains) {
      if (domainUid(domain) === uid) this.#domains.delete(key);
    }
    const rec = this.#d.ghosts.get(uid);
    if (rec) this.#d.queue.add(`${rec.namespace}/${rec.name}`);
  }

  #record(
    vmi: VirtualMachineInstance,
    type: "Normal" | "Warning",
    reason: string,
    message: string,
  ): Promise<unknown> {
    const ref = {
      apiVersion: "kubevirt.io/v1",
      kind: "VirtualMachineInstance",
      metadata: {
        name: vmi.metadata.name,
        namespace: vmi.metadata.namespace,
        uid: vmi.metadata.uid,
      },
    };
    return this.#d.recorder.record(ref, type, reason, message);
  }

  /** Wakes the key of a UID (its launcher just became ready). */
  wake(uid: string): void {
    const rec = this.#d.ghosts.get(uid);
    if (rec) this.#d.queue.add(`${rec.namespace}/${rec.name}`);
  }

  /** Starts `n` workers taking keys from the queue. */
  run(n: number): void {
    for (let i = 0; i < n; i++) this.#workers.push(this.#worker());
  }

  /** Resolves when every worker has stopped (after the queue is shut down). */
  async stopped(): Promise<void> {
    await Promise.all(this.#workers);
  }

  async #worker(): Promise<void> {
    const q = this.#d.queue;
    for (;;) {
      const key = await q.get();
      if (key === undefined) return;
      try {
        await this.execute(key);
        q.forget(key);
      } catch (error) {
        log.error("Sync of {key} failed, retrying with backoff: {error}", { key, error });
        q.addRateLimited(key);
      } finally {
        q.done(key);
      }
    }
  }

  /** Processes one key: reads the stores and syncs (seed 3.1.3). */
  async execute(key: string): Promise<void> {
    log.debug("Sync started", { key });
    if (!this.#d.informer.hasSynced()) {
      // An unsynced cache cannot tell a deleted VMI from one not listed yet.
      this.#d.queue.addAfter(key, 200);
      return;
    }
    const cached = this.#d.informer.get(key);
    const vmiExists = cached !== undefined;
    if (vmiExists && !this.#d.expectations.satisfied(key)) return;
    if (vmiExists) this.#deleted.delete(key);
    const domain = this.#domains.get(key);
    let vmi: VirtualMachineInstance;
    if (cached) {
      vmi = structuredClone(cached);
    } else {
      const [namespace, name] = splitKey(key);
      const last = this.#deleted.get(key);
      const uid = domainUid(domain) ?? last?.metadata.uid ?? this.#d.ghosts.lastKnownUid(key);
      if (!uid) return; // nothing of this VMI is left on the node
      vmi = last ? structuredClone(last) : {
        metadata: { namespace, name, uid },
        spec: { domain: { devices: {} } },
      } as VirtualMachineInstance;
      vmi.metadata.uid = uid;
    }

    // Local leftovers of an older VMI with this name whose domain is gone already:
    // clean them up (the key now belongs to the new VMI, so nothing else would).
    if (vmiExists) {
      for (const rec of this.#d.ghosts.findByKey(key)) {
        if (rec.uid === vmi.metadata.uid || domainUid(domain) === rec.uid) continue;
        log.info("Cleaning up after an older VMI with this name", { key, uid: rec.uid });
        await this.#processVmCleanup({
          ...vmi,
          metadata: { ...vmi.metadata, uid: rec.uid },
          status: {},
        });
      }
    }

    // A domain of an older VMI with the same name: clean it up first (seed 3.1.3).
    const oldUid = domainUid(domain);
    if (vmiExists && domain && oldUid && oldUid !== vmi.metadata.uid) {
      log.info("Domain belongs to an older VMI with this name; cleaning it up first", {
        key,
        uid: oldUid,
      });
      const old = { ...vmi, metadata: { ...vmi.metadata, uid: oldUid }, status: {} };
      await this.#sync(old, false, domain);
      this.#d.queue.addAfter(key, 1_000);
      return;
    }
    await this.#sync(vmi, vmiExists, domain);
  }

  async #launcherState(vmi: VirtualMachineInstance): Promise<LauncherState> {
    const uid = vmi.metadata.uid!;
    if (!this.#d.launchers.get(uid)) {
      const socket = await this.#socketFile(vmi);
      if (!socket) return "notReady";
      this.#d.launchers.getOrCreate(uid, socket);
    }
    return await this.#d.launchers.state(uid);
  }

  async #socketFile(vmi: VirtualMachineInstance): Promise<string | undefined> {
    const uid = vmi.metadata.uid!;
    const ghost = this.#d.ghosts.get(uid);
    if (ghost) return ghost.socketFile;
    const mode = this.#d.mode;
    if (mode.kind === "podless") return undefined; // spawned by processVmUpdate
    for (const [podUid, node] of Object.entries(vmi.status?.activePods ?? {})) {
      if (node !== this.#d.nodeName || !/^[0-9a-zA-Z-]+$/.test(podUid)) continue;
      const dir = launcherSocketDirOnHost(podUid, mode.podsDir);
      try {
        await Deno.lstat(`${dir}/${SocketNames.Launcher}`);
      } catch {
        continue; // not this pod's, or not ready yet
      }
      if (`${dir}/${SocketNames.Launcher}`.length <= MAX_SOCKET_PATH) {
        return `${dir}/${SocketNames.Launcher}`;
      }
      const link = `${mode.linkDir}/${podUid}`;
      await Deno.mkdir(mode.linkDir, { recursive: true, mode: 0o700 });
      try {
        if ((await Deno.readLink(link)) !== dir) {
          await Deno.remove(link);
          await Deno.symlink(dir, link);
        }
      } catch {
        await Deno.symlink(dir, link);
      }
      return `${link}/${SocketNames.Launcher}`;
    }
    return undefined;
  }

  #graceSeconds(vmi: VirtualMachineInstance): number {
    const g = vmi.spec?.terminationGracePeriodSeconds;
    return typeof g === "number" && g >= 0 ? g : DEFAULT_GRACE_PERIOD_SECONDS;
  }

  /** The seed's sync(): decide and act, then report status (seed 3.1.4). */
  async #sync(vmi: VirtualMachineInstance, vmiExists: boolean, domain: Domain | undefined) {
    const key = this.#key(vmi);
    const uid = vmi.metadata.uid!;
    const phase = (vmi.status?.phase ?? VmiPhase.Unset) as VmiPhase;

    if (vmiExists && (phase === VmiPhase.Unset || phase === VmiPhase.Pending)) {
      // Pod-less mode has no virt-controller: do its scheduling step for this node.
      if (this.#d.mode.kind === "podless" && !vmi.metadata.deletionTimestamp) {
        await this.#schedule(vmi);
      }
      return;
    }
    if (vmiExists && phase === VmiPhase.Scheduling) return;

    const launcher = await this.#launcherState(vmi);
    const domainExists = domain !== undefined && launcher !== "unresponsive";
    const status = domain?.status.status;
    const domainAlive = domainExists && status !== LifeCycle.Shutoff &&
      status !== LifeCycle.Crashed && status !== undefined;
    const final = isFinalPhase(phase);
    const deleting = !vmiExists || !!vmi.metadata.deletionTimestamp;
    const forceShutdownIrrecoverable = domainExists && status === LifeCycle.Paused &&
      domain!.status.reason === StateChangeReason.PausedPostcopyFailed;

    let shouldShutdown = false;
    let shouldDelete = false;
    let shouldCleanUp = false;
    let shouldUpdate = false;
    if (deleting || final) {
      if (domainAlive) shouldShutdown = true;
      else if (domainExists) shouldDelete = true;
      else shouldCleanUp = true;
    }
    let computed: ReturnType<typeof computeStatus> | undefined;
    const shutdown = this.#shutdowns.get(uid);
    const statusInput = {
      domain: domainExists ? domain : undefined,
      launcher,
      nodeName: this.#d.nodeName,
      podless: this.#d.mode.kind === "podless",
      gracePeriodApplied: (shutdown?.graceSeconds ?? 0) > 0,
      now: new Date().toISOString(),
    };
    if (vmiExists && !final && !deleting) {
      computed = computeStatus(vmi, statusInput);
      // Only act on the spec once the status agrees with the domain (seed 3.1.4).
      if ((computed.status.phase ?? VmiPhase.Unset) === phase) shouldUpdate = true;
      const ioError = domainExists && status === LifeCycle.Paused &&
        domain!.status.reason === StateChangeReason.PausedIOError;
      const d = this.#ioRetry.shouldDelay(uid, shouldUpdate && ioError);
      if (d.delay) {
        shouldUpdate = false;
        this.#d.queue.addAfter(key, d.afterMs);
      }
    }

    let syncError: unknown;
    try {
      if (shouldShutdown) await this.#processVmShutdown(vmi, vmiExists);
      else if (forceShutdownIrrecoverable) await this.#processVmDestroy(vmi);
      else if (shouldDelete) await this.#processVmDelete(vmi);
      else if (shouldCleanUp) await this.#processVmCleanup(vmi);
      else if (shouldUpdate) await this.#processVmUpdate(vmi, domainExists ? domain : undefined);
    } catch (error) {
      syncError = error;
    }

    if (vmiExists) {
      await this.#updateStatus(vmi, {
        ...statusInput,
        syncError: syncError === undefined ? undefined : describe(syncError),
      });
    }
    if (syncError !== undefined) {
      if (vmiExists) {
        this.#record(vmi, "Warning", EventReason.SyncFailed, describe(syncError))
          .catch(() => {});
      }
      throw syncError;
    }
  }

  async #schedule(vmi: VirtualMachineInstance): Promise<void> {
    const now = new Date().toISOString();
    await this.#writeStatus(vmi, (s) => {
      if (s.phase && s.phase !== VmiPhase.Pending) return;
      s.phase = VmiPhase.Scheduled;
      s.nodeName = this.#d.nodeName;
      s.phaseTransitionTimestamps = [
        ...(s.phaseTransitionTimestamps ?? []),
        { phase: VmiPhase.Scheduled, phaseTransitionTimestamp: now },
      ];
    });
  }

  async #writeStatus(
    vmi: VirtualMachineInstance,
    mutate: (s: VirtualMachineInstanceStatus) => VirtualMachineInstanceStatus | void,
  ): Promise<boolean> {
    const key = this.#key(vmi);
    const current = this.#d.informer.get(key);
    if (!current) return false;
    this.#d.expectations.expectWrites(key);
    try {
      const r = await this.#d.statusWriter.update(current, mutate);
      if (!r.written) this.#d.expectations.writeObserved(key);
      return r.written;
    } catch (error) {
      this.#d.expectations.writeFailed(key);
      throw error;
    }
  }

  async #updateStatus(
    vmi: VirtualMachineInstance,
    input: Parameters<typeof computeStatus>[1],
  ): Promise<void> {
    let change: ReturnType<typeof computeStatus>["phaseChange"];
    let requeue = false;
    const written = await this.#writeStatus(vmi, (s) => {
      const r = computeStatus({ ...vmi, status: s }, input);
      change = r.phaseChange;
      requeue = r.requeue;
      return r.status;
    });
    if (written) log.debug("Status written", { key: this.#key(vmi), phase: change?.to });
    if (requeue) {
      this.#d.queue.addAfter(this.#key(vmi), this.#d.mode.kind === "podless" ? 1_000 : 250);
    }
    if (written && change) {
      const ev = phaseChangeEvent(change);
      if (ev) this.#record(vmi, ev.type, ev.reason, ev.message).catch(() => {});
      log.info("VMI phase changed from {from} to {to}", {
        namespace: vmi.metadata.namespace,
        name: vmi.metadata.name,
        uid: vmi.metadata.uid,
        from: change.from,
        to: change.to,
      });
    }
  }

  /** Ghost record first, then (pod-less) the launcher process; the client once its socket is up. */
  async #ensureLauncher(
    vmi: VirtualMachineInstance,
  ): Promise<LauncherClient | "waiting" | undefined> {
    const uid = vmi.metadata.uid!;
    const mode = this.#d.mode;
    let socket = await this.#socketFile(vmi);
    if (socket && mode.kind === "podless" && !(await mode.spawner.everStarted(uid))) {
      // A ghost record whose launcher was never started: start it now.
      socket = undefined;
    }
    if (!socket && mode.kind === "podless" && !mode.spawner.canStart()) {
      // Too many launchers are starting: wait for a slot rather than polling.
      const key = this.#key(vmi);
      if (!this.#waitingForSlot.has(key)) {
        this.#waitingForSlot.add(key);
        mode.spawner.onSlotFree(() => {
          this.#waitingForSlot.delete(key);
          this.#d.queue.add(key);
        });
      }
      return "waiting";
    }
    if (!socket && mode.kind === "podless") {
      const socketDir = `${mode.socketRoot}/${uid}`;
      socket = `${socketDir}/${SocketNames.Launcher}`;
      await this.#d.ghosts.add({
        name: vmi.metadata.name,
        namespace: vmi.metadata.namespace!,
        socketFile: socket,
        uid,
      });
      await mode.spawner.start({
        namespace: vmi.metadata.namespace!,
        name: vmi.metadata.name,
        uid,
        gracePeriodSeconds: this.#graceSeconds(vmi),
        socketDir,
      });
    }
    if (!socket) return undefined;
    if (!this.#d.ghosts.get(uid)) {
      await this.#d.ghosts.add({
        name: vmi.metadata.name,
        namespace: vmi.metadata.namespace!,
        socketFile: socket,
        uid,
      });
    }
    const client = this.#d.launchers.getOrCreate(uid, socket);
    return (await this.#d.launchers.isReady(uid)) ? client : undefined;
  }

  /** containerDisk -> hotplug -> network -> ownership -> resources -> SyncVirtualMachine (seed 3.2). */
  async #processVmUpdate(vmi: VirtualMachineInstance, domain: Domain | undefined): Promise<void> {
    const key = this.#key(vmi);
    const uid = vmi.metadata.uid!;
    const client = await this.#ensureLauncher(vmi);
    if (client === "waiting") return;
    if (!client) {
      // Pod-less: the spawner wakes the key when the socket appears; this is a fallback.
      this.#d.queue.addAfter(key, this.#d.mode.kind === "podless" ? 1_000 : 250);
      return;
    }
    if (
      domain?.status.status === LifeCycle.Paused &&
      domain.status.reason === StateChangeReason.PausedIOError
    ) {
      await client.unpauseVirtualMachine(vmi);
      this.#record(vmi, "Normal", EventReason.Resumed, "VMI resumed after IO error")
        .catch(() => {});
      return;
    }
    const generation = vmi.metadata.generation ?? 0;
    const alive = domain !== undefined && domain.status.status !== LifeCycle.Shutoff &&
      domain.status.status !== LifeCycle.Crashed;
    if (alive && !this.#synced.has(uid)) {
      // Adopted after a restart: the domain runs this spec already; do not disturb it.
      this.#synced.set(uid, generation);
      return;
    }
    if (alive && this.#synced.get(uid) === generation) return;
    await client.syncVirtualMachine(vmi);
    if (!domain) {
      this.#record(vmi, "Normal", EventReason.Created, "VirtualMachineInstance defined.")
        .catch(() => {});
    }
    this.#synced.set(uid, generation);
  }

  /** Graceful shutdown: ACPI every 5 s until the grace period expires, then kill (seed 3.1). */
  async #processVmShutdown(vmi: VirtualMachineInstance, vmiExists: boolean): Promise<void> {
    const key = this.#key(vmi);
    const uid = vmi.metadata.uid!;
    const client = this.#d.launchers.get(uid);
    if (!client) throw new Error("no launcher client to shut the domain down with");
    const now = Date.now();
    let st = this.#shutdowns.get(uid);
    if (!st) {
      st = { startedMs: now, lastAcpiMs: 0, graceSeconds: this.#graceSeconds(vmi) };
      this.#shutdowns.set(uid, st);
      const [reason, message] = vmiExists && !vmi.metadata.deletionTimestamp
        ? [EventReason.ShuttingDown, "Signaled Graceful Shutdown"]
        : [EventReason.Deleted, "Signaled Deletion"];
      this.#record(vmi, "Normal", reason, message).catch(() => {});
    }
    const graceMs = st.graceSeconds * 1000;
    if (now - st.startedMs >= graceMs) {
      log.info("Grace period expired, killing domain", { key, uid, grace: st.graceSeconds });
      await this.#processVmDestroy(vmi);
      return;
    }
    if (now - st.lastAcpiMs >= ACPI_RESEND_MS) {
      await client.shutdownVirtualMachine(vmi);
      st.lastAcpiMs = now;
      log.debug("Sent ACPI shutdown", {
        key,
        uid,
        elapsedMs: now - st.startedMs,
        grace: st.graceSeconds,
      });
    }
    const remaining = graceMs - (now - st.startedMs);
    this.#d.queue.addAfter(key, Math.min(ACPI_RESEND_MS, remaining));
  }

  async #processVmDestroy(vmi: VirtualMachineInstance): Promise<void> {
    const client = this.#d.launchers.get(vmi.metadata.uid!);
    if (!client) throw new Error("no launcher client to destroy the domain with");
    await client.killVirtualMachine(vmi);
  }

  async #processVmDelete(vmi: VirtualMachineInstance): Promise<void> {
    const client = this.#d.launchers.get(vmi.metadata.uid!);
    if (!client) throw new Error("no launcher client to delete the domain with");
    await client.deleteVirtualMachine(vmi);
  }

  /** Local cleanup in the seed's order: migration proxy first, launcher client last. */
  async #processVmCleanup(vmi: VirtualMachineInstance): Promise<void> {
    const key = this.#key(vmi);
    const uid = vmi.metadata.uid!;
    // (migration proxy: none is started by this version)
    const mode = this.#d.mode;
    if (mode.kind === "podless") {
      // Close our connection before the launcher's server goes away: Deno 2.9.6 can crash
      // in a process whose grpc-js client is connected while the peer shuts down.
      this.#d.launchers.remove(uid);
      const wasAlive = (await mode.spawner.alivePid(uid)) !== undefined;
      await mode.spawner.stop(uid, (this.#graceSeconds(vmi) + 5) * 1000);
      if (!wasAlive && this.#d.reapDomain) {
        // The launcher died without its domain: remove what it left in libvirt.
        await this.#d.reapDomain(vmi.metadata.namespace!, vmi.metadata.name, uid);
      }
      await Deno.remove(`${mode.socketRoot}/${uid}`, { recursive: true }).catch(() => {});
    }
    await this.#d.ghosts.delete(uid);
    this.#shutdowns.delete(uid);
    this.#synced.delete(uid);
    this.#ioRetry.forget(uid);
    this.#deleted.delete(key);
    for (const [k, d] of this.#domains) if (domainUid(d) === uid) this.#domains.delete(k);
    this.#d.launchers.remove(uid);
  }
}

/** Default socket root for pod-less launchers. */
export const PODLESS_SOCKET_ROOT = `${Paths.VirtShareDir}/sockets`;

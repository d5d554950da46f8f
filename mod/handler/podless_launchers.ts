/**
 * Pod-less mode's {@linkcode LauncherProvider}: no kubelet, no virt-controller. The
 * handler starts one launcher process per VMI on this host through the
 * {@linkcode LauncherSpawner}, and plays virt-controller's part: it schedules Pending
 * VMIs to this node and owns their `Ready` condition.
 *
 * A launcher's ghost record is written before the launcher is started, so a handler
 * killed in between finds the record after its restart and starts the launcher that
 * never ran (one that ran and died is a failed VMI: restart policy none, as for a pod).
 * When a launcher died without taking its domain with it, stopping the VMI removes the
 * domain from libvirt (the kubelet would have ended the pod's QEMU with the pod).
 *
 * @module
 */
import { join } from "node:path";
import { LIBVIRT_ERROR_CODES, LibvirtError, openLibvirt } from "../../ffi/mod.ts";
import { SocketNames, type VirtualMachineInstance, vmiKey } from "../api/mod.ts";
import { domainNameOf } from "../domain/mod.ts";
import { aborted } from "../lifecycle/mod.ts";
import type { LauncherOptions } from "../launcher/args/mod.ts";
import { getLogger } from "../log/mod.ts";
import type { GhostRecordStore } from "./ghost_records.ts";
import {
  type LauncherProvider,
  launchersOfGhostRecords,
  type LauncherStart,
} from "./launcher_provider.ts";
import { LauncherSpawner } from "./launcher_spawner.ts";
import { dialDirectly, type DialResolver } from "./launcher_clients.ts";
import { gracePeriodSeconds } from "./_vmi.ts";

const log = getLogger("handler", "podless");

/**
 * How soon a VMI whose launcher is starting is looked at again, ms. The spawner wakes
 * the VMI as soon as the launcher's socket appears (inotify); this is the fallback.
 */
export const PODLESS_NOT_READY_REQUEUE_MS = 1_000;

/** Extra time, beyond the VMI's grace period, a launcher gets to exit before SIGKILL. */
export const LAUNCHER_STOP_EXTRA_MS = 5_000;

/** Options of {@linkcode PodlessLaunchers}. */
export interface PodlessLaunchersOptions {
  /** The ghost record store the handler keeps. */
  ghosts: GhostRecordStore;
  /** Where launcher sockets go: `<socketRoot>/<uid>/launcher-sock`. */
  socketRoot: string;
  /** The handler's state directory (launcher logs and PID files go below it). */
  stateDir: string;
  /** Everything of a launcher's options that is the same for every VMI. */
  launcherDefaults:
    & Omit<
      LauncherOptions,
      "namespace" | "name" | "uid" | "socketDir" | "gracePeriodSeconds" | "runDir" | "diskDir"
    >
    & { runRoot: string; diskRoot: string };
  /** The command line that runs `virtnode launcher` with these options. */
  launcherCommand(options: LauncherOptions): { cmd: string; args: string[] };
  /** Wakes a VMI's key (its launcher became ready, or a start slot came free). */
  wake(key: string): void;
  /** Tells that a VMI's launcher exited. */
  exited(uid: string, why: string): void;
  /** Removes a dead launcher's leftover domain; libvirt at `launcherDefaults.libvirtUri` unless told. */
  reapDomain?: (namespace: string, name: string, uid: string) => Promise<void>;
  /** Launchers starting at once (see {@linkcode LauncherSpawner}). */
  maxStarting?: number;
}

/** Launchers as processes of this host, one per VMI. */
export class PodlessLaunchers implements LauncherProvider {
  /** For logs. */
  readonly name = "podless";
  /** The handler schedules Pending VMIs and owns `Ready` here. */
  readonly standsInForController = true;
  /** See {@linkcode PODLESS_NOT_READY_REQUEUE_MS}. */
  readonly notReadyRequeueMs: number = PODLESS_NOT_READY_REQUEUE_MS;
  /** Sockets live in directories the handler made (0700) for launchers it started. */
  readonly dialResolver: DialResolver = dialDirectly;
  readonly #o: PodlessLaunchersOptions;
  readonly #spawner: LauncherSpawner;
  /** Keys waiting for a launcher start slot. */
  readonly #waitingForSlot = new Set<string>();

  /** Creates the provider; no launcher starts until a VMI asks for one. */
  constructor(options: PodlessLaunchersOptions) {
    this.#o = options;
    const d = options.launcherDefaults;
    this.#spawner = new LauncherSpawner({
      stateDir: options.stateDir,
      maxStarting: options.maxStarting,
      command: (spec) => {
        const { runRoot, diskRoot, ...common } = d;
        return options.launcherCommand({
          ...common,
          namespace: spec.namespace,
          name: spec.name,
          uid: spec.uid,
          socketDir: spec.socketDir,
          gracePeriodSeconds: spec.gracePeriodSeconds,
          runDir: join(runRoot, spec.uid),
          diskDir: join(diskRoot, spec.uid),
        });
      },
      onExit: (uid, code, signal) =>
        options.exited(uid, `launcher exited (code ${code}, signal ${signal})`),
      onReady: (uid) => {
        const rec = options.ghosts.get(uid);
        if (rec) options.wake(vmiKey(rec));
      },
    });
  }

  /** The spawner (for the tests' view of starting launchers). */
  get spawner(): LauncherSpawner {
    return this.#spawner;
  }

  #socketDir(uid: string): string {
    return join(this.#o.socketRoot, uid);
  }

  /** The ghost record's socket, unless its launcher was never started. */
  async socketOf(vmi: VirtualMachineInstance): Promise<string | undefined> {
    const uid = vmi.metadata.uid!;
    const socket = this.#o.ghosts.get(uid)?.socketFile;
    if (!socket) return undefined;
    // A ghost record whose launcher was never started (the handler died in between).
    return (await this.#spawner.everStarted(uid)) ? socket : undefined;
  }

  /** Starts the VMI's launcher unless it runs; waits for a slot when too many are starting. */
  async start(vmi: VirtualMachineInstance): Promise<LauncherStart> {
    const uid = vmi.metadata.uid!;
    const known = await this.socketOf(vmi);
    if (known) return { socket: known };
    if (!this.#spawner.canStart()) {
      const key = vmiKey(vmi.metadata);
      if (!this.#waitingForSlot.has(key)) {
        this.#waitingForSlot.add(key);
        this.#spawner.onSlotFree(() => {
          this.#waitingForSlot.delete(key);
          this.#o.wake(key);
        });
      }
      return { waiting: "too many launchers are starting; waiting for a slot" };
    }
    const socketDir = this.#socketDir(uid);
    const socket = join(socketDir, SocketNames.Launcher);
    await this.#o.ghosts.add({
      name: vmi.metadata.name,
      namespace: vmi.metadata.namespace!,
      socketFile: socket,
      uid,
    });
    await this.#spawner.start({
      namespace: vmi.metadata.namespace!,
      name: vmi.metadata.name,
      uid,
      gracePeriodSeconds: gracePeriodSeconds(vmi),
      socketDir,
    });
    return { socket };
  }

  /** SIGTERM (the launcher shuts its guest down), SIGKILL after the grace period; reaps leftovers. */
  async stop(vmi: VirtualMachineInstance): Promise<void> {
    const uid = vmi.metadata.uid!;
    const wasAlive = (await this.#spawner.alivePid(uid)) !== undefined;
    await this.#spawner.stop(uid, gracePeriodSeconds(vmi) * 1000 + LAUNCHER_STOP_EXTRA_MS);
    if (!wasAlive) {
      // The launcher died without its domain: remove what it left in libvirt.
      const reap = this.#o.reapDomain ??
        ((ns: string, name: string, u: string) =>
          reapDomain(this.#o.launcherDefaults.libvirtUri, ns, name, u));
      await reap(vmi.metadata.namespace!, vmi.metadata.name, uid);
    }
    await Deno.remove(this.#socketDir(uid), { recursive: true }).catch(() => {});
  }

  /** Every ghost record's launcher. */
  adoptable(): { uid: string; socket: string; namespace: string; name: string }[] {
    return launchersOfGhostRecords(this.#o.ghosts);
  }

  /**
   * Writes the PID files a killed handler left unwritten for the launchers its ghost
   * records name (an adopted, running VM gets no start call that would), then waits until
   * `signal` aborts and forgets its children without stopping them (VMs keep running).
   */
  async run(signal: AbortSignal): Promise<void> {
    for (const { uid } of this.#o.ghosts.list()) {
      if (signal.aborted) break;
      await this.#spawner.ensurePidFile(uid).catch((error) =>
        log.warn("Cannot check the PID file of a launcher: {error}", { uid, error })
      );
    }
    await aborted(signal);
    this.#spawner.release();
  }
}

/**
 * Removes the domain a dead launcher left behind in libvirt, if it is still this VMI's
 * (its XML carries the UID). Opens its own short connection: the handler keeps no
 * libvirt connection of its own.
 */
export async function reapDomain(
  uri: string,
  namespace: string,
  name: string,
  uid: string,
): Promise<void> {
  // libvirt's library is opened (dlopen) only here, for this rare repair.
  const conn = await openLibvirt(uri, { events: false, workers: 1 });
  try {
    const domain = await conn.lookupByName(domainNameOf(namespace, name));
    const xml = await domain.getXMLDesc();
    if (!xml.includes(uid)) return; // another VMI's domain by now
    const state = await domain.getState();
    if (state.stateName !== "Shutoff") await domain.destroy();
    await domain.undefine({ nvram: true }).catch(() => domain.undefine());
    log.warn("Removed domain left by a dead launcher", { namespace, name, uid });
  } catch (error) {
    if (!(error instanceof LibvirtError && error.code === LIBVIRT_ERROR_CODES.VIR_ERR_NO_DOMAIN)) {
      throw error;
    }
  } finally {
    await conn.close();
  }
}

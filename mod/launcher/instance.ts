/**
 * One VMI's launcher state: its domain manager, the forwarder of its domain events and
 * its cmd server. A `virtnode launcher` process holds one; a launcher host (pod-less
 * mode) holds one per VMI on a shared libvirt connection and notify client.
 *
 * An instance ends in one of two ways: it is told to stop ({@linkcode LauncherInstance.requestStop},
 * SIGTERM for a launcher process), or its domain stops although nobody asked (no
 * Shutdown, Kill or Delete command): then {@linkcode LauncherInstance.ended} resolves
 * with the state the domain died in.
 *
 * @module
 */

import type { Connection, DomainEvent } from "../../ffi/mod.ts";
import {
  type DomainState,
  isDomainActive,
  isDomainDown,
  LifeCycle,
  StateChangeReason,
} from "../domain/mod.ts";
import { DomainEventType } from "../proto/mod.ts";
import { sleep } from "../lifecycle/mod.ts";
import { getLogger } from "../log/mod.ts";
import { CmdServer } from "./cmd_server.ts";
import { type ConverterSettings, DomainManager, type VmiRef } from "./domain_manager.ts";
import type { ConnectionKeeper } from "./connection_keeper.ts";
import { EventForwarder, type EventSink } from "./event_forwarder.ts";

const log = getLogger("launcher");

/** Exit code when the domain stopped unrequested for another reason than a guest power-off. */
export const EXIT_DOMAIN_FAILED = 1;
/** How often the ACPI request is repeated during a graceful stop (KubeVirt: 5 s). */
const ACPI_RESEND_MS = 5_000;
const POLL_MS = 250;

/** How an instance ended. */
export type InstanceEnd = { kind: "stop" } | { kind: "died"; state: DomainState };

/** Options of {@linkcode LauncherInstance}. */
export interface LauncherInstanceOptions {
  /** The VMI served. */
  vmi: VmiRef;
  /** The libvirt connection (shared in a launcher host). */
  connection: Connection;
  /** Reconnects a lost connection. */
  keeper?: ConnectionKeeper;
  /** Where domain and Kubernetes events go. */
  sink: EventSink;
  /** Directory of `launcher-init-sock` / `launcher-sock`. */
  socketDir: string;
  /** Seconds the guest gets to shut down when the instance is told to stop. */
  gracePeriodSeconds: number;
  /** Converter settings. */
  converter: ConverterSettings;
  /** Where the handler's migration proxy sockets are (KubeVirt's `/var/run/kubevirt`). */
  migrationSocketDir?: string;
}

/** The state of the VMI's own domain; undefined when there is none (another's does not count). */
async function currentState(manager: DomainManager): Promise<DomainState | undefined> {
  const domain = await manager.getDomain();
  const uid = manager.vmi.uid;
  if (!domain || (uid !== undefined && domain.spec.metadata.kubevirt.uid !== uid)) {
    return undefined;
  }
  return { status: domain.status.status, reason: domain.status.reason };
}

/** One VMI's launcher; see the module doc. */
export class LauncherInstance {
  /** The VMI served. */
  readonly vmi: VmiRef;
  /** Carries out the cmd calls. */
  readonly manager: DomainManager;
  /** Forwards the domain's events to the sink. */
  readonly forwarder: EventForwarder;
  readonly #o: LauncherInstanceOptions;
  readonly #ended: Promise<InstanceEnd>;
  #end!: (end: InstanceEnd) => void;
  #server: CmdServer | undefined;
  #stopping = false;

  /** Creates the instance; nothing is served and no libvirt call happens yet. */
  constructor(options: LauncherInstanceOptions) {
    this.#o = options;
    this.vmi = options.vmi;
    this.manager = new DomainManager({
      vmi: options.vmi,
      connection: options.connection,
      keeper: options.keeper,
      converter: options.converter,
      migrationSocketDir: options.migrationSocketDir,
    });
    this.#ended = new Promise((resolve) => this.#end = resolve);
    this.forwarder = new EventForwarder(this.manager, options.sink, (state) => {
      if (this.#stopping || this.manager.stopRequested) return;
      // The guest went on on another node, or never arrived from one: the handler removes
      // what is left here.
      if (state.reason === StateChangeReason.Migrated || this.manager.awaitingMigration) return;
      this.#end({ kind: "died", state });
    });
    this.manager.onChange = () => this.forwarder.refresh();
    this.#ended.then(() => {
      this.forwarder.stopAgentRetry();
      void this.manager.stopAccessCredentials();
    });
  }

  /** The libvirt domain's name. */
  get domainName(): string {
    return this.manager.domainName;
  }

  /** The cmd socket's path once served. */
  get socketPath(): string | undefined {
    return this.#server?.socketPath;
  }

  /** Resolves once the instance is told to stop or its domain died. */
  get ended(): Promise<InstanceEnd> {
    return this.#ended;
  }

  /** Hands a libvirt event to the forwarder (events of other domains are ignored). */
  handle(event: DomainEvent): void {
    this.manager.noteEvent(event);
    this.forwarder.handle(event);
  }

  /**
   * Re-reads the domain and reports a change (see {@linkcode EventForwarder.resync}); a
   * domain taken back has its guest agent asked again afterwards, off the adoption's path
   * (see {@linkcode EventForwarder.refreshAgent}).
   */
  async resync(why: "reconnect" | "adopt" = "reconnect"): Promise<void> {
    await this.forwarder.resync(why);
    if (why === "adopt") this.forwarder.refreshAgent();
  }

  /**
   * Serves the cmd socket and marks it ready; returns its path. With `replaceReady`, an
   * earlier server's `launcher-sock` stays until the new one is renamed over it.
   */
  async serve(options: { replaceReady?: boolean } = {}): Promise<string> {
    const server = await CmdServer.start({
      socketDir: this.#o.socketDir,
      backend: this.manager,
      replaceReady: options.replaceReady,
    });
    this.#server = server;
    await server.markReady();
    return server.socketPath;
  }

  /** Asks the instance to end (SIGTERM for a launcher process); the guest is stopped after. */
  requestStop(): void {
    this.#end({ kind: "stop" });
  }

  /**
   * Logs a domain that stopped unrequested and tells the handler; returns the exit code a
   * launcher process ends with (0 after a guest power-off).
   */
  reportDied(state: DomainState): number {
    this.#stopping = true;
    const { status, reason } = state;
    log.error("The domain stopped without being asked to", { ...this.vmi, status, reason });
    this.#o.sink.sendK8sEvent(
      this.vmi,
      reason === StateChangeReason.Shutdown ? "Normal" : "Warning",
      "Stopped",
      `The domain stopped unrequested: ${status} (${reason})`,
    ).catch(() => {}); // The notify client logs what it cannot deliver.
    return status === LifeCycle.Shutoff && reason === StateChangeReason.Shutdown
      ? 0
      : EXIT_DOMAIN_FAILED;
  }

  /**
   * The graceful stop: an ACPI power-button press (repeated every 5 s) while the grace
   * period lasts, then destroy; then the definition is removed (a launcher's domain does
   * not outlive its launcher) and the last events are forwarded. Never rejects.
   */
  async shutdownGuest(): Promise<void> {
    this.#stopping = true;
    const vmi = this.vmi;
    log.info("Stopping: shutting the guest down", {
      ...vmi,
      gracePeriodSeconds: this.#o.gracePeriodSeconds,
    });
    try {
      // Only a guest that still runs is being shut down; after the handler's cleanup the
      // domain is gone and an event would mislead.
      const state = await currentState(this.manager).catch(() => undefined);
      if (state && isDomainActive(state.status)) {
        this.#o.sink.sendK8sEvent(vmi, "Normal", "ShuttingDown", "Signaled Graceful Shutdown")
          .catch(() => {}); // The notify client logs what it cannot deliver.
      }
      const how = await this.#stopGuest();
      if (how !== "absent") {
        await this.forwarder.waitFor((last) => isDomainDown(last.state.status), 5_000);
        await this.manager.deleteDomain();
        await this.forwarder.waitFor((last) => last.type === DomainEventType.Deleted, 5_000);
      }
    } catch (error) {
      log.error("Cannot stop the guest cleanly", { ...vmi, error: String(error) });
    }
    await this.forwarder.idle();
  }

  async #stopGuest(): Promise<"absent" | "down" | "shutdown" | "destroyed"> {
    const manager = this.manager;
    let state = await currentState(manager);
    if (!state) return "absent";
    if (!isDomainActive(state.status)) return "down";
    manager.requestStop();
    const deadline = Date.now() + this.#o.gracePeriodSeconds * 1_000;
    let nextAcpi = 0;
    while (Date.now() < deadline) {
      if (Date.now() >= nextAcpi) {
        await manager.shutdown().catch((error) => {
          log.warn("ACPI shutdown request failed", { ...manager.vmi, error: String(error) });
        });
        nextAcpi = Date.now() + ACPI_RESEND_MS;
      }
      await sleep(Math.min(POLL_MS, Math.max(0, deadline - Date.now())));
      state = await currentState(manager);
      if (!state || !isDomainActive(state.status)) return "shutdown";
    }
    log.info("Grace period expired, destroying the domain", {
      ...manager.vmi,
      gracePeriodSeconds: this.#o.gracePeriodSeconds,
    });
    await manager.kill();
    return "destroyed";
  }

  /**
   * Stops serving the cmd socket and removes it, and stops the guest's DHCP servers
   * (unless `keepSocket`: a host ending, whose successor serves both again).
   */
  async close(options: { graceMs?: number; keepSocket?: boolean } = {}): Promise<void> {
    if (!options.keepSocket) this.manager.stopNetwork();
    await this.manager.stopAccessCredentials();
    await this.#server?.stop(options.graceMs, { keepSocket: options.keepSocket });
  }
}

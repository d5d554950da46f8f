/**
 * The launcher's lifecycle: open libvirt, forward the VMI's domain events to the
 * handler, serve the cmd socket, and stop the way KubeVirt's virt-launcher stops.
 *
 * - SIGTERM (or SIGINT, or the `signal` option): the guest gets an ACPI power-button
 *   press, repeated every 5 s, and is destroyed when the grace period is over; then its
 *   definition is removed (a launcher's domain does not outlive its launcher, as in a
 *   KubeVirt pod), the last events are delivered, the socket is removed: exit code 0.
 * - The domain stops although nobody asked (no Shutdown, Kill or Delete command, no
 *   signal): the event is reported and the launcher exits, with code 0 when the guest
 *   powered itself off (Shutoff/Shutdown) and {@linkcode EXIT_DOMAIN_FAILED} otherwise
 *   (QEMU crashed or was killed). The definition is kept for the handler to inspect.
 *
 * @module
 */

import { type Connection, type DomainEvent, openLibvirt } from "../../ffi/mod.ts";
import {
  type Domain,
  type DomainState,
  isDomainActive,
  isDomainDown,
  LifeCycle,
  StateChangeReason,
} from "../domain/mod.ts";
import { DomainEventType } from "../proto/mod.ts";
import { sleep } from "../lifecycle/mod.ts";
import { getLogger } from "../log/mod.ts";
import type { LauncherOptions } from "./args/mod.ts";
import { CmdServer } from "./cmd_server.ts";
import { DomainManager } from "./domain_manager.ts";
import { ConnectionKeeper } from "./_connection_keeper.ts";
import { type K8sEventType, NotifyClient, type NotifyTimeouts } from "./notify_client.ts";

const log = getLogger("launcher");

/** Exit code when the domain stopped unrequested for another reason than a guest power-off. */
export const EXIT_DOMAIN_FAILED = 1;
/** Exit code when the launcher could not start (libvirt, socket). */
export const EXIT_START_FAILED = 2;

/** How often the ACPI request is repeated during a graceful stop (KubeVirt: 5 s). */
const ACPI_RESEND_MS = 5_000;
/** After a stop signal, how long queued notify events may still take to be delivered. */
const FINAL_DELIVERY_MS = 3_000;
const POLL_MS = 250;

/** Extra knobs of {@linkcode runLauncher}, mostly for tests and embedding. */
export interface LauncherRuntime {
  /** Aborting it starts the graceful stop, like SIGTERM. */
  signal?: AbortSignal;
  /** Listen for SIGTERM and SIGINT; true unless told. */
  handleSignals?: boolean;
  /** Called once the socket is `launcher-sock` (ready). */
  onReady?: (socketPath: string) => void;
  /** Notify retry timing; KubeVirt's unless told. */
  notifyTimeouts?: NotifyTimeouts;
  /**
   * libvirt call workers (each is a V8 isolate of roughly 10 MB); 1 unless told. Commands
   * run one at a time anyway, so one worker only delays a GetDomain behind a start.
   */
  libvirtWorkers?: number;
}

/** Where domain and Kubernetes events go. */
export interface EventSink {
  /** Reports the domain to the handler. */
  sendDomainEvent(type: DomainEventType, domain: Domain): Promise<void>;
  /** Asks the handler to record a Kubernetes event on the VMI. */
  sendK8sEvent(
    vmi: { namespace: string; name: string; uid?: string },
    type: K8sEventType,
    reason: string,
    message: string,
  ): Promise<void>;
  /** Resolves once everything queued was delivered or given up; false after `timeoutMs`. */
  flush(timeoutMs?: number): Promise<boolean>;
  /** Stops sending. */
  close(): void;
}

const NO_SINK: EventSink = {
  sendDomainEvent: () => Promise.resolve(),
  sendK8sEvent: () => Promise.resolve(),
  flush: () => Promise.resolve(true),
  close: () => {},
};

// libvirt's virDomainEventType and the STOPPED / CRASHED details.
const EVENT_DEFINED = 0;
const EVENT_UNDEFINED = 1;
const EVENT_STOPPED = 5;
const EVENT_CRASHED = 8;
const STOPPED_REASONS: readonly StateChangeReason[] = [
  StateChangeReason.Shutdown,
  StateChangeReason.Destroyed,
  StateChangeReason.Crashed,
  StateChangeReason.Migrated,
  StateChangeReason.Saved,
  StateChangeReason.Failed,
  StateChangeReason.FromSnapshot,
];

/** The state an event itself proves, when later queries might already see a newer one. */
function stateFromEvent(event: DomainEvent): DomainState | undefined {
  if (event.type !== "lifecycle") return undefined;
  if (event.event === EVENT_STOPPED) {
    return {
      status: LifeCycle.Shutoff,
      reason: STOPPED_REASONS[event.detail] ?? StateChangeReason.Unknown,
    };
  }
  if (event.event === EVENT_CRASHED) {
    return {
      status: LifeCycle.Crashed,
      reason: event.detail === 0 ? StateChangeReason.Panicked : StateChangeReason.Unknown,
    };
  }
  return undefined;
}

/**
 * Whether a libvirt event changes what the handler sees of the domain, so the domain is
 * sent again: its lifecycle, a reboot, and the guest agent (dis)connecting, which flips
 * the agent channel's state that the handler's AgentConnected condition follows (as
 * KubeVirt's launcher sends the domain on agent lifecycle events).
 */
export function updatesDomain(event: DomainEvent): boolean {
  return event.type === "lifecycle" || event.type === "reboot" ||
    event.type === "agentLifecycle";
}

function eventLabel(event: DomainEvent): string {
  if (event.type === "lifecycle") return `${event.eventName}/${event.detailName}`;
  if (event.type === "agentLifecycle") return `agent/${event.stateName}`;
  return event.type;
}

/** What the event forwarder needs from the domain manager. */
export type ForwardedDomain = Pick<
  DomainManager,
  "vmi" | "domainName" | "getDomain" | "nonExistentDomain"
>;

/** Turns libvirt events of one domain into notify events, one at a time, in order. */
export class EventForwarder {
  readonly #manager: ForwardedDomain;
  readonly #sink: EventSink;
  readonly #onDown: (state: DomainState) => void;
  #chain: Promise<void> = Promise.resolve();
  #last: { type: DomainEventType; state: DomainState } | undefined;
  readonly #waiters = new Set<() => void>();

  /** Forwards `manager`'s events to `sink`; `onDown` hears of a domain that went down. */
  constructor(
    manager: ForwardedDomain,
    sink: EventSink,
    onDown: (state: DomainState) => void,
  ) {
    this.#manager = manager;
    this.#sink = sink;
    this.#onDown = onDown;
  }

  /** The last event forwarded. */
  get last(): { type: DomainEventType; state: DomainState } | undefined {
    return this.#last;
  }

  /** Queues `event` for forwarding when it is this domain's and {@linkcode updatesDomain}. */
  handle(event: DomainEvent): void {
    if (event.domain.name !== this.#manager.domainName || !updatesDomain(event)) return;
    this.#chain = this.#chain.then(() => this.#forward(event)).catch((error) => {
      log.error("Cannot forward domain event", {
        ...this.#manager.vmi,
        error: error instanceof Error ? error.message : String(error),
      });
    });
  }

  /**
   * Re-reads the domain after the libvirt connection came back (events of the outage
   * are lost) and reports it as MODIFIED when its state differs from the last event.
   * A domain found down with a definite reason did stop during the outage; the
   * connection loss alone never counts as that.
   */
  resync(): Promise<void> {
    const run = this.#chain.then(async () => {
      const domain = await this.#manager.getDomain();
      if (!domain) {
        log.warn("No domain after reconnecting to libvirt", { ...this.#manager.vmi });
        return;
      }
      const state = { status: domain.status.status, reason: domain.status.reason };
      const last = this.#last?.state;
      if (last && last.status === state.status && last.reason === state.reason) {
        log.info("Domain unchanged after reconnecting to libvirt", {
          ...this.#manager.vmi,
          status: state.status,
          reason: state.reason,
        });
        return;
      }
      log.info("Domain changed while libvirt was away", {
        ...this.#manager.vmi,
        status: state.status,
        reason: state.reason,
        was: last ? `${last.status}/${last.reason}` : "unknown",
      });
      this.#sink.sendDomainEvent(DomainEventType.Modified, domain).catch(() => {});
      this.#last = { type: DomainEventType.Modified, state };
      for (const waiter of [...this.#waiters]) waiter();
      if (isDomainDown(state.status) && state.reason !== StateChangeReason.Unknown) {
        this.#onDown(state);
      }
    });
    this.#chain = run.catch(() => {});
    return run;
  }

  /** Resolves once every event received so far has been handed to the sink. */
  idle(): Promise<void> {
    return this.#chain;
  }

  /** Resolves when a forwarded event satisfies `predicate`, or after `timeoutMs` (false). */
  waitFor(
    predicate: (last: { type: DomainEventType; state: DomainState }) => boolean,
    timeoutMs: number,
  ): Promise<boolean> {
    if (this.#last && predicate(this.#last)) return Promise.resolve(true);
    return new Promise((resolve) => {
      const check = () => {
        if (this.#last && predicate(this.#last)) {
          this.#waiters.delete(check);
          clearTimeout(timer);
          resolve(true);
        }
      };
      const timer = setTimeout(() => {
        this.#waiters.delete(check);
        resolve(false);
      }, timeoutMs);
      this.#waiters.add(check);
    });
  }

  async #forward(event: DomainEvent): Promise<void> {
    let domain = await this.#manager.getDomain();
    let type: DomainEventType = DomainEventType.Modified;
    if (!domain) {
      domain = this.#manager.nonExistentDomain();
      if (event.type === "lifecycle" && event.event === EVENT_UNDEFINED) {
        type = DomainEventType.Deleted;
      }
    } else if (event.type === "lifecycle" && event.event === EVENT_DEFINED && event.detail === 0) {
      type = DomainEventType.Added;
    }
    const proven = stateFromEvent(event);
    if (proven) domain.status = { ...domain.status, ...proven };
    const state = { status: domain.status.status, reason: domain.status.reason };
    log.info("Domain event", {
      ...this.#manager.vmi,
      event: eventLabel(event),
      status: state.status,
      reason: state.reason,
    });
    this.#sink.sendDomainEvent(type, domain).catch(() => {
      // NotifyClient logs what it gives up on; the event loop carries on.
    });
    this.#last = { type, state };
    for (const waiter of [...this.#waiters]) waiter();
    // Only a Stopped or Crashed event proves QEMU went away (a defined domain is Shutoff too).
    if (proven && type !== DomainEventType.Deleted && isDomainDown(state.status)) {
      this.#onDown(state);
    }
  }
}

async function currentState(manager: DomainManager): Promise<DomainState | undefined> {
  const domain = await manager.getDomain();
  return domain ? { status: domain.status.status, reason: domain.status.reason } : undefined;
}

/**
 * Stops the guest within `gracePeriodSeconds`: ACPI (repeated every 5 s), then destroy.
 * Returns how it ended.
 */
async function stopGuest(
  manager: DomainManager,
  gracePeriodSeconds: number,
): Promise<"absent" | "down" | "shutdown" | "destroyed"> {
  let state = await currentState(manager);
  if (!state) return "absent";
  if (!isDomainActive(state.status)) return "down";
  manager.requestStop();
  const deadline = Date.now() + gracePeriodSeconds * 1_000;
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
  log.info("Grace period expired, destroying the domain", { ...manager.vmi, gracePeriodSeconds });
  await manager.kill();
  return "destroyed";
}

/**
 * Runs the launcher until it is told to stop or its domain dies; resolves with the
 * process exit code (0 after a SIGTERM-driven stop). Never rejects: start-up failures
 * are logged and give {@linkcode EXIT_START_FAILED}.
 */
export async function runLauncher(
  options: LauncherOptions,
  runtime: LauncherRuntime = {},
): Promise<number> {
  const vmi = { namespace: options.namespace, name: options.name, uid: options.uid };
  let conn: Connection;
  try {
    conn = await openLibvirt(options.libvirtUri, { workers: runtime.libvirtWorkers ?? 1 });
  } catch (error) {
    log.error("Cannot start the launcher", { ...vmi, error: String(error) });
    return EXIT_START_FAILED;
  }
  // The forwarder is created below; the keeper calls it only after a reconnect.
  const keeper: ConnectionKeeper = new ConnectionKeeper(conn, {
    vmi,
    onRestored: (): Promise<void> => forwarder.resync(),
  });
  const manager = new DomainManager({
    vmi,
    connection: conn,
    keeper,
    converter: {
      runDir: options.runDir,
      diskDir: options.diskDir,
      imageDir: options.imageDir,
      hostDiskRoot: options.hostDiskRoot,
      domainType: options.domainType,
      ovmfDir: options.ovmfDir,
    },
  });
  const sink: EventSink = options.notifySocket
    ? new NotifyClient(options.notifySocket, runtime.notifyTimeouts)
    : NO_SINK;

  let stopping = false;
  let finish!: (reason: { kind: "signal" } | { kind: "died"; state: DomainState }) => void;
  const finished = new Promise<{ kind: "signal" } | { kind: "died"; state: DomainState }>(
    (resolve) => finish = resolve,
  );
  const forwarder = new EventForwarder(manager, sink, (state) => {
    if (stopping || manager.stopRequested) return;
    finish({ kind: "died", state });
  });
  const offEvents = conn.onEvent((event) => forwarder.handle(event));

  const onSignal = () => finish({ kind: "signal" });
  const signals: Deno.Signal[] = runtime.handleSignals === false ? [] : ["SIGTERM", "SIGINT"];
  for (const s of signals) Deno.addSignalListener(s, onSignal);
  runtime.signal?.addEventListener("abort", onSignal, { once: true });
  if (runtime.signal?.aborted) onSignal();

  let server: CmdServer | undefined;
  let exitCode = 0;
  try {
    try {
      server = await CmdServer.start({ socketDir: options.socketDir, backend: manager });
      await server.markReady();
    } catch (error) {
      log.error("Cannot start the launcher", { ...vmi, error: String(error) });
      exitCode = EXIT_START_FAILED;
      return exitCode;
    }
    runtime.onReady?.(server.socketPath);
    log.info("Launcher ready", { ...vmi, socket: server.socketPath });

    const reason = await finished;
    stopping = true;
    if (reason.kind === "signal") {
      log.info("Stopping: shutting the guest down", {
        ...vmi,
        gracePeriodSeconds: options.gracePeriodSeconds,
      });
      try {
        // Only a guest that still runs is being shut down; after the handler's cleanup
        // the domain is gone and an event would mislead.
        const state = await currentState(manager).catch(() => undefined);
        if (state && isDomainActive(state.status)) {
          sink.sendK8sEvent(vmi, "Normal", "ShuttingDown", "Signaled Graceful Shutdown")
            .catch(() => {});
        }
        const how = await stopGuest(manager, options.gracePeriodSeconds);
        if (how !== "absent") {
          await forwarder.waitFor((last) => isDomainDown(last.state.status), 5_000);
          await manager.deleteDomain();
          await forwarder.waitFor((last) => last.type === DomainEventType.Deleted, 5_000);
        }
      } catch (error) {
        log.error("Cannot stop the guest cleanly", { ...vmi, error: String(error) });
      }
    } else {
      const { status, reason: why } = reason.state;
      log.error("The domain stopped without being asked to", { ...vmi, status, reason: why });
      sink.sendK8sEvent(
        vmi,
        why === StateChangeReason.Shutdown ? "Normal" : "Warning",
        "Stopped",
        `The domain stopped unrequested: ${status} (${why})`,
      ).catch(() => {});
      exitCode = status === LifeCycle.Shutoff && why === StateChangeReason.Shutdown
        ? 0
        : EXIT_DOMAIN_FAILED;
    }
    await forwarder.idle();
    // Told to stop, the launcher owes its caller a prompt exit (grace period plus a few
    // seconds): a handler that is gone gets a short last chance, not the full retry time.
    const delivered = reason.kind === "signal"
      ? await sink.flush(FINAL_DELIVERY_MS)
      : await sink.flush();
    if (!delivered) log.warn("Some notify events were not delivered", vmi);
    return exitCode;
  } finally {
    for (const s of signals) Deno.removeSignalListener(s, onSignal);
    runtime.signal?.removeEventListener("abort", onSignal);
    await server?.stop().catch(() => {});
    offEvents();
    sink.close();
    await keeper.stop();
    await conn.close().catch(() => {});
  }
}

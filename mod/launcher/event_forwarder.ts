/**
 * Turns libvirt's events of one domain into the handler's notify events, in order, and
 * the sink they go to.
 *
 * @module
 */

import {
  type DomainEvent,
  VIR_DOMAIN_EVENT_CRASHED,
  VIR_DOMAIN_EVENT_CRASHED_PANICKED,
  VIR_DOMAIN_EVENT_DEFINED,
  VIR_DOMAIN_EVENT_DEFINED_ADDED,
  VIR_DOMAIN_EVENT_STOPPED,
  VIR_DOMAIN_EVENT_UNDEFINED,
} from "../../ffi/mod.ts";
import {
  type Domain,
  type DomainState,
  GUEST_AGENT_CHANNEL,
  isDomainDown,
  LifeCycle,
  StateChangeReason,
  stoppedEventReason,
} from "../domain/mod.ts";
import { DomainEventType } from "../proto/mod.ts";
import { getLogger } from "../log/mod.ts";
import type { DomainManager } from "./domain_manager.ts";
import type { K8sEventType } from "./notify_client.ts";
import { errorText } from "../../ffi/mod.ts";

const log = getLogger("launcher");

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

/** A sink that sends nothing (a launcher without a notify socket). */
export const NO_SINK: EventSink = {
  sendDomainEvent: () => Promise.resolve(),
  sendK8sEvent: () => Promise.resolve(),
  flush: () => Promise.resolve(true),
  close: () => {},
};

/** The state an event itself proves, when later queries might already see a newer one. */
function stateFromEvent(event: DomainEvent): DomainState | undefined {
  if (event.type !== "lifecycle") return undefined;
  if (event.event === VIR_DOMAIN_EVENT_STOPPED) {
    return {
      status: LifeCycle.Shutoff,
      reason: stoppedEventReason(event.detail),
    };
  }
  if (event.event === VIR_DOMAIN_EVENT_CRASHED) {
    return {
      status: LifeCycle.Crashed,
      reason: event.detail === VIR_DOMAIN_EVENT_CRASHED_PANICKED
        ? StateChangeReason.Panicked
        : StateChangeReason.Unknown,
    };
  }
  return undefined;
}

/**
 * Whether a libvirt event changes what the handler sees of the domain, so the domain is
 * sent again: its lifecycle, a reboot, the guest agent (dis)connecting, which flips the
 * agent channel's state that the handler's AgentConnected condition follows (as KubeVirt's
 * launcher sends the domain on agent lifecycle events), a device added or removed (a
 * hotplugged disk's target comes and goes with it), and a memory device's new size (the
 * guest's current memory, which the handler reports as `status.memory.guestCurrent`).
 */
export function updatesDomain(event: DomainEvent): boolean {
  return event.type === "lifecycle" || event.type === "reboot" ||
    event.type === "agentLifecycle" || event.type === "deviceAdded" ||
    event.type === "deviceRemoved" || event.type === "memoryDeviceSizeChange";
}

function eventLabel(event: DomainEvent): string {
  if (event.type === "lifecycle") return `${event.eventName}/${event.detailName}`;
  if (event.type === "agentLifecycle") return `agent/${event.stateName}`;
  return event.type;
}

/** What the event forwarder needs from the domain manager. */
export type ForwardedDomain = Pick<
  DomainManager,
  | "vmi"
  | "domainName"
  | "getDomain"
  | "nonExistentDomain"
  | "refreshAgentInfo"
  | "agentAnswered"
  | "isForeignDomain"
>;

/** libvirt's VIR_CONNECT_DOMAIN_EVENT_AGENT_LIFECYCLE_STATE_CONNECTED. */
const AGENT_CONNECTED = 1;

/**
 * How long after a connected guest agent left the launcher without the guest's OS (it did
 * not answer in time: a guest still starting its services, or paused right then) it is
 * asked again; doubled each time up to the last, and asked so while it stays connected.
 */
export const AGENT_RETRY_MS: readonly number[] = [1_000, 2_000, 4_000, 8_000, 16_000, 30_000];

/**
 * How often an agent that answered is asked again while it stays connected and the guest
 * runs, as KubeVirt's launcher polls it (its `--qemu-fsfreeze-status-interval` and
 * `--qemu-agent-sys-interval`): the freeze state every 5 s; the guest OS first after
 * `initialMs`, then twice as long each time up to `sysMs`. Users and filesystems are asked
 * when the handler asks for them, not polled.
 */
export const AGENT_POLL = { freezeMs: 5_000, initialMs: 10_000, sysMs: 120_000 } as const;

function agentChannelConnected(domain: Domain): boolean {
  return domain.spec.devices.channels.some((channel) =>
    channel.target?.name === GUEST_AGENT_CHANNEL && channel.target.state === "connected"
  );
}

/** Turns libvirt events of one domain into notify events, one at a time, in order. */
export class EventForwarder {
  readonly #manager: ForwardedDomain;
  readonly #sink: EventSink;
  readonly #onDown: (state: DomainState) => void;
  #chain: Promise<void> = Promise.resolve();
  #last: { type: DomainEventType; state: DomainState } | undefined;
  readonly #waiters = new Set<() => void>();
  #agentRetry: ReturnType<typeof setTimeout> | undefined;
  #agentAttempt = 0;
  #agentRetryStopped = false;
  /** The poller's timers while it runs, and the guest OS's next interval. */
  #poll:
    | {
      freeze: ReturnType<typeof setInterval>;
      os: ReturnType<typeof setTimeout> | undefined;
      osEveryMs: number;
      /** A round is asking the agent: the next one is skipped. */
      busy: boolean;
    }
    | undefined;
  /** The poller ran before (a pause stopped it): a restart asks at once, as KubeVirt's. */
  #polledBefore = false;

  readonly #pollTimes: { freezeMs: number; initialMs: number; sysMs: number };

  /**
   * Forwards `manager`'s events to `sink`; `onDown` hears of a domain that went down.
   * `pollTimes`: the agent poller's times, {@linkcode AGENT_POLL} unless told (tests).
   */
  constructor(
    manager: ForwardedDomain,
    sink: EventSink,
    onDown: (state: DomainState) => void,
    pollTimes: { freezeMs: number; initialMs: number; sysMs: number } = AGENT_POLL,
  ) {
    this.#manager = manager;
    this.#sink = sink;
    this.#onDown = onDown;
    this.#pollTimes = pollTimes;
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
        error: errorText(error),
      });
    });
  }

  /**
   * Sends the domain again as MODIFIED, after the launcher's own view of it changed (the
   * guest agent's findings: a freeze, a thaw), in order with the libvirt events.
   */
  refresh(): void {
    this.#chain = this.#chain.then(() => this.#forward(undefined)).catch((error) => {
      log.error("Cannot forward domain event", {
        ...this.#manager.vmi,
        error: errorText(error),
      });
    });
  }

  /**
   * Asks the guest agent again (a launcher taking a running domain back: the agent had
   * connected before) and sends the domain when its answers changed anything. After the
   * events queued so far; never rejects.
   */
  refreshAgent(): Promise<void> {
    const run = this.#chain.then(async () => {
      if (await this.#manager.refreshAgentInfo()) await this.#forward(undefined);
      else await this.#followAgent(await this.#manager.getDomain());
    });
    // refreshAgent() returns the chain, so a failure would go unseen without this.
    this.#chain = run.catch((error) =>
      log.warn("Cannot refresh the guest agent's info: {error}", { error })
    );
    return this.#chain;
  }

  /** Whether a connected guest agent that has not answered yet is to be asked again. */
  get agentRetryPending(): boolean {
    return this.#agentRetry !== undefined;
  }

  /** Asks a silent guest agent no more, and stops polling one (the instance ended). */
  stopAgentRetry(): void {
    this.#agentRetryStopped = true;
    clearTimeout(this.#agentRetry);
    this.#agentRetry = undefined;
    this.#stopPolling();
  }

  /** Whether the agent poller runs (an answering agent, connected, of a running guest). */
  get agentPolling(): boolean {
    return this.#poll !== undefined;
  }

  /**
   * Runs the agent poller ({@linkcode AGENT_POLL}) while `domain` runs with its agent
   * connected and answering, and stops it otherwise: a paused guest's agent cannot answer,
   * as KubeVirt's launcher stops its poller on a suspend.
   */
  #followPolling(domain: Domain | undefined): void {
    const poll = domain !== undefined && !this.#agentRetryStopped &&
      domain.status.status === LifeCycle.Running && agentChannelConnected(domain) &&
      this.#manager.agentAnswered;
    if (!poll) return this.#stopPolling();
    if (this.#poll) return;
    // The agent is asked outside the event chain (a hung agent holds no lifecycle event
    // back); only a change it told is sent, in order with the events.
    const round = (which: "all" | "os" | "freeze") => {
      const poll = this.#poll;
      if (!poll || poll.busy) return;
      poll.busy = true;
      this.#manager.refreshAgentInfo(which).then((changed) => {
        if (changed && this.#poll === poll) this.refresh();
      }).catch((error) => {
        log.warn("Cannot poll the guest agent: {error}", { ...this.#manager.vmi, error });
      }).finally(() => poll.busy = false);
    };
    const freeze = setInterval(() => round("freeze"), this.#pollTimes.freezeMs);
    Deno.unrefTimer(freeze);
    this.#poll = { freeze, os: undefined, osEveryMs: this.#pollTimes.initialMs, busy: false };
    if (this.#polledBefore) round("all");
    this.#polledBefore = true;
    const nextOs = () => {
      if (!this.#poll) return;
      const wait = this.#poll.osEveryMs;
      this.#poll.osEveryMs = Math.min(wait * 2, this.#pollTimes.sysMs);
      this.#poll.os = setTimeout(() => {
        round("os");
        nextOs();
      }, wait);
      Deno.unrefTimer(this.#poll.os);
    };
    nextOs();
    log.debug("Polling the guest agent", { ...this.#manager.vmi });
  }

  #stopPolling(): void {
    if (!this.#poll) return;
    clearInterval(this.#poll.freeze);
    clearTimeout(this.#poll.os);
    this.#poll = undefined;
    log.debug("Stopped polling the guest agent", { ...this.#manager.vmi });
  }

  /**
   * Keeps asking a connected guest agent that has not told the guest's OS yet (see
   * {@linkcode AGENT_RETRY_MS}); stops once it answered, disconnected or the domain went.
   */
  #followAgent(domain: Domain | undefined): void {
    this.#followPolling(domain);
    const waiting = domain !== undefined && agentChannelConnected(domain) &&
      !this.#manager.agentAnswered;
    if (!waiting || this.#agentRetryStopped) {
      clearTimeout(this.#agentRetry);
      this.#agentRetry = undefined;
      this.#agentAttempt = 0;
      return;
    }
    if (this.#agentRetry !== undefined) return;
    const delay = AGENT_RETRY_MS[Math.min(this.#agentAttempt, AGENT_RETRY_MS.length - 1)];
    this.#agentAttempt++;
    this.#agentRetry = setTimeout(() => {
      this.#agentRetry = undefined;
      this.#chain = this.#chain.then(async () => {
        if (this.#agentRetryStopped) return;
        log.debug("Asking the guest agent again", {
          ...this.#manager.vmi,
          attempt: this.#agentAttempt,
        });
        if (await this.#manager.refreshAgentInfo()) await this.#forward(undefined);
        else this.#followAgent(await this.#manager.getDomain());
      }).catch((error) => {
        log.error("Cannot ask the guest agent again", {
          ...this.#manager.vmi,
          error: errorText(error),
        });
      });
    }, delay);
    // A launcher process ends when its guest does, whatever is still to be asked.
    Deno.unrefTimer(this.#agentRetry);
  }

  /**
   * Re-reads the domain after the libvirt connection came back (events of the outage
   * are lost), or when a restarted launcher host takes the VMI back (`adopt`), and
   * reports it as MODIFIED when its state differs from the last event (always, when no
   * event was forwarded yet). A domain found down with a definite reason did stop while
   * nobody watched; the connection loss alone never counts as that.
   */
  resync(why: "reconnect" | "adopt" = "reconnect"): Promise<void> {
    const run = this.#chain.then(async () => {
      const domain = await this.#manager.getDomain();
      if (!domain) {
        if (why === "reconnect") {
          log.warn("No domain after reconnecting to libvirt", { ...this.#manager.vmi });
        }
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
      log.info(
        why === "adopt" ? "Domain taken back" : "Domain changed while libvirt was away",
        {
          ...this.#manager.vmi,
          status: state.status,
          reason: state.reason,
          was: last ? `${last.status}/${last.reason}` : "unknown",
        },
      );
      // The notify client logs what it cannot deliver.
      this.#sink.sendDomainEvent(DomainEventType.Modified, domain).catch(() => {});
      this.#last = { type: DomainEventType.Modified, state };
      for (const waiter of [...this.#waiters]) waiter();
      if (isDomainDown(state.status) && state.reason !== StateChangeReason.Unknown) {
        this.#onDown(state);
      }
    });
    // The caller gets the error through run; the chain only orders the work.
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

  /** Sends the domain as `event` left it; no event: as the launcher's view changed it. */
  async #forward(event: DomainEvent | undefined): Promise<void> {
    // A guest agent that just connected is asked what it knows before the domain goes out.
    if (event?.type === "agentLifecycle" && event.state === AGENT_CONNECTED) {
      this.#agentAttempt = 0;
      await this.#manager.refreshAgentInfo().catch(() => false);
    }
    let domain = await this.#manager.getDomain();
    this.#followAgent(domain);
    let type: DomainEventType = DomainEventType.Modified;
    if (!domain) {
      domain = this.#manager.nonExistentDomain();
      if (event?.type === "lifecycle" && event.event === VIR_DOMAIN_EVENT_UNDEFINED) {
        type = DomainEventType.Deleted;
      }
    } else if (
      event?.type === "lifecycle" && event.event === VIR_DOMAIN_EVENT_DEFINED &&
      event.detail === VIR_DOMAIN_EVENT_DEFINED_ADDED
    ) {
      type = DomainEventType.Added;
    }
    // An event of another's domain under our name (pod-less mode shares the host's
    // libvirtd) proves nothing of this VMI's domain: it is only a reason to look again.
    const foreign = event !== undefined && this.#manager.isForeignDomain(event.domain.uuid);
    const proven = event && !foreign ? stateFromEvent(event) : undefined;
    if (proven) domain.status = { ...domain.status, ...proven };
    const state = { status: domain.status.status, reason: domain.status.reason };
    log.info("Domain event", {
      ...this.#manager.vmi,
      event: event ? eventLabel(event) : "guest agent",
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

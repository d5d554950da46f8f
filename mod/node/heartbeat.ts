/**
 * The node heartbeat, as KubeVirt's virt-handler writes it: a strategic merge patch of
 * the Node with the label `kubevirt.io/schedulable` ("true" only once the device plugins
 * are registered), the annotation `kubevirt.io/heartbeat` (an RFC 3339 timestamp that
 * virt-controller reads to find dead handlers) and the labels `kubevirt.io/cpumanager`
 * and `cpumanager` (the kubelet runs the static CPU manager policy). Every minute with
 * jitter; "false" at start-up and on stop, so no VMI lands on a node whose handler is
 * gone.
 *
 * @module
 */

import { Annotations, Labels } from "../api/mod.ts";
import { detailOf, type KubeClient, type KubeObject, patchNodeMetadata } from "../kube/mod.ts";
import { getLogger } from "../log/mod.ts";
import { every, sleep } from "../lifecycle/mod.ts";

const log = getLogger("heartbeat");

/** The CPU manager label KubeVirt writes (and its older, unprefixed twin). */
export const CPU_MANAGER_LABEL = "kubevirt.io/cpumanager";
/** KubeVirt's deprecated CPU manager label, still written for older selectors. */
export const DEPRECATED_CPU_MANAGER_LABEL = "cpumanager";
/** Where the kubelet keeps its CPU manager state. */
export const DEFAULT_CPU_MANAGER_STATE_PATH = "/var/lib/kubelet/cpu_manager_state";
/**
 * Where the CPU manager state is looked for, first existing wins: the host path (systemd
 * unit), then the same file through the host's root as a `hostPID` pod sees it.
 */
export const DEFAULT_CPU_MANAGER_STATE_PATHS: readonly string[] = Object.freeze([
  DEFAULT_CPU_MANAGER_STATE_PATH,
  `/proc/1/root${DEFAULT_CPU_MANAGER_STATE_PATH}`,
]);

/** Options of {@linkcode Heartbeat}. */
export interface HeartbeatOptions {
  /** Whether the device plugins are registered; schedulable is "true" only then. */
  isReady?: () => boolean;
  /** Base period (1 min, KubeVirt's). */
  intervalMs?: number;
  /** Each wait is `interval + random * jitterFactor * interval` (1.2, KubeVirt's). */
  jitterFactor?: number;
  /** CPU manager state files, first existing wins ({@linkcode DEFAULT_CPU_MANAGER_STATE_PATHS}). */
  cpuManagerStatePaths?: string[];
  /**
   * KubeVirt's `CPUManager` feature gate, read at every beat: while it is off the CPU manager
   * labels say "false" whatever the kubelet runs, as virt-handler's do. Unset: the labels
   * follow the kubelet's state file alone (a beat with no cluster configuration).
   */
  cpuManagerGate?: () => boolean;
  /**
   * Told the node as each beat's patch returned it: its labels without a request of its own
   * (the mediated device types follow them, as in virt-handler).
   */
  onNode?: (node: KubeObject) => void;
  /** How long start-up waits for `isReady` before the periodic beats (10 s). */
  readyWaitMs?: number;
  /** Poll period of `isReady` during that wait (1 s). */
  readyPollMs?: number;
  /** Per-request timeout (10 s). */
  timeoutMs?: number;
  /** Clock (tests). */
  now?: () => Date;
  /** Random source in [0, 1) (tests). */
  random?: () => number;
}

/** What one beat wrote. */
export interface HeartbeatState {
  /** The `kubevirt.io/schedulable` value written; undefined when left as it was. */
  schedulable?: boolean;
  /** The `kubevirt.io/cpumanager` value written. */
  cpuManager: boolean;
  /** The `kubevirt.io/heartbeat` timestamp written. */
  heartbeat: string;
}

/** A heartbeat could not be written; `cause` has the failure. */
export class HeartbeatError extends Error {
  /** Creates the error. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "HeartbeatError";
  }
}

/** RFC 3339 with second precision, as `metav1.Time` marshals: `2026-01-02T03:04:05Z`. */
export function rfc3339(date: Date): string {
  return date.toISOString().replace(/\.\d{3}Z$/, "Z");
}

/**
 * Whether the kubelet runs the static CPU manager policy: the first existing file of
 * `paths` is JSON with `policyName` "static". Unreadable or malformed means false.
 */
export async function readCpuManagerEnabled(
  paths: readonly string[] = DEFAULT_CPU_MANAGER_STATE_PATHS,
): Promise<boolean> {
  for (const path of paths) {
    let text: string;
    try {
      text = await Deno.readTextFile(path);
    } catch (error) {
      if (error instanceof Deno.errors.NotFound) continue;
      log.debug("Cannot read the CPU manager state {path}: {error}", { path, error });
      return false;
    }
    try {
      const state = JSON.parse(text) as { policyName?: unknown };
      return state?.policyName === "static";
    } catch (error) {
      log.debug("Cannot parse the CPU manager state {path}: {error}", { path, error });
      return false;
    }
  }
  return false;
}

/** The heartbeat fields as a node carries them (for `virtnode heartbeat --show`). */
export interface NodeHeartbeatView {
  /** The node name. */
  node: string;
  /** `kubevirt.io/schedulable`, when set. */
  schedulable?: string;
  /** `kubevirt.io/cpumanager`, when set. */
  cpuManager?: string;
  /** `kubevirt.io/heartbeat`, when set. */
  heartbeat?: string;
  /** Seconds since the heartbeat, when it parses. */
  ageSeconds?: number;
}

/** Reads a node's heartbeat fields. */
export async function readNodeHeartbeat(
  client: KubeClient,
  nodeName: string,
  now: Date = new Date(),
): Promise<NodeHeartbeatView> {
  let node: KubeObject;
  try {
    node = await client.request<KubeObject>("GET", `/api/v1/nodes/${encodeURIComponent(nodeName)}`);
  } catch (error) {
    throw new HeartbeatError(`Cannot read node "${nodeName}": ${detailOf(error)}`, {
      cause: error,
    });
  }
  const labels = node.metadata?.labels ?? {};
  const heartbeat = node.metadata?.annotations?.[Annotations.Heartbeat];
  const parsed = heartbeat ? Date.parse(heartbeat) : NaN;
  return {
    node: nodeName,
    ...(labels[Labels.NodeSchedulable] !== undefined
      ? { schedulable: labels[Labels.NodeSchedulable] }
      : {}),
    ...(labels[CPU_MANAGER_LABEL] !== undefined ? { cpuManager: labels[CPU_MANAGER_LABEL] } : {}),
    ...(heartbeat ? { heartbeat } : {}),
    ...(Number.isNaN(parsed) ? {} : { ageSeconds: Math.round((now.getTime() - parsed) / 1000) }),
  };
}

/** The innermost error with a cause chain, for short messages. */
function rootCause(error: unknown): unknown {
  let current = error;
  while (current instanceof Error && current.cause !== undefined) current = current.cause;
  return current;
}

/** Writes the node heartbeat; see the module doc. */
export class Heartbeat {
  readonly #client: KubeClient;
  readonly #nodeName: string;
  readonly #options: HeartbeatOptions;
  /** For logs. */
  readonly name = "heartbeat";
  #last: HeartbeatState | undefined;

  /** Creates the heartbeat of `nodeName`; nothing is written until a beat. */
  constructor(client: KubeClient, nodeName: string, options: HeartbeatOptions = {}) {
    this.#client = client;
    this.#nodeName = nodeName;
    this.#options = options;
  }

  /** What the last successful beat wrote. */
  get last(): HeartbeatState | undefined {
    return this.#last;
  }

  /**
   * Writes one heartbeat; `schedulable` overrides what `isReady` says, and "unchanged"
   * leaves the label as it is (a beat by hand, which cannot know the device plugins).
   */
  async beatOnce(
    options: { schedulable?: boolean | "unchanged" } = {},
  ): Promise<HeartbeatState> {
    const schedulable = options.schedulable === "unchanged"
      ? undefined
      : options.schedulable ?? (this.#options.isReady?.() ?? true);
    const gate = this.#options.cpuManagerGate?.() ?? true;
    const cpuManager = gate &&
      await readCpuManagerEnabled(
        this.#options.cpuManagerStatePaths ?? DEFAULT_CPU_MANAGER_STATE_PATHS,
      );
    const heartbeat = rfc3339(this.#options.now?.() ?? new Date());
    let node: KubeObject;
    try {
      node = await patchNodeMetadata(this.#client, this.#nodeName, {
        labels: {
          ...(schedulable === undefined ? {} : { [Labels.NodeSchedulable]: String(schedulable) }),
          [DEPRECATED_CPU_MANAGER_LABEL]: String(cpuManager),
          [CPU_MANAGER_LABEL]: String(cpuManager),
        },
        annotations: { [Annotations.Heartbeat]: heartbeat },
      }, { timeoutMs: this.#options.timeoutMs ?? 10_000 });
    } catch (error) {
      throw new HeartbeatError(
        `Cannot write the heartbeat of node "${this.#nodeName}": ${detailOf(rootCause(error))}`,
        { cause: error },
      );
    }
    const state: HeartbeatState = {
      ...(schedulable === undefined ? {} : { schedulable }),
      cpuManager,
      heartbeat,
    };
    this.#last = state;
    log.debug("Heartbeat sent", { name: this.#nodeName, ...state });
    try {
      this.#options.onNode?.(node);
    } catch (error) {
      log.error("After the heartbeat: {error}", { error, name: this.#nodeName });
    }
    return state;
  }

  /**
   * One beat now, between the periodic ones: what it writes follows a changed cluster
   * configuration at once (the CPUManager gate) instead of at the next beat. Failures are
   * logged, as a periodic beat's are.
   */
  beatNow(): Promise<void> {
    return this.#tryBeat();
  }

  async #tryBeat(options: { schedulable?: boolean } = {}): Promise<void> {
    try {
      await this.beatOnce(options);
    } catch (error) {
      log.error("Heartbeat failed: {error}", { error, name: this.#nodeName });
    }
  }

  /**
   * Beats until `signal` aborts: "false" at once (device plugins are not up yet), then
   * as soon as `isReady` turns true within `readyWaitMs`, then every interval with
   * jitter. When the signal aborts it marks the node unschedulable, retrying like
   * client-go's default backoff (10 ms, 50 ms, 250 ms, 1.25 s); a node it cannot
   * mark is logged as an error.
   */
  async run(signal: AbortSignal): Promise<void> {
    await this.#tryBeat({ schedulable: false });
    const isReady = this.#options.isReady ?? (() => true);
    const deadline = Date.now() + (this.#options.readyWaitMs ?? 10_000);
    while (!signal.aborted && !isReady() && Date.now() < deadline) {
      await sleep(this.#options.readyPollMs ?? 1_000, signal);
    }
    const interval = this.#options.intervalMs ?? 60_000;
    await every(interval, () => this.#tryBeat(), signal, {
      jitter: this.#options.jitterFactor ?? 1.2,
      random: this.#options.random,
    });
    try {
      await this.markUnschedulable();
    } catch (error) {
      log.error("Cannot mark the node unschedulable: {error}", { error, name: this.#nodeName });
    }
  }

  /** Writes a beat with `schedulable=false`, retrying; rejects when every attempt failed. */
  async markUnschedulable(): Promise<void> {
    let lastError: unknown;
    for (const delay of [10, 50, 250, 1_250, 0]) {
      try {
        await this.beatOnce({ schedulable: false });
        return;
      } catch (error) {
        lastError = error;
        if (delay > 0) await sleep(delay);
      }
    }
    throw new HeartbeatError(
      `Cannot mark node "${this.#nodeName}" unschedulable: ${detailOf(rootCause(lastError))}`,
      { cause: lastError },
    );
  }
}

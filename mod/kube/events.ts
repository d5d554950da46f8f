/**
 * An event recorder for core/v1 Events, like client-go's with its aggregation: the
 * same (object, type, reason, message) seen again within 10 minutes PATCHes the
 * existing Event's `count` and `lastTimestamp` instead of creating a new one.
 *
 * @module
 */

import type { KubeClient } from "./client.ts";
import { detailOf, isApiStatus } from "./errors.ts";
import { type KubeObject, objectKey } from "./types.ts";

/** Event types Kubernetes knows. */
export type EventType = "Normal" | "Warning";

/** Options of {@linkcode EventRecorder}. */
export interface EventRecorderOptions {
  /** The node name, written as `source.host` and `reportingInstance`. */
  host: string;
  /** `source.component` (default "virt-handler", as KubeVirt's). */
  component?: string;
  /** Repeats within this window are aggregated (default 10 min). */
  aggregateWindowMs?: number;
  /** Remembered (object, reason, message, type) tuples (default 4096, as client-go's LRU). */
  cacheSize?: number;
  /** Per-request timeout (default 10 s). */
  timeoutMs?: number;
  /** Clock in ms; injectable for tests. */
  now?: () => number;
}

/** The core/v1 Event fields we write. */
export interface KubeEvent extends KubeObject {
  /** The object the event is about. */
  involvedObject: {
    apiVersion?: string;
    kind?: string;
    namespace?: string;
    name?: string;
    uid?: string;
    resourceVersion?: string;
  };
  /** A short CamelCase reason, e.g. `Created`. */
  reason: string;
  /** A human-readable description. */
  message: string;
  /** `Normal` or `Warning`. */
  type: EventType;
  /** How often the event happened (aggregated). */
  count: number;
  /** When it first happened, RFC 3339. */
  firstTimestamp: string;
  /** When it last happened, RFC 3339. */
  lastTimestamp: string;
  /** The component and host that reported it. */
  source: { component: string; host: string };
  /** The reporting controller, e.g. `virt-handler`. */
  reportingComponent?: string;
  /** The reporting controller's instance (the node). */
  reportingInstance?: string;
  /** What was done or failed, when the reason does not say. */
  action?: string;
}

interface Seen {
  namespace: string;
  name: string;
  count: number;
  lastMs: number;
}

/** Records Events about objects; see the module doc. */
export class EventRecorder {
  readonly #client: KubeClient;
  readonly #host: string;
  readonly #component: string;
  readonly #windowMs: number;
  /** The request of each key being made, so repeats wait for it. */
  readonly #inFlight = new Map<string, Promise<KubeEvent>>();
  readonly #cacheSize: number;
  readonly #timeoutMs: number;
  readonly #now: () => number;
  /** Insertion-ordered, so the first entry is the least recently used. */
  readonly #seen = new Map<string, Seen>();

  /** Creates a recorder for one node. */
  constructor(client: KubeClient, options: EventRecorderOptions) {
    this.#client = client;
    this.#host = options.host;
    this.#component = options.component ?? "virt-handler";
    this.#windowMs = options.aggregateWindowMs ?? 10 * 60 * 1000;
    this.#cacheSize = options.cacheSize ?? 4096;
    this.#timeoutMs = options.timeoutMs ?? 10_000;
    this.#now = options.now ?? Date.now;
  }

  /**
   * Records an Event about `object` in its namespace ("default" for cluster-scoped
   * objects such as Nodes) and returns it. Rejects when the apiserver does; callers that
   * treat events as best-effort add `.catch()`.
   */
  record(
    object: KubeObject,
    type: EventType,
    reason: string,
    message: string,
  ): Promise<KubeEvent> {
    const meta = object.metadata ?? {};
    const namespace = meta.namespace || "default";
    const key = JSON.stringify([
      object.kind,
      namespace,
      meta.name,
      meta.uid,
      type,
      reason,
      message,
    ]);
    // One request per key at a time: a repeat that comes while the first Event is still
    // being created must patch it, not create a second one.
    const before = this.#inFlight.get(key);
    // The earlier Event's failure went to its own caller; this one only waits its turn.
    const recorded = (before ? before.catch(() => {}) : Promise.resolve()).then(() =>
      this.#recordNow(key, object, namespace, type, reason, message)
    );
    this.#inFlight.set(key, recorded);
    // Only to clear the entry: the caller gets the error through recorded.
    recorded.catch(() => {}).finally(() => {
      if (this.#inFlight.get(key) === recorded) this.#inFlight.delete(key);
    });
    return recorded;
  }

  async #recordNow(
    key: string,
    object: KubeObject,
    namespace: string,
    type: EventType,
    reason: string,
    message: string,
  ): Promise<KubeEvent> {
    const meta = object.metadata ?? {};
    const nowMs = this.#now();
    const now = timestamp(nowMs);
    const seen = this.#seen.get(key);
    if (seen && nowMs - seen.lastMs <= this.#windowMs) {
      const path = `/api/v1/namespaces/${encodeURIComponent(seen.namespace)}/events/${
        encodeURIComponent(seen.name)
      }`;
      try {
        const patched = await this.#client.request<KubeEvent>(
          "PATCH",
          path,
          { count: seen.count + 1, lastTimestamp: now },
          { contentType: "application/strategic-merge-patch+json", timeoutMs: this.#timeoutMs },
        );
        seen.count = patched.count ?? seen.count + 1;
        seen.lastMs = nowMs;
        this.#touch(key, seen);
        return patched;
      } catch (err) {
        // The Event expired (TTL 1 h by default) or was deleted: create a new one.
        if (!isApiStatus(err, 404)) throw this.#error(reason, object, err);
        this.#seen.delete(key);
      }
    }
    const event: KubeEvent = {
      apiVersion: "v1",
      kind: "Event",
      metadata: { name: `${meta.name ?? "unknown"}.${eventSuffix(nowMs)}`, namespace },
      involvedObject: {
        apiVersion: object.apiVersion,
        kind: object.kind,
        namespace: meta.namespace,
        name: meta.name,
        uid: meta.uid,
        resourceVersion: meta.resourceVersion,
      },
      reason,
      message,
      type,
      count: 1,
      firstTimestamp: now,
      lastTimestamp: now,
      source: { component: this.#component, host: this.#host },
      reportingComponent: this.#component,
      reportingInstance: this.#host,
    };
    let created: KubeEvent;
    try {
      created = await this.#client.request<KubeEvent>(
        "POST",
        `/api/v1/namespaces/${encodeURIComponent(namespace)}/events`,
        event,
        { timeoutMs: this.#timeoutMs },
      );
    } catch (err) {
      throw this.#error(reason, object, err);
    }
    this.#touch(key, {
      namespace,
      name: created.metadata?.name ?? event.metadata!.name!,
      count: 1,
      lastMs: nowMs,
    });
    return created;
  }

  #touch(key: string, seen: Seen): void {
    this.#seen.delete(key);
    this.#seen.set(key, seen);
    while (this.#seen.size > this.#cacheSize) {
      const oldest = this.#seen.keys().next().value;
      if (oldest === undefined) break;
      this.#seen.delete(oldest);
    }
  }

  #error(reason: string, object: KubeObject, err: unknown): Error {
    const name = objectKey(object);
    return new Error(
      `Cannot record event "${reason}" for ${object.kind ?? "object"} "${name}": ${detailOf(err)}`,
      {
        cause: err,
      },
    );
  }
}

/** RFC 3339 with seconds, as metav1.Time serialises. */
function timestamp(ms: number): string {
  return new Date(ms).toISOString().replace(/\.\d{3}Z$/, "Z");
}

let lastSuffix = 0n;

/** A unique, time-ordered hex suffix (client-go uses the nanosecond time). */
function eventSuffix(ms: number): string {
  let ns = BigInt(Math.floor(ms)) * 1_000_000n;
  if (ns <= lastSuffix) ns = lastSuffix + 1n;
  lastSuffix = ns;
  return ns.toString(16);
}

/** Options of {@linkcode EventSpamFilter}. */
export interface EventSpamFilterOptions {
  /** Events an object may have at once (default 25, as client-go's spam filter). */
  burst?: number;
  /** One more event is allowed after this long (default 5 minutes, as client-go's). */
  refillMs?: number;
  /** Objects remembered (default 4096); the least recently seen is forgotten first. */
  cacheSize?: number;
  /** Clock in ms; injectable for tests. */
  now?: () => number;
}

/**
 * client-go's event spam filter: a token bucket per object, so a source that floods
 * Events about one object (a launcher asking for them) gets `burst` at once and then one
 * per `refillMs`, and the apiserver's Event store stays bounded.
 */
export class EventSpamFilter {
  readonly #burst: number;
  readonly #refillMs: number;
  readonly #cacheSize: number;
  readonly #now: () => number;
  /** Tokens left and when they were counted, by object key; insertion-ordered (LRU). */
  readonly #buckets = new Map<string, { tokens: number; atMs: number }>();

  /** A filter with every bucket full. */
  constructor(options: EventSpamFilterOptions = {}) {
    this.#burst = options.burst ?? 25;
    this.#refillMs = options.refillMs ?? 5 * 60_000;
    this.#cacheSize = options.cacheSize ?? 4096;
    this.#now = options.now ?? Date.now;
  }

  /** Takes a token of `key`'s bucket: true when the event may be recorded. */
  allow(key: string): boolean {
    const now = this.#now();
    const bucket = this.#buckets.get(key) ?? { tokens: this.#burst, atMs: now };
    const refilled = Math.floor((now - bucket.atMs) / this.#refillMs);
    if (refilled > 0) {
      bucket.tokens = Math.min(this.#burst, bucket.tokens + refilled);
      bucket.atMs += refilled * this.#refillMs;
    }
    if (bucket.tokens >= this.#burst) bucket.atMs = now;
    this.#buckets.delete(key);
    this.#buckets.set(key, bucket);
    if (this.#buckets.size > this.#cacheSize) {
      this.#buckets.delete(this.#buckets.keys().next().value!);
    }
    if (bucket.tokens < 1) return false;
    bucket.tokens--;
    return true;
  }
}

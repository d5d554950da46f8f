/**
 * A list/watch informer with a local store, written for this agent instead of
 * client-node's (which stops on errors other than 410 and must be restarted by hand).
 *
 * Loop: LIST (paginated) -> diff against the store (adds, updates, and deletes for
 * objects that vanished) -> WATCH from the list's resourceVersion with bookmarks -> on
 * a normal end of the watch (server timeout) WATCH again from the last resourceVersion
 * seen. Errors:
 * - 410 Gone (HTTP, or an ERROR event with code 410): relist after a short random delay
 *   (100 ms to 1 s), so the handlers of a fleet, whose watches all go at once when the
 *   apiserver restarts, do not all list again in the same instant;
 * - an interrupted watch (connection refused or reset, timeout, 429, 5xx, a stream that
 *   ends at once): back off, then WATCH again from the last resourceVersion (as
 *   client-go does); if that version is gone meanwhile the 410 relists;
 * - anything else (a failed LIST, a malformed event): back off, then relist.
 * Backoff: 200 ms doubling to 30 s, back to 200 ms after 60 s without a failure; each wait
 * is a random part of it, from half to all, for the same reason as the 410's delay. The
 * loop never stops until {@linkcode Informer.stop}; every error it recovers from goes
 * to `onError` and `lastError`.
 *
 * @module
 */

import { getLogger } from "@logtape/logtape";
import type { KubeClient } from "./client.ts";
import { detailOf, isApiStatus, KubeApiError, KubeConnectionError } from "./errors.ts";
import { type KubeList, type KubeObject, objectKey, type WatchEvent } from "./types.ts";
import { aborted, sleep } from "../lifecycle/mod.ts";

const logger = getLogger(["virtnode", "kube", "informer"]);

/** Event handlers; exceptions they throw are logged and do not stop the informer. */
export interface InformerHandlers<T> {
  /** An object appeared (also for each object of the first list). */
  onAdd?(obj: T): void;
  /** An object changed. */
  onUpdate?(oldObj: T, newObj: T): void;
  /** An object went away (its last known state). */
  onDelete?(obj: T): void;
}

/** Backoff of the list/watch loop. */
export interface InformerBackoff {
  /** First delay (default 200 ms). */
  initialMs?: number;
  /** Longest delay (default 30 s). */
  maxMs?: number;
  /** A run this long without a failure resets the delay (default 60 s). */
  resetAfterMs?: number;
  /** Longest wait before the relist a 410 Gone asks for (default 1 s; a tenth of it at least). */
  goneMaxMs?: number;
  /** The jitter's random source, numbers in [0, 1) (default `Math.random`). */
  random?: () => number;
}

/** Options of {@linkcode Informer}. */
export interface InformerOptions<T extends KubeObject = KubeObject> {
  /**
   * Collection path: `/apis/kubevirt.io/v1/virtualmachineinstances` (all namespaces)
   * or `/apis/kubevirt.io/v1/namespaces/ns/virtualmachineinstances`.
   */
  path: string;
  /** Label selector, e.g. `kubevirt.io/nodeName=node1`. */
  labelSelector?: string;
  /** Field selector (only metadata.* for custom resources). */
  fieldSelector?: string;
  /** Name used in errors and logs, e.g. "virtualmachineinstances" (default: last path segment). */
  resource?: string;
  /** Server-side watch timeout in seconds (default 300-600 at random); the client watchdog adds 30 s. */
  watchTimeoutSeconds?: number;
  /** Timeout of each LIST page request (default 60 s). */
  listTimeoutMs?: number;
  /** Page size of LIST (default 500). */
  pageSize?: number;
  /** Loop backoff. */
  backoff?: InformerBackoff;
  /** Called with every error the loop recovers from (for conditions, events, metrics). */
  onError?: (err: Error) => void;
  /**
   * Applied to every object before it is stored (client-go's transform), e.g. to drop
   * `metadata.managedFields`, which grows with every write and is never read here.
   */
  transform?: (obj: T) => T;
}

/** The list's resourceVersion is too old (410 Gone): relist. */
class GoneError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "GoneError";
  }
}

/** The watch broke (connection, timeout, 429, 5xx, early end): watch again from the last resourceVersion. */
class WatchInterrupted extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "WatchInterrupted";
  }
}

/** A watch event that is not one (its message names the watch): relist. */
class MalformedWatchEvent extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "MalformedWatchEvent";
  }
}

/** Watches one resource collection and keeps a local store; see the module doc. */
export class Informer<T extends KubeObject = KubeObject> {
  /** For logs: `informer/<resource>`. */
  readonly name: string;
  readonly #client: KubeClient;
  readonly #options: InformerOptions<T>;
  readonly #resource: string;
  readonly #store = new Map<string, T>();
  readonly #handlers: InformerHandlers<T>[] = [];
  #synced = false;
  #syncWaiters: (() => void)[] = [];
  #stopped = false;
  #running: Promise<void> | undefined;
  #abort = new AbortController();
  #resourceVersion = "";
  #lastError: Error | undefined;
  #restarts = 0;
  #lists = 0;

  /** Creates an informer; nothing is listed until {@linkcode Informer.run}. */
  constructor(client: KubeClient, options: InformerOptions<T>) {
    this.#client = client;
    this.#options = options;
    this.#resource = options.resource ?? options.path.split("/").filter(Boolean).at(-1) ??
      options.path;
    this.name = `informer/${this.#resource}`;
  }

  /** Adds handlers; objects already in the store are not replayed. */
  addHandlers(handlers: InformerHandlers<T>): void {
    this.#handlers.push(handlers);
  }

  /**
   * Lists and watches until `signal` aborts, restarting with backoff after any error;
   * resolves once the watch is closed. An informer runs once.
   */
  async run(signal: AbortSignal): Promise<void> {
    if (this.#running || this.#stopped) throw new Error("Cannot run an informer twice");
    this.#running = this.#run();
    await aborted(signal);
    this.#stopped = true;
    this.#abort.abort();
    for (const w of this.#syncWaiters.splice(0)) w();
    await this.#running;
  }

  /** Whether the first LIST has been applied to the store. */
  hasSynced(): boolean {
    return this.#synced;
  }

  /** Resolves once {@linkcode Informer.hasSynced} is true (or the informer stops). */
  waitForSync(): Promise<void> {
    if (this.#synced || this.#stopped) return Promise.resolve();
    return new Promise((resolve) => this.#syncWaiters.push(resolve));
  }

  /** The cached object of `key` ("namespace/name"). */
  get(key: string): T | undefined {
    return this.#store.get(key);
  }

  /** All cached objects. */
  list(): T[] {
    return [...this.#store.values()];
  }

  /** All cached keys. */
  keys(): string[] {
    return [...this.#store.keys()];
  }

  /** The last resourceVersion seen (list, event or bookmark). */
  get resourceVersion(): string {
    return this.#resourceVersion;
  }

  /** The last error the loop recovered from, if any. */
  get lastError(): Error | undefined {
    return this.#lastError;
  }

  /** How many times the loop restarted after an error or 410. */
  get restarts(): number {
    return this.#restarts;
  }

  /** How many LISTs were applied (1 after the first sync). */
  get lists(): number {
    return this.#lists;
  }

  async #run(): Promise<void> {
    const initialMs = this.#options.backoff?.initialMs ?? 200;
    const maxMs = this.#options.backoff?.maxMs ?? 30_000;
    const resetAfterMs = this.#options.backoff?.resetAfterMs ?? 60_000;
    const goneMaxMs = this.#options.backoff?.goneMaxMs ?? 1_000;
    const random = this.#options.backoff?.random ?? Math.random;
    let delay = initialMs;
    let lastFailure = -Infinity;
    let needList = true;
    while (!this.#stopped) {
      try {
        if (needList) {
          await this.#relist();
          needList = false;
        }
        await this.#watchOnce();
      } catch (err) {
        if (this.#stopped) break;
        this.#restarts++;
        const error = err instanceof Error ? err : new Error(String(err));
        this.#lastError = error;
        this.#reportError(error);
        if (err instanceof GoneError) {
          const wait = Math.round(goneMaxMs * (0.1 + 0.9 * random()));
          logger.info("Relisting after 410 Gone", {
            resource: this.#resource,
            delayMs: wait,
            error: error.message,
          });
          needList = true;
          await sleep(wait, this.#abort.signal);
          continue;
        }
        // An interrupted watch resumes from the last resourceVersion (as client-go does
        // for refused connections and 429); anything else relists to be safe.
        needList = needList || !(err instanceof WatchInterrupted);
        const now = performance.now();
        if (now - lastFailure > resetAfterMs) delay = initialMs;
        lastFailure = now;
        const wait = Math.round(delay * (0.5 + 0.5 * random()));
        logger.warn("List/watch failed, retrying", {
          resource: this.#resource,
          delayMs: wait,
          relist: needList,
          error: error.message,
        });
        await sleep(wait, this.#abort.signal);
        delay = Math.min(delay * 2, maxMs);
      }
    }
  }

  async #relist(): Promise<void> {
    const fresh = new Map<string, T>();
    let resourceVersion = "";
    let cont: string | undefined;
    do {
      let page: KubeList<T>;
      try {
        page = await this.#client.request<KubeList<T>>("GET", this.#options.path, undefined, {
          timeoutMs: this.#options.listTimeoutMs ?? 60_000,
          signal: this.#abort.signal,
          query: {
            labelSelector: this.#options.labelSelector,
            fieldSelector: this.#options.fieldSelector,
            limit: this.#options.pageSize ?? 500,
            continue: cont,
          },
        });
      } catch (err) {
        if (isApiStatus(err, 410)) {
          throw new GoneError(`Cannot list ${this.#resource}: continue token expired`, {
            cause: err,
          });
        }
        throw new Error(`Cannot list ${this.#resource}: ${detailOf(err)}`, { cause: err });
      }
      const fault = listFault(page);
      if (fault) throw new Error(`Cannot list ${this.#resource}: malformed list: ${fault}`);
      for (const item of page.items ?? []) fresh.set(objectKey(item), this.#transform(item));
      resourceVersion = page.metadata?.resourceVersion ?? resourceVersion;
      cont = page.metadata?.continue || undefined;
    } while (cont);
    if (this.#stopped) return;
    this.#replace(fresh);
    this.#resourceVersion = resourceVersion;
    this.#lists++;
    if (!this.#synced) {
      this.#synced = true;
      for (const w of this.#syncWaiters.splice(0)) w();
    }
  }

  /** Makes the store equal `fresh`, emitting deletes, adds and updates. */
  #replace(fresh: Map<string, T>): void {
    for (const [key, old] of [...this.#store]) {
      if (!fresh.has(key)) {
        this.#store.delete(key);
        this.#emit((h) => h.onDelete?.(old));
      }
    }
    for (const [key, obj] of fresh) {
      const old = this.#store.get(key);
      this.#store.set(key, obj);
      if (!old) this.#emit((h) => h.onAdd?.(obj));
      else if (old.metadata?.resourceVersion !== obj.metadata?.resourceVersion) {
        this.#emit((h) => h.onUpdate?.(old, obj));
      }
    }
  }

  /** One WATCH request; returns when the server ends it normally (its timeout). */
  async #watchOnce(): Promise<void> {
    // Like client-go: 5 to 10 minutes at random, so many agents do not rewatch in step.
    const timeoutSeconds = this.#options.watchTimeoutSeconds ??
      300 + Math.floor(Math.random() * 300);
    const watchdog = new AbortController();
    const timer = setTimeout(
      () => watchdog.abort(new DOMException("watch watchdog", "TimeoutError")),
      (timeoutSeconds + 30) * 1000,
    );
    const signal = AbortSignal.any([this.#abort.signal, watchdog.signal]);
    try {
      const body = await this.#client.stream(this.#options.path, {
        signal,
        query: {
          watch: 1,
          resourceVersion: this.#resourceVersion,
          allowWatchBookmarks: true,
          timeoutSeconds,
          labelSelector: this.#options.labelSelector,
          fieldSelector: this.#options.fieldSelector,
        },
      });
      let received = 0;
      const started = performance.now();
      for await (const line of jsonLines(body, signal)) {
        if (this.#stopped) return;
        this.#handleEvent(parseEvent<T>(line, this.#resource));
        received++;
      }
      // A watch the server ends at once, again and again, would be a hot loop.
      if (received === 0 && performance.now() - started < 1000 && !this.#stopped) {
        throw new WatchInterrupted(`Cannot watch ${this.#resource}: the watch stream ended early`);
      }
    } catch (err) {
      if (this.#stopped) return;
      if (err instanceof GoneError || err instanceof WatchInterrupted) throw err;
      if (err instanceof MalformedWatchEvent) throw err;
      if (isApiStatus(err, 410)) {
        throw new GoneError(`Cannot watch ${this.#resource}: ${detailOf(err)}`, { cause: err });
      }
      const detail = watchdog.signal.aborted
        ? "no end of the watch from the server in time"
        : detailOf(err);
      const message = `Cannot watch ${this.#resource}: ${detail}`;
      // Broken connections, timeouts and an overloaded apiserver: the resourceVersion is still good.
      const interrupted = err instanceof KubeConnectionError || err instanceof TypeError ||
        isApiStatus(err, 429, 500, 502, 503, 504) || watchdog.signal.aborted;
      if (interrupted) throw new WatchInterrupted(message, { cause: err });
      throw new Error(message, { cause: err });
    } finally {
      clearTimeout(timer);
    }
  }

  #handleEvent(event: WatchEvent<T>): void {
    const obj = event.object;
    if (event.type === "ERROR") {
      // A Status; its fields are read as what they are, whatever the stream carried.
      const status = obj as unknown as Record<string, unknown>;
      const code = typeof status.code === "number" ? status.code : undefined;
      const reason = typeof status.reason === "string" ? status.reason : "";
      const message = typeof status.message === "string" ? status.message : "";
      const err = new KubeApiError(
        `Cannot watch ${this.#resource}: ${code} ${reason}: ${message}`,
        { status: code ?? 500, reason, apiMessage: message },
      );
      if (code === 410) throw new GoneError(err.message, { cause: err });
      throw err;
    }
    const rv = obj.metadata?.resourceVersion;
    if (event.type === "BOOKMARK") {
      if (rv) this.#resourceVersion = rv;
      return;
    }
    const key = objectKey(obj);
    const old = this.#store.get(key);
    if (event.type === "DELETED") {
      this.#store.delete(key);
      this.#emit((h) => h.onDelete?.(old ?? obj));
    } else if (event.type === "ADDED" || event.type === "MODIFIED") {
      const stored = this.#transform(obj);
      this.#store.set(key, stored);
      if (old) this.#emit((h) => h.onUpdate?.(old, stored));
      else this.#emit((h) => h.onAdd?.(stored));
    } else {
      throw new MalformedWatchEvent(
        `Cannot watch ${this.#resource}: unknown event type "${String(event.type)}"`,
      );
    }
    if (rv) this.#resourceVersion = rv;
  }

  #transform(obj: T): T {
    return this.#options.transform ? this.#options.transform(obj) : obj;
  }

  #emit(call: (h: InformerHandlers<T>) => void): void {
    for (const h of this.#handlers) {
      try {
        call(h);
      } catch (err) {
        logger.error("Informer handler failed", { resource: this.#resource, error: detailOf(err) });
      }
    }
  }

  #reportError(err: Error): void {
    try {
      this.#options.onError?.(err);
    } catch {
      // A failing error callback must not stop the loop.
    }
  }
}

function parseEvent<T extends KubeObject>(line: string, resource: string): WatchEvent<T> {
  let event: WatchEvent<T>;
  try {
    event = JSON.parse(line);
  } catch (err) {
    throw new MalformedWatchEvent(
      `Cannot watch ${resource}: invalid JSON in the watch stream: ${detailOf(err)}`,
      { cause: err },
    );
  }
  if (!isJsonObject(event) || typeof event.type !== "string") {
    throw new MalformedWatchEvent(
      `Cannot watch ${resource}: malformed watch event: ${line.slice(0, 200)}`,
    );
  }
  // What the store keeps and the handlers get is an object with a name, whatever came.
  const fault = event.type === "ERROR"
    ? (isJsonObject(event.object) ? undefined : "the status is not a JSON object")
    : objectFault(event.object, event.type === "BOOKMARK");
  if (fault) {
    throw new MalformedWatchEvent(
      `Cannot watch ${resource}: malformed watch event: ${fault}: ${line.slice(0, 200)}`,
    );
  }
  return event;
}

function isJsonObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/**
 * Why `value` cannot be stored (undefined when it can): an object whose metadata names it,
 * with string namespace and resourceVersion when it has them. A bookmark needs no name.
 */
function objectFault(value: unknown, bookmark = false): string | undefined {
  if (!isJsonObject(value)) return "the object is not a JSON object";
  const meta = value.metadata;
  if (!isJsonObject(meta)) return "the object has no metadata";
  if (!bookmark && (typeof meta.name !== "string" || meta.name === "")) {
    return "the object has no name";
  }
  for (const field of ["namespace", "resourceVersion"]) {
    if (meta[field] !== undefined && typeof meta[field] !== "string") {
      return `the object's ${field} is not a string`;
    }
  }
  return undefined;
}

/** Why a LIST page cannot be read (undefined when it can). */
function listFault(page: unknown): string | undefined {
  if (!isJsonObject(page)) return "the answer is not a JSON object";
  if (page.items !== undefined && page.items !== null && !Array.isArray(page.items)) {
    return "items is not an array";
  }
  const meta = page.metadata;
  if (meta !== undefined && !isJsonObject(meta)) return "the list's metadata is not an object";
  for (const field of ["resourceVersion", "continue"]) {
    if (meta?.[field] !== undefined && typeof meta[field] !== "string") {
      return `the list's ${field} is not a string`;
    }
  }
  for (const item of (page.items ?? []) as unknown[]) {
    const fault = objectFault(item);
    if (fault) return fault;
  }
  return undefined;
}

/**
 * The longest line {@linkcode jsonLines} reads, in characters: one watch event, far above
 * the largest object an apiserver stores (etcd refuses values over 1.5 MiB by default). A
 * stream whose line goes past it is refused, not buffered while it lasts.
 */
const MAX_LINE = 16 * 1024 * 1024;

/**
 * Splits a byte stream into non-empty lines (newline-delimited JSON); throws when a line
 * is longer than 16 Mi characters. Aborting `signal` cancels the stream, so a reader
 * blocked on a quiet watch ends at once (Deno does not always end a response body when
 * its fetch signal aborts later).
 */
export async function* jsonLines(
  body: ReadableStream<Uint8Array>,
  signal?: AbortSignal,
): AsyncGenerator<string> {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  // The stream may already be closed or errored; cancel() only frees it.
  const cancel = () => reader.cancel().catch(() => {});
  signal?.addEventListener("abort", cancel, { once: true });
  if (signal?.aborted) cancel();
  // The pieces of the line not ended yet. Each chunk is searched once and a line joined
  // once: searching all that is held on every chunk costs a long line's reader time in the
  // square of its length.
  let pieces: string[] = [];
  let held = 0;
  const tooLong = () =>
    new Error(`Cannot read the watch stream: a line is longer than ${MAX_LINE} characters`);
  try {
    while (true) {
      const { value, done } = await reader.read();
      if (done) break;
      let from = 0;
      for (let nl = value.indexOf("\n"); nl >= 0; nl = value.indexOf("\n", from)) {
        if (held + nl - from > MAX_LINE) throw tooLong();
        pieces.push(value.slice(from, nl));
        const line = pieces.join("").trim();
        pieces = [];
        held = 0;
        from = nl + 1;
        if (line) yield line;
      }
      if (from < value.length) {
        held += value.length - from;
        if (held > MAX_LINE) throw tooLong();
        pieces.push(value.slice(from));
      }
    }
    const rest = pieces.join("").trim();
    if (rest) yield rest;
  } finally {
    signal?.removeEventListener("abort", cancel);
    // The stream may already be closed or errored; cancel() only frees it.
    await reader.cancel().catch(() => {});
  }
}

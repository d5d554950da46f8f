/**
 * A rate-limited work queue with client-go's workqueue semantics:
 * - dedup: a key waiting in the queue is queued once, however often it is added;
 * - a key is never handed to two workers at once;
 * - a key added while a worker holds it is handed out again after `done(key)`;
 * - `addRateLimited` delays by the rate limiter (per-key exponential backoff combined
 *   with an overall token bucket), `forget` resets a key's backoff;
 * - `addAfter` delays a key, keeping the earliest time when added twice.
 *
 * @module
 */

/** Decides how long a key waits before it is requeued. */
export interface RateLimiter<K> {
  /** The delay in ms for the next requeue of `key` (and records the requeue). */
  when(key: K): number;
  /** Stops tracking `key`: its next delay starts over. */
  forget(key: K): void;
  /** How many times `key` was requeued since the last `forget`. */
  numRequeues(key: K): number;
}

/** Per-key exponential backoff: base, 2*base, 4*base, ... capped at max (client-go's ItemExponentialFailureRateLimiter). */
export class ItemExponentialRateLimiter<K> implements RateLimiter<K> {
  readonly #baseMs: number;
  readonly #maxMs: number;
  readonly #failures = new Map<K, number>();

  /** Defaults: 5 ms doubling to 1000 s, as client-go's controller default. */
  constructor(baseMs = 5, maxMs = 1_000_000) {
    this.#baseMs = baseMs;
    this.#maxMs = maxMs;
  }

  /** See {@linkcode RateLimiter.when}. */
  when(key: K): number {
    const failures = this.#failures.get(key) ?? 0;
    this.#failures.set(key, failures + 1);
    const delay = this.#baseMs * 2 ** failures;
    return Number.isFinite(delay) ? Math.min(delay, this.#maxMs) : this.#maxMs;
  }

  /** See {@linkcode RateLimiter.forget}. */
  forget(key: K): void {
    this.#failures.delete(key);
  }

  /** See {@linkcode RateLimiter.numRequeues}. */
  numRequeues(key: K): number {
    return this.#failures.get(key) ?? 0;
  }
}

/**
 * An overall token bucket (client-go's BucketRateLimiter over golang.org/x/time/rate):
 * `burst` requeues at once, then `qps` per second. Each call reserves a token; the
 * delay is how long until that token exists.
 */
export class BucketRateLimiter<K> implements RateLimiter<K> {
  readonly #qps: number;
  readonly #burst: number;
  readonly #now: () => number;
  #tokens: number;
  #last: number;

  /** Defaults: 10 qps, burst 100. `now` is injectable for tests. */
  constructor(qps = 10, burst = 100, now: () => number = performance.now.bind(performance)) {
    this.#qps = qps;
    this.#burst = burst;
    this.#now = now;
    this.#tokens = burst;
    this.#last = now();
  }

  /** See {@linkcode RateLimiter.when}. */
  when(_key: K): number {
    const now = this.#now();
    this.#tokens = Math.min(this.#burst, this.#tokens + ((now - this.#last) / 1000) * this.#qps);
    this.#last = now;
    this.#tokens -= 1;
    return this.#tokens >= 0 ? 0 : (-this.#tokens / this.#qps) * 1000;
  }

  /** The bucket does not track keys. */
  forget(_key: K): void {}

  /** The bucket does not track keys. */
  numRequeues(_key: K): number {
    return 0;
  }
}

/** The longest delay of several limiters (client-go's MaxOfRateLimiter). */
export class MaxOfRateLimiter<K> implements RateLimiter<K> {
  readonly #limiters: RateLimiter<K>[];

  /** Combines `limiters`; every one records every requeue. */
  constructor(...limiters: RateLimiter<K>[]) {
    this.#limiters = limiters;
  }

  /** See {@linkcode RateLimiter.when}. */
  when(key: K): number {
    let max = 0;
    for (const l of this.#limiters) max = Math.max(max, l.when(key));
    return max;
  }

  /** See {@linkcode RateLimiter.forget}. */
  forget(key: K): void {
    for (const l of this.#limiters) l.forget(key);
  }

  /** See {@linkcode RateLimiter.numRequeues}. */
  numRequeues(key: K): number {
    let max = 0;
    for (const l of this.#limiters) max = Math.max(max, l.numRequeues(key));
    return max;
  }
}

/** client-go's DefaultControllerRateLimiter: max(5 ms..1000 s per key, 10 qps burst 100). */
export function defaultControllerRateLimiter<K>(): RateLimiter<K> {
  return new MaxOfRateLimiter<K>(
    new ItemExponentialRateLimiter<K>(5, 1_000_000),
    new BucketRateLimiter<K>(10, 100),
  );
}

/** Options of {@linkcode WorkQueue}. */
export interface WorkQueueOptions<K> {
  /** Defaults to {@linkcode defaultControllerRateLimiter}. */
  rateLimiter?: RateLimiter<K>;
}

/** The bucket bounds of the queue's histograms, seconds (client-go's: 10 ns to 10 s). */
export const QUEUE_DURATION_BUCKETS: readonly number[] = Array.from(
  { length: 10 },
  (_, i) => Number((1e-8 * 10 ** i).toPrecision(1)),
);

/** A histogram's counts: `counts[i]` observations at most `bounds[i]`, `overflow` above. */
export interface QueueHistogram {
  /** Upper bounds, seconds. */
  bounds: readonly number[];
  /** Observations per bucket (not cumulative). */
  counts: number[];
  /** Observations above the last bound. */
  overflow: number;
  /** Sum of the observations, seconds. */
  sum: number;
}

function newHistogram(): QueueHistogram {
  return {
    bounds: QUEUE_DURATION_BUCKETS,
    counts: QUEUE_DURATION_BUCKETS.map(() => 0),
    overflow: 0,
    sum: 0,
  };
}

function observe(h: QueueHistogram, seconds: number): void {
  h.sum += seconds;
  const i = h.bounds.findIndex((b) => seconds <= b);
  if (i < 0) h.overflow++;
  else h.counts[i]++;
}

/** What a queue reports about itself (client-go's workqueue metrics). */
export interface QueueStats {
  /** Keys waiting now. */
  depth: number;
  /** Adds since start. */
  adds: number;
  /** Rate-limited re-adds since start. */
  retries: number;
  /** Time keys waited before a worker took them. */
  queueDuration: QueueHistogram;
  /** Time workers held keys. */
  workDuration: QueueHistogram;
  /** Seconds of work in progress, summed over the keys held now. */
  unfinishedWorkSeconds: number;
  /** Seconds the longest-held key has been held. */
  longestRunningSeconds: number;
}

/** A deduplicating, rate-limited queue of keys; see the module doc for the rules. */
export class WorkQueue<K = string> {
  readonly #rateLimiter: RateLimiter<K>;
  /** When each queued key was added, and each held key taken (ms), for the stats. */
  readonly #addedAt = new Map<K, number>();
  readonly #takenAt = new Map<K, number>();
  #adds = 0;
  #retries = 0;
  readonly #queueDuration = newHistogram();
  readonly #workDuration = newHistogram();
  /** Keys waiting to be handed out, in order. */
  #queue: K[] = [];
  /** Keys that need processing (queued, or re-added while processing). */
  readonly #dirty = new Set<K>();
  /** Keys a worker holds. */
  readonly #processing = new Set<K>();
  /** Delayed adds: key -> when it is due and its timer. */
  readonly #waiting = new Map<K, { at: number; timer: ReturnType<typeof setTimeout> }>();
  /** Workers blocked in get(). */
  #getters: ((key: K | undefined) => void)[] = [];
  /** Resolvers of shutDownWithDrain(), waiting for processing to empty. */
  #drainers: (() => void)[] = [];
  #shuttingDown = false;

  /** Creates an empty queue. */
  constructor(options?: WorkQueueOptions<K>) {
    this.#rateLimiter = options?.rateLimiter ?? defaultControllerRateLimiter<K>();
  }

  /** Adds `key` now (no-op if it is already queued, or after shutdown). */
  add(key: K): void {
    if (this.#shuttingDown || this.#dirty.has(key)) return;
    this.#adds++;
    if (!this.#addedAt.has(key)) this.#addedAt.set(key, performance.now());
    this.#dirty.add(key);
    if (this.#processing.has(key)) return;
    this.#enqueue(key);
  }

  /** Hands a dirty key to a waiting worker, or queues it. */
  #enqueue(key: K): void {
    const getter = this.#getters.shift();
    if (getter) {
      this.#dirty.delete(key);
      this.#processing.add(key);
      this.#taken(key);
      getter(key);
      return;
    }
    this.#queue.push(key);
  }

  /** Number of keys waiting to be handed out (not counting delayed ones). */
  len(): number {
    return this.#queue.length;
  }

  /**
   * The next key to work on; the caller must call `done(key)` when finished. Resolves
   * `undefined` once the queue is shut down and empty (queued keys are still handed out).
   */
  get(): Promise<K | undefined> {
    const key = this.#queue.shift();
    if (key !== undefined) {
      this.#dirty.delete(key);
      this.#processing.add(key);
      this.#taken(key);
      return Promise.resolve(key);
    }
    if (this.#shuttingDown) return Promise.resolve(undefined);
    return new Promise((resolve) => this.#getters.push(resolve));
  }

  #taken(key: K): void {
    const now = performance.now();
    const added = this.#addedAt.get(key);
    this.#addedAt.delete(key);
    if (added !== undefined) observe(this.#queueDuration, (now - added) / 1000);
    this.#takenAt.set(key, now);
  }

  /** The queue's counters and timings now. */
  stats(): QueueStats {
    const now = performance.now();
    let unfinished = 0;
    let longest = 0;
    for (const at of this.#takenAt.values()) {
      const seconds = (now - at) / 1000;
      unfinished += seconds;
      longest = Math.max(longest, seconds);
    }
    return {
      depth: this.#queue.length,
      adds: this.#adds,
      retries: this.#retries,
      queueDuration: structuredClone(this.#queueDuration),
      workDuration: structuredClone(this.#workDuration),
      unfinishedWorkSeconds: unfinished,
      longestRunningSeconds: longest,
    };
  }

  /** Marks `key` finished; if it was added meanwhile it goes back into the queue. */
  done(key: K): void {
    const taken = this.#takenAt.get(key);
    this.#takenAt.delete(key);
    if (taken !== undefined) observe(this.#workDuration, (performance.now() - taken) / 1000);
    this.#processing.delete(key);
    // A key added before shutdown while a worker held it is still handed out (as client-go).
    if (this.#dirty.has(key)) this.#enqueue(key);
    if (this.#processing.size === 0) {
      for (const d of this.#drainers.splice(0)) d();
    }
  }

  /** Adds `key` after `delayMs` (at once if <= 0); of two pending delays the earlier wins. */
  addAfter(key: K, delayMs: number): void {
    if (this.#shuttingDown) return;
    if (delayMs <= 0) {
      this.add(key);
      return;
    }
    const at = performance.now() + delayMs;
    const pending = this.#waiting.get(key);
    if (pending) {
      if (pending.at <= at) return;
      clearTimeout(pending.timer);
    }
    const timer = setTimeout(() => {
      this.#waiting.delete(key);
      this.add(key);
    }, delayMs);
    this.#waiting.set(key, { at, timer });
  }

  /** Adds `key` after the delay the rate limiter gives it (backoff on repeated failures). */
  addRateLimited(key: K): void {
    this.#retries++;
    this.addAfter(key, this.#rateLimiter.when(key));
  }

  /** Resets `key`'s backoff (call after a successful sync). */
  forget(key: K): void {
    this.#rateLimiter.forget(key);
  }

  /** How many times `key` was rate-limited since the last `forget`. */
  numRequeues(key: K): number {
    return this.#rateLimiter.numRequeues(key);
  }

  /** Whether shutDown() was called. */
  shuttingDown(): boolean {
    return this.#shuttingDown;
  }

  /**
   * Stops accepting keys and cancels delayed adds. Blocked `get()` calls resolve
   * `undefined`; keys already queued are still handed out.
   */
  shutDown(): void {
    this.#shuttingDown = true;
    for (const { timer } of this.#waiting.values()) clearTimeout(timer);
    this.#waiting.clear();
    for (const g of this.#getters.splice(0)) g(undefined);
  }

  /** Shuts down, then resolves once every key a worker holds is `done`. */
  shutDownWithDrain(): Promise<void> {
    this.shutDown();
    if (this.#processing.size === 0) return Promise.resolve();
    return new Promise((resolve) => this.#drainers.push(resolve));
  }
}

/**
 * client-go's token bucket for apiserver requests: `burst` requests at once, then `qps` a
 * second. virt-handler's client takes one token per request (a retry and a watch's start
 * included), with the KubeVirt CR's `handlerConfiguration.restClient.rateLimiter` (50 QPS,
 * burst 100 by default), and swaps the bucket when the CR changes.
 *
 * @module
 */

/** A rate: requests per second and how many may go at once. */
export interface RateLimit {
  /** Requests a second, once the burst is spent. */
  qps: number;
  /** Requests at once. */
  burst: number;
}

/** Whether `limit` is a rate a bucket can keep (both positive and finite). */
export function usableRateLimit(limit: RateLimit): boolean {
  return Number.isFinite(limit.qps) && limit.qps > 0 && Number.isFinite(limit.burst) &&
    limit.burst >= 1;
}

/** A token bucket; {@linkcode TokenBucket.take} waits for a token. */
export class TokenBucket {
  /** The rate it keeps. */
  readonly limit: RateLimit;
  readonly #now: () => number;
  #tokens: number;
  #at: number;

  /** A full bucket of `limit` (check it with {@linkcode usableRateLimit} first). */
  constructor(limit: RateLimit, now: () => number = () => performance.now()) {
    this.limit = { ...limit };
    this.#now = now;
    this.#tokens = limit.burst;
    this.#at = now();
  }

  /**
   * Takes a token: resolves at once when one is left, else when it has been refilled (the
   * token is reserved now, so callers are served in order). Rejects when `signal` aborts.
   */
  take(signal?: AbortSignal): Promise<void> {
    const waitMs = this.reserve();
    if (waitMs <= 0) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        signal?.removeEventListener("abort", onAbort);
        resolve();
      }, waitMs);
      const onAbort = () => {
        clearTimeout(timer);
        reject(signal!.reason);
      };
      if (signal?.aborted) return onAbort();
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }

  /** Reserves a token; gives how many milliseconds until it is there (0: now). */
  reserve(): number {
    const now = this.#now();
    this.#tokens = Math.min(
      this.limit.burst,
      this.#tokens + (now - this.#at) / 1000 * this.limit.qps,
    );
    this.#at = now;
    this.#tokens -= 1;
    return this.#tokens >= 0 ? 0 : -this.#tokens / this.limit.qps * 1000;
  }
}

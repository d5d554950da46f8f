/**
 * Exponential backoff for repeating a recovery action while a failure persists
 * (the shape of KubeVirt's FailRetryManager, used for IO-error resumes).
 *
 * Used for domains paused with reason IOError: the first resume happens at
 * once; while the domain keeps pausing, the next tries wait 10 s, 20 s, 40 s ...
 * up to 3 min. When no failure has been seen for 30 s after the last try, the
 * key counts as recovered and starts over.
 *
 * @module
 */

/** Options of {@linkcode FailRetryManager}. */
export interface FailRetryOptions {
  /** Wait before the second try (10 s). */
  initialWaitMs?: number;
  /** Longest wait (3 min). */
  maxWaitMs?: number;
  /** Time after the last try without a failure that counts as recovered (30 s). */
  maxFailResponseMs?: number;
  /** Clock in ms; injectable for tests. */
  now?: () => number;
}

interface RetryState {
  lastTryMs: number;
  waitMs: number;
}

/** Tracks per-key backoff of a recovery action. */
export class FailRetryManager {
  readonly #initialWaitMs: number;
  readonly #maxWaitMs: number;
  readonly #maxFailResponseMs: number;
  readonly #now: () => number;
  readonly #states = new Map<string, RetryState>();

  /** Creates a manager with KubeVirt's timings unless told otherwise. */
  constructor(options: FailRetryOptions = {}) {
    this.#initialWaitMs = options.initialWaitMs ?? 10_000;
    this.#maxWaitMs = options.maxWaitMs ?? 180_000;
    this.#maxFailResponseMs = options.maxFailResponseMs ?? 30_000;
    this.#now = options.now ?? Date.now;
  }

  /**
   * Decides whether to hold the recovery action back. `failing` is whether the
   * failure is present now. Returns `{delay: false}` when the action should run
   * now (and records the try), or the time to wait before looking again.
   */
  shouldDelay(key: string, failing: boolean): { delay: false } | { delay: true; afterMs: number } {
    const now = this.#now();
    const state = this.#states.get(key);
    if (!failing) {
      if (state && now - state.lastTryMs > this.#maxFailResponseMs) this.#states.delete(key);
      return { delay: false };
    }
    if (!state) {
      this.#states.set(key, { lastTryMs: now, waitMs: this.#initialWaitMs });
      return { delay: false };
    }
    const elapsed = now - state.lastTryMs;
    if (elapsed < state.waitMs) return { delay: true, afterMs: state.waitMs - elapsed };
    state.lastTryMs = now;
    state.waitMs = Math.min(state.waitMs * 2, this.#maxWaitMs);
    return { delay: false };
  }

  /** Forgets a key (its VMI is gone). */
  forget(key: string): void {
    this.#states.delete(key);
  }
}

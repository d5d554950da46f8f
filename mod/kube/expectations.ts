/**
 * Controller expectations, as KubeVirt uses them (k8s.io/kubernetes controller_utils'
 * ControllerExpectations plus UIDTrackingControllerExpectations): after the agent
 * writes (or deletes) something for a key it records how many observations it expects;
 * the informer lowers them as it sees the results; the worker skips a key until its
 * expectations are satisfied, so it never acts on a stale cache. A record older than
 * the TTL (5 min) counts as satisfied so a lost watch event cannot wedge a key.
 *
 * @module
 */

/** Default expectation lifetime, as client-go's ExpectationsTimeout. */
export const EXPECTATIONS_TTL_MS = 5 * 60 * 1000;

/** Options of {@linkcode Expectations}. */
export interface ExpectationsOptions {
  /** Expectations older than this are satisfied (default 5 min). */
  ttlMs?: number;
  /** Clock in ms; injectable for tests. */
  now?: () => number;
}

interface ExpectationRecord {
  /** Outstanding writes (creations/updates) to observe. */
  adds: number;
  /** Outstanding deletions to observe (by count). */
  dels: number;
  /** UIDs whose deletion we expect to observe. */
  uids: Set<string>;
  /** When the expectations were last set or raised. */
  setAt: number;
}

/** Per-key expected writes and deletions; see the module doc. */
export class Expectations {
  readonly #records = new Map<string, ExpectationRecord>();
  readonly #ttlMs: number;
  readonly #now: () => number;

  /** Creates an empty set of expectations. */
  constructor(options?: ExpectationsOptions) {
    this.#ttlMs = options?.ttlMs ?? EXPECTATIONS_TTL_MS;
    this.#now = options?.now ?? Date.now;
  }

  /** Replaces `key`'s expectations with `adds` writes and `dels` deletions. */
  setExpectations(key: string, adds: number, dels: number): void {
    this.#records.set(key, { adds, dels, uids: new Set(), setAt: this.#now() });
  }

  /** Expects `n` more writes of `key` to be observed (call before the write). */
  expectWrites(key: string, n = 1): void {
    this.raise(key, n, 0);
  }

  /** Expects the deletion of each of `uids` under `key` to be observed. */
  expectDeletions(key: string, uids: string[]): void {
    const rec = this.#record(key);
    for (const uid of uids) rec.uids.add(uid);
    rec.setAt = this.#now();
  }

  /** Adds to `key`'s outstanding writes and deletions. */
  raise(key: string, adds: number, dels: number): void {
    const rec = this.#record(key);
    rec.adds += adds;
    rec.dels += dels;
    rec.setAt = this.#now();
  }

  /** Lowers `key`'s outstanding writes and deletions. */
  lower(key: string, adds: number, dels: number): void {
    const rec = this.#records.get(key);
    if (!rec) return;
    rec.adds -= adds;
    rec.dels -= dels;
  }

  /** The informer saw a write of `key` (call from onAdd/onUpdate). */
  writeObserved(key: string): void {
    this.lower(key, 1, 0);
  }

  /** The informer saw `uid` deleted under `key` (call from onDelete). */
  deletionObserved(key: string, uid?: string): void {
    const rec = this.#records.get(key);
    if (!rec) return;
    if (uid !== undefined && rec.uids.delete(uid)) return;
    rec.dels -= 1;
  }

  /** The write could not be made (it failed): stop expecting it. */
  writeFailed(key: string): void {
    this.lower(key, 1, 0);
  }

  /**
   * Makes one write of `key` under expectations: expected before it starts, counted as
   * observed at once when `write` says nothing was written (no watch event will come), and
   * forgotten when it throws. Resolves to what `write` resolved to.
   */
  async expectingWrite<T extends { written: boolean }>(
    key: string,
    write: () => Promise<T>,
  ): Promise<T> {
    this.expectWrites(key);
    try {
      const result = await write();
      if (!result.written) this.writeObserved(key);
      return result;
    } catch (error) {
      this.writeFailed(key);
      throw error;
    }
  }

  /**
   * Whether `key` may be acted on: no record, every expectation observed, or the
   * record is older than the TTL.
   */
  satisfied(key: string): boolean {
    const rec = this.#records.get(key);
    if (!rec) return true;
    if (rec.adds <= 0 && rec.dels <= 0 && rec.uids.size === 0) return true;
    return this.#now() - rec.setAt > this.#ttlMs;
  }

  /** Outstanding counts of `key`, for logs and tests. */
  get(key: string): { adds: number; dels: number; uids: string[] } | undefined {
    const rec = this.#records.get(key);
    return rec ? { adds: rec.adds, dels: rec.dels, uids: [...rec.uids] } : undefined;
  }

  /** Forgets `key` (call when the object is gone for good). */
  delete(key: string): void {
    this.#records.delete(key);
  }

  #record(key: string): ExpectationRecord {
    let rec = this.#records.get(key);
    if (!rec) {
      rec = { adds: 0, dels: 0, uids: new Set(), setAt: this.#now() };
      this.#records.set(key, rec);
    }
    return rec;
  }
}

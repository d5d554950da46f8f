/**
 * The worker loop every controller of the handler runs (KubeVirt's `Execute`): take a key,
 * reconcile it, and do what the reconcile returned with the key — forget it, look again
 * after a while, or (on a thrown error) requeue it with per-key exponential backoff. Only
 * this loop takes keys from and puts them back on a queue; event sources only add keys.
 *
 * @module
 */
import type { WorkQueue } from "../kube/mod.ts";
import type { Logger } from "../log/mod.ts";
import { aborted } from "../lifecycle/mod.ts";

/** What a reconcile asks of the worker loop. */
export type ReconcileResult =
  | { readonly kind: "done" }
  | { readonly kind: "requeueAfter"; readonly ms: number; readonly reason: string };

/** Nothing more to do for the key until an event wakes it. */
export const DONE: ReconcileResult = Object.freeze({ kind: "done" });

/** Look at the key again after `ms`, for `reason`. */
export function requeueAfter(ms: number, reason: string): ReconcileResult {
  return { kind: "requeueAfter", ms: Math.max(0, Math.round(ms)), reason };
}

/** The sooner of two results (`done` is the latest). */
export function sooner(a: ReconcileResult, b: ReconcileResult): ReconcileResult {
  if (a.kind === "done") return b;
  if (b.kind === "done") return a;
  return b.ms < a.ms ? b : a;
}

/** Counts of finished reconciles, by outcome. */
export interface SyncCounts {
  /** Reconciles that returned. */
  success: number;
  /** Reconciles that threw. */
  error: number;
}

/** One worker: runs until the queue shuts down. */
export async function workerLoop(
  queue: WorkQueue<string>,
  reconcile: (key: string) => Promise<ReconcileResult>,
  o: { log: Logger; counts?: SyncCounts },
): Promise<void> {
  for (;;) {
    const key = await queue.get();
    if (key === undefined) return;
    try {
      const result = await reconcile(key);
      if (o.counts) o.counts.success++;
      queue.forget(key);
      if (result.kind === "requeueAfter") {
        o.log.debug("Requeue {key} after {ms} ms: {reason}", { key, ...result });
        queue.addAfter(key, result.ms);
      }
    } catch (error) {
      o.log.error("Sync of {key} failed, retrying with backoff: {error}", { key, error });
      if (o.counts) o.counts.error++;
      queue.addRateLimited(key);
    } finally {
      queue.done(key);
    }
  }
}

/**
 * Runs `workers` worker loops once `ready` resolves, until `signal` aborts; then the
 * queue takes no new keys, in-flight reconciles finish, and this resolves.
 */
export async function runWorkers(
  queue: WorkQueue<string>,
  reconcile: (key: string) => Promise<ReconcileResult>,
  o: {
    workers: number;
    log: Logger;
    counts?: SyncCounts;
    ready?: Promise<unknown>;
    onStarted?: () => void;
  },
  signal: AbortSignal,
): Promise<void> {
  await Promise.race([o.ready ?? Promise.resolve(), aborted(signal)]);
  const loops: Promise<void>[] = [];
  if (!signal.aborted) {
    for (let i = 0; i < o.workers; i++) loops.push(workerLoop(queue, reconcile, o));
    o.onStarted?.();
  }
  await aborted(signal);
  await queue.shutDownWithDrain();
  await Promise.all(loops);
}

/**
 * The worker loop every controller of the handler runs (KubeVirt's `Execute`): take a key,
 * reconcile it, and do what the reconcile returned with the key — forget it, look again
 * after a while, or (on a thrown error) requeue it with per-key exponential backoff. Only
 * this loop takes keys from and puts them back on a queue; event sources only add keys.
 * {@linkcode KeyedController} is the base the handler's VMI-keyed controllers share.
 *
 * @module
 */
import type { VirtualMachineInstance } from "../api/mod.ts";
import type { EventRecorder, WorkQueue } from "../kube/mod.ts";
import type { Logger } from "../log/mod.ts";
import { aborted } from "../lifecycle/mod.ts";
import { recordVmiEvent } from "./_vmi.ts";

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

/** What a {@linkcode KeyedController} runs on. */
export interface KeyedControllerParts {
  /** The keys (`namespace/name`) to reconcile; event sources only add to it. */
  queue: WorkQueue<string>;
  /** How many worker loops run. */
  workers: number;
  /** The controller's logger. */
  log: Logger;
  /** Where a VMI's Events go. */
  recorder: EventRecorder;
  /** What must have happened before the first reconcile (the informer's first list). */
  ready: () => Promise<unknown>;
  /** Reconciles counted by outcome, where someone reads them. */
  counts?: SyncCounts;
  /** Called once the workers started. */
  onStarted?: () => void;
}

/**
 * What the handler's VMI-keyed controllers share: a key is woken onto the queue, workers
 * run {@linkcode KeyedController.reconcile} once the controller is ready, and Events about
 * a VMI go through one path. Each controller says only how it reconciles a key.
 */
export abstract class KeyedController {
  readonly #parts: KeyedControllerParts;

  /** Takes the queue, workers and recorder the controller runs on. */
  protected constructor(parts: KeyedControllerParts) {
    this.#parts = parts;
  }

  /** Wakes a key: it is reconciled again soon. */
  wake(key: string): void {
    this.#parts.queue.add(key);
  }

  /**
   * Runs the workers once the controller is ready, until `signal` aborts; then the queue
   * takes no new keys, in-flight reconciles finish, and this resolves.
   */
  async run(signal: AbortSignal): Promise<void> {
    const p = this.#parts;
    await runWorkers(p.queue, (key) => this.reconcile(key), {
      workers: p.workers,
      log: p.log,
      counts: p.counts,
      ready: p.ready(),
      onStarted: p.onStarted,
    }, signal);
  }

  /** One look at a key; what to do with it next is the result. */
  abstract reconcile(key: string): Promise<ReconcileResult>;

  /** Records an Event about `vmi` (and logs it, as KubeVirt's recorder does). */
  protected record(
    vmi: VirtualMachineInstance,
    type: "Normal" | "Warning",
    reason: string,
    message: string,
  ): void {
    recordVmiEvent(this.#parts.recorder, this.#parts.log, vmi, { type, reason, message });
  }
}

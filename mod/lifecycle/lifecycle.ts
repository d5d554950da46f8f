/**
 * One lifecycle for everything that runs until it is told to stop, in the shape of
 * controller-runtime's `Runnable` and the kubelet's `wait.Until`:
 *
 * - a {@linkcode Runnable}'s `run(signal)` starts the work, resolves once the signal
 *   has aborted and the work has wound down, and rejects only when the work failed
 *   for good;
 * - {@linkcode every} repeats a function until the signal aborts;
 * - {@linkcode sleep} waits, ending early when the signal aborts, and
 *   {@linkcode orAborted} waits for a promise the same way; both take their abort
 *   listener off again, so loops that run for months under one signal hold nothing per
 *   round;
 * - {@linkcode runStages} runs groups of runnables under one signal and stops them in
 *   order: the first group has wound down before the second is told to stop, so a node
 *   agent can say "unschedulable" before it drains, and drain before it closes the
 *   connections the drain needs.
 *
 * @module
 */
import { errorText } from "../../ffi/mod.ts";

/** Something long-running: it works until `signal` aborts, then winds down and resolves. */
export interface Runnable {
  /** A short name for logs and errors, e.g. `"heartbeat"`. */
  readonly name: string;
  /** Works until `signal` aborts; resolves once everything it started has ended. */
  run(signal: AbortSignal): Promise<void>;
}

/** Resolves after `ms`, or as soon as `signal` aborts; never rejects. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const timer = setTimeout(done, Math.max(0, ms));
    signal?.addEventListener("abort", done, { once: true });
    function done() {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
  });
}

/**
 * Resolves when `signal` aborts (at once when it has already). Its listener stays until
 * then: for a wait that ends either way, in a loop, use {@linkcode orAborted}.
 */
export function aborted(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    signal.addEventListener("abort", () => resolve(), { once: true });
  });
}

/**
 * Settles as `promise` does, or resolves with undefined as soon as `signal` aborts. The
 * abort listener goes as soon as either happens, so a loop can wait like this every round
 * under one long-lived signal without piling listeners (and what they hold) onto it.
 */
export function orAborted<T>(promise: Promise<T>, signal: AbortSignal): Promise<T | undefined> {
  if (signal.aborted) return Promise.resolve(undefined);
  return new Promise<T | undefined>((resolve, reject) => {
    const onAbort = () => resolve(undefined);
    signal.addEventListener("abort", onAbort, { once: true });
    const off = () => signal.removeEventListener("abort", onAbort);
    promise.then((value) => {
      off();
      resolve(value);
    }, (error) => {
      off();
      reject(error);
    });
  });
}

/** Options of {@linkcode every}. */
export interface EveryOptions {
  /** Run `fn` once at the start instead of after the first interval (default true). */
  immediate?: boolean;
  /** Adds up to `jitter × ms` of random wait to each interval, as `wait.JitterUntil` (default 0). */
  jitter?: number;
  /** Told of an error `fn` threw; the loop goes on. Without it an error ends the loop. */
  onError?: (error: unknown) => void;
  /** Random numbers in [0, 1); injectable for tests. */
  random?: () => number;
}

/**
 * Calls `fn` every `ms` until `signal` aborts; a call in progress is awaited, never
 * overlapped. Resolves once the signal has aborted and the last call has ended.
 */
export async function every(
  ms: number,
  fn: (signal: AbortSignal) => unknown,
  signal: AbortSignal,
  options: EveryOptions = {},
): Promise<void> {
  const random = options.random ?? Math.random;
  if (options.immediate === false) await sleep(ms, signal);
  while (!signal.aborted) {
    try {
      await fn(signal);
    } catch (error) {
      if (!options.onError) throw error;
      options.onError(error);
    }
    if (signal.aborted) break;
    await sleep(ms + random() * (options.jitter ?? 0) * ms, signal);
  }
}

/** A runnable that failed while it was meant to be running; `cause` is its error. */
export class RunnableError extends Error {
  /** The runnable's name. */
  readonly runnable: string;
  /** Creates `Runnable "<name>" failed: <detail>`. */
  constructor(runnable: string, options: { cause: unknown }) {
    const detail = errorText(options.cause);
    super(`Runnable "${runnable}" failed: ${detail}`, options);
    this.name = "RunnableError";
    this.runnable = runnable;
  }
}

/**
 * Runs every runnable of every stage at once, under `signal`. When `signal` aborts
 * (or a runnable fails), the stages are stopped one after the other in the order
 * given: stage N is told to stop once every runnable of stage N-1 has resolved.
 * Resolves when all have ended; rejects with the first {@linkcode RunnableError}.
 */
export async function runStages(
  stages: readonly (readonly Runnable[])[],
  signal: AbortSignal,
): Promise<void> {
  const controllers = stages.map(() => new AbortController());
  let failure: RunnableError | undefined;
  const stopAll = new AbortController();
  const onAbort = () => stopAll.abort();
  signal.addEventListener("abort", onAbort, { once: true });
  if (signal.aborted) stopAll.abort();

  const runs = stages.map((stage, i) =>
    Promise.all(stage.map(async (r) => {
      try {
        await r.run(controllers[i].signal);
      } catch (error) {
        failure ??= new RunnableError(r.name, { cause: error });
        stopAll.abort();
      }
    }))
  );
  await aborted(stopAll.signal);
  for (let i = 0; i < stages.length; i++) {
    controllers[i].abort();
    await runs[i];
  }
  signal.removeEventListener("abort", onAbort);
  if (failure) throw failure;
}

/** A runnable from a name and a function (for small pieces of the composition root). */
export function runnable(name: string, run: (signal: AbortSignal) => Promise<void>): Runnable {
  return { name, run };
}

/**
 * Makes a promise rejection nobody handled a report instead of the end of the process
 * (Deno's default): for a node agent, a dropped write must not take down every VM's
 * management with it. `report` is told of each one.
 */
export function surviveUnhandledRejections(report: (reason: unknown) => void): void {
  globalThis.addEventListener("unhandledrejection", (event) => {
    event.preventDefault();
    report(event.reason);
  });
}

/**
 * Calls run on worker threads, with a typed promise API: the libvirt call workers of one
 * connection, and any other module that answers calls with {@linkcode answerCalls} (the
 * handler's file system work on pod volumes, which a hung mount can stall).
 *
 * Calls wait in one queue and each goes to a worker with nothing to do, so a call that
 * hangs in libvirt (a guest whose QEMU stopped answering its monitor) holds one worker and
 * never a call queued behind it. When the oldest queued call has waited `growAfterMs`
 * and every worker is busy, one more worker is started (up to `max`). A worker whose call
 * has run for `stuckAfterMs` no longer counts toward `min`: another starts beside it at
 * once, so a hung call costs a worker start in the background, not on the path of the
 * next caller (who would otherwise queue, then wait for that start). A worker beyond
 * `min` that stays idle for `retireAfterMs` is ended again (each costs a V8 isolate).
 * A call given a timeout rejects with {@linkcode CallTimeoutError} when it has not ended in
 * time; one that runs keeps its worker until it ends (a thread stuck in a system call cannot
 * be stopped), so at most `max` threads ever wait on a hung file system or daemon.
 *
 * @module
 */

import { CallTimeoutError, errorText, LibvirtError, LibvirtLoadError } from "./errors.ts";
import type { WorkerFailure, WorkerResponse } from "./_libvirt_protocol.ts";

/** The operations a worker module answers, by name: each takes and gives clonable values. */
// deno-lint-ignore no-explicit-any
export type CallOps<Ops> = { [K in keyof Ops]: (...args: any[]) => unknown };

/** The part of a worker's global scope {@linkcode answerCalls} uses. */
interface WorkerScope {
  onmessage: ((event: MessageEvent<CallRequest>) => void) | null;
  postMessage(message: WorkerResponse): void;
}

/** A call as a worker receives it. */
export interface CallRequest {
  /** Matches the response. */
  id: number;
  /** The operation's name. */
  op: string;
  /** Its arguments. */
  args: unknown[];
}

/**
 * Answers the calls a {@linkcode CallWorker} sends, in the worker module that calls it: each
 * runs `ops[op](...args)` (awaited) and answers with its value, or with the message of what
 * it threw (the caller sees `<action>: <message>`). Errors a caller must tell apart are for
 * the operation to return as values.
 */
export function answerCalls(ops: Record<string, (...args: never[]) => unknown>): void {
  const scope = self as unknown as WorkerScope;
  scope.onmessage = async (event: MessageEvent<CallRequest>) => {
    const { id, op, args } = event.data;
    let response: WorkerResponse;
    try {
      if (!Object.hasOwn(ops, op)) throw new Error(`the worker has no operation "${op}"`);
      response = { id, ok: true, value: await ops[op](...(args as never[])) };
    } catch (error) {
      const message = errorText(error);
      response = { id, ok: false, failure: { kind: "internal", message } };
    }
    scope.postMessage(response);
  };
}

interface Pending {
  resolve: (value: unknown) => void;
  reject: (error: Error) => void;
  action: string;
}

/** Turns a worker's failure report into the typed error the caller sees. */
export function failureToError(action: string, failure: WorkerFailure): Error {
  switch (failure.kind) {
    case "libvirt":
      return new LibvirtError(action, failure.details);
    case "load":
      return new LibvirtLoadError(failure.library, "libvirt0", new Error(failure.detail));
    case "internal":
      return new Error(`${action}: ${failure.message}`);
  }
}

/** Options of {@linkcode CallWorker}. */
export interface CallWorkerOptions {
  /** The worker's module; libvirt's call worker unless told. */
  module?: URL;
  /** What the worker is called in errors; `libvirt call worker` unless told. */
  name?: string;
}

/** One worker thread with its own V8 isolate; calls are answered in the order sent. */
export class CallWorker {
  readonly #worker: Worker;
  readonly #name: string;
  readonly #pending = new Map<number, Pending>();
  #nextId = 1;
  #dead: Error | null = null;
  #busySince: number | undefined;
  /** Told when the worker has nothing pending any more. */
  onIdle: (() => void) | undefined;

  /** Starts the worker thread of `options.module` (libvirt's unless told). */
  constructor(options: CallWorkerOptions = {}) {
    this.#name = options.name ?? "libvirt call worker";
    this.#worker = new Worker(options.module ?? new URL("./_libvirt_worker.ts", import.meta.url), {
      type: "module",
    });
    this.#worker.onmessage = (event: MessageEvent<WorkerResponse>) => this.#settle(event.data);
    this.#worker.onerror = (event: ErrorEvent) => {
      event.preventDefault();
      this.#fail(new Error(`${this.#name} failed: ${event.message}`));
    };
  }

  /** Calls sent and not answered yet. */
  get load(): number {
    return this.#pending.size;
  }

  /** Since when (`performance.now()`) the worker has had calls pending, if it has. */
  get busySince(): number | undefined {
    return this.#busySince;
  }

  /** Whether the worker failed or was terminated. */
  get dead(): boolean {
    return this.#dead !== null;
  }

  /** Sends one call; it is answered after every call sent before it. */
  call(op: string, args: unknown[], action: string): Promise<unknown> {
    if (this.#dead) return Promise.reject(new Error(`${action}: ${this.#dead.message}`));
    const id = this.#nextId++;
    this.#busySince ??= performance.now();
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { resolve, reject, action });
      const request: CallRequest = { id, op, args };
      this.#worker.postMessage(request);
    });
  }

  /** Ends the thread; calls still pending are rejected. */
  terminate(): void {
    this.#worker.terminate();
    this.#fail(new Error(`${this.#name} terminated`));
  }

  #settle(response: WorkerResponse): void {
    const pending = this.#pending.get(response.id);
    if (!pending) return;
    this.#pending.delete(response.id);
    if (response.ok) pending.resolve(response.value);
    else pending.reject(failureToError(pending.action, response.failure));
    if (this.#pending.size === 0) {
      this.#busySince = undefined;
      this.onIdle?.();
    }
  }

  #fail(error: Error): void {
    this.#dead ??= error;
    for (const [id, pending] of this.#pending) {
      this.#pending.delete(id);
      pending.reject(new Error(`${pending.action}: ${error.message}`, { cause: error }));
    }
    this.onIdle?.();
  }
}

/** Sizes and timing of a {@linkcode WorkerPool}. */
export interface WorkerPoolOptions {
  /**
   * Workers always running; 0 starts none before the first call and ends each after
   * `retireAfterMs` idle.
   */
  min: number;
  /** Most workers at once; `min` unless told (a fixed pool). */
  max?: number;
  /** Readies a worker started later (loads libvirt, attaches the connection). */
  prepare?: (worker: CallWorker) => Promise<void>;
  /** How long the oldest queued call waits before another worker starts; 25 ms. */
  growAfterMs?: number;
  /** How long a call runs before its worker stops counting toward `min`; 100 ms. */
  stuckAfterMs?: number;
  /** How long a worker beyond `min` may idle before it ends; 30 s. */
  retireAfterMs?: number;
  /** Ends a worker beyond `min` before it is terminated (drops its connection reference). */
  retire?: (worker: CallWorker) => Promise<void>;
  /** Makes a worker; a {@linkcode CallWorker} unless told (tests give stand-ins). */
  newWorker?: () => CallWorker;
}

/** Options of one {@linkcode WorkerPool.call}. */
export interface CallOptions {
  /**
   * Rejects the call with {@linkcode CallTimeoutError} after this many milliseconds: a call
   * still queued leaves the queue; one that runs keeps its worker busy until it ends.
   */
  timeoutMs?: number;
}

interface Queued {
  op: string;
  args: unknown[];
  action: string;
  since: number;
  resolve: (value: unknown) => void;
  reject: (error: Error) => void;
}

/** Workers answering the operations `Ops` (any, unless told); see the module doc. */
// deno-lint-ignore no-explicit-any
export class WorkerPool<Ops extends CallOps<Ops> = Record<string, (...args: any[]) => unknown>> {
  readonly #workers: CallWorker[] = [];
  readonly #queue: Queued[] = [];
  readonly #min: number;
  readonly #max: number;
  readonly #growAfterMs: number;
  readonly #stuckAfterMs: number;
  readonly #retireAfterMs: number;
  readonly #prepare?: (worker: CallWorker) => Promise<void>;
  readonly #retire?: (worker: CallWorker) => Promise<void>;
  readonly #newWorker: () => CallWorker;
  readonly #retireTimers = new Map<CallWorker, ReturnType<typeof setTimeout>>();
  #growTimer: ReturnType<typeof setTimeout> | undefined;
  #stuckTimer: ReturnType<typeof setTimeout> | undefined;
  #growing = false;
  #terminated = false;
  #peak = 0;

  /** Starts `min` workers (`size` for a fixed pool). */
  constructor(options: WorkerPoolOptions | number) {
    const o = typeof options === "number" ? { min: options } : options;
    this.#min = Math.max(0, o.min);
    this.#max = Math.max(this.#min, o.max ?? this.#min);
    this.#growAfterMs = o.growAfterMs ?? 25;
    this.#stuckAfterMs = o.stuckAfterMs ?? 100;
    this.#retireAfterMs = o.retireAfterMs ?? 30_000;
    this.#prepare = o.prepare;
    this.#retire = o.retire;
    this.#newWorker = o.newWorker ?? (() => new CallWorker());
    for (let i = 0; i < this.#min; i++) this.#add(this.#newWorker());
  }

  /** The number of workers now. */
  get size(): number {
    return this.#workers.length;
  }

  /** The most workers there were at once. */
  get peak(): number {
    return this.#peak;
  }

  #add(worker: CallWorker): void {
    worker.onIdle = () => this.#idle(worker);
    this.#workers.push(worker);
    this.#peak = Math.max(this.#peak, this.#workers.length);
  }

  /**
   * Runs `op` on a worker that has nothing else to do, as soon as there is one; with
   * `options.timeoutMs`, rejects with {@linkcode CallTimeoutError} once that has passed.
   */
  call<K extends keyof Ops & string>(
    op: K,
    args: Parameters<Ops[K]>,
    action: string,
    options: CallOptions = {},
  ): Promise<ReturnType<Ops[K]>> {
    if (this.#terminated) {
      return Promise.reject(new Error(`${action}: the call workers are terminated`));
    }
    return new Promise((resolve, reject) => {
      const queued: Queued = {
        op,
        args,
        action,
        since: performance.now(),
        resolve: resolve as (value: unknown) => void,
        reject,
      };
      const timeoutMs = options.timeoutMs;
      if (timeoutMs !== undefined) {
        const timer = setTimeout(() => {
          const at = this.#queue.indexOf(queued);
          if (at >= 0) this.#queue.splice(at, 1);
          reject(new CallTimeoutError(action, timeoutMs));
        }, timeoutMs);
        queued.resolve = (value) => {
          clearTimeout(timer);
          resolve(value as ReturnType<Ops[K]>);
        };
        queued.reject = (error) => {
          clearTimeout(timer);
          reject(error);
        };
      }
      this.#queue.push(queued);
      this.#dispatch();
    });
  }

  #dispatch(): void {
    while (this.#queue.length > 0) {
      const worker = this.#workers.find((w) => w.load === 0 && !w.dead);
      if (!worker) break;
      const timer = this.#retireTimers.get(worker);
      if (timer !== undefined) {
        clearTimeout(timer);
        this.#retireTimers.delete(worker);
      }
      const q = this.#queue.shift()!;
      worker.call(q.op, q.args, q.action).then(q.resolve, q.reject);
      this.#watchStuck();
    }
    if (this.#queue.length > 0) this.#scheduleGrowth();
  }

  /** Looks again when the busy worker that started first will have run `stuckAfterMs`. */
  #watchStuck(): void {
    if (this.#stuckTimer !== undefined || this.#terminated || this.#max <= this.#min) return;
    const since = this.#workers
      .map((w) => w.busySince)
      .filter((t): t is number => t !== undefined);
    const now = performance.now();
    const fresh = since.filter((t) => now - t < this.#stuckAfterMs);
    if (fresh.length === 0) return;
    this.#stuckTimer = setTimeout(() => {
      this.#stuckTimer = undefined;
      this.#replaceStuck();
    }, Math.min(...fresh) + this.#stuckAfterMs - now);
  }

  /** Starts a worker beside those stuck in a call, while fewer than `min` would answer. */
  #replaceStuck(): void {
    if (this.#terminated) return;
    const now = performance.now();
    const answering =
      this.#workers.filter((w) =>
        !w.dead && (w.busySince === undefined || now - w.busySince < this.#stuckAfterMs)
      ).length;
    if (answering < this.#min) void this.#grow(true);
    this.#watchStuck();
  }

  #scheduleGrowth(): void {
    if (this.#growTimer !== undefined || this.#growing) return;
    if (this.#workers.length >= this.#max) return;
    const waited = performance.now() - this.#queue[0].since;
    this.#growTimer = setTimeout(() => {
      this.#growTimer = undefined;
      if (this.#queue.length > 0) void this.#grow();
    }, Math.max(0, this.#growAfterMs - waited));
  }

  async #grow(spare = false): Promise<void> {
    if (this.#growing || this.#terminated || this.#workers.length >= this.#max) return;
    if (!spare && this.#workers.some((w) => w.load === 0 && !w.dead)) return this.#dispatch();
    this.#growing = true;
    const worker = this.#newWorker();
    try {
      await this.#prepare?.(worker);
      if (this.#terminated) {
        worker.terminate();
        return;
      }
      this.#add(worker);
    } catch {
      // The queued calls stay queued: the busy workers will take them.
      worker.terminate();
    } finally {
      this.#growing = false;
    }
    this.#dispatch();
  }

  #idle(worker: CallWorker): void {
    if (this.#terminated) return;
    if (worker.dead) {
      this.#drop(worker);
      return;
    }
    this.#dispatch();
    if (worker.load > 0 || this.#workers.indexOf(worker) < this.#min) return;
    if (this.#retireTimers.has(worker)) return;
    const timer = setTimeout(() => {
      this.#retireTimers.delete(worker);
      if (worker.load > 0 || this.#workers.length <= this.#min) return;
      this.#drop(worker);
      // The worker is terminated either way, which frees whatever retiring it did not.
      (this.#retire?.(worker) ?? Promise.resolve()).catch(() => {}).finally(() =>
        worker.terminate()
      );
    }, this.#retireAfterMs);
    // An idle worker's retirement keeps no process alive that is otherwise done.
    Deno.unrefTimer(timer);
    this.#retireTimers.set(worker, timer);
  }

  #drop(worker: CallWorker): void {
    const i = this.#workers.indexOf(worker);
    if (i >= 0) this.#workers.splice(i, 1);
    const timer = this.#retireTimers.get(worker);
    if (timer !== undefined) clearTimeout(timer);
    this.#retireTimers.delete(worker);
  }

  /** Runs `op` on every worker (in order) and returns the results. */
  async each<K extends keyof Ops & string>(
    op: K,
    args: Parameters<Ops[K]>,
    action: string,
  ): Promise<ReturnType<Ops[K]>[]> {
    return await Promise.all(
      this.#workers.map((w) => w.call(op, args, action) as Promise<ReturnType<Ops[K]>>),
    );
  }

  /** Runs `op` on the first worker only. */
  first<K extends keyof Ops & string>(
    op: K,
    args: Parameters<Ops[K]>,
    action: string,
  ): Promise<ReturnType<Ops[K]>> {
    return this.#workers[0].call(op, args, action) as Promise<ReturnType<Ops[K]>>;
  }

  /** Runs `op` on every worker but the first. */
  async rest<K extends keyof Ops & string>(
    op: K,
    args: Parameters<Ops[K]>,
    action: string,
  ): Promise<void> {
    await Promise.all(this.#workers.slice(1).map((w) => w.call(op, args, action)));
  }

  /** Terminates all workers; pending and queued calls are rejected. */
  terminate(): void {
    this.#terminated = true;
    clearTimeout(this.#growTimer);
    clearTimeout(this.#stuckTimer);
    for (const timer of this.#retireTimers.values()) clearTimeout(timer);
    this.#retireTimers.clear();
    for (const w of this.#workers) w.terminate();
    for (const q of this.#queue.splice(0)) {
      q.reject(new Error(`${q.action}: the call workers are terminated`));
    }
  }
}

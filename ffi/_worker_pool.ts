/**
 * A small pool of libvirt call workers with a typed promise API. Private to `ffi/`.
 *
 * @module
 */

import { LibvirtError, LibvirtLoadError } from "./errors.ts";
import type {
  OpName,
  WorkerFailure,
  WorkerOps,
  WorkerRequest,
  WorkerResponse,
} from "./_libvirt_protocol.ts";

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

class CallWorker {
  readonly #worker: Worker;
  readonly #pending = new Map<number, Pending>();
  #nextId = 1;
  #dead: Error | null = null;

  constructor() {
    this.#worker = new Worker(new URL("./_libvirt_worker.ts", import.meta.url), {
      type: "module",
    });
    this.#worker.onmessage = (event: MessageEvent<WorkerResponse>) => this.#settle(event.data);
    this.#worker.onerror = (event: ErrorEvent) => {
      event.preventDefault();
      this.#fail(new Error(`libvirt call worker failed: ${event.message}`));
    };
  }

  get load(): number {
    return this.#pending.size;
  }

  call(op: OpName, args: unknown[], action: string): Promise<unknown> {
    if (this.#dead) return Promise.reject(new Error(`${action}: ${this.#dead.message}`));
    const id = this.#nextId++;
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { resolve, reject, action });
      const request: WorkerRequest = { id, op, args };
      this.#worker.postMessage(request);
    });
  }

  terminate(): void {
    this.#worker.terminate();
    this.#fail(new Error("libvirt call worker terminated"));
  }

  #settle(response: WorkerResponse): void {
    const pending = this.#pending.get(response.id);
    if (!pending) return;
    this.#pending.delete(response.id);
    if (response.ok) pending.resolve(response.value);
    else pending.reject(failureToError(pending.action, response.failure));
  }

  #fail(error: Error): void {
    this.#dead = error;
    for (const [id, pending] of this.#pending) {
      this.#pending.delete(id);
      pending.reject(new Error(`${pending.action}: ${error.message}`, { cause: error }));
    }
  }
}

/** A fixed set of call workers; each call goes to the least busy one. */
export class WorkerPool {
  readonly #workers: CallWorker[];

  /** Starts `size` workers (at least one). */
  constructor(size: number) {
    this.#workers = Array.from({ length: Math.max(1, size) }, () => new CallWorker());
  }

  /** The number of workers. */
  get size(): number {
    return this.#workers.length;
  }

  /** Runs `op` on the least busy worker. */
  call<K extends OpName>(
    op: K,
    args: Parameters<WorkerOps[K]>,
    action: string,
  ): Promise<ReturnType<WorkerOps[K]>> {
    let best = this.#workers[0];
    for (const w of this.#workers) if (w.load < best.load) best = w;
    return best.call(op, args, action) as Promise<ReturnType<WorkerOps[K]>>;
  }

  /** Runs `op` on every worker (in order) and returns the results. */
  async each<K extends OpName>(
    op: K,
    args: Parameters<WorkerOps[K]>,
    action: string,
  ): Promise<ReturnType<WorkerOps[K]>[]> {
    return await Promise.all(
      this.#workers.map((w) => w.call(op, args, action) as Promise<ReturnType<WorkerOps[K]>>),
    );
  }

  /** Runs `op` on the first worker only. */
  first<K extends OpName>(
    op: K,
    args: Parameters<WorkerOps[K]>,
    action: string,
  ): Promise<ReturnType<WorkerOps[K]>> {
    return this.#workers[0].call(op, args, action) as Promise<ReturnType<WorkerOps[K]>>;
  }

  /** Runs `op` on every worker but the first. */
  async rest<K extends OpName>(
    op: K,
    args: Parameters<WorkerOps[K]>,
    action: string,
  ): Promise<void> {
    await Promise.all(this.#workers.slice(1).map((w) => w.call(op, args, action)));
  }

  /** Terminates all workers; pending calls are rejected. */
  terminate(): void {
    for (const w of this.#workers) w.terminate();
  }
}

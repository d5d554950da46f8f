/**
 * Work inside network namespaces (a launcher pod's, a pod-less VM's) without moving any
 * thread of the agent's own: {@linkcode NetnsRunner} hands each request to a worker thread
 * (`_netns_worker.ts`) that enters the namespace with `setns(2)` for each step and comes
 * back right after. Programs spawned in a step (`ip`, `nft`, a CNI plugin) run in the
 * namespace; UDP sockets made in one stay in it.
 *
 * The worker starts on the first request and ends after {@linkcode NETNS_IDLE_MS} without
 * one, so an agent that configures no network holds no extra thread or isolate.
 *
 * @module
 */

import { ErrnoError } from "./errors.ts";
import type { UdpSocketOptions } from "./sockets.ts";

/** One step of a request; see {@linkcode NetnsRunner.run}. */
export type NetnsStep =
  /** Runs a program in the namespace; gives its exit code and output (it is not checked). */
  | { op: "exec"; cmd: string; args: string[]; stdin?: string; timeoutMs?: number }
  /** Reads a file as a thread of the namespace sees it (`/proc/sys/net/...`). */
  | { op: "readFile"; path: string }
  /** Writes a file as a thread of the namespace (a sysctl under `/proc/sys/net`). */
  | { op: "writeFile"; path: string; data: string }
  /** Makes a UDP socket in the namespace (see `openUdpSocket`); gives its descriptor. */
  | ({ op: "udpSocket" } & UdpSocketOptions)
  /** Turns transmit checksum offload off on a device of the namespace. */
  | { op: "txChecksumOff"; device: string }
  /** Creates a new network namespace pinned by a bind mount on `path` (the request's netns is ignored). */
  | { op: "create"; path: string }
  /** Unmounts and removes a namespace made by `create` (idempotent). */
  | { op: "remove"; path: string };

/** What a step gives: `exec` its outcome, `readFile` text, `udpSocket` a descriptor. */
export type NetnsResult = { code: number; stdout: string; stderr: string } | string | number | null;

/** A request to the worker. */
export interface NetnsRequest {
  /** Matches the response. */
  id: number;
  /** The namespace file (`/proc/<pid>/ns/net`, a pinned one); none: the worker's own. */
  netns?: string;
  /** Done in order; the first failure ends the request. */
  steps: NetnsStep[];
}

/** The worker's answer. */
export type NetnsResponse =
  | { id: number; ok: true; results: NetnsResult[] }
  | {
    id: number;
    ok: false;
    step: number;
    error: { message: string; action?: string; errno?: number; description?: string };
  };

/** The worker ends after this long without a request, ms. */
export const NETNS_IDLE_MS = 30_000;

interface Pending {
  resolve(results: NetnsResult[]): void;
  reject(error: Error): void;
}

/** Runs steps inside network namespaces on a worker thread; see the module doc. */
export class NetnsRunner {
  #worker: Worker | undefined;
  #nextId = 1;
  readonly #pending = new Map<number, Pending>();
  #idle: ReturnType<typeof setTimeout> | undefined;
  readonly #idleMs: number;

  /** Creates the runner; the worker starts with the first request. */
  constructor(options: { idleMs?: number } = {}) {
    this.#idleMs = options.idleMs ?? NETNS_IDLE_MS;
  }

  #start(): Worker {
    const worker = new Worker(new URL("./_netns_worker.ts", import.meta.url), { type: "module" });
    worker.onmessage = (event: MessageEvent<NetnsResponse | { fatal: string }>) => {
      const data = event.data;
      if ("fatal" in data) {
        this.#fail(worker, new Error(`Network namespace worker ended: ${data.fatal}`));
        return;
      }
      const pending = this.#pending.get(data.id);
      if (!pending) return;
      this.#pending.delete(data.id);
      this.#armIdle();
      if (data.ok) {
        pending.resolve(data.results);
      } else {
        const e = data.error;
        pending.reject(
          e.errno !== undefined
            ? new ErrnoError(e.action ?? e.message, e.errno, e.description ?? "")
            : new Error(e.message),
        );
      }
    };
    worker.onerror = (event) => {
      event.preventDefault();
      this.#fail(worker, new Error(`Network namespace worker failed: ${event.message}`));
    };
    return worker;
  }

  #fail(worker: Worker, error: Error): void {
    if (this.#worker !== worker) return;
    this.#worker = undefined;
    worker.terminate();
    for (const pending of this.#pending.values()) pending.reject(error);
    this.#pending.clear();
  }

  #armIdle(): void {
    clearTimeout(this.#idle);
    this.#idle = undefined;
    if (this.#pending.size > 0 || !this.#worker) return;
    this.#idle = setTimeout(() => {
      if (this.#pending.size > 0) return;
      this.#worker?.terminate();
      this.#worker = undefined;
    }, this.#idleMs);
    Deno.unrefTimer(this.#idle);
  }

  /**
   * Runs `steps` in order inside the namespace `netns` (a namespace file; none: the
   * agent's own) and gives each step's result. The first failing step rejects the request
   * with its error; the steps before it stay done.
   */
  run(netns: string | undefined, steps: NetnsStep[]): Promise<NetnsResult[]> {
    clearTimeout(this.#idle);
    this.#idle = undefined;
    this.#worker ??= this.#start();
    const id = this.#nextId++;
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { resolve, reject });
      this.#worker!.postMessage({ id, netns, steps } satisfies NetnsRequest);
    });
  }

  /** Whether the worker thread runs now. */
  get running(): boolean {
    return this.#worker !== undefined;
  }

  /** Ends the worker; requests still running are refused. */
  close(): void {
    clearTimeout(this.#idle);
    const worker = this.#worker;
    if (worker) this.#fail(worker, new Error("The network namespace runner was closed"));
  }
}

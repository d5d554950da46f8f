/**
 * One VMI watch of a namespace, read by the benchmark: every event is stamped with
 * the time it arrived, and waiters registered before an action resolve with the
 * arrival time of the first event that matches them.
 *
 * @module
 */
import { jsonLines, type KubeClient } from "../../mod/kube/mod.ts";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { BenchTimeoutError, sleep } from "./_util.ts";

/** One watch event as the benchmark sees it. */
export interface SeenEvent {
  type: "ADDED" | "MODIFIED" | "DELETED";
  object: VirtualMachineInstance;
  /** `performance.now()` when the line was read. */
  at: number;
}

interface Waiter {
  match(event: SeenEvent): boolean;
  resolve(at: number): void;
  reject(error: Error): void;
  timer: ReturnType<typeof setTimeout>;
}

/** The VMI collection path of a namespace. */
export function vmiCollection(namespace: string): string {
  return `/apis/kubevirt.io/v1/namespaces/${namespace}/virtualmachineinstances`;
}

/** A running watch of the VMIs of one namespace; {@linkcode VmiWatch.stop} it. */
export class VmiWatch {
  readonly #client: KubeClient;
  readonly #namespace: string;
  readonly #abort = new AbortController();
  readonly #waiters = new Set<Waiter>();
  readonly #latest = new Map<string, VirtualMachineInstance>();
  #resourceVersion = "";
  #loop?: Promise<void>;

  private constructor(client: KubeClient, namespace: string) {
    this.#client = client;
    this.#namespace = namespace;
  }

  /** Lists the namespace's VMIs and watches from there. */
  static async start(client: KubeClient, namespace: string): Promise<VmiWatch> {
    const w = new VmiWatch(client, namespace);
    await w.#list();
    w.#loop = w.#run();
    return w;
  }

  /** The newest copy of a VMI the watch has seen (undefined once deleted). */
  latest(name: string): VirtualMachineInstance | undefined {
    return this.#latest.get(name);
  }

  /** Every VMI the watch currently knows. */
  all(): VirtualMachineInstance[] {
    return [...this.#latest.values()];
  }

  /**
   * Resolves with the arrival time of the first event from now on for which
   * `match` is true; rejects after `timeoutMs`. Register before acting.
   */
  waitFor(what: string, match: (e: SeenEvent) => boolean, timeoutMs: number): Promise<number> {
    return new Promise((resolve, reject) => {
      const waiter: Waiter = {
        match,
        resolve: (at) => {
          clearTimeout(waiter.timer);
          this.#waiters.delete(waiter);
          resolve(at);
        },
        reject: (error) => {
          clearTimeout(waiter.timer);
          this.#waiters.delete(waiter);
          reject(error);
        },
        timer: setTimeout(
          () =>
            waiter.reject(
              new BenchTimeoutError(`Timed out after ${timeoutMs} ms waiting for ${what}`),
            ),
          timeoutMs,
        ),
      };
      this.#waiters.add(waiter);
    });
  }

  /** Ends the watch and rejects every waiter. */
  async stop(): Promise<void> {
    this.#abort.abort();
    for (const w of [...this.#waiters]) w.reject(new Error("Cannot wait: the watch stopped"));
    await this.#loop?.catch(() => {});
  }

  async #list(): Promise<void> {
    const list = await this.#client.request<
      { metadata: { resourceVersion: string }; items: VirtualMachineInstance[] }
    >("GET", vmiCollection(this.#namespace));
    this.#latest.clear();
    for (const item of list.items) this.#latest.set(item.metadata.name!, item);
    this.#resourceVersion = list.metadata.resourceVersion;
  }

  async #run(): Promise<void> {
    const signal = this.#abort.signal;
    while (!signal.aborted) {
      try {
        const body = await this.#client.stream(vmiCollection(this.#namespace), {
          query: {
            watch: true,
            resourceVersion: this.#resourceVersion,
            allowWatchBookmarks: true,
            timeoutSeconds: 3600,
          },
          signal,
        });
        for await (const line of jsonLines(body, signal)) {
          const at = performance.now();
          const raw = JSON.parse(line) as { type: string; object: VirtualMachineInstance };
          if (raw.type === "ERROR") {
            // Most likely 410 Gone: start again from a fresh list.
            await this.#list();
            break;
          }
          const rv = raw.object?.metadata?.resourceVersion;
          if (rv) this.#resourceVersion = rv;
          if (raw.type === "BOOKMARK") continue;
          this.#dispatch({ type: raw.type as SeenEvent["type"], object: raw.object, at });
        }
      } catch (error) {
        if (signal.aborted) return;
        console.error(`bench: VMI watch interrupted, reconnecting: ${error}`);
        await sleep(200, signal).catch(() => {});
      }
    }
  }

  #dispatch(event: SeenEvent): void {
    const name = event.object.metadata.name!;
    if (event.type === "DELETED") this.#latest.delete(name);
    else this.#latest.set(name, event.object);
    for (const w of [...this.#waiters]) {
      let hit = false;
      try {
        hit = w.match(event);
      } catch {
        hit = false;
      }
      if (hit) w.resolve(event.at);
    }
  }
}

/** A matcher: the named VMI (of `uid` when given) has `phase`. */
export function hasPhase(name: string, phase: string): (e: SeenEvent) => boolean {
  return (e) =>
    e.type !== "DELETED" && e.object.metadata.name === name && e.object.status?.phase === phase;
}

/** A matcher: the named VMI is gone. */
export function isDeleted(name: string): (e: SeenEvent) => boolean {
  return (e) => e.type === "DELETED" && e.object.metadata.name === name;
}

/** A matcher: the named VMI's Paused condition is `True` (paused) or absent (not paused). */
export function pausedIs(name: string, paused: boolean): (e: SeenEvent) => boolean {
  return (e) => {
    if (e.type === "DELETED" || e.object.metadata.name !== name) return false;
    const c = e.object.status?.conditions?.find((c) => c.type === "Paused");
    return paused ? c?.status === "True" : c === undefined || c.status !== "True";
  };
}

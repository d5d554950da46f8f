/**
 * The handler's side of the launcher host's control socket (see `mod/launcher/host.ts`):
 * one connection, one JSON object per line each way, requests matched to their answers by
 * `id`, and the host's `exited` pushes handed to a callback.
 *
 * @module
 */

import type { VirtualMachineOptions } from "../../proto/mod.ts";
import {
  type HostedVmSpec,
  type HostedVmStatus,
  readLines,
  writeAll,
} from "../../launcher/host_protocol/mod.ts";

/** A control request failed: the host refused it, did not answer in time, or went away. */
export class LauncherHostError extends Error {
  /** Creates `launcher host: <op>: <detail>`. */
  constructor(op: string, detail: string, options?: ErrorOptions) {
    super(`launcher host: ${op}: ${detail}`, options);
    this.name = "LauncherHostError";
  }
}

/** A launcher the host reports ended on its own (its domain died). */
export interface HostExit {
  /** The VMI's UID. */
  uid: string;
  /** The exit code a launcher process would have had. */
  code: number;
  /** Why. */
  why: string;
}

interface Waiting {
  op: string;
  resolve: (value: Record<string, unknown>) => void;
  reject: (error: Error) => void;
  timer: ReturnType<typeof setTimeout>;
}

/** One connection to a launcher host's control socket. */
export class LauncherHostClient {
  readonly #conn: Deno.UnixConn;
  readonly #waiting = new Map<number, Waiting>();
  readonly #closed: Promise<void>;
  #nextId = 1;
  #writing: Promise<void> = Promise.resolve();
  #open = true;

  private constructor(conn: Deno.UnixConn, onExit: (exit: HostExit) => void) {
    this.#conn = conn;
    this.#closed = this.#read(onExit);
  }

  /** Connects to `socket`; `onExit` hears every launcher that ended on its own. */
  static async connect(
    socket: string,
    onExit: (exit: HostExit) => void,
  ): Promise<LauncherHostClient> {
    const conn = await Deno.connect({ transport: "unix", path: socket });
    return new LauncherHostClient(conn, onExit);
  }

  /** Resolves when the connection ends (the host exited, or {@linkcode close}). */
  get closed(): Promise<void> {
    return this.#closed;
  }

  /** Whether the connection is still open. */
  get open(): boolean {
    return this.#open;
  }

  async #read(onExit: (exit: HostExit) => void): Promise<void> {
    try {
      for await (const line of readLines(this.#conn.readable)) {
        let message: Record<string, unknown>;
        try {
          message = JSON.parse(line);
        } catch {
          continue;
        }
        if (message.event === "exited") {
          onExit({
            uid: String(message.uid),
            code: Number(message.code),
            why: String(message.why ?? ""),
          });
          continue;
        }
        const waiting = this.#waiting.get(Number(message.id));
        if (!waiting) continue;
        this.#waiting.delete(Number(message.id));
        clearTimeout(waiting.timer);
        if (message.ok === true) waiting.resolve(message);
        else waiting.reject(new LauncherHostError(waiting.op, String(message.error)));
      }
    } catch {
      // The host went away.
    } finally {
      this.#open = false;
      for (const [id, waiting] of this.#waiting) {
        this.#waiting.delete(id);
        clearTimeout(waiting.timer);
        waiting.reject(new LauncherHostError(waiting.op, "the launcher host went away"));
      }
    }
  }

  #request(
    op: string,
    body: Record<string, unknown>,
    timeoutMs: number,
  ): Promise<Record<string, unknown>> {
    if (!this.#open) {
      return Promise.reject(new LauncherHostError(op, "not connected to the launcher host"));
    }
    const id = this.#nextId++;
    const line = new TextEncoder().encode(`${JSON.stringify({ id, op, ...body })}\n`);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#waiting.delete(id);
        reject(new LauncherHostError(op, `no answer within ${timeoutMs} ms`));
      }, timeoutMs);
      this.#waiting.set(id, { op, resolve, reject, timer });
      this.#writing = this.#writing.then(() => writeAll(this.#conn, line)).catch((error) => {
        const waiting = this.#waiting.get(id);
        if (!waiting) return;
        this.#waiting.delete(id);
        clearTimeout(timer);
        reject(new LauncherHostError(op, `cannot send: ${error}`, { cause: error }));
      });
    });
  }

  /** Serves a VMI's launcher; resolves with its status once its socket is ready. */
  async start(spec: HostedVmSpec, timeoutMs = 30_000): Promise<HostedVmStatus> {
    const reply = await this.#request("start", { spec }, timeoutMs);
    return reply.vm as HostedVmStatus;
  }

  /**
   * Serves a VMI's launcher, then has the host sync its domain from `vmiJson` as a
   * `SyncVirtualMachine` call would. `synced` is absent when the launcher is not ready
   * (it ended); `synced.error` says why a sync failed.
   */
  async startAndSync(
    spec: HostedVmSpec,
    vmiJson: string,
    timeoutMs: number,
    options?: VirtualMachineOptions,
  ): Promise<{ status: HostedVmStatus; synced?: { error?: string } }> {
    const reply = await this.#request(
      "start",
      { spec, sync: vmiJson, ...(options ? { options } : {}) },
      timeoutMs,
    );
    const synced = reply.synced as { error?: unknown } | undefined;
    return {
      status: reply.vm as HostedVmStatus,
      synced: synced === undefined
        ? undefined
        : typeof synced.error === "string"
        ? { error: synced.error }
        : {},
    };
  }

  /**
   * Stops a VMI's guest gracefully and ends its launcher; removes the domain a launcher
   * that ended left (`vmi` names it, should the host not know the UID).
   */
  async stop(
    uid: string,
    timeoutMs: number,
    vmi: { namespace?: string; name?: string } = {},
  ): Promise<void> {
    await this.#request("stop", { uid, ...vmi }, timeoutMs);
  }

  /**
   * Hands a served VMI's launcher its access credentials and the text of their Secrets
   * (Secret name to key to value); the host keeps them in memory only.
   */
  async credentials(
    uid: string,
    accessCredentials: unknown,
    secrets: Record<string, Record<string, string>>,
    timeoutMs = 10_000,
  ): Promise<void> {
    await this.#request("credentials", { uid, accessCredentials, secrets }, timeoutMs);
  }

  /** Every launcher the host serves or saw end. */
  async list(timeoutMs = 10_000): Promise<HostedVmStatus[]> {
    const reply = await this.#request("list", {}, timeoutMs);
    return reply.vms as HostedVmStatus[];
  }

  /** Closes the connection. */
  async close(): Promise<void> {
    if (this.#open) {
      try {
        this.#conn.close();
      } catch { /* closed already */ }
    }
    await this.#closed;
  }
}

/**
 * Keeps the launcher's libvirt connection open across libvirtd restarts.
 *
 * A restart of libvirtd closes every client connection while the guests (QEMU
 * processes) keep running. The launcher learns of it from the connection's close
 * event, or from a call that fails because the connection is dead; it then reconnects
 * with exponential backoff (`Connection.reconnect()` re-registers the event callbacks)
 * and, once back, lets the launcher re-read the domain's state, since events of the
 * outage are lost. A lost connection says nothing about the guest: it is never
 * reported as the domain stopping.
 *
 * @module
 */

import { type Connection, errorText, LIBVIRT_ERROR_CODES, LibvirtError } from "../../ffi/mod.ts";
import { sleep } from "../lifecycle/mod.ts";
import { getLogger } from "../log/mod.ts";
import type { VmiRef } from "./_domain_reader.ts";

const log = getLogger("launcher", "libvirt-connection");

/** Backoff of reconnect attempts, in ms. */
export interface ReconnectBackoff {
  /** Wait before the second attempt (the first one is immediate). */
  initialMs: number;
  /** The longest wait between attempts. */
  maxMs: number;
}

/** Options of {@linkcode ConnectionKeeper}. */
export interface ConnectionKeeperOptions {
  /** The VMI, for log context. */
  vmi: VmiRef;
  /** Runs after each successful reconnect (re-read the domain, report a change). */
  onRestored?: () => Promise<void>;
  /** 200 ms doubling to 2 s unless told. */
  backoff?: ReconnectBackoff;
}

// Codes of a connection that is gone, whatever the call was.
const CONNECTION_CODES = new Set<number>([
  LIBVIRT_ERROR_CODES.VIR_ERR_NO_CONNECT,
  LIBVIRT_ERROR_CODES.VIR_ERR_INVALID_CONN,
  LIBVIRT_ERROR_CODES.VIR_ERR_RPC,
]);
// Codes that a dead connection may hide behind; for these the connection is asked.
const AMBIGUOUS_CODES = new Set<number>([
  LIBVIRT_ERROR_CODES.VIR_ERR_INTERNAL_ERROR,
  LIBVIRT_ERROR_CODES.VIR_ERR_OPERATION_FAILED,
  LIBVIRT_ERROR_CODES.VIR_ERR_SYSTEM_ERROR,
  LIBVIRT_ERROR_CODES.VIR_ERR_OPERATION_TIMEOUT,
]);
const CONNECTION_MESSAGE =
  /client socket is closed|end of file while reading|connection reset|broken pipe|cannot (recv|write) data|no connection/i;

/** Whether an error by itself proves the libvirt connection is gone. */
export function isConnectionError(error: unknown): boolean {
  if (!(error instanceof LibvirtError)) return false;
  return CONNECTION_CODES.has(error.code) || CONNECTION_MESSAGE.test(error.libvirtMessage);
}

/** Watches one connection and reconnects it when it is lost. */
export class ConnectionKeeper {
  readonly #conn: Connection;
  readonly #opts: ConnectionKeeperOptions;
  readonly #offClose: () => void;
  readonly #waiters = new Set<(connected: boolean) => void>();
  #lost = false;
  #stopped = false;
  #loop: Promise<void> | undefined;

  /** Starts listening for the connection's close event. */
  constructor(connection: Connection, options: ConnectionKeeperOptions) {
    this.#conn = connection;
    this.#opts = options;
    this.#offClose = connection.onClose((event) => {
      this.lost(`libvirt closed the connection (${event.reasonName})`);
    });
  }

  /** Whether the connection is believed to be up. */
  get connected(): boolean {
    return !this.#lost;
  }

  /** Marks the connection lost and starts reconnecting (once; later calls join in). */
  lost(reason: string): void {
    if (this.#stopped || this.#lost) return;
    this.#lost = true;
    log.warn("Lost the libvirt connection, reconnecting: {reason}", {
      ...this.#opts.vmi,
      uri: this.#conn.uri,
      reason,
    });
    this.#loop = this.#reconnect();
  }

  /**
   * Tells whether a failed call failed because the connection is gone (then a reconnect
   * is under way). Errors that are not libvirt's never are, nor are libvirt's definite
   * answers (no such domain, invalid XML...); for vague ones the connection is asked.
   */
  async failedByConnection(error: unknown): Promise<boolean> {
    if (this.#stopped) return false;
    if (this.#lost) return true;
    if (!(error instanceof LibvirtError)) return false;
    if (isConnectionError(error)) {
      this.lost(error.message);
      return true;
    }
    if (!AMBIGUOUS_CODES.has(error.code)) return false;
    const alive = await this.#conn.isAlive().catch(() => false);
    if (alive) return false;
    this.lost(`the connection is not alive after: ${error.message}`);
    return true;
  }

  /** Resolves true once connected (at once when it is), false after `timeoutMs` or stop. */
  whenConnected(timeoutMs: number): Promise<boolean> {
    if (!this.#lost) return Promise.resolve(true);
    if (this.#stopped) return Promise.resolve(false);
    return new Promise((resolve) => {
      const done = (connected: boolean) => {
        clearTimeout(timer);
        this.#waiters.delete(done);
        resolve(connected);
      };
      const timer = setTimeout(() => done(false), timeoutMs);
      this.#waiters.add(done);
    });
  }

  /** Stops watching and reconnecting (the launcher is closing its connection). */
  async stop(): Promise<void> {
    this.#stopped = true;
    this.#offClose();
    for (const waiter of [...this.#waiters]) waiter(false);
    // #reconnect() logs its own failures; stop() only waits for it to end.
    await this.#loop?.catch(() => {});
  }

  async #reconnect(): Promise<void> {
    const { initialMs, maxMs } = this.#opts.backoff ?? { initialMs: 200, maxMs: 2_000 };
    const started = performance.now();
    let delay = initialMs;
    for (let attempt = 1; !this.#stopped; attempt++) {
      try {
        await this.#conn.reconnect();
      } catch (error) {
        log.debug("Reconnect attempt {attempt} failed: {error}", {
          ...this.#opts.vmi,
          attempt,
          error: errorText(error),
        });
        await sleep(delay);
        delay = Math.min(delay * 2, maxMs);
        continue;
      }
      if (this.#stopped) return;
      log.info("Reconnected to libvirt after {downMs} ms", {
        ...this.#opts.vmi,
        uri: this.#conn.uri,
        attempts: attempt,
        downMs: Math.round(performance.now() - started),
      });
      this.#lost = false;
      try {
        await this.#opts.onRestored?.();
      } catch (error) {
        log.warn("Cannot re-read the domain after reconnecting: {error}", {
          ...this.#opts.vmi,
          error: errorText(error),
        });
      }
      for (const waiter of [...this.#waiters]) waiter(true);
      return;
    }
  }
}

/**
 * Many UDP sockets on one wait: {@linkcode DatagramPoller} keeps one `poll(2)` call
 * running on a thread of Deno's blocking pool over every socket it was given (made by
 * `openUdpSocket`, typically inside a VM's network namespace) and hands each datagram that
 * arrives to its socket's callback on the event loop. An eventfd wakes the wait when the
 * set changes. With no socket left the wait ends, and with it the thread's use.
 *
 * A launcher host with a DHCP server per VM therefore uses one blocked thread and no CPU
 * while no guest asks, however many VMs it serves.
 *
 * @module
 */

import { close } from "./files.ts";
import {
  type DatagramAddress,
  drainEventFd,
  eventFd,
  receiveDatagram,
  sendDatagram,
  signalEventFd,
} from "./sockets.ts";

const POLLIN = 0x1;
/** The largest datagram read (an Ethernet frame's worth; DHCP messages are smaller). */
const BUFFER_BYTES = 9216;

let blocking:
  | Deno.DynamicLibrary<{
    poll: { parameters: ["buffer", "u64", "i32"]; result: "i32"; nonblocking: true };
  }>
  | null = null;

function pollSymbol() {
  blocking ??= Deno.dlopen(
    "libc.so.6",
    {
      poll: { parameters: ["buffer", "u64", "i32"], result: "i32", nonblocking: true },
    } as const,
  );
  return blocking.symbols.poll;
}

/** Called with each datagram a socket receives. */
export type DatagramHandler = (data: Uint8Array, from: DatagramAddress) => void;

/** Waits on many UDP sockets at once; see the module doc. */
export class DatagramPoller {
  readonly #sockets = new Map<number, DatagramHandler>();
  /** Sockets removed while a wait ran: closed once it returns. */
  readonly #closing = new Set<number>();
  readonly #buffer = new Uint8Array(BUFFER_BYTES);
  #wake: number | undefined;
  #loop: Promise<void> | undefined;
  /** Told about a handler that threw (the poller goes on). */
  readonly #onError: (error: unknown) => void;

  /** Creates the poller; it waits only while it has sockets. */
  constructor(options: { onError?: (error: unknown) => void } = {}) {
    this.#onError = options.onError ?? (() => {});
  }

  /** The sockets it waits on. */
  get size(): number {
    return this.#sockets.size;
  }

  /** Waits on `fd` too; `onMessage` gets each datagram it receives. The poller owns `fd` now. */
  add(fd: number, onMessage: DatagramHandler): void {
    this.#sockets.set(fd, onMessage);
    this.#wakeUp();
  }

  /** Stops waiting on `fd` and closes it (once a running wait has returned). */
  remove(fd: number): void {
    if (!this.#sockets.delete(fd)) return;
    if (this.#loop) {
      this.#closing.add(fd);
      this.#wakeUp();
    } else {
      close(fd);
    }
  }

  /** Sends a datagram from one of its sockets. */
  send(fd: number, data: Uint8Array, to: DatagramAddress): void {
    sendDatagram(fd, data, to);
  }

  /** Removes and closes every socket; resolves once the wait has ended. */
  async close(): Promise<void> {
    for (const fd of [...this.#sockets.keys()]) this.remove(fd);
    await this.#loop;
  }

  #wakeUp(): void {
    if (this.#loop) {
      signalEventFd(this.#wake!);
      return;
    }
    if (this.#sockets.size === 0) return;
    this.#wake ??= eventFd();
    this.#loop = this.#run().finally(() => {
      this.#loop = undefined;
      // A socket added while the last wait wound down starts the next one.
      if (this.#sockets.size > 0) this.#wakeUp();
    });
  }

  async #run(): Promise<void> {
    const poll = pollSymbol();
    while (this.#sockets.size > 0) {
      const fds = [...this.#sockets.keys()];
      const pollfds = new Uint8Array(8 * (fds.length + 1)); // struct pollfd { int; short; short; }
      const view = new DataView(pollfds.buffer);
      [this.#wake!, ...fds].forEach((fd, i) => {
        view.setInt32(i * 8, fd, true);
        view.setInt16(i * 8 + 4, POLLIN, true);
      });
      const n = await poll(pollfds, BigInt(fds.length + 1), -1);
      drainEventFd(this.#wake!);
      for (const fd of this.#closing) close(fd);
      this.#closing.clear();
      if (n <= 0) continue; // EINTR
      fds.forEach((fd, i) => {
        const handler = this.#sockets.get(fd);
        if (!handler || (view.getInt16((i + 1) * 8 + 6, true) & POLLIN) === 0) return;
        this.#drain(fd, handler);
      });
    }
  }

  #drain(fd: number, handler: DatagramHandler): void {
    for (;;) {
      let got: ReturnType<typeof receiveDatagram>;
      try {
        got = receiveDatagram(fd, this.#buffer);
      } catch (error) {
        this.#onError(error);
        return;
      }
      if (!got) return;
      try {
        handler(new Uint8Array(got.data), got.from);
      } catch (error) {
        this.#onError(error);
      }
    }
  }
}

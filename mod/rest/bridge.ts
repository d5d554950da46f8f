/**
 * A WebSocket joined to a unix socket, byte for byte: what the client sends in binary
 * frames goes to the unix socket, what the unix socket sends goes back in binary frames.
 * Each side waits for the other to drain before reading more, so a slow client holds back
 * the guest's console instead of filling the handler's memory; a vanished client is found
 * by TCP keepalive. Whichever side ends, or `stop()`, closes both and settles `done`.
 *
 * @module
 */
import type { Socket } from "node:net";
import { binaryFrame, CloseCode, closeFrame, FrameReader, pongFrame } from "./websocket.ts";

/** How often an idle client is probed, ms (then the kernel's retries decide). */
const KEEPALIVE_MS = 30_000;

/** A running bridge. */
export interface Bridge {
  /** Settles once both sockets are closed; the reason it ended. */
  readonly done: Promise<string>;
  /**
   * Ends the bridge by closing both connections, without a close frame, as virt-handler
   * ends a session a newer one took over: virt-api then gives its client an EOF, which is
   * what KubeVirt's clients wait for.
   */
  stop(reason: string): void;
}

/**
 * Joins `client` (upgraded already; `head` holds bytes that came with the upgrade) to
 * `target`, which may still be connecting.
 */
export function bridge(client: Socket, head: Uint8Array, target: Socket): Bridge {
  const reader = new FrameReader();
  let ended: string | undefined;
  let resolve!: (reason: string) => void;
  const done = new Promise<string>((r) => resolve = r);
  let open = 2;
  const closed = () => {
    if (--open === 0) resolve(ended ?? "closed");
  };
  client.once("close", closed);
  target.once("close", closed);

  const end = (reason: string, code: number) => {
    if (ended !== undefined) return;
    ended = reason;
    if (!client.destroyed) {
      client.write(closeFrame(code));
      client.end();
      // A client that never reads its close frame is not waited for.
      setTimeout(() => client.destroy(), 1000).unref?.();
    }
    target.destroy();
  };

  // A ping is answered at once while the client reads what it is sent. While its queue is
  // full, only the latest ping waits for an answer (RFC 6455 5.5.3 lets a pong answer the
  // most recent ping alone): a client that floods pings and reads nothing holds one pong
  // here, not one per ping.
  let waitingPong: Uint8Array | undefined;
  const pong = (payload: Uint8Array) => {
    if (!client.writableNeedDrain) {
      client.write(pongFrame(payload));
      return;
    }
    if (waitingPong === undefined) {
      client.once("drain", () => {
        const last = waitingPong!;
        waitingPong = undefined;
        if (ended === undefined && !client.destroyed) client.write(pongFrame(last));
      });
    }
    waitingPong = payload;
  };

  const fromClient = (bytes: Uint8Array) => {
    for (const event of reader.push(bytes)) {
      switch (event.kind) {
        case "data":
          if (event.payload.length && !target.write(event.payload)) {
            client.pause();
            target.once("drain", () => client.resume());
          }
          break;
        case "ping":
          pong(event.payload);
          break;
        case "close":
          end("the client closed the WebSocket", CloseCode.Normal);
          return;
        case "error":
          end(`protocol error: ${event.reason}`, event.code);
          return;
      }
    }
  };

  client.setKeepAlive(true, KEEPALIVE_MS);
  client.setNoDelay(true);
  client.on("data", (chunk: Uint8Array) => fromClient(chunk));
  client.on("end", () => end("the client ended the connection", CloseCode.Normal));
  client.on("error", (error: Error) => end(`client: ${error.message}`, CloseCode.GoingAway));
  target.on("data", (chunk: Uint8Array) => {
    if (!client.write(binaryFrame(chunk))) {
      target.pause();
      client.once("drain", () => target.resume());
    }
  });
  target.on("end", () => end("the socket was closed", CloseCode.Normal));
  target.on("error", (error: Error) => end(`socket: ${error.message}`, CloseCode.InternalError));
  if (head.length) fromClient(head);

  return {
    done,
    stop: (reason) => {
      if (ended !== undefined) return;
      ended = reason;
      client.destroy();
      target.destroy();
    },
  };
}

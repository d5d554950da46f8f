/**
 * The REST side as its tests reach it: the websocket frame reader, the console bridge and the
 * certificate poll period each have tests of their own.
 * Only `tests/` imports this file.
 *
 * @module
 */
export * from "./mod.ts";
export { bridge } from "./bridge.ts";
export { connectRetrying } from "./server.ts";
export { TLS_POLL_MS } from "./tls.ts";
export { CloseCode, MAX_FRAME_PAYLOAD } from "./websocket.ts";

/**
 * The handler's REST server (console, VNC, USB redirection, lifecycle and guest queries over
 * mutual TLS, as virt-api reaches virt-handler) and the pieces it is made of.
 *
 * @module
 */
export {
  CONSOLE_SERVER_PORT,
  type OpenedSocket,
  parseGoDuration,
  type PrivateSocketName,
  type RestBackend,
  type RestLauncher,
  RestServer,
  type RestServerOptions,
} from "./server.ts";
export {
  CLIENT_COMMON_NAME_PREFIX,
  refuseClient,
  type TlsContext,
  TlsMaterial,
  TlsMaterialError,
  type TlsMaterialOptions,
} from "./tls.ts";
export {
  acceptKey,
  binaryFrame,
  closeFrame,
  type FrameEvent,
  FrameReader,
  PLAIN_STREAM_PROTOCOL,
  type UpgradeHeaders,
  UpgradeRefused,
  upgradeResponse,
} from "./websocket.ts";

/**
 * The handler's REST server, as virt-api reaches virt-handler's (port 8186, mutual TLS):
 *
 * | route (`/v1/namespaces/{namespace}/virtualmachineinstances/{name}/...`) | what |
 * |---|---|
 * | GET `console`, GET `vnc` (`?preserveSession=true`) | WebSocket (`plain.kubevirt.io`) bridged to the launcher's `virt-serial0` / `virt-vnc` |
 * | GET `usbredir` | WebSocket bridged to the VMI's first free `virt-usbredir-<0..3>` (`clientPassthrough`) |
 * | GET `vnc/screenshot` | the guest's screen, in the launcher's image type |
 * | PUT `pause`, `unpause`, `softreboot`, `reset`, `freeze` (`{"unfreezeTimeout": "5m"}`), `unfreeze` | 202 |
 * | GET `guestosinfo`, `userlist`, `filesystemlist` | the guest agent's answer, JSON (the lists as KubeVirt's `{"metadata":{},"items":[...]}`) |
 *
 * The answers follow KubeVirt's handler: a VMI that is not this node's is 404 `VMI
 * <namespace>/<name> does not exist`; a launcher that cannot be reached or fails is 500
 * (400 for freeze and unfreeze, with a `FreezeError` Event for a failed freeze); a console
 * whose socket cannot be found is 400. One serial and one VNC session per VMI: a new one
 * ends the old one, unless a VNC client asks to `preserveSession`, which is then refused
 * with 503. A VMI redirects up to four USB devices at a time, each session on a port of its
 * own; a fifth is refused with 503. Beyond KubeVirt's handler: a guest query of a VMI whose agent is not connected
 * is 409 (virt-api answers so before it calls the handler), and a WebSocket without the
 * subprotocol is 400.
 *
 * No request is read before the client's certificate has been verified and its common
 * name allowed ({@linkcode refuseClient}); a refused client's connection is destroyed
 * without a byte.
 *
 * @module
 */
import https from "node:https";
import type { IncomingMessage, ServerResponse } from "node:http";
import { connect, type Socket } from "node:net";
import type { TLSSocket } from "node:tls";
import type { VirtualMachineInstance } from "../api/mod.ts";
import type { Runnable } from "../lifecycle/mod.ts";
import { getLogger } from "../log/mod.ts";
import { type Bridge, bridge } from "./bridge.ts";
import { refuseClient, type TlsMaterial } from "./tls.ts";
import { refusalResponse, UpgradeRefused, upgradeResponse } from "./websocket.ts";
import { errorText } from "../../ffi/mod.ts";
import { USB_CLIENT_PASSTHROUGH_SLOTS, usbRedirSocket } from "../api/mod.ts";

const log = getLogger("rest");

/** KubeVirt's handler console server port. */
export const CONSOLE_SERVER_PORT = 8186;

/** Idle keep-alive connections are closed after this long, ms (KubeVirt's 60 s). */
const IDLE_TIMEOUT_MS = 60_000;
/** The largest request body read (a freeze's timeout). */
const MAX_BODY = 1024;

/** What the REST routes need of a launcher (the handler's launcher client has it). */
export interface RestLauncher {
  /** Pauses the domain. */
  pauseVirtualMachine(vmi: VirtualMachineInstance): Promise<void>;
  /** Resumes the domain. */
  unpauseVirtualMachine(vmi: VirtualMachineInstance): Promise<void>;
  /** Asks the guest to reboot. */
  softRebootVirtualMachine(vmi: VirtualMachineInstance): Promise<void>;
  /** Resets the domain. */
  resetVirtualMachine(vmi: VirtualMachineInstance): Promise<void>;
  /** Freezes the guest's filesystems. */
  freezeVirtualMachine(vmi: VirtualMachineInstance, unfreezeTimeoutSeconds: number): Promise<void>;
  /** Thaws them. */
  unfreezeVirtualMachine(vmi: VirtualMachineInstance): Promise<void>;
  /** The guest's screen. */
  getScreenshot(vmi: VirtualMachineInstance): Promise<{ mime: string; data: Uint8Array }>;
  /** A guest agent query's answer. */
  guestQuery(method: "GetGuestInfo" | "GetUsers" | "GetFilesystems"): Promise<unknown>;
}

/** A console socket opened beneath its launcher's directory. */
export interface OpenedSocket {
  /** What to connect to. */
  readonly path: string;
  /** Lets go of it once connected. */
  release(): void;
}

/** The sockets of a VMI's private directory the REST server bridges clients to. */
export type PrivateSocketName = "virt-serial0" | "virt-vnc" | `virt-usbredir-${number}`;

/** The handler's side of the REST server. */
export interface RestBackend {
  /** This node's VMI by namespace and name, or undefined. */
  vmi(namespace: string, name: string): VirtualMachineInstance | undefined;
  /** The VMI's launcher; throws a clear error when it has none. */
  launcher(vmi: VirtualMachineInstance): Promise<RestLauncher>;
  /**
   * Opens the VMI's `virt-serial0`, `virt-vnc` or `virt-usbredir-<slot>`; throws a clear
   * error when it cannot.
   */
  openSocket(vmi: VirtualMachineInstance, name: PrivateSocketName): Promise<OpenedSocket>;
  /** Records an Event about the VMI. */
  record(
    vmi: VirtualMachineInstance,
    type: "Normal" | "Warning",
    reason: string,
    message: string,
  ): void;
}

/** Options of {@linkcode RestServer}. */
export interface RestServerOptions {
  /** Address to listen on; `0.0.0.0` unless told. */
  hostname?: string;
  /** Port; {@linkcode CONSOLE_SERVER_PORT} unless told (0: any free one). */
  port?: number;
  /** Server certificate and client CA. */
  tls: TlsMaterial;
  /** The handler's side. */
  backend: RestBackend;
  /** Allowed client types (`kubevirt.io:system:client:<type>`); `["virt-handler"]`. */
  clientTypes?: string[];
}

/** A route's failure: its HTTP status and message. */
class RouteError extends Error {
  readonly status: number;
  constructor(status: number, message: string) {
    super(message);
    this.status = status;
  }
}

const ROUTE =
  /^\/v1\/namespaces\/([^/]+)\/virtualmachineinstances\/([^/]+)\/([a-z]+(?:\/screenshot)?)$/;

const PUT_ROUTES = ["pause", "unpause", "softreboot", "reset", "freeze", "unfreeze"] as const;
const GUEST_ROUTES = {
  guestosinfo: "GetGuestInfo",
  userlist: "GetUsers",
  filesystemlist: "GetFilesystems",
} as const;
const SOCKET_ROUTES = {
  console: "virt-serial0",
  vnc: "virt-vnc",
  usbredir: "virt-usbredir",
} as const;

/**
 * A Go duration (`1h30m`, `300s`, `1.5m`) in seconds, as KubeVirt's `metav1.Duration`
 * reads it; undefined when it is not one.
 */
export function parseGoDuration(text: string): number | undefined {
  if (text === "0") return 0;
  const units: Record<string, number> = {
    h: 3600,
    m: 60,
    s: 1,
    ms: 1e-3,
    us: 1e-6,
    "µs": 1e-6,
    ns: 1e-9,
  };
  const re = /(\d+(?:\.\d*)?|\.\d+)(h|ms|us|µs|ns|m|s)/gy;
  let total = 0;
  let at = 0;
  let m: RegExpExecArray | null;
  while ((m = re.exec(text)) !== null) {
    total += Number(m[1]) * units[m[2]];
    at = re.lastIndex;
  }
  return at === text.length && at > 0 ? total : undefined;
}

function isAgentConnected(vmi: VirtualMachineInstance): boolean {
  return (vmi.status?.conditions ?? []).some((c) =>
    c.type === "AgentConnected" && c.status === "True"
  );
}

/** The REST server; see the module doc. */
export class RestServer implements Runnable {
  /** For logs. */
  readonly name = "rest";
  readonly #o: RestServerOptions;
  readonly #sessions = { console: new Map<string, Bridge>(), vnc: new Map<string, Bridge>() };
  /**
   * The redirected USB ports in use, by VMI UID: each slot's session, or null while its
   * socket is being opened for a new one (so that no other session takes it meanwhile).
   */
  readonly #usbSessions = new Map<string, Map<number, Bridge | null>>();
  readonly #sockets = new Set<Socket>();
  #port = 0;
  #listening: Promise<void>;
  #resolveListening!: () => void;

  /** A server for `options`; {@linkcode run} serves it. */
  constructor(options: RestServerOptions) {
    this.#o = options;
    this.#listening = new Promise((r) => this.#resolveListening = r);
  }

  /** The port it listens on, once {@linkcode listening} settled. */
  get port(): number {
    return this.#port;
  }

  /** Settles once the server listens (a CA bundle is needed first). */
  listening(): Promise<void> {
    return this.#listening;
  }

  /** Open WebSocket sessions (console, VNC and USB redirection). */
  sessions(): number {
    let usb = 0;
    for (const slots of this.#usbSessions.values()) {
      usb += [...slots.values()].filter((b) => b !== null).length;
    }
    return this.#sessions.console.size + this.#sessions.vnc.size + usb;
  }

  /** Waits for a CA bundle, serves until `signal` aborts, then ends every session. */
  async run(signal: AbortSignal): Promise<void> {
    const tls = this.#o.tls;
    if (!tls.hasCa()) {
      log.info("REST server waits for the client CA bundle");
      await new Promise<void>((resolve) => {
        tls.onChange(() => {
          if (tls.hasCa()) resolve();
        });
        signal.addEventListener("abort", () => resolve(), { once: true });
      });
      if (signal.aborted) {
        this.#resolveListening();
        return;
      }
    }
    const server = https.createServer({
      ...tls.context(),
      requestCert: true,
      rejectUnauthorized: true,
    });
    tls.onChange((context) => server.setSecureContext(context));
    server.keepAliveTimeout = IDLE_TIMEOUT_MS;
    server.on("secureConnection", (socket: TLSSocket) => {
      const refused = refuseClient(socket.getPeerCertificate(), this.#clientTypes());
      if (refused) {
        log.warn("Client refused: {reason}", { reason: refused, remote: socket.remoteAddress });
        socket.destroy();
        return;
      }
      this.#sockets.add(socket);
      socket.once("close", () => this.#sockets.delete(socket));
    });
    server.on("tlsClientError", (error: Error, socket: Socket) => {
      log.debug("TLS handshake failed: {error}", { error: error.message });
      socket.destroy();
    });
    server.on("request", (req: IncomingMessage, res: ServerResponse) => {
      this.#request(req, res).catch((error) => {
        log.error("REST request failed: {error}", { error: errorText(error) });
        if (!res.headersSent) this.#send(res, 500, errorText(error));
        else res.destroy();
      });
    });
    server.on("upgrade", (req: IncomingMessage, socket: Socket, head: Uint8Array) => {
      this.#upgrade(req, socket as TLSSocket, head).catch((error) => {
        log.error("WebSocket upgrade failed: {error}", { error: errorText(error) });
        socket.destroy();
      });
    });
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(this.#o.port ?? CONSOLE_SERVER_PORT, this.#o.hostname ?? "0.0.0.0", () => {
        server.off("error", reject);
        resolve();
      });
    });
    const address = server.address();
    this.#port = typeof address === "object" && address ? address.port : 0;
    log.info("REST server listening", { port: this.#port });
    this.#resolveListening();
    await new Promise<void>((resolve) => {
      if (signal.aborted) resolve();
      else signal.addEventListener("abort", () => resolve(), { once: true });
    });
    const closed = new Promise<void>((resolve) => server.close(() => resolve()));
    const ending: Promise<string>[] = [];
    const all = [
      ...Object.values(this.#sessions),
      ...this.#usbSessions.values(),
    ];
    for (const sessions of all) {
      for (const b of sessions.values()) {
        if (b === null) continue;
        b.stop("the handler is stopping");
        ending.push(b.done);
      }
    }
    await Promise.all(ending);
    for (const s of this.#sockets) s.destroy();
    await closed;
  }

  #clientTypes(): string[] {
    return this.#o.clientTypes ?? ["virt-handler"];
  }

  /** The socket's client is verified and allowed (checked again for every request). */
  #allowed(socket: Socket): boolean {
    const tls = socket as TLSSocket;
    return tls.authorized === true &&
      refuseClient(tls.getPeerCertificate(), this.#clientTypes()) === undefined;
  }

  #send(res: ServerResponse, status: number, message: string): void {
    const body = JSON.stringify({ kind: "Status", status: "Failure", message, code: status });
    res.writeHead(status, { "Content-Type": "application/json" });
    res.end(body + "\n");
  }

  #vmiOf(namespace: string, name: string): VirtualMachineInstance {
    const vmi = this.#o.backend.vmi(namespace, name);
    if (!vmi) throw new RouteError(404, `VMI ${namespace}/${name} does not exist`);
    return vmi;
  }

  async #launcherOf(vmi: VirtualMachineInstance): Promise<RestLauncher> {
    try {
      return await this.#o.backend.launcher(vmi);
    } catch (error) {
      throw new RouteError(500, errorText(error));
    }
  }

  async #request(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (!this.#allowed(req.socket)) {
      req.socket.destroy();
      return;
    }
    const url = new URL(req.url ?? "/", "https://handler");
    const route = ROUTE.exec(url.pathname);
    if (!route) return this.#send(res, 404, "404 page not found");
    const [, namespace, name, action] = route.map(decodeURIComponent);
    const method = req.method ?? "";
    try {
      if (action in SOCKET_ROUTES) {
        if (method !== "GET") throw new RouteError(405, `Method ${method} is not allowed`);
        this.#vmiOf(namespace, name);
        throw new RouteError(400, "This route serves WebSocket connections only");
      }
      if ((PUT_ROUTES as readonly string[]).includes(action)) {
        if (method !== "PUT") throw new RouteError(405, `Method ${method} is not allowed`);
        const body = await readBody(req);
        return await this.#lifecycle(res, this.#vmiOf(namespace, name), action, body);
      }
      if (action in GUEST_ROUTES || action === "vnc/screenshot") {
        if (method !== "GET") throw new RouteError(405, `Method ${method} is not allowed`);
        const vmi = this.#vmiOf(namespace, name);
        if (action === "vnc/screenshot") return await this.#screenshot(res, vmi);
        if (!isAgentConnected(vmi)) {
          throw new RouteError(409, "VMI does not have guest agent connected");
        }
        const launcher = await this.#launcherOf(vmi);
        let answer: unknown;
        try {
          answer = await launcher.guestQuery(GUEST_ROUTES[action as keyof typeof GUEST_ROUTES]);
        } catch (error) {
          throw new RouteError(500, errorText(error));
        }
        // KubeVirt's handler wraps the two lists in a list object (its ListMeta is empty).
        if (action !== "guestosinfo") answer = { metadata: {}, items: answer };
        res.writeHead(200, { "Content-Type": "application/json" });
        res.end(JSON.stringify(answer));
        return;
      }
      throw new RouteError(404, "404 page not found");
    } catch (error) {
      if (!(error instanceof RouteError)) throw error;
      this.#send(res, error.status, error.message);
    }
  }

  async #lifecycle(
    res: ServerResponse,
    vmi: VirtualMachineInstance,
    action: string,
    body: string,
  ): Promise<void> {
    let timeoutSeconds = 0;
    if (action === "freeze") {
      let parsed: { unfreezeTimeout?: unknown } = {};
      if (body.trim() !== "") {
        try {
          parsed = JSON.parse(body);
        } catch {
          throw new RouteError(400, "failed to unmarshal unfreeze timeout");
        }
      }
      if (typeof parsed.unfreezeTimeout !== "string") {
        throw new RouteError(400, "Unfreeze timeout in freeze request is not set");
      }
      const seconds = parseGoDuration(parsed.unfreezeTimeout);
      if (seconds === undefined) throw new RouteError(400, "failed to unmarshal unfreeze timeout");
      timeoutSeconds = Math.trunc(seconds);
    }
    const launcher = await this.#launcherOf(vmi);
    const failureStatus = action === "freeze" || action === "unfreeze" ? 400 : 500;
    try {
      switch (action) {
        case "pause":
          await launcher.pauseVirtualMachine(vmi);
          break;
        case "unpause":
          await launcher.unpauseVirtualMachine(vmi);
          break;
        case "softreboot":
          await launcher.softRebootVirtualMachine(vmi);
          this.#o.backend.record(
            vmi,
            "Normal",
            "SoftRebooted",
            "VirtualMachineInstance soft rebooted",
          );
          break;
        case "reset":
          await launcher.resetVirtualMachine(vmi);
          this.#o.backend.record(vmi, "Normal", "Reset", "VirtualMachineInstance reset");
          break;
        case "freeze":
          await launcher.freezeVirtualMachine(vmi, timeoutSeconds);
          break;
        case "unfreeze":
          await launcher.unfreezeVirtualMachine(vmi);
          break;
      }
    } catch (error) {
      if (action === "freeze") {
        this.#o.backend.record(
          vmi,
          "Warning",
          "FreezeError",
          `Failed to freeze VMI: ${errorText(error)}`,
        );
      }
      throw new RouteError(failureStatus, errorText(error));
    }
    res.writeHead(202);
    res.end();
  }

  async #screenshot(res: ServerResponse, vmi: VirtualMachineInstance): Promise<void> {
    const launcher = await this.#launcherOf(vmi);
    let shot: { mime: string; data: Uint8Array };
    try {
      shot = await launcher.getScreenshot(vmi);
    } catch (error) {
      throw new RouteError(500, errorText(error));
    }
    res.writeHead(200, { "Content-Type": shot.mime || "application/octet-stream" });
    res.end(shot.data);
  }

  async #upgrade(req: IncomingMessage, socket: TLSSocket, head: Uint8Array): Promise<void> {
    if (!this.#allowed(socket)) {
      socket.destroy();
      return;
    }
    const refuse = (status: number, message: string) => {
      socket.end(refusalResponse(status, message));
    };
    const url = new URL(req.url ?? "/", "https://handler");
    const route = ROUTE.exec(url.pathname);
    const action = route?.[3];
    if (!route || !(action! in SOCKET_ROUTES)) return refuse(404, "404 page not found");
    const kind = action as keyof typeof SOCKET_ROUTES;
    const [namespace, name] = [decodeURIComponent(route[1]), decodeURIComponent(route[2])];
    const vmi = this.#o.backend.vmi(namespace, name);
    if (!vmi) return refuse(404, `VMI ${namespace}/${name} does not exist`);
    let answer: string;
    try {
      answer = upgradeResponse(req.method, req.headers);
    } catch (error) {
      if (error instanceof UpgradeRefused) return refuse(error.status, error.message);
      throw error;
    }
    const uid = vmi.metadata.uid ?? `${namespace}/${name}`;
    if (kind === "usbredir") return await this.#usbRedirect(socket, head, vmi, uid, answer);
    const sessions = this.#sessions[kind];
    if (kind === "vnc" && url.searchParams.get("preserveSession") === "true" && sessions.has(uid)) {
      return refuse(503, "Active VNC connection. Request denied.");
    }
    const target = await this.#connect(socket, vmi, SOCKET_ROUTES[kind]);
    if (!target) return;
    sessions.get(uid)?.stop("a newer session took over");
    socket.write(answer);
    const session = bridge(socket, head, target);
    sessions.set(uid, session);
    log.info("WebSocket session opened", { namespace, name, uid, kind });
    const reason = await session.done;
    if (sessions.get(uid) === session) sessions.delete(uid);
    log.info("WebSocket session ended: {reason}", { namespace, name, uid, kind, reason });
  }

  /**
   * Connects to one of the VMI's private sockets, or answers the client why not (400 when
   * there is no such socket, 500 when it does not answer) and gives undefined; undefined
   * also when the client went away meanwhile.
   */
  async #connect(
    socket: TLSSocket,
    vmi: VirtualMachineInstance,
    name: PrivateSocketName,
  ): Promise<Socket | undefined> {
    let opened: OpenedSocket;
    try {
      opened = await this.#o.backend.openSocket(vmi, name);
    } catch (error) {
      socket.end(refusalResponse(400, errorText(error)));
      return undefined;
    }
    let target: Socket;
    try {
      target = await connectRetrying(opened.path);
    } catch (error) {
      socket.end(refusalResponse(500, `Cannot connect to the VMI's ${name}: ${errorText(error)}`));
      return undefined;
    } finally {
      opened.release();
    }
    if (socket.destroyed) {
      target.destroy();
      return undefined;
    }
    return target;
  }

  /**
   * A USB redirection session: the VMI's first free port of four, kept until the session
   * ends (KubeVirt's slots); 503 when all four are in use.
   */
  async #usbRedirect(
    socket: TLSSocket,
    head: Uint8Array,
    vmi: VirtualMachineInstance,
    uid: string,
    answer: string,
  ): Promise<void> {
    let slots = this.#usbSessions.get(uid);
    if (!slots) {
      slots = new Map();
      this.#usbSessions.set(uid, slots);
    }
    const taken = slots;
    const slot = Array.from({ length: USB_CLIENT_PASSTHROUGH_SLOTS }, (_, i) => i)
      .find((i) => !taken.has(i));
    if (slot === undefined) {
      socket.end(refusalResponse(503, "All USB devices are in use."));
      return;
    }
    // Held (before any await) while the socket is opened: no other session takes the slot.
    slots.set(slot, null);
    const free = () => {
      slots.delete(slot);
      if (slots.size === 0 && this.#usbSessions.get(uid) === slots) this.#usbSessions.delete(uid);
    };
    let target: Socket | undefined;
    try {
      target = await this.#connect(socket, vmi, usbRedirSocket(slot));
    } finally {
      if (!target) free();
    }
    if (!target) return;
    socket.write(answer);
    const session = bridge(socket, head, target);
    slots.set(slot, session);
    const { namespace, name } = vmi.metadata;
    log.info("USB redirection session opened", { namespace, name, uid, slot });
    const reason = await session.done;
    free();
    log.info("USB redirection session ended: {reason}", { namespace, name, uid, slot, reason });
  }
}

async function readBody(req: IncomingMessage): Promise<string> {
  const chunks: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Uint8Array).length;
    if (size > MAX_BODY) {
      throw new RouteError(400, `The request body is larger than ${MAX_BODY} bytes`);
    }
    chunks.push(chunk as Uint8Array);
  }
  const all = new Uint8Array(size);
  let at = 0;
  for (const c of chunks) {
    all.set(c, at);
    at += c.length;
  }
  return new TextDecoder().decode(all);
}

/** How long a connect to a VMI's socket keeps trying while its listener's backlog is full. */
const CONNECT_BACKLOG_MS = 5_000;

/**
 * Connects to the unix socket `path`, giving up after `timeoutMs`. QEMU's chardev sockets
 * listen with a backlog of one: a connect that comes while the one before is still waiting to be accepted (a session that
 * just ended and one that starts) is answered EAGAIN at once, and is tried again, backing
 * off, for up to {@linkcode CONNECT_BACKLOG_MS}, as ffi's `connectUnix` does.
 */
export async function connectRetrying(
  path: string,
  timeoutMs = CONNECT_BACKLOG_MS,
): Promise<Socket> {
  const deadline = performance.now() + timeoutMs;
  for (let pause = 5;; pause = Math.min(pause * 2, 200)) {
    try {
      return await new Promise<Socket>((resolve, reject) => {
        const s = connect({ path });
        s.once("connect", () => resolve(s));
        s.once("error", reject);
      });
    } catch (error) {
      const left = deadline - performance.now();
      if ((error as { code?: string }).code !== "EAGAIN" || left <= 0) throw error;
      await new Promise((resolve) => setTimeout(resolve, Math.min(pause, left)));
    }
  }
}

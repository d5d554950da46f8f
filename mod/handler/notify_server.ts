/**
 * The handler's notify server: launchers push every domain change
 * here as `kubevirt.notify.v1.Notify/HandleDomainEvent`, and Kubernetes events
 * about their VMI as `HandleK8sEvent`. The socket is a unix socket only root can
 * use. A malformed message is answered `success: false` naming the problem; it
 * never reaches the controller and never stops the server.
 *
 * @module
 */
import * as grpc from "@grpc/grpc-js";
import { decodeDomainJson, type Domain } from "../domain/mod.ts";
import {
  type DomainEventRequest,
  DomainEventType,
  type K8sEventRequest,
  notifyInfoService,
  notifyService,
  type Response,
  SUPPORTED_NOTIFY_VERSIONS,
  unixTarget,
} from "../proto/mod.ts";
import { aborted } from "../lifecycle/mod.ts";
import { getLogger } from "../log/mod.ts";

const log = getLogger("handler", "notify-server");

/** A domain change as the controller consumes it. */
export interface DomainNotification {
  /** What happened to the domain, as a watch event names it. */
  type: "ADDED" | "MODIFIED" | "DELETED";
  /** The domain as the launcher reports it now. */
  domain: Domain;
}

/** A Kubernetes event a launcher asks the handler to record. */
export interface K8sEventNotification {
  /** The event's type. */
  type: "Normal" | "Warning";
  /** The event's reason. */
  reason: string;
  /** The event's message. */
  message: string;
  /** The namespace of the VMI it is about. */
  namespace: string;
  /** The name of the VMI it is about. */
  name: string;
  /** The UID of the VMI it is about. */
  uid?: string;
}

/** What the notify server hands to the rest of the handler. */
export interface NotifyHandlers {
  /** A launcher reported a domain change. */
  onDomainEvent(event: DomainNotification): void;
  /** A launcher asked for a Kubernetes event about its VMI. */
  onK8sEvent(event: K8sEventNotification): void;
}

const decoder = new TextDecoder();

/** Parses a `DomainEventRequest`; throws with a clear message on bad input. */
export function parseDomainEvent(req: DomainEventRequest): DomainNotification {
  const type = req.eventType;
  if (
    type !== DomainEventType.Added && type !== DomainEventType.Modified &&
    type !== DomainEventType.Deleted
  ) {
    throw new Error(`unsupported eventType ${JSON.stringify(type)}`);
  }
  const domain = decodeDomainJson(decoder.decode(req.domainJSON ?? new Uint8Array()));
  if (!domain.metadata.name || !domain.metadata.namespace) {
    throw new Error("domain JSON lacks ObjectMeta name or namespace");
  }
  return { type, domain };
}

/** Parses a `K8sEventRequest` (a core/v1 Event as JSON). */
export function parseK8sEvent(req: K8sEventRequest): K8sEventNotification {
  let raw: Record<string, unknown>;
  try {
    raw = JSON.parse(decoder.decode(req.eventJSON ?? new Uint8Array()));
  } catch (error) {
    throw new Error("eventJSON is not valid JSON", { cause: error });
  }
  const involved = (raw?.involvedObject ?? {}) as Record<string, unknown>;
  const type = raw?.type === "Warning" ? "Warning" : "Normal";
  const reason = raw?.reason;
  if (typeof reason !== "string" || reason === "") throw new Error("event has no reason");
  if (typeof involved.name !== "string" || typeof involved.namespace !== "string") {
    throw new Error("event has no involvedObject name and namespace");
  }
  return {
    type,
    reason,
    message: typeof raw.message === "string" ? raw.message : "",
    namespace: involved.namespace,
    name: involved.name,
    uid: typeof involved.uid === "string" ? involved.uid : undefined,
  };
}

function reply(callback: grpc.sendUnaryData<Response>, error?: unknown): void {
  callback(null, {
    success: error === undefined,
    message: error === undefined ? "" : (error instanceof Error ? error.message : String(error)),
  });
}

/** The notify server: bound by {@linkcode NotifyServer.start}, served until its run ends. */
export class NotifyServer {
  /** For logs. */
  readonly name = "notify-server";
  readonly #server: grpc.Server;
  /** The socket path. */
  readonly socketPath: string;

  private constructor(server: grpc.Server, socketPath: string) {
    this.#server = server;
    this.socketPath = socketPath;
  }

  /** Binds the socket (replacing a stale one), sets mode 0600 and starts serving. */
  static async start(socketPath: string, handlers: NotifyHandlers): Promise<NotifyServer> {
    const server = new grpc.Server();
    server.addService(notifyService(), {
      HandleDomainEvent(
        call: grpc.ServerUnaryCall<DomainEventRequest, Response>,
        callback: grpc.sendUnaryData<Response>,
      ) {
        let event: DomainNotification;
        try {
          event = parseDomainEvent(call.request);
        } catch (error) {
          log.warn("Rejected malformed domain event: {error}", { error });
          return reply(callback, error);
        }
        log.debug("Domain event received", {
          namespace: event.domain.metadata.namespace,
          name: event.domain.metadata.name,
          type: event.type,
          status: event.domain.status.status,
          reason: event.domain.status.reason,
        });
        try {
          handlers.onDomainEvent(event);
        } catch (error) {
          log.error("Domain event handler failed: {error}", { error });
          return reply(callback, error);
        }
        reply(callback);
      },
      HandleK8sEvent(
        call: grpc.ServerUnaryCall<K8sEventRequest, Response>,
        callback: grpc.sendUnaryData<Response>,
      ) {
        try {
          handlers.onK8sEvent(parseK8sEvent(call.request));
          reply(callback);
        } catch (error) {
          log.warn("Rejected malformed Kubernetes event: {error}", { error });
          reply(callback, error);
        }
      },
    });
    server.addService(notifyInfoService(), {
      Info(_call: unknown, callback: grpc.sendUnaryData<unknown>) {
        callback(null, { supportedNotifyVersions: [...SUPPORTED_NOTIFY_VERSIONS] });
      },
    });
    const dir = socketPath.slice(0, socketPath.lastIndexOf("/")) || "/";
    await Deno.mkdir(dir, { recursive: true, mode: 0o755 });
    await Deno.remove(socketPath).catch(() => {});
    await new Promise<void>((resolve, reject) => {
      server.bindAsync(unixTarget(socketPath), grpc.ServerCredentials.createInsecure(), (err) => {
        if (err) reject(new Error(`Cannot bind notify socket "${socketPath}"`, { cause: err }));
        else resolve();
      });
    });
    await Deno.chmod(socketPath, 0o600);
    return new NotifyServer(server, socketPath);
  }

  /** Serves until `signal` aborts; then stops (in-flight calls finish) and removes the socket. */
  async run(signal: AbortSignal): Promise<void> {
    await aborted(signal);
    await this.#stop();
  }

  async #stop(): Promise<void> {
    await new Promise<void>((resolve) => {
      const timer = setTimeout(() => {
        this.#server.forceShutdown();
        resolve();
      }, 2_000);
      this.#server.tryShutdown(() => {
        clearTimeout(timer);
        resolve();
      });
    });
    await Deno.remove(this.socketPath).catch(() => {});
  }
}

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
import { aborted, removeIfPresent } from "../lifecycle/mod.ts";
import { getLogger } from "../log/mod.ts";
import { errorText } from "../../ffi/mod.ts";

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
    message: error === undefined ? "" : errorText(error),
  });
}

/**
 * The one VMI a notify connection may speak for: a launcher pod's pipe is bound to the
 * VMI whose launcher it was opened for, so a compromised launcher cannot report domains
 * or record Events of another tenant's VMI.
 */
export interface NotifySender {
  /** The VMI's UID. */
  uid: string;
  /** The VMI's namespace. */
  namespace: string;
  /** The VMI's name. */
  name: string;
}

/** Messages refused because they named a VMI other than their sender's, by kind. */
export interface NotifyRefusals {
  /** `HandleDomainEvent` calls refused. */
  domainEvents: number;
  /** `HandleK8sEvent` calls refused. */
  k8sEvents: number;
}

/** Counts of refused messages over every pipe of the handler (for its metrics). */
export const notifyRefusals: NotifyRefusals = { domainEvents: 0, k8sEvents: 0 };

/**
 * Why `domain` may not come from `sender`, or undefined when it may: its name and
 * namespace must be the sender's VMI's, and its UID that VMI's UID (a missing UID is
 * foreign, as KubeVirt's handler counts it).
 */
export function refuseDomain(sender: NotifySender, domain: Domain): string | undefined {
  const { namespace, name } = domain.metadata;
  if (namespace !== sender.namespace || name !== sender.name) {
    return `the domain names VMI "${namespace}/${name}", not this launcher's ` +
      `"${sender.namespace}/${sender.name}"`;
  }
  const uid = domain.spec.metadata.kubevirt.uid || domain.metadata.uid;
  if (uid !== sender.uid) {
    return `the domain's VMI UID ${
      JSON.stringify(uid ?? "")
    } is not this launcher's "${sender.uid}"`;
  }
  return undefined;
}

/** Why `event` may not come from `sender`, or undefined when it may. */
export function refuseK8sEvent(
  sender: NotifySender,
  event: K8sEventNotification,
): string | undefined {
  if (event.namespace !== sender.namespace || event.name !== sender.name) {
    return `the event is about "${event.namespace}/${event.name}", not this launcher's VMI ` +
      `"${sender.namespace}/${sender.name}"`;
  }
  if (event.uid !== undefined && event.uid !== sender.uid) {
    return `the event's UID "${event.uid}" is not this launcher's VMI's "${sender.uid}"`;
  }
  return undefined;
}

/** The implementations of `Notify` and `NotifyInfo` a grpc-js server serves. */
export interface NotifyImplementation {
  /** `kubevirt.notify.v1.Notify`. */
  notify: grpc.UntypedServiceImplementation;
  /** `kubevirt.notify.v1.NotifyInfo`. */
  info: grpc.UntypedServiceImplementation;
}

/**
 * The notify services over `handlers`. With a `sender`, every message must be about that
 * VMI: others are answered `success: false`, logged and counted in
 * {@linkcode notifyRefusals}, and never reach the handlers.
 */
export function notifyImplementation(
  handlers: NotifyHandlers,
  sender?: NotifySender,
): NotifyImplementation {
  const notify = {
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
      const refused = sender && refuseDomain(sender, event.domain);
      if (refused) {
        notifyRefusals.domainEvents++;
        log.warn("Refused a domain event from a launcher: {why}", { ...sender, why: refused });
        return reply(callback, new Error(`Refused domain event: ${refused}`));
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
      let event: K8sEventNotification;
      try {
        event = parseK8sEvent(call.request);
      } catch (error) {
        log.warn("Rejected malformed Kubernetes event: {error}", { error });
        return reply(callback, error);
      }
      const refused = sender && refuseK8sEvent(sender, event);
      if (refused) {
        notifyRefusals.k8sEvents++;
        log.warn("Refused a Kubernetes event from a launcher: {why}", { ...sender, why: refused });
        return reply(callback, new Error(`Refused Kubernetes event: ${refused}`));
      }
      try {
        handlers.onK8sEvent(event);
        reply(callback);
      } catch (error) {
        log.warn("Kubernetes event refused: {error}", { error });
        reply(callback, error);
      }
    },
  };
  const info = {
    Info(_call: unknown, callback: grpc.sendUnaryData<unknown>) {
      callback(null, { supportedNotifyVersions: [...SUPPORTED_NOTIFY_VERSIONS] });
    },
  };
  return { notify, info };
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
    const implementation = notifyImplementation(handlers);
    server.addService(notifyService(), implementation.notify);
    server.addService(notifyInfoService(), implementation.info);
    const dir = socketPath.slice(0, socketPath.lastIndexOf("/")) || "/";
    await Deno.mkdir(dir, { recursive: true, mode: 0o755 });
    await removeIfPresent(socketPath);
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
    // Shutting down: a socket left behind is replaced by the next start().
    await removeIfPresent(this.socketPath).catch((error) =>
      log.warn("Cannot remove the notify socket {path}: {error}", { path: this.socketPath, error })
    );
  }
}

/**
 * The launcher's side of the notify API: it tells the handler about every change of its
 * domain (`HandleDomainEvent`) and about Kubernetes events concerning its VMI
 * (`HandleK8sEvent`), over the handler's unix socket (in KubeVirt
 * `<virt share dir>/domain-notify-pipe.sock`).
 *
 * Delivery follows KubeVirt's launcher: the version is negotiated with
 * `kubevirt.notify.info.NotifyInfo` on connect; each send is retried about once a second,
 * with a 5 s deadline per try, and given up after 20 s in all. Transient failures
 * (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, or no gRPC status at all) drop the connection
 * and retry; any other gRPC status fails the send at once. Sends are queued and delivered
 * strictly in the order they were made.
 *
 * Once a send was given up, the handler is taken as gone: each later send gets one try
 * and fails at once if that fails too, until a send gets through again. A launcher host
 * shares one client among all its VMIs, so without this an orphaned host would spend
 * 20 s of retries on every event queued behind the first, for minutes (two connects a
 * second, 0.5 % of a core and garbage in steps of megabytes with 8 VMIs). Nothing is lost
 * that matters: a handler that comes back reads every domain afresh when it takes its
 * VMIs back.
 *
 * @module
 */

import * as grpc from "@grpc/grpc-js";
import { type Domain, encodeDomainJson } from "../domain/mod.ts";
import {
  type DomainEventType,
  highestCommonVersion,
  type NotifyInfoResponse,
  notifyInfoService,
  notifyService,
  type Response,
  SUPPORTED_NOTIFY_VERSIONS,
  unixTarget,
} from "../proto/mod.ts";
import { sleep } from "../lifecycle/mod.ts";
import { getLogger } from "../log/mod.ts";
import { errorText } from "../../ffi/mod.ts";

const log = getLogger("launcher", "notify-client");

/** Timing of {@linkcode NotifyClient}; KubeVirt's values unless told. */
export interface NotifyTimeouts {
  /** Pause between tries; 1,000 ms. */
  intervalMs?: number;
  /** Deadline of one try; 5,000 ms. */
  sendTimeoutMs?: number;
  /** Give up after this long in all; 20,000 ms. */
  totalTimeoutMs?: number;
}

/** A Kubernetes object reference, as the Event's `involvedObject`. */
export interface InvolvedObject {
  /** The object's namespace. */
  namespace: string;
  /** The object's name. */
  name: string;
  /** The object's UID. */
  uid?: string;
  /** The object's kind (`VirtualMachineInstance` unless told). */
  kind?: string;
  /** The object's API version (`kubevirt.io/v1` unless told). */
  apiVersion?: string;
}

/** Severity of a Kubernetes event. */
export type K8sEventType = "Normal" | "Warning";

/** A notify call failed for good (after retries, or at once for a non-transient status). */
export class NotifyError extends Error {
  /** The gRPC status code of the last failure, when there was one (grpc-js `status`). */
  readonly code?: number;
  /** Creates the error; `detail` follows `Cannot send <what> to "<socket>": `. */
  constructor(what: string, socketPath: string, detail: string, options?: ErrorOptions) {
    super(`Cannot send ${what} to "${socketPath}": ${detail}`, options);
    this.name = "NotifyError";
    const cause = options?.cause as Partial<grpc.ServiceError> | undefined;
    if (typeof cause?.code === "number") this.code = cause.code;
  }
}

type Unary<Req, Res> = (
  request: Req,
  options: grpc.CallOptions,
  callback: (error: grpc.ServiceError | null, response?: Res) => void,
) => grpc.ClientUnaryCall;

interface Connection {
  notify: grpc.Client & Record<string, Unary<unknown, Response>>;
}

const TRANSIENT = new Set<number>([
  grpc.status.UNAVAILABLE,
  grpc.status.DEADLINE_EXCEEDED,
  grpc.status.ABORTED,
]);

/** Whether a failed call is worth another try, as KubeVirt decides it. */
export function isTransientNotifyError(error: unknown): boolean {
  const code = (error as Partial<grpc.ServiceError> | null)?.code;
  return typeof code !== "number" || TRANSIENT.has(code);
}

function unary<Req, Res>(
  client: grpc.Client,
  method: string,
  request: Req,
  timeoutMs: number,
): Promise<Res> {
  const fn = (client as unknown as Record<string, Unary<Req, Res>>)[method];
  return new Promise((resolve, reject) => {
    fn.call(client, request, { deadline: Date.now() + timeoutMs }, (error, response) => {
      if (error) reject(error);
      else resolve(response as Res);
    });
  });
}

function message(error: unknown): string {
  return errorText(error);
}

/**
 * A notify client for one handler socket. Create it once per launcher; {@linkcode close}
 * it at the end (after {@linkcode flush} to deliver what is queued).
 */
export class NotifyClient {
  /** The socket path. */
  readonly socketPath: string;
  readonly #intervalMs: number;
  readonly #sendTimeoutMs: number;
  readonly #totalTimeoutMs: number;
  #connection: Connection | null = null;
  #tail: Promise<void> = Promise.resolve();
  #pending = 0;
  #closed = false;
  /** The last send was given up and none got through since. */
  #unreachable = false;

  /** Creates the client; nothing is dialled before the first send. */
  constructor(socketPath: string, timeouts: NotifyTimeouts = {}) {
    this.socketPath = socketPath;
    this.#intervalMs = timeouts.intervalMs ?? 1_000;
    this.#sendTimeoutMs = timeouts.sendTimeoutMs ?? 5_000;
    this.#totalTimeoutMs = timeouts.totalTimeoutMs ?? 20_000;
  }

  /** Number of sends queued or in flight. */
  get pending(): number {
    return this.#pending;
  }

  /**
   * Queues a domain event (`ADDED`, `MODIFIED`, `DELETED`) carrying the domain as
   * KubeVirt's Domain JSON. Resolves when the handler accepted it; rejects with
   * {@linkcode NotifyError} when it could not be delivered.
   */
  sendDomainEvent(eventType: DomainEventType, domain: Domain): Promise<void> {
    const request = {
      domainJSON: new TextEncoder().encode(encodeDomainJson(domain)),
      statusJSON: new Uint8Array(),
      eventType,
    };
    return this.#enqueue(`domain event ${eventType}`, "HandleDomainEvent", request);
  }

  /**
   * Queues a Kubernetes event about the VMI (`reason` e.g. `Started`, `ShuttingDown`);
   * the handler records it on the VMI.
   */
  sendK8sEvent(
    vmi: InvolvedObject,
    type: K8sEventType,
    reason: string,
    text: string,
  ): Promise<void> {
    const event = {
      metadata: { creationTimestamp: null },
      involvedObject: {
        kind: vmi.kind ?? "VirtualMachineInstance",
        namespace: vmi.namespace,
        name: vmi.name,
        uid: vmi.uid,
        apiVersion: vmi.apiVersion ?? "kubevirt.io/v1",
      },
      reason,
      message: text,
      source: {},
      firstTimestamp: null,
      lastTimestamp: null,
      eventTime: null,
      type,
      reportingComponent: "",
      reportingInstance: "",
    };
    const request = { eventJSON: new TextEncoder().encode(JSON.stringify(event)) };
    return this.#enqueue(`Kubernetes event ${reason}`, "HandleK8sEvent", request);
  }

  /** Resolves when everything queued so far was delivered or given up, or after `timeoutMs`. */
  async flush(timeoutMs = this.#totalTimeoutMs + this.#sendTimeoutMs): Promise<boolean> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const done = await Promise.race([
      this.#tail.then(() => true),
      new Promise<boolean>((resolve) => timer = setTimeout(() => resolve(false), timeoutMs)),
    ]);
    clearTimeout(timer);
    return done;
  }

  /** Drops the connection; later sends fail at once. */
  close(): void {
    this.#closed = true;
    this.#disconnect();
  }

  #enqueue(what: string, method: string, request: unknown): Promise<void> {
    if (this.#closed) {
      return Promise.reject(new NotifyError(what, this.socketPath, "the client is closed"));
    }
    this.#pending++;
    const result = this.#tail.then(() => this.#deliver(what, method, request));
    this.#tail = result.then(() => {}, () => {}).finally(() => this.#pending--);
    return result;
  }

  async #deliver(what: string, method: string, request: unknown): Promise<void> {
    // Given up before and not heard since: one try, no retries.
    const once = this.#unreachable;
    const deadline = Date.now() + (once ? 0 : this.#totalTimeoutMs);
    let last: unknown = new Error("no try was made");
    for (let attempt = 0;; attempt++) {
      if (this.#closed) throw new NotifyError(what, this.socketPath, "the client is closed");
      try {
        const connection = await this.#connect();
        const response = await unary<unknown, Response>(
          connection.notify,
          method,
          request,
          this.#sendTimeoutMs,
        );
        if (!response.success && response.message !== "") {
          throw new NotifyError(
            what,
            this.socketPath,
            `the handler refused it: ${response.message}`,
          );
        }
        this.#unreachable = false;
        return;
      } catch (error) {
        if (error instanceof NotifyError) throw error;
        last = error;
        if (!isTransientNotifyError(error)) {
          throw new NotifyError(what, this.socketPath, message(error), { cause: error });
        }
        log.debug("Notify send failed, retrying", {
          socket: this.socketPath,
          attempt,
          error: message(error),
        });
        this.#disconnect();
      }
      if (Date.now() + this.#intervalMs > deadline) break;
      await sleep(this.#intervalMs);
    }
    this.#unreachable = true;
    const error = new NotifyError(
      what,
      this.socketPath,
      once
        ? `one try, the handler being unreachable since an earlier send was given up: ${
          message(last)
        }`
        : `gave up after ${this.#totalTimeoutMs} ms: ${message(last)}`,
      { cause: last },
    );
    log.error("Could not send notify event", { socket: this.socketPath, error: error.message });
    throw error;
  }

  async #connect(): Promise<Connection> {
    if (this.#connection) return this.#connection;
    const target = unixTarget(this.socketPath);
    const Info = grpc.makeClientConstructor(notifyInfoService(), "NotifyInfo");
    const info = new Info(target, grpc.credentials.createInsecure());
    let version: number | undefined;
    try {
      const reply = await unary<unknown, NotifyInfoResponse>(info, "Info", {}, this.#sendTimeoutMs);
      version = highestCommonVersion(reply.supportedNotifyVersions, SUPPORTED_NOTIFY_VERSIONS);
    } catch (error) {
      info.close();
      throw error;
    }
    if (version === undefined) {
      info.close();
      // Not transient: the handler speaks no version we know.
      const error = Object.assign(
        new Error(`no common notify version (ours: ${SUPPORTED_NOTIFY_VERSIONS.join(",")})`),
        { code: grpc.status.FAILED_PRECONDITION },
      );
      throw error;
    }
    const Notify = grpc.makeClientConstructor(notifyService(), "Notify");
    const notify = new Notify(target, grpc.credentials.createInsecure(), {
      channelOverride: info.getChannel() as grpc.Channel,
    }) as Connection["notify"];
    this.#connection = { notify };
    return this.#connection;
  }

  #disconnect(): void {
    // The notify client shares the info client's channel; closing it closes both.
    this.#connection?.notify.close();
    this.#connection = null;
  }
}

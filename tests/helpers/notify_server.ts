/**
 * A real `kubevirt.notify.v1.Notify` (and `NotifyInfo`) grpc-js server on a temporary
 * unix socket, recording what launchers send, in arrival order. For tests.
 *
 * @module
 */

import * as grpc from "@grpc/grpc-js";
import { join } from "node:path";
import { decodeDomainJson, type Domain } from "../../mod/domain/mod.ts";
import {
  type DomainEventRequest,
  type K8sEventRequest,
  notifyInfoService,
  notifyService,
  SUPPORTED_NOTIFY_VERSIONS,
  unixTarget,
} from "../../mod/proto/mod.ts";

/** One `HandleDomainEvent` call as received. */
export interface RecordedDomainEvent {
  /** `ADDED`, `MODIFIED`, `DELETED`, `ERROR`. */
  eventType: string;
  /** The decoded domain (`undefined` when `domainJSON` was empty). */
  domain?: Domain;
  /** The raw domain JSON text. */
  domainJSON: string;
  /** The raw status JSON text. */
  statusJSON: string;
}

/** One `HandleK8sEvent` call as received: the Kubernetes Event JSON, parsed. */
export interface RecordedK8sEvent {
  type: string;
  reason: string;
  message: string;
  involvedObject: { kind?: string; namespace?: string; name?: string; uid?: string };
}

/** Options of {@linkcode startNotifyServer}. */
export interface NotifyServerOptions {
  /** Socket path; a fresh temporary one unless told. */
  socketPath?: string;
  /** Versions `NotifyInfo.Info` reports; `[1]` unless told. */
  supportedVersions?: number[];
  /** Answer the first N `HandleDomainEvent` calls with UNAVAILABLE (retry tests). */
  failFirst?: number;
}

/** A running test notify server. */
export interface TestNotifyServer {
  /** The socket path. */
  socketPath: string;
  /** Domain events in arrival order. */
  domainEvents: RecordedDomainEvent[];
  /** Kubernetes events in arrival order. */
  k8sEvents: RecordedK8sEvent[];
  /** Number of `HandleDomainEvent` calls, failed ones included. */
  domainCalls: number;
  /** Resolves with the first domain event (from the start) matching, or rejects after `timeoutMs`. */
  waitForDomainEvent(
    predicate: (event: RecordedDomainEvent) => boolean,
    timeoutMs?: number,
  ): Promise<RecordedDomainEvent>;
  /** Like {@linkcode waitForDomainEvent} for Kubernetes events. */
  waitForK8sEvent(
    predicate: (event: RecordedK8sEvent) => boolean,
    timeoutMs?: number,
  ): Promise<RecordedK8sEvent>;
  /** `status/reason` of every recorded domain event, e.g. `Running/Unknown`. */
  statuses(): string[];
  /** Stops the server and removes the socket (and its temporary directory). */
  close(): Promise<void>;
}

type Callback = (error: Partial<grpc.ServiceError> | null, value?: unknown) => void;

async function waitUntil<T>(
  find: () => T | undefined,
  what: string,
  timeoutMs: number,
  describe: () => string,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const found = find();
    if (found !== undefined) return found;
    if (Date.now() > deadline) {
      throw new Error(`No ${what} matched within ${timeoutMs} ms; received: ${describe()}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** Starts a notify server; close it in the test's `finally`. */
export async function startNotifyServer(
  options: NotifyServerOptions = {},
): Promise<TestNotifyServer> {
  const tempDir = options.socketPath ? undefined : await Deno.makeTempDir({ prefix: "vn-notify" });
  const socketPath = options.socketPath ?? join(tempDir!, "domain-notify-pipe.sock");
  const decoder = new TextDecoder();
  let failures = options.failFirst ?? 0;
  const server = new grpc.Server();
  const state: TestNotifyServer = {
    socketPath,
    domainEvents: [],
    k8sEvents: [],
    domainCalls: 0,
    waitForDomainEvent: (predicate, timeoutMs = 10_000) =>
      waitUntil(
        () => state.domainEvents.find(predicate),
        "domain event",
        timeoutMs,
        () => state.statuses().join(", "),
      ),
    waitForK8sEvent: (predicate, timeoutMs = 10_000) =>
      waitUntil(
        () => state.k8sEvents.find(predicate),
        "Kubernetes event",
        timeoutMs,
        () => state.k8sEvents.map((e) => e.reason).join(", "),
      ),
    statuses: () =>
      state.domainEvents.map((e) =>
        e.domain
          ? `${e.eventType}:${e.domain.status.status}/${e.domain.status.reason}`
          : e.eventType
      ),
    close: async () => {
      await new Promise<void>((resolve) => server.tryShutdown(() => resolve()));
      if (tempDir) await Deno.remove(tempDir, { recursive: true }).catch(() => {});
      else await Deno.remove(socketPath).catch(() => {});
    },
  };
  server.addService(notifyService(), {
    HandleDomainEvent: (call: { request: DomainEventRequest }, callback: Callback) => {
      state.domainCalls++;
      if (failures > 0) {
        failures--;
        callback({ code: grpc.status.UNAVAILABLE, details: "test: not yet" });
        return;
      }
      const domainJSON = decoder.decode(call.request.domainJSON);
      state.domainEvents.push({
        eventType: call.request.eventType,
        domain: domainJSON ? decodeDomainJson(domainJSON) : undefined,
        domainJSON,
        statusJSON: decoder.decode(call.request.statusJSON),
      });
      callback(null, { success: true, message: "" });
    },
    HandleK8sEvent: (call: { request: K8sEventRequest }, callback: Callback) => {
      state.k8sEvents.push(JSON.parse(decoder.decode(call.request.eventJSON)));
      callback(null, { success: true, message: "" });
    },
  });
  server.addService(notifyInfoService(), {
    Info: (_call: unknown, callback: Callback) => {
      callback(null, {
        supportedNotifyVersions: options.supportedVersions ?? [...SUPPORTED_NOTIFY_VERSIONS],
      });
    },
  });
  await new Promise<void>((resolve, reject) => {
    server.bindAsync(unixTarget(socketPath), grpc.ServerCredentials.createInsecure(), (error) => {
      if (error) reject(error);
      else resolve();
    });
  });
  return state;
}

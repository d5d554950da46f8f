/**
 * What every gRPC API of this folder shares: the loader options, where the `.proto` files
 * are, the error when one cannot be loaded, the target of a unix socket, and the grpc-js
 * shapes the clients and service definitions are typed with.
 *
 * @module
 */

import { fileURLToPath } from "node:url";
import * as protoLoader from "@grpc/proto-loader";
// The `.proto` files of this folder, compiled by `deno task proto` (tests/proto_compile.ts):
// loading them costs no parsing at start.
import descriptors from "./descriptors.json" with { type: "json" };

// The grpc-js shapes below are our own, narrowed to what virtnode uses: the public API names
// no npm type, so `deno doc` documents it whole. A ServiceDefinition is assignable to what
// grpc-js takes (`Server.addService`, `makeClientConstructor`); what grpc-js hands back
// (its ServiceError, calls, streams) is assignable to ours.

/** Options of `@grpc/proto-loader`'s `loadSync`, the ones virtnode sets. */
export interface ProtoLoaderOptions {
  /** Keep field names as in the `.proto` instead of camelCasing them. */
  readonly keepCase: boolean;
  /** Type 64-bit integers are read as (`String`: decimal strings). */
  readonly longs: typeof String;
  /** Type enum values are read as (`String`: their names). */
  readonly enums: typeof String;
  /** Set unset fields to their default values. */
  readonly defaults: boolean;
  /** Add a virtual field naming the set member of each oneof. */
  readonly oneofs: boolean;
}

/** Loader options: KubeVirt field names kept, defaults filled in. */
export const PROTO_LOADER_OPTIONS: ProtoLoaderOptions = Object.freeze({
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
});

/** The `.proto` files could not be found or parsed. */
export class ProtoLoadError extends Error {
  /** The file that failed. */
  readonly file: string;
  /** Creates the error for `file`, with the loader's failure as `cause`. */
  constructor(file: string, options?: ErrorOptions) {
    const detail = options?.cause instanceof Error ? `: ${options.cause.message}` : "";
    super(`Cannot load proto file "${file}"${detail}`, options);
    this.name = "ProtoLoadError";
    this.file = file;
  }
}

/** Absolute path of one of this module's `.proto` files. */
export function protoPath(file: string): string {
  return fileURLToPath(new URL(`./${file}`, import.meta.url));
}

const definitions = new Map<string, protoLoader.PackageDefinition>();

/**
 * The package definition of one of this folder's `.proto` files, from its precompiled
 * descriptor (`descriptors.json`), built once per process. Throws {@linkcode ProtoLoadError}.
 */
export function loadDefinition(file: string): protoLoader.PackageDefinition {
  let definition = definitions.get(file);
  if (!definition) {
    const json = (descriptors as Record<string, unknown>)[file];
    try {
      if (json === undefined) throw new Error("not among the precompiled descriptors");
      definition = protoLoader.fromJSON(json as Parameters<typeof protoLoader.fromJSON>[0], {
        ...PROTO_LOADER_OPTIONS,
      });
    } catch (error) {
      throw new ProtoLoadError(protoPath(file), { cause: error });
    }
    definitions.set(file, definition);
  }
  return definition;
}

/** The grpc-js target of a unix socket path: `unix:///abs/path`. */
export function unixTarget(socketPath: string): string {
  return socketPath.startsWith("/") ? `unix://${socketPath}` : `unix:${socketPath}`;
}

/** One RPC of a service definition, as `@grpc/proto-loader` describes it. */
export interface MethodDefinition {
  /** The RPC's HTTP/2 path, `/package.Service/Method`. */
  readonly path: string;
  /** Whether the client sends a stream of requests. */
  readonly requestStream: boolean;
  /** Whether the server sends a stream of responses. */
  readonly responseStream: boolean;
  /** Encodes a request message. */
  requestSerialize(value: unknown): Buffer;
  /** Decodes a request message. */
  requestDeserialize(bytes: Buffer): unknown;
  /** Encodes a response message. */
  responseSerialize(value: unknown): Buffer;
  /** Decodes a response message. */
  responseDeserialize(bytes: Buffer): unknown;
  /** The RPC's name as written in the `.proto`. */
  readonly originalName?: string;
}

/** A service definition for grpc-js's `Server.addService` or `makeClientConstructor`. */
export interface ServiceDefinition {
  /** The definition of each RPC, by method name. */
  readonly [method: string]: MethodDefinition;
}

/** A failed call as grpc-js reports it: an `Error` with the gRPC status. */
export interface ServiceError extends Error {
  /** The gRPC status code, e.g. 14 (UNAVAILABLE) or 4 (DEADLINE_EXCEEDED). */
  code: number;
  /** The status message. */
  details: string;
}

/** Options of one call. */
export interface CallOptions {
  /** When the call fails with DEADLINE_EXCEEDED: a `Date`, or milliseconds since the epoch. */
  deadline?: Date | number;
}

/** A call in progress. */
export interface ClientCall {
  /** Cancels the call; its callback or `error` listener gets CANCELLED. */
  cancel(): void;
}

/** A call whose responses arrive as a stream of `data` events. */
export interface ClientReadableStream<Res> extends ClientCall {
  /** Adds a listener for each response. */
  on(event: "data", listener: (response: Res) => void): this;
  /** Adds a listener for the call's failure. */
  on(event: "error", listener: (error: ServiceError) => void): this;
  /** Adds a listener for the end of the stream. */
  on(event: "end", listener: () => void): this;
}

/** What every client has besides its RPCs. */
export interface GrpcClient {
  /** Closes the channel; calls in progress fail. */
  close(): void;
}

/** Channel options by grpc's option name, e.g. `{ "grpc.client_idle_timeout_ms": 10_000 }`. */
export type ChannelOptions = Readonly<Record<string, string | number>>;

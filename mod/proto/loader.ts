/**
 * What every gRPC API of this folder shares: the loader options, where the `.proto` files
 * are, the error when one cannot be loaded, and the target of a unix socket.
 *
 * @module
 */

import type * as protoLoader from "@grpc/proto-loader";
import { fileURLToPath } from "node:url";

/** Loader options: KubeVirt field names kept, defaults filled in. */
export const PROTO_LOADER_OPTIONS: protoLoader.Options = Object.freeze({
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

/** The grpc-js target of a unix socket path: `unix:///abs/path`. */
export function unixTarget(socketPath: string): string {
  return socketPath.startsWith("/") ? `unix://${socketPath}` : `unix:${socketPath}`;
}

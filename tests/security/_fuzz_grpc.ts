/**
 * A gRPC client for fuzzing: it sends any bytes as a method's request message, the
 * protobuf a real client would not write, over grpc-js on a unix socket.
 *
 * @module
 */
import * as grpc from "@grpc/grpc-js";
import { type ServiceDefinition, unixTarget } from "../../mod/proto/mod.ts";

/** How a call ended: the decoded response, or the gRPC error status. */
export type RawOutcome =
  | { response: unknown; error?: undefined }
  | { response?: undefined; error: grpc.ServiceError };

/** A client of one unix socket that sends request messages as raw bytes. */
export class RawGrpcClient {
  readonly #client: grpc.Client;

  /** Dials `socketPath` lazily. */
  constructor(socketPath: string) {
    this.#client = new grpc.Client(unixTarget(socketPath), grpc.credentials.createInsecure());
  }

  /** Calls `method` of `service` with `bytes` as its request; never rejects. */
  call(
    service: ServiceDefinition,
    method: string,
    bytes: Uint8Array,
    timeoutMs = 10_000,
  ): Promise<RawOutcome> {
    const definition = service[method];
    return new Promise((resolve) => {
      this.#client.makeUnaryRequest(
        definition.path,
        (b: Uint8Array) => Buffer.from(b),
        (b: Buffer) => definition.responseDeserialize(b),
        bytes,
        { deadline: Date.now() + timeoutMs },
        (error, response) => resolve(error ? { error } : { response }),
      );
    });
  }

  /** Closes the channel. */
  close(): void {
    this.#client.close();
  }
}

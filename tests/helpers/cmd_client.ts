/**
 * A promise-style test client of a launcher socket, built from the same protos as the
 * server (`mod/proto`): `kubevirt.cmd.v1.Cmd` and `kubevirt.cmd.info.CmdInfo`.
 *
 * @module
 */

import type * as grpc from "@grpc/grpc-js";
import {
  type CmdClient,
  type CmdInfoClient,
  type CmdMethod,
  type DomainResponse,
  newCmdClient,
  newCmdInfoClient,
  type Response,
} from "../../mod/proto/mod.ts";

/** A test cmd client; {@linkcode TestCmdClient.close} it at the end. */
export class TestCmdClient {
  readonly #cmd: CmdClient;
  readonly #info: CmdInfoClient;
  readonly #timeoutMs: number;

  /** Dials `socketPath` lazily; each call has a `timeoutMs` deadline (30 s unless told). */
  constructor(socketPath: string, timeoutMs = 30_000) {
    this.#cmd = newCmdClient(socketPath);
    this.#info = newCmdInfoClient(socketPath);
    this.#timeoutMs = timeoutMs;
  }

  /** Calls any Cmd RPC; rejects with the grpc `ServiceError` on a non-OK status. */
  call<Res = unknown>(method: CmdMethod, request: unknown = {}): Promise<Res> {
    const fn = this.#cmd[method] as (
      req: unknown,
      options: grpc.CallOptions,
      callback: (error: grpc.ServiceError | null, response?: Res) => void,
    ) => void;
    return new Promise((resolve, reject) => {
      fn.call(this.#cmd, request, { deadline: Date.now() + this.#timeoutMs }, (error, res) => {
        if (error) reject(error);
        else resolve(res as Res);
      });
    });
  }

  /** Calls a VMIRequest RPC with `vmi` (an object, or raw JSON text) as `vmi.vmiJson`. */
  vmiCall(method: CmdMethod, vmi: unknown): Promise<Response> {
    const text = typeof vmi === "string" ? vmi : JSON.stringify(vmi);
    return this.call<Response>(method, { vmi: { vmiJson: new TextEncoder().encode(text) } });
  }

  /** `GetDomain`. */
  getDomain(): Promise<DomainResponse> {
    return this.call<DomainResponse>("GetDomain", {});
  }

  /** `CmdInfo.Info`: the supported cmd versions. */
  info(): Promise<number[]> {
    return new Promise((resolve, reject) => {
      this.#info.Info({}, { deadline: Date.now() + this.#timeoutMs }, (error, res) => {
        if (error) reject(error);
        else resolve(res?.supportedCmdVersions ?? []);
      });
    });
  }

  /** Closes both clients. */
  close(): void {
    this.#cmd.close();
    this.#info.close();
  }
}

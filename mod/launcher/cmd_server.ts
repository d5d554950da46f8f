/**
 * The launcher's cmd server: `kubevirt.cmd.v1.Cmd` and `kubevirt.cmd.info.CmdInfo` over
 * a unix socket, laid out as KubeVirt's virt-launcher lays it out: the server binds
 * `<socket dir>/launcher-init-sock` (mode 0600, root only) and, once the launcher is
 * ready, renames it to `<socket dir>/launcher-sock`, the name the handler dials (in a
 * KubeVirt pod the socket dir is `/var/run/kubevirt/sockets`).
 *
 * Every RPC answers; none throws. Failures are `Response{success: false, message}` with
 * a message naming the VMI and the problem, except the probes' GuestPing and Exec, which
 * fail with gRPC status UNKNOWN as KubeVirt's launcher's do (its clients read nothing
 * else); RPCs virtnode does not implement answer gRPC status UNIMPLEMENTED naming the RPC. GetGuestInfo, GetUsers and GetFilesystems succeed
 * without a guest agent too, with an empty object or list, as KubeVirt's launcher does.
 *
 * @module
 */

import * as grpc from "@grpc/grpc-js";
import { join } from "node:path";
import { SocketNames } from "../api/mod.ts";
import { encodeDomainJson } from "../domain/mod.ts";
import {
  CMD_METHODS,
  cmdInfoService,
  type CmdMethod,
  cmdService,
  type DomainResponse,
  type DomainStatsResponse,
  type GuestInfoResponse,
  type MemoryDumpRequest,
  type QemuVersionResponse,
  type Response,
  SUPPORTED_CMD_VERSIONS,
  unixTarget,
  type VMIRequest,
} from "../proto/mod.ts";
import type { DomainManager } from "./domain_manager.ts";
import { getLogger } from "../log/mod.ts";
import { errorText } from "../../ffi/mod.ts";
import { removeIfPresent } from "../lifecycle/mod.ts";

const log = getLogger("launcher", "cmd-server");

/** `<dir>/launcher-sock`: where the handler dials a ready launcher. */
export function launcherSocketPath(socketDir: string): string {
  return join(socketDir, SocketNames.Launcher);
}

/** `<dir>/launcher-init-sock`: the socket while the launcher starts. */
export function launcherInitSocketPath(socketDir: string): string {
  return join(socketDir, SocketNames.LauncherInit);
}

/** What the cmd server needs from the domain manager. */
export type CmdBackend = Pick<
  DomainManager,
  | "vmiKey"
  | "syncVmi"
  | "pause"
  | "unpause"
  | "shutdown"
  | "kill"
  | "deleteDomain"
  | "softReboot"
  | "reset"
  | "getDomain"
  | "getDomainStats"
  | "getDomainDirtyRateStats"
  | "qemuVersion"
  | "guestInfo"
  | "guestUsers"
  | "guestFilesystems"
  | "guestPing"
  | "guestExec"
  | "freeze"
  | "unfreeze"
  | "screenshot"
  | "migrate"
  | "cancelMigration"
  | "prepareMigrationTarget"
  | "finalizeMigration"
  | "signalTargetPodCleanup"
  | "memoryDump"
  | "syncCpus"
  | "syncMemory"
>;

/** `kubevirt.cmd.v1.MigrationRequest`: the VMI and KubeVirt's `MigrationOptions` as JSON. */
interface MigrationRequest {
  vmi?: { vmiJson?: Uint8Array };
  options?: Uint8Array;
}

/** `kubevirt.cmd.v1.FreezeRequest`. */
interface FreezeRequest {
  vmi?: { vmiJson?: Uint8Array };
  unfreezeTimeoutSeconds?: number;
}

/** `kubevirt.cmd.v1.DirtyRateStatsResponse` (an int64, as a decimal string). */
interface DirtyRateStatsResponse {
  response: Response;
  dirtyRateMbs: string;
}

/** `kubevirt.cmd.v1.ScreenshotResponse`. */
interface ScreenshotResponse {
  response: Response;
  mime: string;
  data: Uint8Array;
}

/** `kubevirt.cmd.v1.GuestUserListResponse`: `guestUserListResponse` is a JSON array. */
interface GuestUserListResponse {
  response: Response;
  guestUserListResponse: string;
}

/** `kubevirt.cmd.v1.ExecRequest`: a probe's command to run in the guest. */
interface ExecRequest {
  domainName?: string;
  Command?: string;
  Args?: string[];
  timeoutSeconds?: number;
}

/** `kubevirt.cmd.v1.GuestPingRequest`. */
interface GuestPingRequest {
  domainName?: string;
  timeoutSeconds?: number;
}

/** `kubevirt.cmd.v1.GuestFilesystemsResponse`: `guestFilesystemsResponse` is a JSON array. */
interface GuestFilesystemsResponse {
  response: Response;
  guestFilesystemsResponse: string;
}

/** Options of {@linkcode CmdServer.start}. */
export interface CmdServerOptions {
  /** Directory of the sockets; created (0755) when missing. */
  socketDir: string;
  /** Carries out the commands. */
  backend: CmdBackend;
  /**
   * Leave a `launcher-sock` of an earlier server in place until {@linkcode CmdServer.markReady}
   * renames the new socket over it (a launcher host re-adopting its VMs: the handler never
   * sees the socket missing). A fresh launcher removes it at once, so that the name always
   * means "ready".
   */
  replaceReady?: boolean;
}

/** The socket could not be served. */
export class CmdServerError extends Error {
  /** Creates the error; `detail` follows `Cannot serve the cmd socket "<path>": `. */
  constructor(path: string, detail: string, options?: ErrorOptions) {
    super(`Cannot serve the cmd socket "${path}": ${detail}`, options);
    this.name = "CmdServerError";
  }
}

type Callback<T> = (error: Partial<grpc.ServiceError> | null, value?: T) => void;
type Call<Req> = grpc.ServerUnaryCall<Req, unknown>;
type Handler = (call: Call<unknown>, callback: Callback<unknown>) => void;

const ok = (): Response => ({ success: true, message: "" });
const failed = (error: unknown): Response => ({ success: false, message: errorText(error) });

/** Wraps an async handler so that nothing escapes: any throw becomes `onError(error)`. */
function safe<Req, Res>(
  name: string,
  fn: (request: Req) => Promise<Res>,
  onError: (error: unknown) => Res,
): Handler {
  return (call, callback) => {
    let request: Req;
    try {
      request = (call.request ?? {}) as Req;
    } catch (error) {
      callback(null, onError(error));
      return;
    }
    fn(request).then(
      (value) => callback(null, value),
      (error) => {
        log.warn("Command failed", { rpc: name, error: errorText(error) });
        callback(null, onError(error));
      },
    );
  };
}

/**
 * Wraps a probe rpc, whose failure KubeVirt's clients (virt-probe, the handler's cmd
 * client) read from the gRPC status alone, as KubeVirt's launcher fails it: status UNKNOWN
 * with the message, and no answer.
 */
function probe<Req, Res>(name: string, fn: (request: Req) => Promise<Res>): Handler {
  return (call, callback) => {
    fn((call.request ?? {}) as Req).then(
      (value) => callback(null, value),
      (error) => {
        log.info("Probe failed", { rpc: name, error: errorText(error) });
        callback({ code: grpc.status.UNKNOWN, details: errorText(error) });
      },
    );
  };
}

/**
 * `VirtualMachineOptions.interfaceMigration` as the domain manager reads it: the .proto's
 * `InterfaceBindingMigration` carries `Method`, with a capital M, per interface name.
 */
function interfaceMigrationOf(
  options: VMIRequest["options"],
): Record<string, { method?: string }> {
  const wire = options?.interfaceMigration;
  if (typeof wire !== "object" || wire === null) return {};
  return Object.fromEntries(
    Object.entries(wire).map(([name, binding]) => {
      const method = (binding as { Method?: unknown } | null)?.Method;
      return [name, { method: typeof method === "string" ? method : undefined }];
    }),
  );
}

function vmiJsonOf(request: VMIRequest): Uint8Array | null {
  return request.vmi?.vmiJson ?? null;
}

function buildHandlers(backend: CmdBackend): Record<string, Handler> {
  const command = (name: string, fn: (json: Uint8Array | null) => Promise<void>): Handler =>
    safe<VMIRequest, Response>(name, async (request) => {
      await fn(vmiJsonOf(request));
      return ok();
    }, failed);

  const implemented: Partial<Record<CmdMethod, Handler>> = {
    SyncVirtualMachine: safe<VMIRequest, Response>("SyncVirtualMachine", async (request) => {
      await backend.syncVmi(vmiJsonOf(request), request.options ?? null);
      return ok();
    }, failed),
    PauseVirtualMachine: command("PauseVirtualMachine", (json) => backend.pause(json)),
    UnpauseVirtualMachine: command("UnpauseVirtualMachine", (json) => backend.unpause(json)),
    ShutdownVirtualMachine: command("ShutdownVirtualMachine", (json) => backend.shutdown(json)),
    KillVirtualMachine: command("KillVirtualMachine", (json) => backend.kill(json)),
    DeleteVirtualMachine: command("DeleteVirtualMachine", (json) => backend.deleteDomain(json)),
    SoftRebootVirtualMachine: command(
      "SoftRebootVirtualMachine",
      (json) => backend.softReboot(json),
    ),
    ResetVirtualMachine: command("ResetVirtualMachine", (json) => backend.reset(json)),
    FreezeVirtualMachine: safe<FreezeRequest, Response>("FreezeVirtualMachine", async (request) => {
      await backend.freeze(request.vmi?.vmiJson ?? null, request.unfreezeTimeoutSeconds ?? 0);
      return ok();
    }, failed),
    UnfreezeVirtualMachine: command("UnfreezeVirtualMachine", (json) => backend.unfreeze(json)),
    SyncVirtualMachineCPUs: command("SyncVirtualMachineCPUs", (json) => backend.syncCpus(json)),
    SyncVirtualMachineMemory: command(
      "SyncVirtualMachineMemory",
      (json) => backend.syncMemory(json),
    ),
    VirtualMachineMemoryDump: safe<MemoryDumpRequest, Response>(
      "VirtualMachineMemoryDump",
      async (request) => {
        await backend.memoryDump(request.vmi?.vmiJson ?? null, request.dumpPath ?? "");
        return ok();
      },
      failed,
    ),
    MigrateVirtualMachine: safe<MigrationRequest, Response>(
      "MigrateVirtualMachine",
      async (request) => {
        await backend.migrate(request.vmi?.vmiJson ?? null, request.options ?? null);
        return ok();
      },
      failed,
    ),
    SyncMigrationTarget: command(
      "SyncMigrationTarget",
      (json) => backend.prepareMigrationTarget(json),
    ),
    FinalizeVirtualMachineMigration: safe<VMIRequest, Response>(
      "FinalizeVirtualMachineMigration",
      async (request) => {
        await backend.finalizeMigration(request.vmi?.vmiJson ?? null, {
          interfaceMigration: interfaceMigrationOf(request.options),
        });
        return ok();
      },
      failed,
    ),
    SignalTargetPodCleanup: command(
      "SignalTargetPodCleanup",
      (json) => backend.signalTargetPodCleanup(json),
    ),
    CancelVirtualMachineMigration: command(
      "CancelVirtualMachineMigration",
      (json) => backend.cancelMigration(json),
    ),
    GetScreenshot: safe<VMIRequest, ScreenshotResponse>("GetScreenshot", async (request) => {
      const shot = await backend.screenshot(vmiJsonOf(request));
      return { response: ok(), mime: shot.mime, data: shot.data };
    }, (error) => ({ response: failed(error), mime: "", data: new Uint8Array() })),
    Ping: safe("Ping", () => Promise.resolve(ok()), failed),
    GuestPing: probe<GuestPingRequest, { response: Response }>("GuestPing", async (request) => {
      await backend.guestPing(request.domainName ?? "", request.timeoutSeconds ?? 0);
      return { response: ok() };
    }),
    // A command that ran and exited with a code other than 0 is an answer, not a failure.
    Exec: probe<ExecRequest, { response: Response; exitCode: number; stdOut: string }>(
      "Exec",
      async (request) => {
        const { exitCode, stdOut } = await backend.guestExec(
          request.domainName ?? "",
          request.Command ?? "",
          request.Args ?? [],
          request.timeoutSeconds ?? 0,
        );
        return { response: ok(), exitCode, stdOut };
      },
    ),
    GetDomain: safe<unknown, DomainResponse>("GetDomain", async () => {
      const domain = await backend.getDomain();
      return { response: ok(), domain: domain ? encodeDomainJson(domain) : "" };
    }, (error) => ({ response: failed(error), domain: "" })),
    GetDomainStats: safe<unknown, DomainStatsResponse>("GetDomainStats", async () => {
      const stats = await backend.getDomainStats();
      return { response: ok(), domainStats: stats ? JSON.stringify(stats) : "" };
    }, (error) => ({ response: failed(error), domainStats: "" })),
    GetDomainDirtyRateStats: safe<unknown, DirtyRateStatsResponse>(
      "GetDomainDirtyRateStats",
      async () => {
        const mbs = await backend.getDomainDirtyRateStats();
        return { response: ok(), dirtyRateMbs: String(Math.round(mbs)) };
      },
      (error) => ({ response: failed(error), dirtyRateMbs: "0" }),
    ),
    GetQemuVersion: safe<unknown, QemuVersionResponse>("GetQemuVersion", async () => {
      return { response: ok(), version: await backend.qemuVersion() };
    }, (error) => ({ response: failed(error), version: "" })),
    GetGuestInfo: safe<unknown, GuestInfoResponse>("GetGuestInfo", async () => {
      const info = await backend.guestInfo();
      return { response: ok(), guestInfoResponse: JSON.stringify(info) };
    }, (error) => ({ response: failed(error), guestInfoResponse: "" })),
    GetUsers: safe<unknown, GuestUserListResponse>("GetUsers", async () => {
      const users = await backend.guestUsers();
      return { response: ok(), guestUserListResponse: JSON.stringify(users) };
    }, (error) => ({ response: failed(error), guestUserListResponse: "" })),
    GetFilesystems: safe<unknown, GuestFilesystemsResponse>("GetFilesystems", async () => {
      const filesystems = await backend.guestFilesystems();
      return { response: ok(), guestFilesystemsResponse: JSON.stringify(filesystems) };
    }, (error) => ({ response: failed(error), guestFilesystemsResponse: "" })),
  };

  const handlers: Record<string, Handler> = {};
  for (const name of CMD_METHODS) {
    handlers[name] = implemented[name] ?? ((_call, callback) => {
      callback({
        code: grpc.status.UNIMPLEMENTED,
        details:
          `${name} is not implemented by the virtnode launcher serving VMI "${backend.vmiKey}"`,
      });
    });
  }
  return handlers;
}

/** A running cmd server. */
export class CmdServer {
  /** Directory of the sockets. */
  readonly socketDir: string;
  readonly #server: grpc.Server;
  #path: string;
  #stopped = false;

  private constructor(socketDir: string, server: grpc.Server, path: string) {
    this.socketDir = socketDir;
    this.#server = server;
    this.#path = path;
  }

  /** Where the socket is now: the init socket until {@linkcode markReady}. */
  get socketPath(): string {
    return this.#path;
  }

  /**
   * Binds `<socketDir>/launcher-init-sock` (replacing a stale one), restricts it to mode
   * 0600 and serves Cmd and CmdInfo on it. Throws {@linkcode CmdServerError}.
   */
  static async start(options: CmdServerOptions): Promise<CmdServer> {
    const path = launcherInitSocketPath(options.socketDir);
    try {
      await Deno.mkdir(options.socketDir, { recursive: true, mode: 0o755 });
      await removeIfPresent(path);
      if (!options.replaceReady) await removeIfPresent(launcherSocketPath(options.socketDir));
    } catch (error) {
      throw new CmdServerError(path, errorText(error), { cause: error });
    }
    const server = new grpc.Server();
    server.addService(cmdService(), buildHandlers(options.backend));
    server.addService(cmdInfoService(), {
      Info: (_call: Call<unknown>, callback: Callback<unknown>) => {
        callback(null, { supportedCmdVersions: [...SUPPORTED_CMD_VERSIONS] });
      },
    });
    try {
      await new Promise<void>((resolve, reject) => {
        server.bindAsync(unixTarget(path), grpc.ServerCredentials.createInsecure(), (error) => {
          if (error) reject(error);
          else resolve();
        });
      });
      await Deno.chmod(path, 0o600);
    } catch (error) {
      server.forceShutdown();
      // The bind's own error is what the caller must see; this one is only logged.
      await removeIfPresent(path).catch((removeError) =>
        log.warn("Cannot remove the cmd socket {path}: {error}", { path, error: removeError })
      );
      throw new CmdServerError(path, errorText(error), { cause: error });
    }
    log.info("Cmd server listening", { socket: path });
    return new CmdServer(options.socketDir, server, path);
  }

  /** Renames the init socket to `launcher-sock`: the handler may now dial the launcher. */
  async markReady(): Promise<void> {
    const ready = launcherSocketPath(this.socketDir);
    if (this.#path === ready) return;
    try {
      await Deno.rename(this.#path, ready);
    } catch (error) {
      throw new CmdServerError(
        this.#path,
        `cannot rename it to "${ready}": ${errorText(error)}`,
        {
          cause: error,
        },
      );
    }
    this.#path = ready;
    log.info("Marked as ready", { socket: ready });
  }

  /**
   * Stops serving (in-flight calls get up to `graceMs`, 1 s as in KubeVirt) and removes
   * the socket (unless `keepSocket`: a launcher host ending leaves it for its successor).
   */
  async stop(graceMs = 1_000, options: { keepSocket?: boolean } = {}): Promise<void> {
    if (this.#stopped) return;
    this.#stopped = true;
    await new Promise<void>((resolve) => {
      const timer = setTimeout(() => {
        this.#server.forceShutdown();
        resolve();
      }, graceMs);
      this.#server.tryShutdown(() => {
        clearTimeout(timer);
        resolve();
      });
    });
    if (options.keepSocket) return;
    // Stopping goes on either way: a socket left behind is replaced by the next start().
    await removeIfPresent(this.#path).catch((error) =>
      log.warn("Cannot remove the cmd socket {path}: {error}", { path: this.#path, error })
    );
  }
}

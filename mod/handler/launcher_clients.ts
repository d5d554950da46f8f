/**
 * Launcher clients: one gRPC cmd client per VMI UID, with
 * timeouts on every call and KubeVirt's unresponsive detection.
 *
 * A monitor dials every known launcher about every 11 s; a launcher that has not
 * answered for more than 30 s is marked unresponsive, and from then on its domain is
 * treated as gone. A missing socket file, or (pod-less mode) a launcher process that
 * exited, counts as unresponsive at once. The mark is a file named after the VMI's UID
 * in a directory of the handler's own state (KubeVirt keeps it beside the launcher's
 * socket; a directory a launcher pod controls is no place for a privileged write), so
 * the verdict survives a handler restart.
 *
 * Before its first cmd call on a connection, a client asks the launcher which cmd API
 * versions it speaks (`kubevirt.cmd.info.CmdInfo/Info`), as KubeVirt's handler does, and
 * calls only when the launcher speaks version 1, the only one this handler speaks.
 *
 * Sockets are connected to through a {@linkcode DialTarget} the launcher provider gives:
 * for a launcher pod, an `O_PATH` descriptor opened beneath the pod's directory without
 * following symlinks, so the handler never dials a path a pod pointed elsewhere.
 *
 * @module
 */
import { join } from "node:path";
import type { VirtualMachineInstance } from "../api/mod.ts";
import { decodeDomainJson, type Domain, type LauncherState } from "../domain/mod.ts";
import {
  type CmdClient,
  type CmdInfoClient,
  type CmdInfoResponse,
  type DomainResponse,
  type GrpcClient,
  highestCommonVersion,
  type MemoryDumpRequest,
  newCmdClient,
  newCmdInfoClient,
  type Response,
  type ServiceError,
  SUPPORTED_CMD_VERSIONS,
  type UnaryMethod,
  type VirtualMachineOptions,
  type VMIRequest,
} from "../proto/mod.ts";
import { writeFileDurably } from "../../ffi/mod.ts";
import { every, removeIfPresent } from "../lifecycle/mod.ts";
import { getLogger } from "../log/mod.ts";

const log = getLogger("handler", "launcher-clients");

/** A launcher call failed: it answered `success: false`, timed out, or could not be reached. */
export class LauncherCallError extends Error {
  /** The RPC. */
  readonly method: string;
  /** True when the launcher could not be reached at all (as opposed to refusing). */
  readonly unreachable: boolean;
  /**
   * True when the launcher's connection ended during the call (KubeVirt's
   * `IsDisconnected`): a launcher exiting while it is asked to stop.
   */
  readonly disconnected: boolean;
  /** Creates `server error. command <method> failed: <message>`, as KubeVirt words it. */
  constructor(
    method: string,
    message: string,
    options?: { cause?: unknown; unreachable?: boolean; disconnected?: boolean },
  ) {
    super(`server error. command ${method} failed: ${message}`, options);
    this.name = "LauncherCallError";
    this.method = method;
    this.unreachable = options?.unreachable ?? false;
    this.disconnected = options?.disconnected ?? false;
  }
}

/**
 * Whether a call failed because its connection ended while it was under way: CANCELLED
 * (KubeVirt's `IsDisconnected` counts it), or what grpc-js reports for a peer whose socket
 * closed with the call open (its Go client reports the same as EOF or ECONNRESET): either
 * UNAVAILABLE "Connection dropped" or INTERNAL for the stream the closing socket reset.
 */
export function endedMidCall(error: unknown): boolean {
  const { code, details } = error as Partial<ServiceError>;
  if (code === 1) return true;
  if (code === 14) return details === "Connection dropped";
  if (code !== 13) return false;
  return /socket has been ended|ECONNRESET|RST_STREAM with code 2/.test(details ?? "");
}

/**
 * The gRPC channel's idle timeout: the longest a timer can wait (about 24.8 days), i.e.
 * never in practice. A launcher's HTTP/2 session stays open for its VMI's life: Deno
 * 2.9's `node:http2` never frees a client session once it is closed (measured: about
 * 50 KB of RSS per session, 600 closed sessions held by the runtime's handles), so a
 * session closed when idle and opened again for the next call is memory lost each time,
 * while an open idle one costs about 12 KB.
 */
const CHANNEL_IDLE_TIMEOUT_MS = 2 ** 31 - 1;

/**
 * What a probe rpc's call waits beyond the probe's own timeout (KubeVirt's cmd client: its
 * short timeout, 5 s): the launcher, not the call, decides that the guest took too long.
 */
const PROBE_CALL_GRACE_MS = 5_000;

/** Timeouts of launcher calls, in ms. */
export const LAUNCHER_TIMEOUTS = {
  short: 10_000,
  sync: 60_000,
  ping: 5_000,
};

/** The response field that holds each guest query's JSON. */
const GUEST_QUERY_FIELDS = {
  GetGuestInfo: "guestInfoResponse",
  GetUsers: "guestUserListResponse",
  GetFilesystems: "guestFilesystemsResponse",
} as const;

/** A VMI request; options empty unless given, as KubeVirt's cmd client sends them. */
function encodeVmi(vmi: VirtualMachineInstance, options: VirtualMachineOptions = {}): VMIRequest {
  return { vmi: { vmiJson: new TextEncoder().encode(JSON.stringify(vmi)) }, options };
}

/** The path to connect to for a launcher's socket, held open for as long as it is used. */
export interface DialTarget {
  /** What `connect(2)` is given. */
  readonly path: string;
  /** Lets go of what {@linkcode DialTarget.path} needs (a descriptor). */
  release(): void;
}

/** Resolves a launcher's socket file to what is dialled; throws when it must not be. */
export type DialResolver = (socketFile: string) => DialTarget;

/** Dials the socket file's own path (sockets in directories the handler owns). */
export function dialDirectly(socketFile: string): DialTarget {
  return { path: socketFile, release() {} };
}

/** One unary call with a deadline; rejects with the gRPC error. */
function unary<Req, Res>(
  client: GrpcClient,
  method: string,
  request: Req,
  timeoutMs: number,
): Promise<Res> {
  const fn = (client as unknown as Record<string, UnaryMethod<Req, Res>>)[method];
  return new Promise<Res>((resolve, reject) => {
    // A channel closed meanwhile throws here, which rejects too.
    fn.call(
      client,
      request,
      { deadline: Date.now() + timeoutMs },
      (error: ServiceError | null, response?: Res) => {
        if (error) reject(error);
        else resolve(response as Res);
      },
    );
  });
}

/** The launcher's cmd versions as KubeVirt lists them, e.g. `[2, 3]`. */
function versions(list: readonly number[]): string {
  return `[${list.join(", ")}]`;
}

/** The version check of a connection failed; each waiting call rewords it as its own. */
class VersionCheckError extends Error {
  readonly unreachable: boolean;
  constructor(message: string, options: { cause?: unknown; unreachable: boolean }) {
    super(message, options);
    this.name = "VersionCheckError";
    this.unreachable = options.unreachable;
  }
}

/** One connection to a launcher: its cmd client and a CmdInfo client on the same channel. */
interface Connection {
  readonly cmd: CmdClient;
  readonly info: CmdInfoClient;
  /** The version check, asked once by whichever call comes first and shared by the rest. */
  negotiated?: Promise<void>;
}

/** Promise-based cmd client of one launcher. */
export class LauncherClient {
  /** The launcher's cmd socket. */
  readonly socketFile: string;
  readonly #resolve: DialResolver;
  #target: DialTarget | undefined;
  #connection: Connection | undefined;

  /**
   * A client of the launcher at `socketFile`, reached through `resolve`; nothing is
   * resolved or connected before the first call.
   */
  constructor(socketFile: string, resolve: DialResolver = dialDirectly) {
    this.socketFile = socketFile;
    this.#resolve = resolve;
  }

  /** What is dialled now, resolved on first use (and again after the launcher went away). */
  target(): DialTarget {
    this.#target ??= this.#resolve(this.socketFile);
    return this.#target;
  }

  #connect(method: string): Connection {
    if (!this.#connection) {
      let target: DialTarget;
      try {
        target = this.target();
      } catch (error) {
        throw new LauncherCallError(method, (error as Error).message, {
          cause: error,
          unreachable: true,
        });
      }
      const cmd = newCmdClient(target.path, {
        "grpc.client_idle_timeout_ms": CHANNEL_IDLE_TIMEOUT_MS,
        "grpc.enable_channelz": 0,
      });
      this.#connection = { cmd, info: newCmdInfoClient(target.path, cmd) };
    }
    return this.#connection;
  }

  /**
   * Forgets the connection (its version check with it) and the resolved target: the next
   * call resolves, dials and asks anew. Given `only`, does so only while that connection
   * is the current one: a late failure on an old connection leaves a newer one alone.
   */
  #reset(only?: Connection): void {
    if (only && only !== this.#connection) return;
    // The CmdInfo client shares the cmd client's channel: this closes both.
    this.#connection?.cmd.close();
    this.#connection = undefined;
    this.#target?.release();
    this.#target = undefined;
  }

  /** Whether a failed call reached nobody; drops the connection when the socket went. */
  #failed(connection: Connection, error: unknown): boolean {
    const code = (error as Partial<ServiceError>).code;
    // A socket that went (the launcher restarted it, or the pod went) is resolved again
    // next time rather than dialled through a stale descriptor.
    if (code === 14) this.#reset(connection);
    // 14 UNAVAILABLE, 4 DEADLINE_EXCEEDED: nobody answered. No code at all: the call never
    // left, its channel was closed while it waited for the version check.
    return code === undefined || code === 14 || code === 4;
  }

  /**
   * Asks the launcher's cmd versions on `connection`, once: concurrent first calls share
   * the one question. A failed check is forgotten, so the next call asks again (KubeVirt's
   * handler, too, builds a new client after `NewClient` failed).
   */
  async #negotiate(method: string, connection: Connection): Promise<void> {
    connection.negotiated ??= this.#checkVersion(connection).catch((error) => {
      connection.negotiated = undefined;
      throw error;
    });
    try {
      await connection.negotiated;
    } catch (error) {
      const failed = error as VersionCheckError;
      throw new LauncherCallError(method, failed.message, {
        cause: failed.cause,
        unreachable: failed.unreachable,
      });
    }
  }

  async #checkVersion(connection: Connection): Promise<void> {
    let reply: CmdInfoResponse;
    try {
      reply = await unary(connection.info, "Info", {}, LAUNCHER_TIMEOUTS.short);
    } catch (error) {
      // A launcher without CmdInfo (UNIMPLEMENTED) fails here too, as KubeVirt's
      // NewClient fails: which cmd API such a launcher speaks is unknown, and
      // guessing version 1 would send calls to an API nobody agreed on.
      const unreachable = this.#failed(connection, error);
      const detail = (error as ServiceError).details || (error as Error).message;
      throw new VersionCheckError(`could not check cmd server version: ${detail}`, {
        cause: error,
        unreachable,
      });
    }
    const theirs = reply.supportedCmdVersions ?? [];
    if (highestCommonVersion(theirs, SUPPORTED_CMD_VERSIONS) === undefined) {
      // The launcher answered: it is there, it speaks another API.
      throw new VersionCheckError(
        `no compatible cmd version: the launcher speaks ${versions(theirs)}, ` +
          `this handler speaks ${versions(SUPPORTED_CMD_VERSIONS)}`,
        { unreachable: false },
      );
    }
  }

  async #call<Req, Res>(method: string, request: Req, timeoutMs: number): Promise<Res> {
    const connection = this.#connect(method);
    try {
      await this.#negotiate(method, connection);
      return await unary<Req, Res>(connection.cmd, method, request, timeoutMs);
    } catch (error) {
      if (error instanceof LauncherCallError) throw error;
      const unreachable = this.#failed(connection, error);
      const disconnected = endedMidCall(error);
      if (disconnected) this.#reset(connection);
      const detail = (error as ServiceError).details || (error as Error).message;
      throw new LauncherCallError(method, detail, { cause: error, unreachable, disconnected });
    }
  }

  async #vmiCall(
    method: string,
    vmi: VirtualMachineInstance,
    timeoutMs: number,
    options?: VirtualMachineOptions,
  ): Promise<void> {
    const res = await this.#call<VMIRequest, Response>(method, encodeVmi(vmi, options), timeoutMs);
    if (!res.success) throw new LauncherCallError(method, res.message || "no message");
  }

  /** Defines and starts the domain, or reconciles a running one. */
  syncVirtualMachine(vmi: VirtualMachineInstance, options?: VirtualMachineOptions): Promise<void> {
    return this.#vmiCall("SyncVirtualMachine", vmi, LAUNCHER_TIMEOUTS.sync, options);
  }
  /** Asks the guest to shut down (ACPI). */
  shutdownVirtualMachine(vmi: VirtualMachineInstance): Promise<void> {
    return this.#vmiCall("ShutdownVirtualMachine", vmi, LAUNCHER_TIMEOUTS.short);
  }
  /** Destroys the domain now. */
  killVirtualMachine(vmi: VirtualMachineInstance): Promise<void> {
    return this.#vmiCall("KillVirtualMachine", vmi, LAUNCHER_TIMEOUTS.short);
  }
  /** Undefines the (stopped) domain. */
  deleteVirtualMachine(vmi: VirtualMachineInstance): Promise<void> {
    return this.#vmiCall("DeleteVirtualMachine", vmi, LAUNCHER_TIMEOUTS.short);
  }
  /**
   * Starts a dump of the guest's memory to `dumpPath`, a file in the launcher's view; the
   * launcher records its progress in the domain's metadata (KubeVirt's launcher answers
   * at once and dumps in the background, once per file name).
   */
  async virtualMachineMemoryDump(vmi: VirtualMachineInstance, dumpPath: string): Promise<void> {
    const request: MemoryDumpRequest = { vmi: encodeVmi(vmi).vmi, dumpPath };
    const res = await this.#call<MemoryDumpRequest, Response>(
      "VirtualMachineMemoryDump",
      request,
      LAUNCHER_TIMEOUTS.short,
    );
    if (!res.success) {
      throw new LauncherCallError("VirtualMachineMemoryDump", res.message || "no message");
    }
  }
  /** Plugs or unplugs vCPUs to the VMI's topology (CPU hot-plug). */
  syncVirtualMachineCpus(vmi: VirtualMachineInstance): Promise<void> {
    return this.#vmiCall("SyncVirtualMachineCPUs", vmi, LAUNCHER_TIMEOUTS.short);
  }
  /** Plugs or unplugs guest memory to the VMI's `memory.guest` (memory hot-plug). */
  syncVirtualMachineMemory(vmi: VirtualMachineInstance): Promise<void> {
    return this.#vmiCall("SyncVirtualMachineMemory", vmi, LAUNCHER_TIMEOUTS.short);
  }
  /** Plugs the host devices the launcher's pod has that the domain lacks (SR-IOV VFs). */
  hotplugHostDevices(vmi: VirtualMachineInstance): Promise<void> {
    return this.#vmiCall("HotplugHostDevices", vmi, LAUNCHER_TIMEOUTS.short);
  }
  /** Resumes a paused domain. */
  unpauseVirtualMachine(vmi: VirtualMachineInstance): Promise<void> {
    return this.#vmiCall("UnpauseVirtualMachine", vmi, LAUNCHER_TIMEOUTS.short);
  }
  /** Pauses the running domain. */
  pauseVirtualMachine(vmi: VirtualMachineInstance): Promise<void> {
    return this.#vmiCall("PauseVirtualMachine", vmi, LAUNCHER_TIMEOUTS.short);
  }
  /** Asks the guest to reboot (through its agent or ACPI). */
  softRebootVirtualMachine(vmi: VirtualMachineInstance): Promise<void> {
    return this.#vmiCall("SoftRebootVirtualMachine", vmi, LAUNCHER_TIMEOUTS.short);
  }
  /** Resets the domain like a reset button. */
  resetVirtualMachine(vmi: VirtualMachineInstance): Promise<void> {
    return this.#vmiCall("ResetVirtualMachine", vmi, LAUNCHER_TIMEOUTS.short);
  }
  /** Readies the launcher as a migration's target (nothing is defined: the domain comes with it). */
  syncMigrationTarget(vmi: VirtualMachineInstance, options?: VirtualMachineOptions): Promise<void> {
    return this.#vmiCall("SyncMigrationTarget", vmi, LAUNCHER_TIMEOUTS.sync, options);
  }
  /** Ends a migration on its target (link refresh, the guest's clock). */
  finalizeVirtualMachineMigration(
    vmi: VirtualMachineInstance,
    options?: VirtualMachineOptions,
  ): Promise<void> {
    return this.#vmiCall("FinalizeVirtualMachineMigration", vmi, LAUNCHER_TIMEOUTS.short, options);
  }
  /** Tells a failed migration's target launcher that it is to be cleaned up. */
  signalTargetPodCleanup(vmi: VirtualMachineInstance): Promise<void> {
    return this.#vmiCall("SignalTargetPodCleanup", vmi, LAUNCHER_TIMEOUTS.short);
  }
  /** Aborts the running migration. */
  cancelVirtualMachineMigration(vmi: VirtualMachineInstance): Promise<void> {
    return this.#vmiCall("CancelVirtualMachineMigration", vmi, LAUNCHER_TIMEOUTS.short);
  }
  /**
   * Starts migrating the domain to the target the VMI's migration state names, with
   * KubeVirt's `MigrationOptions` (Go field names, as JSON); returns once it runs.
   */
  async migrateVirtualMachine(
    vmi: VirtualMachineInstance,
    options: Record<string, unknown>,
  ): Promise<void> {
    const res = await this.#call<{ vmi: VMIRequest["vmi"]; options: Uint8Array }, Response>(
      "MigrateVirtualMachine",
      {
        vmi: encodeVmi(vmi).vmi,
        options: new TextEncoder().encode(JSON.stringify(options)),
      },
      LAUNCHER_TIMEOUTS.sync,
    );
    if (!res.success) {
      throw new LauncherCallError("MigrateVirtualMachine", res.message || "no message");
    }
  }
  /** Thaws the guest's filesystems. */
  unfreezeVirtualMachine(vmi: VirtualMachineInstance): Promise<void> {
    return this.#vmiCall("UnfreezeVirtualMachine", vmi, LAUNCHER_TIMEOUTS.short);
  }
  /** Freezes the guest's filesystems; the launcher thaws them itself after the timeout (0: never). */
  async freezeVirtualMachine(vmi: VirtualMachineInstance, unfreezeTimeoutSeconds: number) {
    const res = await this.#call<
      { vmi: VMIRequest["vmi"]; unfreezeTimeoutSeconds: number },
      Response
    >(
      "FreezeVirtualMachine",
      { vmi: encodeVmi(vmi).vmi, unfreezeTimeoutSeconds },
      LAUNCHER_TIMEOUTS.sync,
    );
    if (!res.success) {
      throw new LauncherCallError("FreezeVirtualMachine", res.message || "no message");
    }
  }
  /** A picture of the guest's screen and its MIME type. */
  async getScreenshot(vmi: VirtualMachineInstance): Promise<{ mime: string; data: Uint8Array }> {
    const res = await this.#call<
      VMIRequest,
      { response?: Response; mime?: string; data?: Uint8Array }
    >(
      "GetScreenshot",
      encodeVmi(vmi),
      LAUNCHER_TIMEOUTS.short,
    );
    if (!res.response?.success) {
      throw new LauncherCallError("GetScreenshot", res.response?.message || "no message");
    }
    return { mime: res.mime ?? "", data: res.data ?? new Uint8Array() };
  }
  /** The launcher's QEMU version (`GetQemuVersion`). */
  async getQemuVersion(): Promise<string> {
    const res = await this.#call<
      Record<string, never>,
      { response?: Response; version?: string }
    >("GetQemuVersion", {}, LAUNCHER_TIMEOUTS.short);
    if (res.response && !res.response.success) {
      throw new LauncherCallError("GetQemuVersion", res.response.message);
    }
    return res.version ?? "";
  }
  /**
   * Pings the guest agent of `domainName` (`<namespace>_<name>`) as KubeVirt's virt-probe
   * does for a `guestAgentPing` probe: resolves when it answered within `timeoutSeconds`,
   * throws {@linkcode LauncherCallError} with the launcher's reason otherwise.
   */
  async guestPing(domainName: string, timeoutSeconds: number): Promise<void> {
    await this.#call<{ domainName: string; timeoutSeconds: number }, unknown>(
      "GuestPing",
      { domainName, timeoutSeconds },
      timeoutSeconds * 1000 + PROBE_CALL_GRACE_MS,
    );
  }
  /**
   * Runs `command` with `args` in the guest of `domainName` through its agent, as KubeVirt's
   * virt-probe does for an `exec` probe: its exit code and standard output, or
   * {@linkcode LauncherCallError} when it could not run or did not end in `timeoutSeconds`.
   */
  async exec(
    domainName: string,
    command: string,
    args: readonly string[],
    timeoutSeconds: number,
  ): Promise<{ exitCode: number; stdOut: string }> {
    const res = await this.#call<
      { domainName: string; Command: string; Args: string[]; timeoutSeconds: number },
      { exitCode?: number; stdOut?: string }
    >(
      "Exec",
      { domainName, Command: command, Args: [...args], timeoutSeconds },
      timeoutSeconds * 1000 + PROBE_CALL_GRACE_MS,
    );
    return { exitCode: res.exitCode ?? 0, stdOut: res.stdOut ?? "" };
  }
  /**
   * What the guest agent reports (`GetGuestInfo`, `GetUsers`, `GetFilesystems`): the JSON
   * the launcher sends, parsed.
   */
  async guestQuery(method: "GetGuestInfo" | "GetUsers" | "GetFilesystems"): Promise<unknown> {
    const field = GUEST_QUERY_FIELDS[method];
    const res = await this.#call<Record<string, never>, Record<string, unknown>>(
      method,
      {},
      LAUNCHER_TIMEOUTS.short,
    );
    const response = res.response as Response | undefined;
    if (response && !response.success) throw new LauncherCallError(method, response.message);
    const json = res[field];
    if (typeof json !== "string" || json === "") return method === "GetGuestInfo" ? {} : [];
    try {
      return JSON.parse(json);
    } catch (error) {
      throw new LauncherCallError(method, `the launcher sent no JSON: ${(error as Error).message}`);
    }
  }
  /**
   * The domain's statistics as the launcher reports them (KubeVirt's `DomainStats` JSON,
   * parsed); undefined when it has no domain.
   */
  async getDomainStats(
    timeoutMs = LAUNCHER_TIMEOUTS.short,
  ): Promise<Record<string, unknown> | undefined> {
    const res = await this.#call<
      Record<string, never>,
      { response?: Response; domainStats?: string }
    >(
      "GetDomainStats",
      {},
      timeoutMs,
    );
    if (res.response && !res.response.success) {
      throw new LauncherCallError("GetDomainStats", res.response.message);
    }
    if (!res.domainStats) return undefined;
    try {
      return JSON.parse(res.domainStats);
    } catch (error) {
      throw new LauncherCallError(
        "GetDomainStats",
        `the launcher sent no JSON: ${(error as Error).message}`,
      );
    }
  }
  /**
   * The guest's memory dirty rate in MB/s, which the launcher measures over a second
   * (`GetDomainDirtyRateStats`).
   */
  async getDomainDirtyRateStats(timeoutMs = LAUNCHER_TIMEOUTS.short): Promise<number> {
    const res = await this.#call<
      Record<string, never>,
      { response?: Response; dirtyRateMbs?: string }
    >("GetDomainDirtyRateStats", {}, timeoutMs);
    if (res.response && !res.response.success) {
      throw new LauncherCallError("GetDomainDirtyRateStats", res.response.message);
    }
    return Number(res.dirtyRateMbs ?? 0);
  }
  /** The domain the launcher has, or undefined when it has none. */
  async getDomain(): Promise<Domain | undefined> {
    const res = await this.#call<Record<string, never>, DomainResponse>(
      "GetDomain",
      {},
      LAUNCHER_TIMEOUTS.short,
    );
    if (res.response && !res.response.success) {
      throw new LauncherCallError("GetDomain", res.response.message);
    }
    return res.domain ? decodeDomainJson(res.domain) : undefined;
  }
  /** Checks the launcher answers. */
  async ping(timeoutMs = LAUNCHER_TIMEOUTS.ping): Promise<void> {
    const res = await this.#call<Record<string, never>, Response>("Ping", {}, timeoutMs);
    if (!res.success) throw new LauncherCallError("Ping", res.message);
  }
  /** Connects to the socket and closes again (the monitor's liveness check). */
  async dial(timeoutMs: number): Promise<void> {
    try {
      await dial(this.target().path, timeoutMs);
    } catch (error) {
      this.#reset();
      throw error;
    }
  }

  /** Closes the connection and lets go of the target. */
  close(): void {
    this.#reset();
  }
}

interface Entry {
  client: LauncherClient;
  /** When the launcher last answered (or was created), ms. */
  lastAnswerMs: number;
  /** Marked unresponsive (marker file written, or process known dead). */
  unresponsive: boolean;
  /** Since when the socket was expected but missing, ms. */
  createdMs: number;
}

/** Options of {@linkcode LauncherClients}. */
export interface LauncherClientsOptions {
  /** Monitor interval (≈11 s as KubeVirt). */
  monitorIntervalMs?: number;
  /** Unanswered time after which a launcher is unresponsive (30 s). */
  unresponsiveAfterMs?: number;
  /** A launcher whose socket never appears is given up after this long (3 min). */
  notReadyTimeoutMs?: number;
  /** Where unresponsive marks are kept (one file per UID); kept in memory only when unset. */
  markerDir?: string;
  /** How sockets are dialled; {@linkcode dialDirectly} unless told. */
  dialResolver?: DialResolver;
  /** Called when a launcher becomes unresponsive (the controller requeues its VMI). */
  onUnresponsive?: (uid: string) => void;
  /**
   * Dial every launcher's socket each round (KubeVirt's monitor); true unless told. A
   * provider that watches its launchers itself (the pod-less launcher host reports ends and
   * is pinged as a whole) turns it off: 200 dials every 11 s cost the handler and the host
   * CPU for nothing.
   */
  dial?: boolean;
  /** Clock; injectable for tests. */
  now?: () => number;
}

/**
 * Connects to a unix socket and closes again, as KubeVirt's monitor dials launcher
 * sockets: it proves a live listener without holding a gRPC session per launcher.
 */
export async function dial(socketFile: string, timeoutMs: number): Promise<void> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${timeoutMs} ms`)), timeoutMs);
  });
  try {
    const conn = await Promise.race([
      Deno.connect({ transport: "unix", path: socketFile }),
      timeout,
    ]);
    conn.close();
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Whether a path exists, without following a last symlink. Synchronous on purpose: an
 * lstat of a local file takes microseconds, while the async form hands each call to
 * Deno's blocking thread pool, and a monitor round over 200 launchers at once left 22
 * threads (and their malloc arenas, ~5 MB RSS) alive for as long as the rounds went on.
 */
function exists(path: string): boolean {
  try {
    Deno.lstatSync(path);
    return true;
  } catch {
    return false;
  }
}

/** The pool of launcher clients, keyed by VMI UID. */
export class LauncherClients {
  readonly #entries = new Map<string, Entry>();
  /**
   * Marks that came before the UID had a client (a pod-less launcher that ended while the
   * host was still answering its start): its client starts unresponsive, instead of waiting
   * out the start-up allowance for a socket that will never appear.
   */
  readonly #early = new Set<string>();
  readonly #opts:
    & Required<
      Omit<LauncherClientsOptions, "onUnresponsive" | "markerDir" | "dialResolver" | "dial">
    >
    & LauncherClientsOptions;
  /** For logs. */
  readonly name = "launcher-monitor";

  /** An empty pool; the monitor runs with {@linkcode run}. */
  constructor(options: LauncherClientsOptions = {}) {
    this.#opts = {
      monitorIntervalMs: 11_000,
      unresponsiveAfterMs: 30_000,
      notReadyTimeoutMs: 180_000,
      now: Date.now,
      ...options,
    };
  }

  /** The client of a UID, creating it for `socketFile` when missing. */
  getOrCreate(uid: string, socketFile: string): LauncherClient {
    let entry = this.#entries.get(uid);
    if (entry && entry.client.socketFile !== socketFile) {
      entry.client.close();
      entry = undefined;
    }
    if (!entry) {
      const now = this.#opts.now();
      entry = {
        client: new LauncherClient(socketFile, this.#opts.dialResolver),
        lastAnswerMs: now,
        unresponsive: this.#early.delete(uid),
        createdMs: now,
      };
      this.#entries.set(uid, entry);
    }
    return entry.client;
  }

  /** The client of a UID, if one exists. */
  get(uid: string): LauncherClient | undefined {
    return this.#entries.get(uid)?.client;
  }

  /** Every UID with a client. */
  uids(): string[] {
    return [...this.#entries.keys()];
  }

  /**
   * The launcher's state for the phase table: `notReady` while its socket has not
   * appeared yet (within the start-up allowance), `unresponsive` once marked or
   * once the socket is gone, else `responsive`.
   */
  async state(uid: string): Promise<LauncherState> {
    const entry = this.#entries.get(uid);
    if (!entry) return "notReady";
    if (entry.unresponsive) return "unresponsive";
    const socket = entry.client.socketFile;
    const marker = this.#marker(uid);
    if (marker && exists(marker)) {
      entry.unresponsive = true;
      return "unresponsive";
    }
    if (!exists(socket)) {
      if (this.#opts.now() - entry.createdMs > this.#opts.notReadyTimeoutMs) {
        await this.markUnresponsive(uid, "socket never appeared");
        return "unresponsive";
      }
      return "notReady";
    }
    return "responsive";
  }

  /** Whether a launcher's cmd socket exists (it is ready for calls). */
  async isReady(uid: string): Promise<boolean> {
    return (await this.state(uid)) === "responsive";
  }

  /** The mark file of a UID (UIDs are checked before they get here), if marks persist. */
  #marker(uid: string): string | undefined {
    if (!this.#opts.markerDir || !/^[0-9A-Za-z][0-9A-Za-z._-]*$/.test(uid)) return undefined;
    return join(this.#opts.markerDir, uid);
  }

  /**
   * Marks a launcher unresponsive now: writes its mark in the handler's state (so the
   * verdict survives a handler restart) and tells the controller.
   */
  async markUnresponsive(uid: string, why: string): Promise<void> {
    const entry = this.#entries.get(uid);
    if (entry?.unresponsive || (!entry && this.#early.has(uid))) return;
    // Without a client the mark stays in memory: a late report for a VMI already cleaned up
    // must not leave a file behind; after a restart the launcher host reports the end again.
    if (entry) entry.unresponsive = true;
    else this.#early.add(uid);
    const marker = entry && this.#marker(uid);
    if (marker) {
      try {
        await writeFileDurably(marker, why, { mode: 0o600, dirMode: 0o700 });
      } catch (error) {
        log.warn("Cannot keep the unresponsive mark: {error}", { uid, error });
      }
    }
    log.warn("Launcher unresponsive: {why}", { uid, why });
    this.#opts.onUnresponsive?.(uid);
  }

  /** Closes and forgets a UID's client. */
  remove(uid: string): void {
    const entry = this.#entries.get(uid);
    if (!entry) return;
    entry.client.close();
    this.#entries.delete(uid);
  }

  /** Forgets a UID's unresponsive mark (its VMI is cleaned up). */
  async forgetMark(uid: string): Promise<void> {
    this.#early.delete(uid);
    const marker = this.#marker(uid);
    if (marker) await removeIfPresent(marker);
  }

  /** One monitor round: ping every launcher whose socket exists. */
  async monitorOnce(): Promise<void> {
    const now = this.#opts.now();
    await Promise.all([...this.#entries].map(async ([uid, entry]) => {
      if (entry.unresponsive) return;
      if (!exists(entry.client.socketFile)) {
        // Never became ready: the start-up allowance applies (see state()).
        if (now - entry.createdMs > this.#opts.notReadyTimeoutMs) {
          await this.markUnresponsive(uid, "socket never appeared");
        }
        return;
      }
      if (this.#opts.dial === false) return;
      try {
        await entry.client.dial(LAUNCHER_TIMEOUTS.ping);
        entry.lastAnswerMs = this.#opts.now();
      } catch (error) {
        const silentMs = this.#opts.now() - entry.lastAnswerMs;
        if (silentMs > this.#opts.unresponsiveAfterMs) {
          await this.markUnresponsive(
            uid,
            `no answer for ${Math.round(silentMs / 1000)} s: ${(error as Error).message}`,
          );
        }
      }
    }));
  }

  /**
   * Dials every launcher each `monitorIntervalMs` until `signal` aborts; then closes
   * every client.
   */
  async run(signal: AbortSignal): Promise<void> {
    await every(this.#opts.monitorIntervalMs, () => this.monitorOnce(), signal, {
      immediate: false,
      onError: (error) => log.warn("Launcher monitor round failed: {error}", { error }),
    });
    this.close();
  }

  /** Closes and forgets every client. */
  close(): void {
    for (const uid of this.uids()) this.remove(uid);
  }
}

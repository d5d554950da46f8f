/**
 * KubeVirt's handler/launcher APIs (`kubevirt.cmd.v1`, `kubevirt.cmd.info`,
 * `kubevirt.notify.v1`, `kubevirt.notify.info`): names, message types, service definitions
 * and clients; the folder's face is `mod.ts`.
 *
 * @module
 */

import * as grpc from "@grpc/grpc-js";
import {
  type CallOptions,
  type ChannelOptions,
  type ClientCall,
  type GrpcClient,
  loadDefinition,
  ProtoLoadError,
  protoPath,
  type ServiceDefinition,
  type ServiceError,
  unixTarget,
} from "./loader.ts";

/** Fully qualified name of the launcher's command service. */
export const CMD_SERVICE = "kubevirt.cmd.v1.Cmd";
/** Fully qualified name of the launcher's version service. */
export const CMD_INFO_SERVICE = "kubevirt.cmd.info.CmdInfo";
/** Fully qualified name of the handler's notify service. */
export const NOTIFY_SERVICE = "kubevirt.notify.v1.Notify";
/** Fully qualified name of the handler's notify version service. */
export const NOTIFY_INFO_SERVICE = "kubevirt.notify.info.NotifyInfo";

/** Cmd API versions this code speaks (KubeVirt's `CmdVersion` is 1). */
export const SUPPORTED_CMD_VERSIONS: readonly number[] = Object.freeze([1]);
/** Notify API versions this code speaks (KubeVirt's `NotifyVersion` is 1). */
export const SUPPORTED_NOTIFY_VERSIONS: readonly number[] = Object.freeze([1]);

/** Every RPC of `kubevirt.cmd.v1.Cmd`, in the order of `cmd.proto`. */
export const CMD_METHODS = [
  "SyncVirtualMachine",
  "PauseVirtualMachine",
  "UnpauseVirtualMachine",
  "FreezeVirtualMachine",
  "UnfreezeVirtualMachine",
  "ResetVirtualMachine",
  "SoftRebootVirtualMachine",
  "ShutdownVirtualMachine",
  "KillVirtualMachine",
  "DeleteVirtualMachine",
  "MigrateVirtualMachine",
  "SyncMigrationTarget",
  "CancelVirtualMachineMigration",
  "SignalTargetPodCleanup",
  "FinalizeVirtualMachineMigration",
  "HotplugHostDevices",
  "GetDomain",
  "GetDomainStats",
  "GetGuestInfo",
  "GetUsers",
  "GetFilesystems",
  "Ping",
  "Exec",
  "GuestPing",
  "VirtualMachineMemoryDump",
  "GetQemuVersion",
  "SyncVirtualMachineCPUs",
  "SyncVirtualMachineMemory",
  "GetSEVInfo",
  "GetLaunchMeasurement",
  "InjectLaunchSecret",
  "GetDomainDirtyRateStats",
  "GetScreenshot",
  "BackupVirtualMachine",
  "RedefineCheckpoint",
  "GetVMStats",
] as const;
/** Name of a `kubevirt.cmd.v1.Cmd` RPC. */
export type CmdMethod = typeof CMD_METHODS[number];

/** Domain event types of `DomainEventRequest.eventType` (Kubernetes watch event types). */
export const DomainEventType = {
  Added: "ADDED",
  Modified: "MODIFIED",
  Deleted: "DELETED",
  Error: "ERROR",
} as const;
/** A domain event type. */
export type DomainEventType = typeof DomainEventType[keyof typeof DomainEventType];

// ---- kubevirt.cmd.v1 messages ----

/** `kubevirt.cmd.v1.VMI`: the VMI as Kubernetes JSON bytes. */
export interface VMI {
  /** The `VirtualMachineInstance` as Kubernetes JSON. */
  vmiJson: Uint8Array;
}

/** `kubevirt.cmd.v1.VirtualMachineOptions`, the fields virtnode reads; others pass through. */
export interface VirtualMachineOptions {
  /** Seconds between memory balloon statistics updates; 0 turns them off. */
  MemBalloonStatsPeriod?: number;
  /** Names of the volumes whose disk images are preallocated. */
  PreallocatedVolumes?: string[];
  /** Options virtnode does not read, passed on as received. */
  [field: string]: unknown;
}

/** `kubevirt.cmd.v1.VMIRequest`. */
export interface VMIRequest {
  /** The VMI to act on. */
  vmi?: VMI | null;
  /** Options for defining the domain. */
  options?: VirtualMachineOptions | null;
}

/** `kubevirt.cmd.v1.MemoryDumpRequest`: dump the guest's memory to a file of the launcher's. */
export interface MemoryDumpRequest {
  /** The VMI whose guest's memory is dumped. */
  vmi?: VMI | null;
  /** The file, as the launcher sees it. */
  dumpPath: string;
}

/** `kubevirt.cmd.v1.EmptyRequest`. */
export type EmptyRequest = Record<string, never>;

/** `kubevirt.cmd.v1.Response` (also `kubevirt.notify.v1.Response`). */
export interface Response {
  /** Whether the call succeeded. */
  success: boolean;
  /** Why it failed; empty on success. */
  message: string;
}

/** `kubevirt.cmd.v1.DomainResponse`: `domain` is the Domain JSON, empty when none. */
export interface DomainResponse {
  /** The outcome of the call. */
  response: Response | null;
  /** The Domain as JSON, or empty when there is no domain. */
  domain: string;
}

/** `kubevirt.cmd.v1.DomainStatsResponse`: `domainStats` is JSON text. */
export interface DomainStatsResponse {
  /** The outcome of the call. */
  response: Response | null;
  /** The domain's statistics as JSON. */
  domainStats: string;
}

/** `kubevirt.cmd.v1.GuestInfoResponse`: `guestInfoResponse` is JSON text. */
export interface GuestInfoResponse {
  /** The outcome of the call. */
  response: Response | null;
  /** What the guest agent reports, as JSON. */
  guestInfoResponse: string;
}

/** `kubevirt.cmd.v1.QemuVersionResponse`. */
export interface QemuVersionResponse {
  /** The outcome of the call. */
  response: Response | null;
  /** The QEMU version the launcher runs. */
  version: string;
}

/** `kubevirt.cmd.info.CmdInfoResponse`. */
export interface CmdInfoResponse {
  /** The cmd API versions the launcher speaks. */
  supportedCmdVersions: number[];
}

// ---- kubevirt.notify.v1 messages ----

/** `kubevirt.notify.v1.DomainEventRequest`. */
export interface DomainEventRequest {
  /** Domain JSON (KubeVirt wire shape) for ADDED, MODIFIED, DELETED. */
  domainJSON: Uint8Array;
  /** A Kubernetes `Status` as JSON for ERROR; empty otherwise. */
  statusJSON: Uint8Array;
  /** The event type, one of {@linkcode DomainEventType}. */
  eventType: string;
}

/** `kubevirt.notify.v1.K8sEventRequest`: a Kubernetes core/v1 Event as JSON. */
export interface K8sEventRequest {
  /** The core/v1 Event as JSON. */
  eventJSON: Uint8Array;
}

/** `kubevirt.notify.info.NotifyInfoResponse`. */
export interface NotifyInfoResponse {
  /** The notify API versions the handler speaks. */
  supportedNotifyVersions: number[];
}

/** The `.proto` files of this module, by name. */
export const PROTO_FILES: Readonly<Record<"cmd" | "cmdInfo" | "notify" | "notifyInfo", string>> =
  Object.freeze({
    cmd: "cmd.proto",
    cmdInfo: "cmd_info.proto",
    notify: "notify.proto",
    notifyInfo: "notify_info.proto",
  });

function service(file: string, name: string): ServiceDefinition {
  const definition = loadDefinition(file)[name];
  if (!definition || "format" in definition) {
    throw new ProtoLoadError(protoPath(file), {
      cause: new Error(`service "${name}" is not defined`),
    });
  }
  return definition as unknown as ServiceDefinition;
}

/** The `kubevirt.cmd.v1.Cmd` service definition, for `Server.addService` or a client. */
export function cmdService(): ServiceDefinition {
  return service(PROTO_FILES.cmd, CMD_SERVICE);
}

/** The `kubevirt.cmd.info.CmdInfo` service definition. */
export function cmdInfoService(): ServiceDefinition {
  return service(PROTO_FILES.cmdInfo, CMD_INFO_SERVICE);
}

/** The `kubevirt.notify.v1.Notify` service definition. */
export function notifyService(): ServiceDefinition {
  return service(PROTO_FILES.notify, NOTIFY_SERVICE);
}

/** The `kubevirt.notify.info.NotifyInfo` service definition. */
export function notifyInfoService(): ServiceDefinition {
  return service(PROTO_FILES.notifyInfo, NOTIFY_INFO_SERVICE);
}

/** A typed unary client method that also takes call options. */
export interface UnaryMethod<Req, Res> {
  (
    request: Req,
    callback: (error: ServiceError | null, response?: Res) => void,
  ): ClientCall;
  (
    request: Req,
    options: CallOptions,
    callback: (error: ServiceError | null, response?: Res) => void,
  ): ClientCall;
}

/** A `kubevirt.cmd.v1.Cmd` client; methods not typed here exist too (see `CMD_METHODS`). */
export interface CmdClient extends GrpcClient {
  /** Defines and starts the domain, or brings a running one in line with the VMI. */
  SyncVirtualMachine: UnaryMethod<VMIRequest, Response>;
  /** Pauses the domain. */
  PauseVirtualMachine: UnaryMethod<VMIRequest, Response>;
  /** Resumes a paused domain. */
  UnpauseVirtualMachine: UnaryMethod<VMIRequest, Response>;
  /** Resets the domain, like pressing the reset button. */
  ResetVirtualMachine: UnaryMethod<VMIRequest, Response>;
  /** Asks the guest to reboot. */
  SoftRebootVirtualMachine: UnaryMethod<VMIRequest, Response>;
  /** Asks the guest to shut down (ACPI). */
  ShutdownVirtualMachine: UnaryMethod<VMIRequest, Response>;
  /** Destroys the domain at once. */
  KillVirtualMachine: UnaryMethod<VMIRequest, Response>;
  /** Undefines the domain. */
  DeleteVirtualMachine: UnaryMethod<VMIRequest, Response>;
  /** The current domain. */
  GetDomain: UnaryMethod<EmptyRequest, DomainResponse>;
  /** The domain's statistics. */
  GetDomainStats: UnaryMethod<EmptyRequest, DomainStatsResponse>;
  /** What the guest agent reports. */
  GetGuestInfo: UnaryMethod<EmptyRequest, GuestInfoResponse>;
  /** Succeeds when the launcher answers. */
  Ping: UnaryMethod<EmptyRequest, Response>;
  /** The QEMU version of the launcher. */
  GetQemuVersion: UnaryMethod<EmptyRequest, QemuVersionResponse>;
  /** The other RPCs of `CMD_METHODS`, untyped. */
  [method: string]: unknown;
}

/** A `kubevirt.cmd.info.CmdInfo` client. */
export interface CmdInfoClient extends GrpcClient {
  /** The cmd API versions the launcher speaks. */
  Info: UnaryMethod<Record<string, never>, CmdInfoResponse>;
}

/** A `kubevirt.notify.v1.Notify` client. */
export interface NotifyClient extends GrpcClient {
  /** Reports a change of the domain to the handler. */
  HandleDomainEvent: UnaryMethod<DomainEventRequest, Response>;
  /** Asks the handler to record a Kubernetes event on the VMI. */
  HandleK8sEvent: UnaryMethod<K8sEventRequest, Response>;
}

/** A `kubevirt.notify.info.NotifyInfo` client. */
export interface NotifyInfoClient extends GrpcClient {
  /** The notify API versions the handler speaks. */
  Info: UnaryMethod<Record<string, never>, NotifyInfoResponse>;
}

function client<C>(
  definition: ServiceDefinition,
  name: string,
  socketPath: string,
  options?: grpc.ClientOptions,
): C {
  const Ctor = grpc.makeClientConstructor(definition, name);
  return new Ctor(
    unixTarget(socketPath),
    grpc.credentials.createInsecure(),
    options,
  ) as unknown as C;
}

/** A cmd client for a launcher socket path (no I/O until the first call). */
export function newCmdClient(socketPath: string, options?: ChannelOptions): CmdClient {
  return client<CmdClient>(cmdService(), "Cmd", socketPath, options);
}

/**
 * A CmdInfo client for a launcher socket path; given `sharing`, a client of the same socket,
 * it uses that client's channel (one connection for both, as KubeVirt's handler asks Info on
 * its cmd connection), and closing either closes both.
 */
export function newCmdInfoClient(socketPath: string, sharing?: GrpcClient): CmdInfoClient {
  const channelOverride = (sharing as grpc.Client | undefined)?.getChannel();
  return client<CmdInfoClient>(
    cmdInfoService(),
    "CmdInfo",
    socketPath,
    channelOverride ? { channelOverride } : undefined,
  );
}

/** A Notify client for a notify socket path. */
export function newNotifyClient(socketPath: string): NotifyClient {
  return client<NotifyClient>(notifyService(), "Notify", socketPath);
}

/** A NotifyInfo client for a notify socket path. */
export function newNotifyInfoClient(socketPath: string): NotifyInfoClient {
  return client<NotifyInfoClient>(notifyInfoService(), "NotifyInfo", socketPath);
}

/** The highest version both sides support, or `undefined` (KubeVirt's negotiation rule). */
export function highestCommonVersion(
  theirs: readonly number[],
  ours: readonly number[],
): number | undefined {
  const common = theirs.filter((v) => ours.includes(v));
  return common.length === 0 ? undefined : Math.max(...common);
}

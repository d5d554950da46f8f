/**
 * The gRPC APIs between handler and launcher, with KubeVirt's package, service, method,
 * message and field names and numbers: `kubevirt.cmd.v1.Cmd` and `kubevirt.cmd.info.CmdInfo`
 * on the launcher socket, `kubevirt.notify.v1.Notify` and `kubevirt.notify.info.NotifyInfo`
 * on the handler's notify socket.
 *
 * The `.proto` files sit beside this module and are loaded from paths relative to
 * `import.meta.url` (the `compile` task embeds `mod/proto`). Loading is lazy and happens
 * once per process. Messages follow `@grpc/proto-loader` with `keepCase`, `longs: String`,
 * `enums: String`, `defaults` and `oneofs`: field names as in the `.proto`, 64-bit integers
 * as decimal strings, `bytes` as `Uint8Array` (a `Buffer`), unset fields at their defaults.
 *
 * @example
 * ```ts
 * import * as grpc from "@grpc/grpc-js";
 * import { cmdService, newCmdClient } from "./mod/proto/mod.ts";
 * const client = newCmdClient("/var/run/kubevirt/sockets/launcher-sock");
 * client.Ping({}, (error, response) => console.log(error ?? response));
 * ```
 *
 * @module
 */

export {
  type CallOptions,
  type ChannelOptions,
  type ClientCall,
  type ClientReadableStream,
  type GrpcClient,
  type MethodDefinition,
  PROTO_LOADER_OPTIONS,
  type ProtoLoaderOptions,
  ProtoLoadError,
  protoPath,
  type ServiceDefinition,
  type ServiceError,
  unixTarget,
} from "./loader.ts";
export {
  CMD_INFO_SERVICE,
  CMD_METHODS,
  CMD_SERVICE,
  type CmdClient,
  type CmdInfoClient,
  type CmdInfoResponse,
  cmdInfoService,
  type CmdMethod,
  cmdService,
  type DomainEventRequest,
  DomainEventType,
  type DomainResponse,
  type DomainStatsResponse,
  type EmptyRequest,
  type GuestInfoResponse,
  highestCommonVersion,
  type K8sEventRequest,
  type MemoryDumpRequest,
  newCmdClient,
  newCmdInfoClient,
  newNotifyClient,
  newNotifyInfoClient,
  NOTIFY_INFO_SERVICE,
  NOTIFY_SERVICE,
  type NotifyClient,
  type NotifyInfoClient,
  type NotifyInfoResponse,
  notifyInfoService,
  notifyService,
  PROTO_FILES,
  type QemuVersionResponse,
  type Response,
  SUPPORTED_CMD_VERSIONS,
  SUPPORTED_NOTIFY_VERSIONS,
  type UnaryMethod,
  type VirtualMachineOptions,
  type VMI,
  type VMIRequest,
} from "./kubevirt.ts";
export {
  type AllocateRequest,
  type AllocateResponse,
  type Callback,
  type ContainerAllocateResponse,
  type Device,
  DEVICE_PLUGIN_API_VERSION,
  DEVICE_PLUGIN_PROTO,
  DEVICE_PLUGIN_SERVICE,
  DeviceHealth,
  type DevicePluginClient,
  type DevicePluginOptions,
  devicePluginService,
  type DeviceSpec,
  type Empty,
  KUBELET_SOCKET,
  type ListAndWatchResponse,
  type Mount,
  newDevicePluginClient,
  newRegistrationClient,
  type PreferredAllocationRequest,
  type PreferredAllocationResponse,
  type PreStartContainerRequest,
  type RegisterRequest,
  REGISTRATION_SERVICE,
  type RegistrationClient,
  registrationService,
  type Unary,
} from "./deviceplugin.ts";

/**
 * The kubelet device plugin API `v1beta1` (`deviceplugin_v1beta1.proto`): the
 * `v1beta1.Registration` service the kubelet serves and the `v1beta1.DevicePlugin`
 * service each plugin serves, with message types in `@grpc/proto-loader`'s `keepCase`
 * shape (field names exactly as in the `.proto`).
 *
 * @module
 */

import * as grpc from "@grpc/grpc-js";
import {
  type CallOptions,
  type ClientCall,
  type ClientReadableStream,
  type GrpcClient,
  loadDefinition,
  ProtoLoadError,
  protoPath,
  type ServiceDefinition,
  type ServiceError,
  unixTarget,
} from "./loader.ts";

/** The `.proto` file of the device plugin API. */
export const DEVICE_PLUGIN_PROTO = "deviceplugin_v1beta1.proto";
/** Fully qualified name of the kubelet's registration service. */
export const REGISTRATION_SERVICE = "v1beta1.Registration";
/** Fully qualified name of a device plugin's service. */
export const DEVICE_PLUGIN_SERVICE = "v1beta1.DevicePlugin";
/** The API version a plugin registers with. */
export const DEVICE_PLUGIN_API_VERSION = "v1beta1";
/** The kubelet's registration socket name in the device-plugins directory. */
export const KUBELET_SOCKET = "kubelet.sock";
/** Device health values. */
export const DeviceHealth = { Healthy: "Healthy", Unhealthy: "Unhealthy" } as const;
/** A device health value. */
export type DeviceHealth = typeof DeviceHealth[keyof typeof DeviceHealth];

/** `v1beta1.DevicePluginOptions`. */
export interface DevicePluginOptions {
  /** Whether the kubelet must call `PreStartContainer` before each container start. */
  pre_start_required: boolean;
  /** Whether the plugin implements `GetPreferredAllocation`. */
  get_preferred_allocation_available: boolean;
}

/** `v1beta1.RegisterRequest`. */
export interface RegisterRequest {
  /** The API version the plugin speaks: `v1beta1`. */
  version: string;
  /** The plugin's socket file name in the device-plugins directory. */
  endpoint: string;
  /** The extended resource, e.g. `devices.kubevirt.io/kvm`. */
  resource_name: string;
  /** What the plugin supports. */
  options?: DevicePluginOptions | null;
}

/** `v1beta1.Empty`. */
export type Empty = Record<string, never>;

/** `v1beta1.Device`. */
export interface Device {
  /** The device's ID, unique within the resource; at most 63 characters. */
  ID: string;
  /** `Healthy` or `Unhealthy` ({@linkcode DeviceHealth}). */
  health: string;
  /** The NUMA nodes the device is attached to. */
  topology?: { nodes: { ID: string }[] } | null;
}

/** `v1beta1.ListAndWatchResponse`. */
export interface ListAndWatchResponse {
  /** Every device of the resource. */
  devices: Device[];
}

/** `v1beta1.AllocateRequest`. */
export interface AllocateRequest {
  /** The device IDs wanted by each container. */
  container_requests: { devices_ids: string[] }[];
}

/** `v1beta1.DeviceSpec`. */
export interface DeviceSpec {
  /** Path in the container. */
  container_path: string;
  /** Path on the host. */
  host_path: string;
  /** Cgroup permissions: any of `r`, `w`, `m`. */
  permissions: string;
}

/** `v1beta1.Mount`. */
export interface Mount {
  /** Path in the container. */
  container_path: string;
  /** Path on the host. */
  host_path: string;
  /** Whether the mount is read-only. */
  read_only: boolean;
}

/** `v1beta1.ContainerAllocateResponse`. */
export interface ContainerAllocateResponse {
  /** Environment variables to set in the container. */
  envs: Record<string, string>;
  /** Host paths to mount into the container. */
  mounts: Mount[];
  /** Device nodes to make available in the container. */
  devices: DeviceSpec[];
  /** Annotations to pass to the container runtime. */
  annotations: Record<string, string>;
  /** CDI devices to add to the container, by fully qualified name. */
  cdi_devices: { name: string }[];
}

/** `v1beta1.AllocateResponse`. */
export interface AllocateResponse {
  /** What to give each container, in the order of the request. */
  container_responses: ContainerAllocateResponse[];
}

/** `v1beta1.PreferredAllocationRequest`. */
export interface PreferredAllocationRequest {
  /** For each container: the devices to choose from and how many to pick. */
  container_requests: {
    available_deviceIDs: string[];
    must_include_deviceIDs: string[];
    allocation_size: number;
  }[];
}

/** `v1beta1.PreferredAllocationResponse`. */
export interface PreferredAllocationResponse {
  /** The preferred device IDs of each container. */
  container_responses: { deviceIDs: string[] }[];
}

/** `v1beta1.PreStartContainerRequest`. */
export interface PreStartContainerRequest {
  /** The devices allocated to the container. */
  devices_ids: string[];
}

function service(name: string): ServiceDefinition {
  const path = protoPath(DEVICE_PLUGIN_PROTO);
  const found = loadDefinition(DEVICE_PLUGIN_PROTO)[name];
  if (!found || "format" in found) {
    throw new ProtoLoadError(path, { cause: new Error(`service "${name}" is not defined`) });
  }
  return found as unknown as ServiceDefinition;
}

/** The `v1beta1.Registration` service definition. */
export function registrationService(): ServiceDefinition {
  return service(REGISTRATION_SERVICE);
}

/** The `v1beta1.DevicePlugin` service definition. */
export function devicePluginService(): ServiceDefinition {
  return service(DEVICE_PLUGIN_SERVICE);
}

/** The callback of a unary call: an error or the response. */
export type Callback<Res> = (error: ServiceError | null, response?: Res) => void;

/** A unary method with optional call options. */
export interface Unary<Req, Res> {
  (request: Req, callback: Callback<Res>): ClientCall;
  (request: Req, options: CallOptions, callback: Callback<Res>): ClientCall;
}

/** A `v1beta1.Registration` client (what a plugin uses to reach the kubelet). */
export interface RegistrationClient extends GrpcClient {
  /** Registers a plugin with the kubelet. */
  Register: Unary<RegisterRequest, Empty>;
}

/** A `v1beta1.DevicePlugin` client (what the kubelet uses to reach a plugin). */
export interface DevicePluginClient extends GrpcClient {
  /** What the plugin supports. */
  GetDevicePluginOptions: Unary<Empty, DevicePluginOptions>;
  /** The device list at once, then again on every change. */
  ListAndWatch(
    request: Empty,
    options?: CallOptions,
  ): ClientReadableStream<ListAndWatchResponse>;
  /** The devices the plugin would pick, given the available ones. */
  GetPreferredAllocation: Unary<PreferredAllocationRequest, PreferredAllocationResponse>;
  /** What the container runtime needs to give containers the devices. */
  Allocate: Unary<AllocateRequest, AllocateResponse>;
  /** Prepares the devices before a container starts. */
  PreStartContainer: Unary<PreStartContainerRequest, Empty>;
}

/** A Registration client for a kubelet socket path (no I/O until the first call). */
export function newRegistrationClient(socketPath: string): RegistrationClient {
  const Ctor = grpc.makeClientConstructor(registrationService(), "Registration");
  return new Ctor(
    unixTarget(socketPath),
    grpc.credentials.createInsecure(),
  ) as unknown as RegistrationClient;
}

/** A DevicePlugin client for a plugin socket path. */
export function newDevicePluginClient(socketPath: string): DevicePluginClient {
  const Ctor = grpc.makeClientConstructor(devicePluginService(), "DevicePlugin");
  return new Ctor(
    unixTarget(socketPath),
    grpc.credentials.createInsecure(),
  ) as unknown as DevicePluginClient;
}

/**
 * KubeVirt's permanent device plugins, speaking the kubelet's device plugin API
 * `v1beta1`: `devices.kubevirt.io/kvm` (/dev/kvm), `devices.kubevirt.io/tun`
 * (/dev/net/tun) and `devices.kubevirt.io/vhost-net` (/dev/vhost-net), each advertising
 * `maxDevices` interchangeable devices named like KubeVirt's (`kvm0`, `kvm1`, ...).
 *
 * Each plugin serves `v1beta1.DevicePlugin` on `kubevirt-<name>.sock` (mode 0600) in the
 * kubelet's device-plugins directory and registers at `kubelet.sock` there. A session
 * lasts until the kubelet restarts: the kubelet wipes the directory (our socket goes)
 * and re-creates its socket; the plugin then serves and registers again. Failed starts
 * back off 1, 2, 5, 10 s. Every plugin registers whether its device node exists or not, as
 * KubeVirt's do. Health follows the device node: it is Unhealthy while the node is missing
 * and Healthy while it is there (a `Deno.watchFs` on the parent directory, with a periodic
 * stat as the fallback), pushed to every ListAndWatch stream.
 *
 * @module
 */

import * as grpc from "@grpc/grpc-js";
import { basename, dirname, join } from "node:path";
import { DeviceResources } from "../api/mod.ts";
import { getLogger } from "../log/mod.ts";
import {
  type AllocateRequest,
  type AllocateResponse,
  type ContainerAllocateResponse,
  type Device,
  DEVICE_PLUGIN_API_VERSION,
  DeviceHealth,
  devicePluginService,
  type Empty,
  KUBELET_SOCKET,
  type ListAndWatchResponse,
  newRegistrationClient,
  type PreferredAllocationRequest,
  type PreferredAllocationResponse,
} from "../proto/mod.ts";
import { unixTarget } from "../proto/mod.ts";
import { every, removeIfPresent, sleep } from "../lifecycle/mod.ts";
import { errorText } from "../../ffi/mod.ts";

const log = getLogger("device-plugins");

/** The kubelet's device-plugins directory. */
export const DEFAULT_DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins";
/** Devices per plugin KubeVirt advertises unless told. */
export const DEFAULT_MAX_DEVICES = 1000;
/** Restart delays after failures (KubeVirt's `defaultBackoffTime`). */
export const DEFAULT_BACKOFF_MS: readonly number[] = Object.freeze([1_000, 2_000, 5_000, 10_000]);

/** A host device one plugin hands out. */
export interface PermanentDevice {
  /** Short name: the socket is `kubevirt-<name>.sock`, device IDs `<name><n>`. */
  name: string;
  /** Device node path on the host and in the container; its presence is the health. */
  path: string;
  /** Extended resource name. */
  resourceName: string;
  /** Open and close the node once before serving (loads tun/vhost-net modules). */
  preOpen: boolean;
  /**
   * The devices, when they are distinct (a permitted host device's IOMMU groups), with the
   * NUMA node each is attached to (-1: none known); unset, `maxDevices` interchangeable
   * ones named `<name><n>`.
   */
  ids?: readonly { id: string; numaNode: number }[];
  /**
   * What a container is given for `ids` (default: the device node at `path`, no variable);
   * `permissions` is the plugin's cgroup permissions.
   */
  allocate?: (ids: string[], permissions: string) => Pick<
    ContainerAllocateResponse,
    "envs" | "devices"
  >;
}

/** KubeVirt's permanent host devices. */
export const PERMANENT_DEVICES: readonly PermanentDevice[] = Object.freeze([
  { name: "kvm", path: "/dev/kvm", resourceName: DeviceResources.Kvm, preOpen: false },
  { name: "tun", path: "/dev/net/tun", resourceName: DeviceResources.Tun, preOpen: true },
  {
    name: "vhost-net",
    path: "/dev/vhost-net",
    resourceName: DeviceResources.VhostNet,
    preOpen: true,
  },
]);

/** Options shared by the plugins and the manager. */
export interface DevicePluginConfig {
  /** The kubelet's device-plugins directory ({@linkcode DEFAULT_DEVICE_PLUGIN_DIR}). */
  pluginDir?: string;
  /** Where the host's `/` is seen (tests point it at a temporary directory); "/" unless told. */
  deviceRoot?: string;
  /** Devices per plugin ({@linkcode DEFAULT_MAX_DEVICES}). */
  maxDevices?: number;
  /** Cgroup permissions in Allocate's DeviceSpec ("rw"). */
  permissions?: string;
  /** Restart delays after failures ({@linkcode DEFAULT_BACKOFF_MS}). */
  backoffMs?: readonly number[];
  /** Fallback stat period of the device node, sockets and missing devices (5 s). */
  pollIntervalMs?: number;
  /** Timeout of the Register call (5 s). */
  registerTimeoutMs?: number;
}

/** The socket file name of a plugin: `kubevirt-<name>.sock`. */
export function pluginSocketName(deviceName: string): string {
  return `kubevirt-${deviceName}.sock`;
}

/** KubeVirt's device IDs of a plugin: `<name>0` ... `<name><max-1>`. */
export function deviceIds(deviceName: string, maxDevices: number): string[] {
  return Array.from({ length: maxDevices }, (_, i) => `${deviceName}${i}`);
}

/** A plugin could not serve or register. */
export class DevicePluginError extends Error {
  /** The resource of the plugin that failed. */
  readonly resourceName: string;
  /** Creates the error. */
  constructor(resourceName: string, message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "DevicePluginError";
    this.resourceName = resourceName;
  }
}

async function statOrUndefined(path: string): Promise<Deno.FileInfo | undefined> {
  try {
    return await Deno.stat(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound || error instanceof Deno.errors.NotADirectory) {
      return undefined;
    }
    throw error;
  }
}

/** Inode numbers are reused at once on tmpfs; the change time tells a new file apart. */
function fileId(info: Deno.FileInfo): string {
  return `${info.dev}:${info.ino}:${info.ctime?.getTime()}:${info.birthtime?.getTime()}`;
}

function message(error: unknown): string {
  return errorText(error);
}

/** A wake-up flag: `wake()` any number of times, `wait()` resolves once per batch. */
class Waker {
  #pending = false;
  #resolve: (() => void) | undefined;
  wake(): void {
    this.#pending = true;
    this.#resolve?.();
    this.#resolve = undefined;
  }
  wait(signal: AbortSignal): Promise<void> {
    if (this.#pending || signal.aborted) {
      this.#pending = false;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const onAbort = () => resolve();
      signal.addEventListener("abort", onAbort, { once: true });
      this.#resolve = () => {
        signal.removeEventListener("abort", onAbort);
        this.#pending = false;
        resolve();
      };
    });
  }
}

/** Why a session ended without an error. */
type SessionEnd = "stopped" | "socket-removed";

/** One device plugin: serves, registers, watches health, restarts; see the module doc. */
export class GenericDevicePlugin {
  /** The device. */
  readonly device: PermanentDevice;
  /** The plugin's socket path. */
  readonly socketPath: string;
  /** The kubelet's registration socket path. */
  readonly kubeletSocket: string;
  /** Where the device node is looked for (device root + device path). */
  readonly watchedPath: string;
  readonly #ids: string[];
  readonly #numa = new Map<string, number>();
  readonly #permissions: string;
  readonly #backoff: readonly number[];
  readonly #pollMs: number;
  readonly #registerTimeoutMs: number;
  readonly #streams = new Set<grpc.ServerWritableStream<Empty, ListAndWatchResponse>>();
  #healthy = true;
  #registered = false;
  #registrations = 0;
  /** Identity of the kubelet socket registered with; undefined once it was seen gone. */
  #kubeletId: string | undefined;

  /** Creates the plugin; nothing happens until {@linkcode run}. */
  constructor(device: PermanentDevice, config: DevicePluginConfig = {}) {
    const pluginDir = config.pluginDir ?? DEFAULT_DEVICE_PLUGIN_DIR;
    this.device = device;
    this.socketPath = join(pluginDir, pluginSocketName(device.name));
    this.kubeletSocket = join(pluginDir, KUBELET_SOCKET);
    this.watchedPath = join(config.deviceRoot ?? "/", device.path);
    this.#ids = device.ids
      ? device.ids.map((d) => d.id)
      : deviceIds(device.name, config.maxDevices ?? DEFAULT_MAX_DEVICES);
    for (const d of device.ids ?? []) if (d.numaNode >= 0) this.#numa.set(d.id, d.numaNode);
    this.#permissions = config.permissions ?? "rw";
    this.#backoff = config.backoffMs?.length ? config.backoffMs : DEFAULT_BACKOFF_MS;
    this.#pollMs = config.pollIntervalMs ?? 5_000;
    this.#registerTimeoutMs = config.registerTimeoutMs ?? 5_000;
  }

  /** The extended resource name, e.g. `devices.kubevirt.io/kvm`. */
  get resourceName(): string {
    return this.device.resourceName;
  }

  /** Whether the kubelet accepted the current session's registration. */
  get registered(): boolean {
    return this.#registered;
  }

  /** How many times the plugin registered since it was created. */
  get registrations(): number {
    return this.#registrations;
  }

  /** Whether the device node is present. */
  get healthy(): boolean {
    return this.#healthy;
  }

  /** The device list as ListAndWatch sends it. */
  devices(): Device[] {
    const health = this.#healthy ? DeviceHealth.Healthy : DeviceHealth.Unhealthy;
    return this.#ids.map((ID) => {
      const numa = this.#numa.get(ID);
      return numa === undefined
        ? { ID, health }
        : { ID, health, topology: { nodes: [{ ID: String(numa) }] } };
    });
  }

  /**
   * Serves, registers with the kubelet and watches until `signal` aborts, registering
   * again after a kubelet restart; then streams get an empty device list and end, and
   * the socket is removed.
   */
  async run(signal: AbortSignal): Promise<void> {
    let failures = 0;
    while (!signal.aborted) {
      try {
        const end = await this.#session(signal);
        failures = 0;
        if (end === "stopped") break;
        log.info("Plugin socket removed, the kubelet probably restarted; registering again", {
          resource: this.resourceName,
        });
      } catch (error) {
        failures++;
        log.error("Device plugin failed: {error}", { resource: this.resourceName, error });
      }
      if (signal.aborted) break;
      const delay = this.#backoff[Math.min(Math.max(failures - 1, 0), this.#backoff.length - 1)];
      await sleep(delay, signal);
    }
  }

  async #session(signal: AbortSignal): Promise<SessionEnd> {
    await removeIfPresent(this.socketPath);
    if (this.device.preOpen) {
      try {
        (await Deno.open(this.watchedPath, { read: true })).close();
      } catch {
        // Health reports a missing node; opening only triggers module loading.
      }
    }
    const server = new grpc.Server();
    server.addService(devicePluginService(), this.#handlers());
    let socketIno: number | null = null;
    try {
      await new Promise<number>((resolve, reject) =>
        server.bindAsync(
          unixTarget(this.socketPath),
          grpc.ServerCredentials.createInsecure(),
          (error, port) => error ? reject(error) : resolve(port),
        )
      ).catch((error) => {
        throw new DevicePluginError(
          this.resourceName,
          `Cannot serve device plugin "${this.resourceName}" on "${this.socketPath}": ${
            message(error)
          }`,
          { cause: error },
        );
      });
      await Deno.chmod(this.socketPath, 0o600);
      socketIno = (await Deno.stat(this.socketPath)).ino;
      this.#setHealth((await statOrUndefined(this.watchedPath)) !== undefined);
      this.#kubeletId = await this.#register();
      return await this.#watch(signal, socketIno);
    } finally {
      this.#registered = false;
      for (const stream of this.#streams) {
        // An empty list makes the kubelet drop the devices at once (KubeVirt does this).
        stream.write({ devices: [] });
        stream.end();
      }
      this.#streams.clear();
      server.forceShutdown();
      // A socket that cannot be looked at is left alone: the next session removes it first.
      const current = await statOrUndefined(this.socketPath).catch(() => undefined);
      if (current && socketIno !== null && current.ino === socketIno) {
        // In a finally, where a throw would hide the session's own error.
        await removeIfPresent(this.socketPath).catch((error) =>
          log.warn("Cannot remove the device plugin socket {path}: {error}", {
            resource: this.resourceName,
            path: this.socketPath,
            error,
          })
        );
      }
    }
  }

  /** Registers with the kubelet; returns the identity of the kubelet socket registered with. */
  async #register(): Promise<string | undefined> {
    const kubelet = await statOrUndefined(this.kubeletSocket);
    const client = newRegistrationClient(this.kubeletSocket);
    try {
      await new Promise<void>((resolve, reject) => {
        client.Register(
          {
            version: DEVICE_PLUGIN_API_VERSION,
            endpoint: basename(this.socketPath),
            resource_name: this.resourceName,
            options: { pre_start_required: false, get_preferred_allocation_available: false },
          },
          { deadline: Date.now() + this.#registerTimeoutMs },
          (error) => error ? reject(error) : resolve(),
        );
      });
    } catch (error) {
      throw new DevicePluginError(
        this.resourceName,
        `Cannot register device plugin "${this.resourceName}" with the kubelet at "${this.kubeletSocket}": ${
          message(error)
        }`,
        { cause: error },
      );
    } finally {
      client.close();
    }
    this.#registered = true;
    this.#registrations++;
    log.info("Device plugin registered", {
      resource: this.resourceName,
      devices: this.#ids.length,
    });
    return kubelet && fileId(kubelet);
  }

  /**
   * Watches the device node and both sockets until the plugin is stopped or its socket
   * goes; a re-created kubelet socket (seen missing, or a new inode or creation time)
   * means a new kubelet: register again.
   */
  async #watch(signal: AbortSignal, socketIno: number | null): Promise<SessionEnd> {
    const waker = new Waker();
    const relevant = new Set([this.watchedPath, this.socketPath, this.kubeletSocket]);
    const dirs = [...new Set([dirname(this.watchedPath), dirname(this.socketPath)])];
    const watchers: Deno.FsWatcher[] = [];
    for (const dir of dirs) {
      try {
        const watcher = Deno.watchFs(dir, { recursive: false });
        watchers.push(watcher);
        (async () => {
          for await (const event of watcher) {
            if (event.paths.some((p) => relevant.has(p))) waker.wake();
          }
        })().catch(() => waker.wake());
      } catch (error) {
        log.debug("Cannot watch {dir}, polling only: {error}", { dir, error });
      }
    }
    const poll = setInterval(() => waker.wake(), this.#pollMs);
    try {
      while (!signal.aborted) {
        await waker.wait(signal);
        if (signal.aborted) break;
        this.#setHealth((await statOrUndefined(this.watchedPath)) !== undefined);
        const own = await statOrUndefined(this.socketPath);
        if (!own || (socketIno !== null && own.ino !== socketIno)) return "socket-removed";
        const kubelet = await statOrUndefined(this.kubeletSocket);
        if (!kubelet) this.#kubeletId = undefined;
        else if (fileId(kubelet) !== this.#kubeletId) {
          log.info("Kubelet socket re-created; registering again", {
            resource: this.resourceName,
          });
          this.#registered = false;
          this.#kubeletId = await this.#register();
        }
      }
      return "stopped";
    } finally {
      clearInterval(poll);
      for (const watcher of watchers) {
        try {
          watcher.close();
        } catch {
          // already closed
        }
      }
    }
  }

  #setHealth(healthy: boolean): void {
    if (healthy === this.#healthy) return;
    this.#healthy = healthy;
    log.info(healthy ? "Device appeared" : "Device disappeared", {
      resource: this.resourceName,
      path: this.device.path,
    });
    const update = { devices: this.devices() };
    for (const stream of this.#streams) stream.write(update);
  }

  #handlers(): grpc.UntypedServiceImplementation {
    return {
      GetDevicePluginOptions: (
        _call: grpc.ServerUnaryCall<Empty, unknown>,
        callback: grpc.sendUnaryData<unknown>,
      ) => callback(null, { pre_start_required: false, get_preferred_allocation_available: false }),
      ListAndWatch: (call: grpc.ServerWritableStream<Empty, ListAndWatchResponse>) => {
        this.#streams.add(call);
        const drop = () => this.#streams.delete(call);
        call.on("cancelled", drop);
        call.on("close", drop);
        call.on("error", drop);
        call.write({ devices: this.devices() });
      },
      GetPreferredAllocation: (
        call: grpc.ServerUnaryCall<PreferredAllocationRequest, PreferredAllocationResponse>,
        callback: grpc.sendUnaryData<PreferredAllocationResponse>,
      ) => callback(null, preferredAllocation(call.request)),
      Allocate: (
        call: grpc.ServerUnaryCall<AllocateRequest, AllocateResponse>,
        callback: grpc.sendUnaryData<AllocateResponse>,
      ) => {
        const known = new Set(this.#ids);
        const unknown = call.request.container_requests.flatMap((r) => r.devices_ids)
          .filter((id) => !known.has(id));
        if (unknown.length > 0) {
          callback({
            code: grpc.status.INVALID_ARGUMENT,
            details: `Cannot allocate "${this.resourceName}": unknown device IDs ${
              unknown.map((id) => `"${id}"`).join(", ")
            }`,
          });
          return;
        }
        log.debug("Allocate", { resource: this.resourceName });
        const given = (ids: string[]) =>
          this.device.allocate?.(ids, this.#permissions) ?? {
            envs: {},
            devices: [{
              container_path: this.device.path,
              host_path: this.device.path,
              permissions: this.#permissions,
            }],
          };
        const requests = call.request.container_requests.length > 0
          ? call.request.container_requests
          : [{ devices_ids: [] }];
        let responses;
        try {
          responses = requests.map((r) => ({
            ...given(r.devices_ids),
            mounts: [],
            annotations: {},
            cdi_devices: [],
          }));
        } catch (error) {
          // A device that went away since the kubelet listed it: the kubelet tries again.
          log.warn("Allocate failed: {error}", { resource: this.resourceName, error });
          callback({ code: grpc.status.INTERNAL, details: message(error) });
          return;
        }
        callback(null, { container_responses: responses });
      },
      PreStartContainer: (
        _call: grpc.ServerUnaryCall<unknown, unknown>,
        callback: grpc.sendUnaryData<unknown>,
      ) => callback(null, {}),
    };
  }
}

/** Must-include IDs first, then available ones in order, up to the allocation size. */
export function preferredAllocation(
  request: PreferredAllocationRequest,
): PreferredAllocationResponse {
  return {
    container_responses: request.container_requests.map((r) => {
      const chosen = [...new Set(r.must_include_deviceIDs)];
      for (const id of r.available_deviceIDs) {
        if (chosen.length >= r.allocation_size) break;
        if (!chosen.includes(id)) chosen.push(id);
      }
      return { deviceIDs: chosen };
    }),
  };
}

/** Whether two host devices serve the same resource with the same devices. */
function sameDevices(a: PermanentDevice, b: PermanentDevice): boolean {
  return a.resourceName === b.resourceName && a.path === b.path &&
    JSON.stringify(a.ids ?? []) === JSON.stringify(b.ids ?? []);
}

/** Options of {@linkcode DevicePluginManager}. */
export interface DevicePluginManagerOptions extends DevicePluginConfig {
  /** The devices to serve ({@linkcode PERMANENT_DEVICES}). */
  devices?: readonly PermanentDevice[];
}

/**
 * Runs one plugin per device, its node present or not (an absent node's devices are
 * Unhealthy until it appears), as virt-handler does. Permitted host devices
 * ({@linkcode setHostDevices}) follow the cluster's configuration: a resource no longer
 * permitted has its plugin stopped, a new one started, a changed one restarted.
 * {@linkcode allRegistered} feeds the heartbeat.
 */
export class DevicePluginManager {
  readonly #config: DevicePluginManagerOptions;
  readonly #plugins = new Map<string, { plugin: GenericDevicePlugin; stop: AbortController }>();
  #hostDevices: readonly PermanentDevice[] = [];
  #running: { signal: AbortSignal; runs: Promise<void>[] } | undefined;
  /** For logs. */
  readonly name = "device-plugins";

  /** Creates the manager; nothing runs until {@linkcode run}. */
  constructor(options: DevicePluginManagerOptions = {}) {
    this.#config = options;
  }

  /** The running plugins. */
  get plugins(): GenericDevicePlugin[] {
    return [...this.#plugins.values()].map((p) => p.plugin);
  }

  /**
   * The permitted host devices to serve besides the permanent ones (the KubeVirt CR's
   * `permittedHostDevices` as found on this host); takes effect at once when running.
   */
  setHostDevices(devices: readonly PermanentDevice[]): void {
    this.#hostDevices = devices;
    const wanted = new Map(devices.map((d) => [d.name, d]));
    for (const [name, entry] of this.#plugins) {
      const permanent = (this.#config.devices ?? PERMANENT_DEVICES).some((d) => d.name === name);
      if (permanent) continue;
      const now = wanted.get(name);
      if (now && sameDevices(now, entry.plugin.device)) continue;
      log.info("Stopping device plugin", { resource: entry.plugin.resourceName });
      entry.stop.abort();
      this.#plugins.delete(name);
    }
    if (this.#running) {
      this.#startAll(this.#running.signal, this.#running.runs);
    }
  }

  /**
   * Runs a plugin for each device present now, looks for the others every poll, and
   * stops every plugin when `signal` aborts.
   */
  async run(signal: AbortSignal): Promise<void> {
    await Deno.mkdir(this.#config.pluginDir ?? DEFAULT_DEVICE_PLUGIN_DIR, { recursive: true });
    const runs: Promise<void>[] = [];
    this.#running = { signal, runs };
    await every(
      this.#config.pollIntervalMs ?? 5_000,
      () => this.#startAll(signal, runs),
      signal,
      {
        onError: (error) => log.error("Cannot look for devices: {error}", { error }),
      },
    );
    this.#running = undefined;
    await Promise.all(runs);
    this.#plugins.clear();
  }

  #startAll(signal: AbortSignal, runs: Promise<void>[]): void {
    // Every device gets its plugin, present or not, as in KubeVirt: a missing node's devices
    // are listed Unhealthy, so the kubelet shows the resource with none allocatable (KubeVirt's
    // tests look for the resource on the node, e.g. devices.kubevirt.io/kvm under emulation).
    for (const device of [...(this.#config.devices ?? PERMANENT_DEVICES), ...this.#hostDevices]) {
      if (signal.aborted || this.#plugins.has(device.name)) continue;
      const plugin = new GenericDevicePlugin(device, this.#config);
      const stop = new AbortController();
      this.#plugins.set(device.name, { plugin, stop });
      log.info("Starting device plugin", { resource: device.resourceName, path: device.path });
      runs.push(plugin.run(AbortSignal.any([signal, stop.signal])));
    }
  }

  /** Whether every started plugin is registered (true when none runs, as KubeVirt's). */
  allRegistered(): boolean {
    return this.plugins.every((p) => p.registered);
  }
}

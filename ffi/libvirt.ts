/**
 * libvirt through Deno FFI: a typed, promise-based API over `libvirt.so.0`.
 *
 * Design (see the tests for proof):
 * - every libvirt call that can fail runs in a call worker, a Worker with one OS thread of
 *   its own; the failing call, `virGetLastError` and `virResetLastError` happen together
 *   on that thread, so an error always belongs to its call, however many run at once;
 * - slow calls (a QEMU start takes about a second) block only a worker, never the
 *   caller's event loop;
 * - libvirt's default event loop is driven from the main thread with a `nonblocking`
 *   `virEventRunDefaultImpl`, and event callbacks are thread-safe `UnsafeCallback`s whose
 *   JavaScript runs on the main thread;
 * - domain objects never cross threads: a {@linkcode Domain} is a name and UUID, and each
 *   call looks the domain up, acts and frees it inside the worker.
 *
 * @example
 * ```ts
 * const conn = await openLibvirt("test:///default");
 * const dom = await conn.lookupByName("test");
 * console.log(await dom.getState()); // { state: 1, stateName: "Running", ... }
 * await conn.close();
 * ```
 *
 * @module
 */

import {
  LIBVIRT_QEMU_SONAME,
  LIBVIRT_SONAME,
  type LibvirtLibrary,
  loadLibvirt,
  readCString,
  silenceDefaultErrorHandler,
} from "./_libvirt_symbols.ts";
import { acquireEventLoop, releaseEventLoop } from "./_event_loop.ts";
import { WorkerPool } from "./worker_pool.ts";
import type {
  DomainRef,
  HostCpuQuery,
  MigrateParam,
  OpName,
  RawDomainStats,
  TypedParamValue,
  WorkerOps,
} from "./_libvirt_protocol.ts";
import {
  AGENT_REASON_NAMES,
  AGENT_STATE_NAMES,
  CLOSE_REASON_NAMES,
  DOMAIN_STATE_NAMES,
  DOMAIN_STATE_REASON_NAMES,
  IO_ERROR_ACTION_NAMES,
  LIFECYCLE_DETAIL_NAMES,
  LIFECYCLE_EVENT_NAMES,
  nameOf,
} from "./_libvirt_names.ts";
import {
  VIR_CONNECT_BASELINE_CPU_EXPAND_FEATURES,
  VIR_DOMAIN_AFFECT_CONFIG,
  VIR_DOMAIN_AFFECT_LIVE,
  VIR_DOMAIN_CORE_DUMP_FORMAT_RAW,
  VIR_DOMAIN_DESTROY_GRACEFUL,
  VIR_DOMAIN_EVENT_ID_AGENT_LIFECYCLE,
  VIR_DOMAIN_EVENT_ID_DEVICE_ADDED,
  VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED,
  VIR_DOMAIN_EVENT_ID_IO_ERROR_REASON,
  VIR_DOMAIN_EVENT_ID_LIFECYCLE,
  VIR_DOMAIN_EVENT_ID_MEMORY_DEVICE_SIZE_CHANGE,
  VIR_DOMAIN_EVENT_ID_REBOOT,
  VIR_DOMAIN_SHUTDOWN_ACPI_POWER_BTN,
  VIR_DOMAIN_START_PAUSED,
  VIR_DOMAIN_UNDEFINE_NVRAM,
  VIR_DUMP_MEMORY_ONLY,
} from "./libvirt_constants.ts";

export type { DomainRef, HostCpuQuery, MigrateParam, RawDomainStats, TypedParamValue };

/** Options of {@linkcode openLibvirt}. */
export interface OpenOptions {
  /** Open read-only (`virConnectOpenReadOnly`). */
  readOnly?: boolean;
  /** Path or soname of libvirt; `libvirt.so.0` unless told (tests use a missing one). */
  libraryPath?: string;
  /** Path or soname of libvirt-qemu (guest agent commands); `libvirt-qemu.so.0`. */
  qemuLibraryPath?: string;
  /** Number of call workers (OS threads) for this connection; 2 unless told. */
  workers?: number;
  /**
   * Most call workers: more start (one at a time) while every worker is busy and a call
   * has waited 25 ms, and end again after 30 s idle; `workers` unless told.
   */
  maxWorkers?: number;
  /** Register domain event callbacks; true unless told. */
  events?: boolean;
  /**
   * Take domain events on a connection of their own (`events` only), so that a call that
   * hangs in libvirt (a stopped QEMU) cannot hold up other domains' events: libvirt's
   * client reads a connection's socket in the thread waiting for a reply, and events read
   * there wait for the next keepalive (5 s) to be dispatched. False unless told.
   */
  eventConnection?: boolean;
  /**
   * Give every call worker a libvirt connection of its own instead of sharing one. On a
   * shared connection, the thread whose call hangs holds libvirt's client I/O for the socket,
   * and another thread's call queued behind it is sometimes sent only when that thread's
   * poll times out (the 5 s keepalive): seen with a stopped QEMU's pause holding up another
   * domain's calls. False unless told.
   */
  connectionPerWorker?: boolean;
  /**
   * Keepalive (`virConnectSetKeepAlive`): interval in seconds and missed-reply count.
   * Unless told: 5 s x 5 for remote URIs (`qemu:`...), none for `test:` URIs; `false` turns
   * it off.
   */
  keepAlive?: { interval: number; count: number } | false;
}

/** A libvirt version split into its parts. */
export interface LibvirtVersion {
  /** Major version. */
  major: number;
  /** Minor version. */
  minor: number;
  /** Release. */
  release: number;
  /** libvirt's encoding: major * 1,000,000 + minor * 1,000 + release. */
  raw: number;
}

/** A domain's state and its reason, as numbers and names. */
export interface DomainStateInfo {
  /** `virDomainState`. */
  state: number;
  /** The reason number, per state. */
  reason: number;
  /** e.g. "Running", "Paused", "Shutoff". */
  stateName: string;
  /** e.g. "Booted", "User", "Destroyed". */
  reasonName: string;
}

/** A domain with its state, from {@linkcode Connection.listAllDomains}. */
export interface DomainSummary extends DomainRef, DomainStateInfo {
  /** Hypervisor ID, or -1 when not running. */
  id: number;
}

/** One domain's statistics, typed parameters as a plain object. */
export type DomainStats = RawDomainStats;

/** A lifecycle event: `event`/`detail` numbers with their names ("Started"/"Booted"). */
export interface LifecycleEvent {
  /** Discriminator. */
  type: "lifecycle";
  /** The domain. */
  domain: DomainRef;
  /** `virDomainEventType`. */
  event: number;
  /** The detail number, per event type. */
  detail: number;
  /** e.g. "Started". */
  eventName: string;
  /** e.g. "Booted". */
  detailName: string;
}

/** The guest rebooted. */
export interface RebootEvent {
  /** Discriminator. */
  type: "reboot";
  /** The domain. */
  domain: DomainRef;
}

/** A disk IO error, with its reason (e.g. "enospc"). */
export interface IOErrorEvent {
  /** Discriminator. */
  type: "ioError";
  /** The domain. */
  domain: DomainRef;
  /** Host path of the disk. */
  srcPath: string;
  /** Device alias. */
  devAlias: string;
  /** `virDomainEventIOErrorAction`. */
  action: number;
  /** "None", "Pause" or "Report". */
  actionName: string;
  /** Why, as QEMU reported it: "enospc", "eio", ... */
  reason: string;
}

/** The guest agent connected or disconnected. */
export interface AgentLifecycleEvent {
  /** Discriminator. */
  type: "agentLifecycle";
  /** The domain. */
  domain: DomainRef;
  /** 1 connected, 2 disconnected. */
  state: number;
  /** "Connected" or "Disconnected". */
  stateName: string;
  /** 0 unknown, 1 domain started, 2 channel. */
  reason: number;
  /** "Unknown", "DomainStarted" or "Channel". */
  reasonName: string;
}

/** A device was removed from the guest. */
export interface DeviceRemovedEvent {
  /** Discriminator. */
  type: "deviceRemoved";
  /** The domain. */
  domain: DomainRef;
  /** Device alias. */
  devAlias: string;
}

/** A device was added to the guest (a disk hotplugged, say). */
export interface DeviceAddedEvent {
  /** Discriminator. */
  type: "deviceAdded";
  /** The domain. */
  domain: DomainRef;
  /** Device alias. */
  devAlias: string;
}

/** A memory device's size changed: the guest plugged or unplugged virtio-mem blocks. */
export interface MemoryDeviceSizeChangeEvent {
  /** Discriminator. */
  type: "memoryDeviceSizeChange";
  /** The domain. */
  domain: DomainRef;
  /** Device alias. */
  devAlias: string;
  /** The device's new size, KiB. */
  sizeKib: number;
}

/** Any domain event this module delivers. */
export type DomainEvent =
  | LifecycleEvent
  | RebootEvent
  | IOErrorEvent
  | AgentLifecycleEvent
  | DeviceRemovedEvent
  | DeviceAddedEvent
  | MemoryDeviceSizeChangeEvent;

/** Why a connection closed under us (`virConnectCloseReason`). */
export interface CloseEvent {
  /** 0 error, 1 EOF, 2 keepalive, 3 client. */
  reason: number;
  /** "Error", "EOF", "Keepalive" or "Client". */
  reasonName: string;
}

/** Options of {@linkcode Connection.getDomainCapabilities}. */
export interface DomainCapabilitiesOptions extends HostCpuQuery {
  /** Flags; 0 unless told. */
  flags?: number;
}

/** Options of {@linkcode Connection.baselineHypervisorCPU}. */
export interface BaselineCPUOptions extends HostCpuQuery {
  /** Flags; {@linkcode VIR_CONNECT_BASELINE_CPU_EXPAND_FEATURES} unless told. */
  flags?: number;
}

/** Options of {@linkcode Connection.waitForEvent}. */
export interface WaitForEventOptions {
  /** Give up after this many milliseconds; 10,000 unless told. */
  timeoutMs?: number;
}

type Call = <K extends OpName>(
  op: K,
  args: Parameters<WorkerOps[K]>,
  action: string,
) => Promise<ReturnType<WorkerOps[K]>>;

/** Splits libvirt's version number. */
export function parseLibvirtVersion(raw: number): LibvirtVersion {
  return {
    major: Math.floor(raw / 1_000_000),
    minor: Math.floor(raw / 1_000) % 1_000,
    release: raw % 1_000,
    raw,
  };
}

/** Names a state and reason pair. */
export function domainStateInfo(state: number, reason: number): DomainStateInfo {
  return {
    state,
    reason,
    stateName: nameOf(DOMAIN_STATE_NAMES, state),
    reasonName: nameOf(DOMAIN_STATE_REASON_NAMES[state], reason),
  };
}

/**
 * A libvirt domain, known by name and UUID. Obtained from a {@linkcode Connection}; every
 * method looks the domain up by UUID, so a handle stays valid across reconnects.
 */
export class Domain {
  /** Domain name. */
  readonly name: string;
  /** Domain UUID. */
  readonly uuid: string;
  readonly #call: Call;

  /** For {@linkcode Connection} only. */
  constructor(call: Call, ref: DomainRef) {
    this.#call = call;
    this.name = ref.name;
    this.uuid = ref.uuid;
  }

  #action(verb: string): string {
    return `Cannot ${verb} domain "${this.name}"`;
  }

  /** Starts the domain (`virDomainCreateWithFlags`); `paused` adds `VIR_DOMAIN_START_PAUSED`. */
  async start(options: { paused?: boolean; flags?: number } = {}): Promise<void> {
    const flags = (options.flags ?? 0) | (options.paused ? VIR_DOMAIN_START_PAUSED : 0);
    await this.#call("domainCreate", [this.uuid, flags], this.#action("start"));
  }

  /** State and reason (`virDomainGetState`). */
  async getState(): Promise<DomainStateInfo> {
    const [state, reason] = await this.#call(
      "domainState",
      [this.uuid],
      this.#action("get state of"),
    );
    return domainStateInfo(state, reason);
  }

  /** The domain XML (`virDomainGetXMLDesc`). */
  async getXMLDesc(flags = 0): Promise<string> {
    return await this.#call("domainXML", [this.uuid, flags], this.#action("get XML of"));
  }

  /** Asks the guest to shut down; `acpi` presses the ACPI power button. */
  async shutdown(options: { acpi?: boolean; flags?: number } = {}): Promise<void> {
    const flags = (options.flags ?? 0) | (options.acpi ? VIR_DOMAIN_SHUTDOWN_ACPI_POWER_BTN : 0);
    await this.#call("domainShutdown", [this.uuid, flags], this.#action("shut down"));
  }

  /** Stops the domain now; `graceful` sends SIGTERM only (`VIR_DOMAIN_DESTROY_GRACEFUL`). */
  async destroy(options: { graceful?: boolean; flags?: number } = {}): Promise<void> {
    const flags = (options.flags ?? 0) | (options.graceful ? VIR_DOMAIN_DESTROY_GRACEFUL : 0);
    await this.#call("domainDestroy", [this.uuid, flags], this.#action("destroy"));
  }

  /** Removes the persistent definition; `nvram` also removes NVRAM. */
  async undefine(options: { nvram?: boolean; flags?: number } = {}): Promise<void> {
    const flags = (options.flags ?? 0) | (options.nvram ? VIR_DOMAIN_UNDEFINE_NVRAM : 0);
    await this.#call("domainUndefine", [this.uuid, flags], this.#action("undefine"));
  }

  /** Pauses the domain. */
  async suspend(): Promise<void> {
    await this.#call("domainSuspend", [this.uuid], this.#action("suspend"));
  }

  /** Resumes a paused domain. */
  async resume(): Promise<void> {
    await this.#call("domainResume", [this.uuid], this.#action("resume"));
  }

  /** Resets the domain like a reset button. */
  async reset(): Promise<void> {
    await this.#call("domainReset", [this.uuid], this.#action("reset"));
  }

  /**
   * Adds a device to the domain (`virDomainAttachDeviceFlags`); the default `flags` change
   * the running guest and its persistent definition alike, as KubeVirt's launcher does.
   */
  async attachDevice(xml: string, flags = VIR_DOMAIN_AFFECT_LIVE | VIR_DOMAIN_AFFECT_CONFIG) {
    await this.#call(
      "domainAttachDevice",
      [this.uuid, xml, flags],
      this.#action("attach a device to"),
    );
  }

  /**
   * Changes a device of the domain in place (`virDomainUpdateDeviceFlags`), e.g. an
   * interface's link state; live and persistent unless told.
   */
  async updateDevice(xml: string, flags = VIR_DOMAIN_AFFECT_LIVE | VIR_DOMAIN_AFFECT_CONFIG) {
    await this.#call(
      "domainUpdateDevice",
      [this.uuid, xml, flags],
      this.#action("update a device of"),
    );
  }

  /**
   * Sets the number of the guest's vCPUs (`virDomainSetVcpusFlags`): vCPUs are plugged or
   * unplugged up to the domain's maximum; live and persistent unless told, as KubeVirt's
   * launcher sets them.
   */
  async setVcpus(count: number, flags = VIR_DOMAIN_AFFECT_LIVE | VIR_DOMAIN_AFFECT_CONFIG) {
    await this.#call("domainSetVcpus", [this.uuid, count, flags], this.#action("set the vCPUs of"));
  }

  /**
   * Pins vCPU `vcpu` to the host CPUs `cpus` (`virDomainPinVcpuFlags`), live and in the
   * definition unless told: the domain's `<vcpupin>` then names them.
   */
  async pinVcpu(
    vcpu: number,
    cpus: readonly number[],
    flags = VIR_DOMAIN_AFFECT_LIVE | VIR_DOMAIN_AFFECT_CONFIG,
  ) {
    await this.#call(
      "domainPinVcpu",
      [this.uuid, vcpu, [...cpus], flags],
      this.#action("pin a vCPU of"),
    );
  }

  /**
   * Writes the guest's memory to `path` (`virDomainCoreDumpWithFormat`): raw and memory
   * only unless told, an ELF core, as KubeVirt's launcher dumps it. Holds its call worker
   * until QEMU has written the whole file.
   */
  async coreDump(
    path: string,
    format = VIR_DOMAIN_CORE_DUMP_FORMAT_RAW,
    flags = VIR_DUMP_MEMORY_ONLY,
  ): Promise<void> {
    await this.#call(
      "domainCoreDump",
      [this.uuid, path, format, flags],
      this.#action("dump the memory of"),
    );
  }

  /**
   * Sets the guest's clock through its agent (`virDomainSetTime`) to `when` (the host's
   * time unless told), to the nanosecond.
   */
  async setTime(when: { seconds: number; nanoseconds: number } = nowForGuest()): Promise<void> {
    await this.#call(
      "domainSetTime",
      [this.uuid, when.seconds, when.nanoseconds],
      this.#action("set the time of"),
    );
  }

  /** Removes a device from the domain (`virDomainDetachDeviceFlags`), live and persistent. */
  async detachDevice(xml: string, flags = VIR_DOMAIN_AFFECT_LIVE | VIR_DOMAIN_AFFECT_CONFIG) {
    await this.#call(
      "domainDetachDevice",
      [this.uuid, xml, flags],
      this.#action("detach a device from"),
    );
  }

  /**
   * Freezes the guest's filesystems through its agent (`virDomainFSFreeze`, all mount
   * points); resolves to the number frozen.
   */
  async fsFreeze(): Promise<number> {
    return await this.#call(
      "domainFsFreeze",
      [this.uuid],
      this.#action("freeze the filesystems of"),
    );
  }

  /** Thaws the guest's filesystems (`virDomainFSThaw`); resolves to the number thawed. */
  async fsThaw(): Promise<number> {
    return await this.#call("domainFsThaw", [this.uuid], this.#action("thaw the filesystems of"));
  }

  /**
   * Takes a picture of the guest's `screen` (`virDomainScreenshot` read through a stream):
   * the image and its MIME type as the hypervisor made it (QEMU: PPM).
   */
  async screenshot(screen = 0): Promise<{ mime: string; data: Uint8Array }> {
    return await this.#call(
      "domainScreenshot",
      [this.uuid, screen],
      this.#action("take a screenshot of"),
    );
  }

  /**
   * Migrates the domain (`virDomainMigrateToURI3`) to the libvirt at `dconnuri` (peer to
   * peer: the source's libvirt connects there itself), with the `VIR_MIGRATE_PARAM_*`
   * `params` and `VIR_MIGRATE_*` `flags`; resolves once the migration is over. It holds a
   * call worker throughout: {@linkcode Domain.jobStats} and {@linkcode Domain.abortJob}
   * meanwhile run on another.
   */
  async migrateToURI3(dconnuri: string, params: MigrateParam[], flags: number): Promise<void> {
    await this.#call(
      "domainMigrateToURI3",
      [this.uuid, dconnuri, params, flags],
      this.#action("migrate"),
    );
  }

  /**
   * This domain's statistics alone (`virDomainListGetStats`); `stats` 0 means all groups.
   * `undefined` when libvirt returns no record for it.
   */
  async getStats(stats = 0, flags = 0): Promise<DomainStats | undefined> {
    return (await this.#call(
      "domainStats",
      [this.uuid, stats, flags],
      this.#action("get statistics of"),
    )) ?? undefined;
  }

  /**
   * The domain's job now (`virDomainGetJobStats`; with `VIR_DOMAIN_JOB_STATS_COMPLETED`,
   * the last one that ended): its
   * `VIR_DOMAIN_JOB_*` type and its statistics (`data_total`, `data_remaining`,
   * `memory_dirty_rate`, ...).
   */
  async jobStats(flags = 0): Promise<{ type: number; params: Record<string, TypedParamValue> }> {
    return await this.#call("domainJobStats", [this.uuid, flags], this.#action("get the job of"));
  }

  /**
   * Which host CPUs each of the domain's vCPUs may run on now (`virDomainGetVcpuPinInfo`):
   * one row per vCPU, one flag per host CPU.
   */
  async vcpuPinInfo(): Promise<boolean[][]> {
    return await this.#call(
      "domainVcpuPinInfo",
      [this.uuid],
      this.#action("get the vCPU pinning of"),
    );
  }

  /**
   * Starts measuring how fast the guest dirties its memory, over `seconds`
   * (`virDomainStartDirtyRateCalc`); the `dirtyrate.*` statistics
   * (`VIR_DOMAIN_STATS_DIRTYRATE`) give the result once it is measured.
   */
  async startDirtyRateCalc(seconds: number, flags = 0): Promise<void> {
    await this.#call(
      "domainStartDirtyRateCalc",
      [this.uuid, seconds, flags],
      this.#action("measure the dirty rate of"),
    );
  }

  /** Aborts the domain's job, such as a migration (`virDomainAbortJob`). */
  async abortJob(): Promise<void> {
    await this.#call("domainAbortJob", [this.uuid], this.#action("abort the job of"));
  }

  /** Sets how long the guest may be paused at a migration's end (`virDomainMigrateSetMaxDowntime`). */
  async migrateSetMaxDowntime(milliseconds: number): Promise<void> {
    await this.#call(
      "domainMigrateSetMaxDowntime",
      [this.uuid, milliseconds],
      this.#action("set the migration downtime of"),
    );
  }

  /** Switches a running migration to post-copy (`virDomainMigrateStartPostCopy`). */
  async migrateStartPostCopy(): Promise<void> {
    await this.#call(
      "domainMigrateStartPostCopy",
      [this.uuid],
      this.#action("start post-copy migration of"),
    );
  }

  /** Asks the guest to reboot. */
  async reboot(flags = 0): Promise<void> {
    await this.#call("domainReboot", [this.uuid, flags], this.#action("reboot"));
  }

  /**
   * Sends a raw guest agent command (`virDomainQemuAgentCommand` from libvirt-qemu.so.0)
   * and returns the agent's JSON reply. If libvirt-qemu cannot be loaded the promise
   * rejects with a {@linkcode LibvirtLoadError}.
   */
  async agentCommand(command: string, timeoutSeconds = 5): Promise<string> {
    return await this.#call(
      "domainAgentCommand",
      [this.uuid, command, timeoutSeconds, 0],
      this.#action("run a guest agent command in"),
    );
  }

  /** Pings the guest agent (`guest-ping`); resolves when it answered. */
  async agentPing(timeoutSeconds = 5): Promise<void> {
    await this.agentCommand('{"execute":"guest-ping"}', timeoutSeconds);
  }
}

const P = "pointer" as const;
const I = "i32" as const;
const LIFECYCLE_CB = { parameters: [P, P, I, I, P], result: I } as const;
const GENERIC_CB = { parameters: [P, P, P], result: "void" } as const;
const IO_ERROR_REASON_CB = { parameters: [P, P, P, P, I, P, P], result: "void" } as const;
const AGENT_CB = { parameters: [P, P, I, I, P], result: "void" } as const;
/** The callback of device added and removed events: (conn, dom, alias, opaque). */
const DEVICE_REMOVED_CB = { parameters: [P, P, P, P], result: "void" } as const;
const MEMORY_SIZE_CB = { parameters: [P, P, P, "u64", P], result: "void" } as const;
const CLOSE_CB = { parameters: [P, I, P], result: "void" } as const;

const mainLibraries = new Map<string, LibvirtLibrary>();

function mainLibrary(path: string): LibvirtLibrary {
  let lib = mainLibraries.get(path);
  if (!lib) {
    lib = loadLibvirt(path);
    silenceDefaultErrorHandler(lib, path);
    mainLibraries.set(path, lib);
  }
  return lib;
}

function pointerValue(cb: Deno.UnsafeCallback): bigint {
  return BigInt(Deno.UnsafePointer.value(cb.pointer));
}

/**
 * An open libvirt connection with its call workers and event callbacks. Close it with
 * {@linkcode Connection.close} (or `await using`).
 */
export class Connection {
  /** The URI this connection was opened with. */
  readonly uri: string;
  readonly #lib: LibvirtLibrary;
  readonly #pool: WorkerPool<WorkerOps>;
  readonly #options: OpenOptions;
  readonly #listeners = new Set<(event: DomainEvent) => void>();
  readonly #closeListeners = new Set<(event: CloseEvent) => void>();
  readonly #iteratorEnders = new Set<() => void>();
  readonly #callbacks: Deno.UnsafeCallback[] = [];
  readonly #eventCallbacks: [number, Deno.UnsafeCallback][] = [];
  #closeCallback: Deno.UnsafeCallback | null = null;
  #closeCallbackRegistered = false;
  #eventRegistrations: number[] = [];
  #connected = false;
  #closed = false;
  /** The open `virConnectPtr` workers attach to (undefined while disconnected). */
  #ptr: bigint | undefined;

  private constructor(
    uri: string,
    lib: LibvirtLibrary,
    pool: WorkerPool<WorkerOps>,
    options: OpenOptions,
  ) {
    this.uri = uri;
    this.#lib = lib;
    this.#pool = pool;
    this.#options = options;
  }

  /** Same as {@linkcode openLibvirt}. */
  static async open(uri: string, options: OpenOptions = {}): Promise<Connection> {
    const libraryPath = options.libraryPath ?? LIBVIRT_SONAME;
    const lib = mainLibrary(libraryPath);
    // Registers the event loop implementation before the first connection exists.
    acquireEventLoop(lib);
    // The pool readies later workers with the connection built after it.
    const built: { conn?: Connection } = {};
    const init = [libraryPath, options.qemuLibraryPath ?? LIBVIRT_QEMU_SONAME] as [
      string,
      string,
    ];
    const pool = new WorkerPool<WorkerOps>({
      min: options.workers ?? 2,
      max: options.maxWorkers,
      prepare: async (worker) => {
        await worker.call("init", init, "Cannot load libvirt in a call worker");
        const conn = built.conn;
        if (conn === undefined || conn.#ptr === undefined) return;
        if (options.connectionPerWorker) {
          await worker.call("open", conn.#openArgs, "Cannot connect a call worker");
          const keepAlive = conn.#keepAlive;
          if (keepAlive) {
            await worker.call(
              "setKeepAlive",
              [keepAlive.interval, keepAlive.count],
              "Cannot set keepalive",
            );
          }
        } else {
          await worker.call("attach", [conn.#ptr], "Cannot attach a call worker");
        }
      },
      retire: async (worker) => {
        await worker.call("closeConnection", [], "Cannot close connection");
      },
    });
    const conn = built.conn = new Connection(uri, lib, pool, options);
    try {
      await pool.each("init", init, "Cannot load libvirt in a call worker");
      conn.#createCallbacks();
      await conn.#connect();
      return conn;
    } catch (error) {
      // The connect error is what the caller must see; this frees what the half-made connection holds.
      await conn.#shutdown().catch(() => {});
      throw error;
    }
  }

  readonly #call: Call = (op, args, action) => {
    if (this.#closed) {
      return Promise.reject(new Error(`${action}: connection to "${this.uri}" is closed`));
    }
    return this.#pool.call(op, args, action);
  };

  #domain(ref: DomainRef): Domain {
    return new Domain(this.#call, ref);
  }

  #ref(dom: Deno.PointerValue): DomainRef {
    if (dom === null) return { name: "", uuid: "" };
    const s = this.#lib.symbols;
    const uuid = new Uint8Array(37);
    s.virDomainGetUUIDString(dom, uuid);
    return {
      name: readCString(s.virDomainGetName(dom)) ?? "",
      uuid: new TextDecoder().decode(uuid.subarray(0, 36)),
    };
  }

  #emit(event: DomainEvent): void {
    for (const listener of [...this.#listeners]) {
      try {
        listener(event);
      } catch {
        // A listener's failure must not reach libvirt's event thread.
      }
    }
  }

  #createCallbacks(): void {
    const add = <D extends Deno.UnsafeCallbackDefinition>(cb: Deno.UnsafeCallback<D>) => {
      // Open connections keep the process alive through the event loop, not callbacks.
      cb.unref();
      this.#callbacks.push(cb as unknown as Deno.UnsafeCallback);
      return cb as unknown as Deno.UnsafeCallback;
    };
    this.#eventCallbacks.push([
      VIR_DOMAIN_EVENT_ID_LIFECYCLE,
      add(Deno.UnsafeCallback.threadSafe(LIFECYCLE_CB, (_c, dom, event, detail) => {
        this.#emit({
          type: "lifecycle",
          domain: this.#ref(dom),
          event,
          detail,
          eventName: nameOf(LIFECYCLE_EVENT_NAMES, event),
          detailName: nameOf(LIFECYCLE_DETAIL_NAMES[event], detail),
        });
        return 0;
      })),
    ]);
    this.#eventCallbacks.push([
      VIR_DOMAIN_EVENT_ID_REBOOT,
      add(Deno.UnsafeCallback.threadSafe(GENERIC_CB, (_c, dom) => {
        this.#emit({ type: "reboot", domain: this.#ref(dom) });
      })),
    ]);
    this.#eventCallbacks.push([
      VIR_DOMAIN_EVENT_ID_IO_ERROR_REASON,
      add(Deno.UnsafeCallback.threadSafe(
        IO_ERROR_REASON_CB,
        (_c, dom, srcPath, devAlias, action, reason) => {
          this.#emit({
            type: "ioError",
            domain: this.#ref(dom),
            srcPath: readCString(srcPath) ?? "",
            devAlias: readCString(devAlias) ?? "",
            action,
            actionName: nameOf(IO_ERROR_ACTION_NAMES, action),
            reason: readCString(reason) ?? "",
          });
        },
      )),
    ]);
    this.#eventCallbacks.push([
      VIR_DOMAIN_EVENT_ID_AGENT_LIFECYCLE,
      add(Deno.UnsafeCallback.threadSafe(AGENT_CB, (_c, dom, state, reason) => {
        this.#emit({
          type: "agentLifecycle",
          domain: this.#ref(dom),
          state,
          stateName: nameOf(AGENT_STATE_NAMES, state),
          reason,
          reasonName: nameOf(AGENT_REASON_NAMES, reason),
        });
      })),
    ]);
    this.#eventCallbacks.push([
      VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED,
      add(Deno.UnsafeCallback.threadSafe(DEVICE_REMOVED_CB, (_c, dom, devAlias) => {
        this.#emit({
          type: "deviceRemoved",
          domain: this.#ref(dom),
          devAlias: readCString(devAlias) ?? "",
        });
      })),
    ]);
    this.#eventCallbacks.push([
      VIR_DOMAIN_EVENT_ID_DEVICE_ADDED,
      add(Deno.UnsafeCallback.threadSafe(DEVICE_REMOVED_CB, (_c, dom, devAlias) => {
        this.#emit({
          type: "deviceAdded",
          domain: this.#ref(dom),
          devAlias: readCString(devAlias) ?? "",
        });
      })),
    ]);
    this.#eventCallbacks.push([
      VIR_DOMAIN_EVENT_ID_MEMORY_DEVICE_SIZE_CHANGE,
      add(Deno.UnsafeCallback.threadSafe(MEMORY_SIZE_CB, (_c, dom, devAlias, size) => {
        this.#emit({
          type: "memoryDeviceSizeChange",
          domain: this.#ref(dom),
          devAlias: readCString(devAlias) ?? "",
          sizeKib: Number(size),
        });
      })),
    ]);
    this.#closeCallback = add(Deno.UnsafeCallback.threadSafe(CLOSE_CB, (_c, reason) => {
      this.#connected = false;
      const event = { reason, reasonName: nameOf(CLOSE_REASON_NAMES, reason) };
      for (const listener of [...this.#closeListeners]) {
        try {
          listener(event);
        } catch {
          // As for domain events.
        }
      }
    }));
  }

  get #openArgs(): [string, boolean] {
    return [this.uri, this.#options.readOnly ?? false];
  }

  get #keepAlive(): { interval: number; count: number } | false {
    return this.#options.keepAlive ??
      (this.uri.startsWith("test:") ? false : { interval: 5, count: 5 });
  }

  async #connect(): Promise<void> {
    const action = `Cannot connect to "${this.uri}"`;
    const ptr = await this.#pool.first("open", this.#openArgs, action);
    this.#connected = true;
    this.#ptr = ptr;
    const perWorker = this.#options.connectionPerWorker ?? false;
    if (perWorker) await this.#pool.rest("open", this.#openArgs, action);
    else await this.#pool.rest("attach", [ptr], action);
    const keepAlive = this.#keepAlive;
    if (keepAlive) {
      const args: [number, number] = [keepAlive.interval, keepAlive.count];
      const what = `Cannot set keepalive on "${this.uri}"`;
      await this.#pool.first("setKeepAlive", args, what);
      if (perWorker) await this.#pool.rest("setKeepAlive", args, what);
    }
    if ((this.#options.events ?? true) && this.#options.eventConnection) {
      await this.#pool.first(
        "openEvents",
        [
          this.uri,
          this.#options.readOnly ?? false,
          keepAlive ? keepAlive.interval : 0,
          keepAlive ? keepAlive.count : 0,
        ],
        `Cannot open the event connection to "${this.uri}"`,
      );
    }
    if (this.#closeCallback !== null) {
      await this.#pool.first(
        "registerCloseCallback",
        [pointerValue(this.#closeCallback)],
        `Cannot register close callback on "${this.uri}"`,
      );
      this.#closeCallbackRegistered = true;
    }
    if (this.#options.events ?? true) {
      for (const [eventId, cb] of this.#eventCallbacks) {
        const id = await this.#pool.first(
          "eventRegister",
          [eventId, pointerValue(cb)],
          `Cannot register domain event ${eventId} on "${this.uri}"`,
        );
        this.#eventRegistrations.push(id);
      }
    }
  }

  /** Undoes {@linkcode #connect}; best effort when the peer is gone. */
  async #disconnect(): Promise<void> {
    const ignore = () => {};
    for (const id of this.#eventRegistrations) {
      await this.#pool.first("eventDeregister", [id], "Cannot deregister event").catch(ignore);
    }
    this.#eventRegistrations = [];
    if (this.#closeCallbackRegistered && this.#closeCallback !== null) {
      await this.#pool.first(
        "unregisterCloseCallback",
        [pointerValue(this.#closeCallback)],
        "Cannot unregister close callback",
      ).catch(ignore);
      this.#closeCallbackRegistered = false;
    }
    this.#ptr = undefined;
    await this.#pool.first("closeEvents", [], "Cannot close the event connection").catch(ignore);
    await this.#pool.each("closeConnection", [], "Cannot close connection").catch(ignore);
    this.#connected = false;
  }

  async #shutdown(): Promise<void> {
    try {
      await this.#disconnect();
    } finally {
      this.#pool.terminate();
      for (const end of [...this.#iteratorEnders]) end();
      await releaseEventLoop();
      // Let any event dispatch queued before deregistration run before the callbacks go.
      await new Promise((resolve) => setTimeout(resolve, 0));
      for (const cb of this.#callbacks) cb.close();
      this.#callbacks.length = 0;
    }
  }

  /** Whether the connection is open and libvirt considers it alive. */
  async isAlive(): Promise<boolean> {
    if (this.#closed || !this.#connected) return false;
    return await this.#call("isAlive", [], `Cannot check connection "${this.uri}"`);
  }

  /** Closes the connection, deregisters callbacks and stops the call workers. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#shutdown();
  }

  /** Closes the connection (for `await using`). */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  /**
   * Opens the URI again (after the daemon restarted or the connection broke) and
   * re-registers the close callback, keepalive and all domain event callbacks. Listeners
   * and iterators carry on.
   */
  async reconnect(): Promise<void> {
    if (this.#closed) throw new Error(`Cannot reconnect to "${this.uri}": connection is closed`);
    await this.#disconnect();
    await this.#connect();
  }

  /** Calls `listener` for every domain event; returns a function that unsubscribes. */
  onEvent(listener: (event: DomainEvent) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  /** Calls `listener` when libvirt closes the connection under us (EOF, keepalive...). */
  onClose(listener: (event: CloseEvent) => void): () => void {
    this.#closeListeners.add(listener);
    return () => this.#closeListeners.delete(listener);
  }

  /**
   * Domain events as an async iterator, from now on. Ends when the connection closes,
   * when `signal` aborts, or when the loop breaks.
   */
  events(options: { signal?: AbortSignal } = {}): AsyncIterableIterator<DomainEvent> {
    const queue: DomainEvent[] = [];
    let wake: (() => void) | null = null;
    let done = false;
    const listener = (event: DomainEvent) => {
      queue.push(event);
      wake?.();
    };
    const end = () => {
      done = true;
      this.#listeners.delete(listener);
      this.#iteratorEnders.delete(end);
      options.signal?.removeEventListener("abort", end);
      wake?.();
    };
    this.#listeners.add(listener);
    this.#iteratorEnders.add(end);
    options.signal?.addEventListener("abort", end, { once: true });
    if (this.#closed || options.signal?.aborted) end();
    const iterator: AsyncIterableIterator<DomainEvent> = {
      async next(): Promise<IteratorResult<DomainEvent>> {
        while (queue.length === 0 && !done) {
          await new Promise<void>((resolve) => wake = resolve);
          wake = null;
        }
        const value = queue.shift();
        return value === undefined ? { value: undefined, done: true } : { value, done: false };
      },
      return(): Promise<IteratorResult<DomainEvent>> {
        end();
        return Promise.resolve({ value: undefined, done: true });
      },
      [Symbol.asyncIterator]() {
        return iterator;
      },
    };
    return iterator;
  }

  /**
   * Resolves with the first event (from now on) that `predicate` accepts; rejects after
   * `timeoutMs`.
   */
  waitForEvent<E extends DomainEvent = DomainEvent>(
    predicate: (event: DomainEvent) => boolean,
    options: WaitForEventOptions = {},
  ): Promise<E> {
    const timeoutMs = options.timeoutMs ?? 10_000;
    return new Promise<E>((resolve, reject) => {
      const off = this.onEvent((event) => {
        if (!predicate(event)) return;
        clearTimeout(timer);
        off();
        resolve(event as E);
      });
      const timer = setTimeout(() => {
        off();
        reject(new Error(`Cannot wait for a domain event: none matched within ${timeoutMs} ms`));
      }, timeoutMs);
    });
  }

  /** Defines a persistent domain (`virDomainDefineXML`). */
  async defineXML(xml: string): Promise<Domain> {
    return this.#domain(await this.#call("defineXML", [xml], "Cannot define domain"));
  }

  /** Creates and starts a transient domain (`virDomainCreateXML`). */
  async createXML(xml: string, flags = 0): Promise<Domain> {
    return this.#domain(await this.#call("createXML", [xml, flags], "Cannot create domain"));
  }

  /** Finds a domain by name. */
  async lookupByName(name: string): Promise<Domain> {
    return this.#domain(
      await this.#call("lookupByName", [name], `Cannot look up domain "${name}"`),
    );
  }

  /** Finds a domain by UUID. */
  async lookupByUUID(uuid: string): Promise<Domain> {
    return this.#domain(
      await this.#call("lookupByUUID", [uuid], `Cannot look up domain with UUID "${uuid}"`),
    );
  }

  /** All domains with their state (`virConnectListAllDomains`; `flags` filter). */
  async listAllDomains(flags = 0): Promise<DomainSummary[]> {
    const raw = await this.#call("listAll", [flags], "Cannot list domains");
    return raw.map((d) => ({ ...d, ...domainStateInfo(d.state, d.reason) }));
  }

  /** Statistics of all domains (`virConnectGetAllDomainStats`); `stats` 0 means all. */
  async getAllDomainStats(stats = 0, flags = 0): Promise<DomainStats[]> {
    return await this.#call("allDomainStats", [stats, flags], "Cannot get domain statistics");
  }

  /** The libvirt library's version (`virGetVersion`). */
  async getLibVersion(): Promise<LibvirtVersion> {
    return parseLibvirtVersion(
      await this.#call("libVersion", [], "Cannot get the libvirt version"),
    );
  }

  /** The hypervisor's version (`virConnectGetVersion`). */
  async getHypervisorVersion(): Promise<LibvirtVersion> {
    return parseLibvirtVersion(
      await this.#call("hypervisorVersion", [], "Cannot get the hypervisor version"),
    );
  }

  /** The host capabilities XML. */
  async getCapabilities(): Promise<string> {
    return await this.#call("capabilities", [], "Cannot get host capabilities");
  }

  /** The domain capabilities XML (`virConnectGetDomainCapabilities`). */
  async getDomainCapabilities(options: DomainCapabilitiesOptions = {}): Promise<string> {
    const { flags = 0, ...query } = options;
    return await this.#call(
      "domainCapabilities",
      [query, flags],
      "Cannot get domain capabilities",
    );
  }

  /**
   * The baseline CPU of the given `<cpu>` XMLs that this hypervisor can run
   * (`virConnectBaselineHypervisorCPU`, with all features expanded unless told).
   */
  async baselineHypervisorCPU(
    cpuXmls: string[],
    options: BaselineCPUOptions = {},
  ): Promise<string> {
    const { flags = VIR_CONNECT_BASELINE_CPU_EXPAND_FEATURES, ...query } = options;
    return await this.#call(
      "baselineHypervisorCPU",
      [query, cpuXmls, flags],
      "Cannot compute the baseline hypervisor CPU",
    );
  }
}

/**
 * Opens a libvirt connection: `test:///default`, `test:///abs/node.xml`, `qemu:///system`,
 * `qemu+unix:///system?socket=...`. Throws {@linkcode LibvirtLoadError} when libvirt
 * cannot be loaded and {@linkcode LibvirtError} when the connection fails.
 */
export function openLibvirt(uri: string, options: OpenOptions = {}): Promise<Connection> {
  return Connection.open(uri, options);
}

/** The host's time now, whole seconds and nanoseconds since the epoch. */
function nowForGuest(): { seconds: number; nanoseconds: number } {
  const ms = Date.now();
  return { seconds: Math.floor(ms / 1000), nanoseconds: (ms % 1000) * 1_000_000 };
}

/**
 * The launcher's domain manager: what each cmd RPC does to the one libvirt domain of
 * the launcher's VMI. Commands run one at a time; each is idempotent where KubeVirt's
 * are (a second Sync of a running domain, a Pause of a paused one, a Kill of a stopped
 * one change nothing).
 *
 * @module
 */

import { basename, dirname, isAbsolute, join } from "node:path";
import {
  type Connection,
  type Domain as LibvirtDomain,
  type DomainEvent,
  errorText,
  LIBVIRT_ERROR_CODES,
  LibvirtError,
  VIR_DOMAIN_AFFECT_LIVE,
  VIR_DOMAIN_DIRTYRATE_MEASURED,
  VIR_DOMAIN_STATS_DIRTYRATE,
  VIR_DOMAIN_XML_MIGRATABLE,
} from "../../ffi/mod.ts";
import {
  type GuestOsInfo,
  isFinalPhase,
  kubeTime,
  type VirtualMachineInstance,
  vmiKey,
  VmiPhase,
} from "../api/mod.ts";
import {
  type Domain,
  type DomainInterfaceStatus,
  domainNameOf,
  type DomainState,
  domainStateFromLibvirt,
  isDomainActive,
  LifeCycle,
  newDomain,
  parseCpuList,
  StateChangeReason,
} from "../domain/mod.ts";
import {
  checkVmiSemantics,
  ConversionError,
  convertVmiToDomainXml,
  cpuTopology,
  domainClusterOptions,
  hotplugDiskXml,
  maxCpuSockets,
  pinnedForTarget,
  type PrepareOptions,
  prepareVolume,
  validateVmi,
  virtioMemDevice,
} from "./converter.ts";
import { hostNumaCellsOfOptions } from "./converter_cpu_tune.ts";
import { placeQemuThreads, QemuLocator, realtimeMask } from "../cpus/mod.ts";
import { type CpuPool, dedicatedCpuCount, pinnedCpusOfDomainXml } from "./cpu_pool.ts";
import { el, renderXml, type XmlElement as RenderedElement } from "./_xml.ts";
import {
  child as xmlChild,
  children as xmlChildren,
  parseXml,
  type XmlElement,
} from "../xml/mod.ts";
import { confineToNamespace } from "./_host_path.ts";
import { letQemuReach, prepareForQemuUser, type QemuUser } from "./qemu_user.ts";
import { domainFromXml, type VmiRef, vmiUidOfDomainXml } from "./_domain_reader.ts";
import { deviceAliases, domainStatsToKubevirt, parseNetDev } from "./domain_stats.ts";
import type { ConnectionKeeper } from "./connection_keeper.ts";
import {
  emptyGuestAgentInfo,
  fsFreezeStatusFromAgent,
  guestAgentInfoFromAgent,
  guestExecPid,
  guestExecStatus,
  guestFilesystemsFromAgent,
  guestInterfacesFromAgent,
  guestOsInfoFromAgent,
  guestUsersFromAgent,
} from "./guest_agent.ts";
import { getLogger } from "../log/mod.ts";
import { type AccessCredentialResult, AccessCredentials } from "./access_credentials.ts";
import { IncomingMigration } from "./migration_target.ts";
import { kvmUsable } from "../host/mod.ts";
import {
  DEFAULT_MIGRATION_SOCKET_DIR,
  migrationDataGiB,
  parseMigrationOptions,
  SourceMigration,
} from "./migration_source.ts";
import {
  type GuestNetworkEnv,
  podNetworkPlan,
  type PreparedInterface,
  prepareGuestNetwork,
} from "../network/mod.ts";

export type { VmiRef };
// The manager's domain XML reader, reachable for unit tests; the folder's face leaves it out.
export { domainFromXml, DomainXmlReadError, parseXml } from "./_domain_reader.ts";

const log = getLogger("launcher", "domain-manager");
/** How long a dirty-rate measurement serves (KubeVirt's launcher caches it as long). */
const DIRTY_RATE_CACHE_MS = 3_000;

/** What `#find` says of a domain that is this VMI's. */
const OURS = Symbol("this VMI's domain");
/** Whose a domain of our name is: {@linkcode OURS}, another VMI's UID, or no VMI's. */
type Holder = typeof OURS | string | undefined;

/** A cmd failed; the message is what the handler shows the user. */
export class LauncherCommandError extends Error {
  /** The failed action, e.g. `sync`. */
  readonly action: string;
  /** `namespace/name` of the VMI. */
  readonly vmiKey: string;
  /** Creates `Cannot <action> VMI "<key>": <detail>`. */
  constructor(action: string, vmiKey: string, detail: string, options?: ErrorOptions) {
    super(`Cannot ${action} VMI "${vmiKey}": ${detail}`, options);
    this.name = "LauncherCommandError";
    this.action = action;
    this.vmiKey = vmiKey;
  }
}

/**
 * A domain of the VMI's name is not the VMI's: another VMI's (its KubeVirt metadata names
 * another UID) or no KubeVirt domain at all. The launcher never defines, starts or stops
 * it; the handler removes another VMI's once that VMI is gone.
 */
export class DomainNameTakenError extends Error {
  /** The domain's name, `<namespace>_<name>`. */
  readonly domainName: string;
  /** The UID in the holder's KubeVirt metadata; undefined when it is no KubeVirt domain. */
  readonly holderUid: string | undefined;
  /** Creates the error for the domain `domainName`, held by `holderUid`'s VMI (or no VMI). */
  constructor(domainName: string, holderUid: string | undefined) {
    super(
      holderUid === undefined
        ? `the domain "${domainName}" is not a KubeVirt domain (its metadata names no VMI UID); ` +
          "remove or rename it to let this VMI start"
        : `the domain "${domainName}" belongs to VMI UID "${holderUid}", not this VMI; ` +
          "it is removed once that VMI is gone",
    );
    this.name = "DomainNameTakenError";
    this.domainName = domainName;
    this.holderUid = holderUid;
  }
}

/** How the converter runs for this VMI (see `PrepareOptions` of the converter). */
export interface ConverterSettings extends PrepareOptions {
  /** The VMI's private run directory (serial console and VNC sockets). */
  runDir: string;
  /** `kvm` or `qemu`; detected from `/dev/kvm` unless told. */
  domainType?: "kvm" | "qemu";
  /**
   * The pod network the guest's interfaces join (its namespace, DHCP servers); the private
   * directory with the handler's DHCP facts is `runDir` unless told. Without it a VMI with
   * a pod-network interface is refused.
   */
  network?: Omit<GuestNetworkEnv, "privateDir"> & { privateDir?: string };
  /** The user QEMU runs as, when not root: the VMI's folders are prepared for it. */
  qemuUser?: QemuUser;
  /**
   * Where a VMI with `dedicatedCpuPlacement` gets its host CPUs (the launcher host's pool,
   * shared by its launchers); none: such a VMI is refused.
   */
  cpuPool?: CpuPool;
}

/** Options of {@linkcode DomainManager}. */
export interface DomainManagerOptions {
  /** The launcher's VMI. */
  vmi: VmiRef;
  /** The libvirt connection. */
  connection: Connection;
  /** Converter settings. */
  converter: ConverterSettings;
  /**
   * Reconnects a lost connection; a command that failed because of the loss waits for
   * the reconnect (up to {@linkcode RECONNECT_WAIT_MS}) and runs once more.
   */
  keeper?: ConnectionKeeper;
  /**
   * Where the handler's migration proxy sockets are, as this launcher's libvirt sees
   * them (`<dir>/migrationproxy/`); KubeVirt's `/var/run/kubevirt` unless told.
   */
  migrationSocketDir?: string;
}

/**
 * How long a command waits for a lost libvirt connection to come back: below the
 * handler's 10 s timeout of short calls, above a libvirtd restart (1 to 3 s).
 */
export const RECONNECT_WAIT_MS = 8_000;

/**
 * How long one guest agent command may take. Short: libvirt fails at once when no agent is
 * connected, so only a connected but hung agent waits this long, and meanwhile it holds a
 * libvirt call worker (the launcher has one) that GetDomain and the event forwarder share.
 */
export const GUEST_AGENT_TIMEOUT_SECONDS = 2;

/**
 * How long an agent command of the access credentials may take: setting a password runs
 * a program in the guest.
 */
export const CREDENTIAL_AGENT_TIMEOUT_SECONDS = 10;

/** The most of a guest command's standard output an Exec answer carries, in bytes. */
export const GUEST_EXEC_OUTPUT_LIMIT = 64 * 1024;

function detail(error: unknown): string {
  if (error instanceof ConversionError) {
    // The converter's message repeats the VMI; keep its detail only.
    return error.message.replace(/^Cannot convert VMI "[^"]*": /, "");
  }
  return errorText(error);
}

function isNoDomain(error: unknown): boolean {
  return error instanceof LibvirtError && error.code === LIBVIRT_ERROR_CODES.VIR_ERR_NO_DOMAIN;
}

function isUnsupportedFlags(error: unknown): boolean {
  return error instanceof LibvirtError && error.code === LIBVIRT_ERROR_CODES.VIR_ERR_INVALID_ARG;
}

/** Reads the VMI JSON of a request; throws a plain Error with the reason. */
export function parseVmiJson(bytes: Uint8Array | string | undefined | null): unknown {
  const text = typeof bytes === "string" ? bytes : new TextDecoder().decode(bytes ?? undefined);
  if (text.trim() === "") throw new Error("the request carries no VMI JSON");
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new Error(`malformed VMI JSON: ${detail(error)}`, { cause: error });
  }
}

/** The domain manager of one VMI. */
export class DomainManager {
  /** The VMI served. */
  readonly vmi: VmiRef;
  /** libvirt domain name, `<namespace>_<name>`. */
  readonly domainName: string;
  readonly #conn: Connection;
  readonly #converter: ConverterSettings;
  readonly #keeper: ConnectionKeeper | undefined;
  #lock: Promise<unknown> = Promise.resolve();
  #stopRequested = false;
  /** The VMI's pod interfaces and their taps in the pod, as the last sync planned them. */
  #netPlans: { name: string; tap: string }[] = [];
  /** The thaw that follows a freeze nobody undid in time. */
  #safetyThaw: ReturnType<typeof setTimeout> | undefined;
  /**
   * What the guest agent last told: the guest OS and whether its filesystems are frozen,
   * carried in the domain's status (the handler's `status.guestOSInfo` and
   * `status.fsFreezeStatus` follow it), as KubeVirt's launcher carries its agent poller's.
   */
  #agentInfo: {
    osInfo?: GuestOsInfo;
    fsFreezeStatus?: string;
    interfaces?: DomainInterfaceStatus[];
  } = {};
  /** The VMI's access credentials in its guest, once the handler handed any over. */
  #credentials: AccessCredentials | undefined;
  /** Their last result, carried in the domain's metadata as KubeVirt's launcher carries it. */
  #accessCredential: AccessCredentialResult | undefined;
  /** The last memory dump, carried in the domain's metadata as KubeVirt's launcher carries it. */
  #memoryDump: NonNullable<Domain["spec"]["metadata"]["kubevirt"]["memoryDump"]> | undefined;
  /** A memory dump is being written (one at a time, as in KubeVirt's launcher). */
  #dumping = false;
  /** Hears of a change of what the launcher adds to the domain (the instance re-sends it). */
  #onChange: () => void = () => {};
  /** The live migration from here, once one was asked for. */
  #migration: SourceMigration | undefined;
  /** The last dirty-rate measurement (MB/s), while it is fresh. */
  #dirtyRate: { at: number; value: Promise<number> } | undefined;
  /** The live migration to here, once this launcher was readied as its target. */
  #incoming: IncomingMigration | undefined;
  /** The guest's clock was set after a migration (or is being set): once per launcher. */
  #guestTimeSynced = false;
  readonly #migrationSocketDir: string;
  /** The libvirt UUID of the domain found to be this VMI's (see `#find`). */
  #ownUuid: string | undefined;
  /** The domain's QEMU, found once while it lives (for a dedicated-CPU VMI's threads). */
  readonly #qemu = new QemuLocator();
  /** The libvirt UUIDs of domains of our name found to be another's. */
  readonly #foreignUuids = new Set<string>();

  /** Creates the manager; no libvirt call happens yet. */
  constructor(options: DomainManagerOptions) {
    this.vmi = options.vmi;
    this.domainName = domainNameOf(options.vmi.namespace, options.vmi.name);
    this.#conn = options.connection;
    this.#converter = options.converter;
    this.#keeper = options.keeper;
    this.#migrationSocketDir = options.migrationSocketDir ?? DEFAULT_MIGRATION_SOCKET_DIR;
  }

  /**
   * Sets who hears that what the launcher adds to the domain changed (the guest agent's
   * findings, a migration's progress): the domain is then sent again.
   */
  set onChange(listener: () => void) {
    this.#onChange = listener;
  }

  /**
   * Asks the guest agent for the guest OS with its interfaces, and the filesystems' freeze
   * state (`all`: on the agent connecting or a launcher taking a running domain back), or
   * one of them (the poller's rounds: `os` asks what KubeVirt's launcher asks at its
   * `--qemu-agent-sys-interval`, the OS and the interfaces); returns whether what it knew
   * changed. No agent, or one that does not answer, changes nothing.
   */
  async refreshAgentInfo(which: "all" | "os" | "freeze" = "all"): Promise<boolean> {
    const domain = await this.#agentDomain();
    if (!domain) return false;
    const osInfo = which === "freeze"
      ? {}
      : guestOsInfoFromAgent(await this.#askAgent(domain, "guest-get-osinfo"));
    const interfaces = which === "freeze"
      ? undefined
      : guestInterfacesFromAgent(await this.#askAgent(domain, "guest-network-get-interfaces"));
    const freeze = which === "os"
      ? undefined
      : fsFreezeStatusFromAgent(await this.#askAgent(domain, "guest-fsfreeze-status"));
    const next = {
      osInfo: osInfo.name ? osInfo : this.#agentInfo.osInfo,
      fsFreezeStatus: freeze ?? this.#agentInfo.fsFreezeStatus,
      interfaces: interfaces ?? this.#agentInfo.interfaces,
    };
    const changed = JSON.stringify(next) !== JSON.stringify(this.#agentInfo);
    this.#agentInfo = next;
    return changed;
  }

  /**
   * Takes the VMI's `spec.accessCredentials` (`raw`) and the text of the Secrets they name,
   * from the handler (pod-less mode); they go into the guest through its agent (see
   * `access_credentials.ts`), and the result into the domain's metadata.
   */
  setAccessCredentials(
    raw: unknown,
    secrets: Readonly<Record<string, Record<string, string>>>,
  ): void {
    this.#credentials ??= new AccessCredentials({
      vmi: { ...this.vmi },
      agent: async (command) => {
        const domain = await this.lookup();
        if (!domain) throw new Error(`domain "${this.domainName}" not found`);
        return await domain.agentCommand(
          JSON.stringify(command),
          CREDENTIAL_AGENT_TIMEOUT_SECONDS,
        );
      },
      // As KubeVirt's launcher runs the programs of its fallback: 10 s each.
      exec: (command, args) => this.guestExec("", command, args, 10),
      report: (result) => {
        const before = this.#accessCredential;
        this.#accessCredential = result;
        if (before?.succeeded !== result.succeeded || before?.message !== result.message) {
          this.#onChange();
        }
      },
    });
    this.#credentials.update(raw, secrets);
  }

  /** Stops applying access credentials (the launcher ends). */
  async stopAccessCredentials(): Promise<void> {
    await this.#credentials?.close();
  }

  /** Whether the guest agent told the guest's OS (since this launcher took the domain). */
  get agentAnswered(): boolean {
    return this.#agentInfo.osInfo !== undefined;
  }

  #setFreezeStatus(status: string): void {
    if (this.#agentInfo.fsFreezeStatus === status) return;
    this.#agentInfo = { ...this.#agentInfo, fsFreezeStatus: status };
    this.#onChange();
  }

  /** `namespace/name`. */
  get vmiKey(): string {
    return vmiKey(this.vmi);
  }

  /** Whether the last lifecycle command asked the domain to stop (Shutdown, Kill, Delete). */
  get stopRequested(): boolean {
    return this.#stopRequested;
  }

  /** Marks a stop as requested by the launcher itself (SIGTERM handling). */
  requestStop(): void {
    this.#stopRequested = true;
  }

  /**
   * Runs `fn`; when it fails because the libvirt connection was lost, waits for the
   * reconnect and runs it once more (`retry`; commands that are not idempotent do not).
   */
  async #reconnecting<T>(action: string, fn: () => Promise<T>, retry = true): Promise<T> {
    try {
      return await fn();
    } catch (error) {
      if (!this.#keeper || !(await this.#keeper.failedByConnection(error))) throw error;
      if (!retry) {
        throw new LauncherCommandError(
          action,
          this.vmiKey,
          `the libvirt connection was lost during the call, reconnecting: ${detail(error)}`,
          { cause: error },
        );
      }
      if (!(await this.#keeper.whenConnected(RECONNECT_WAIT_MS))) {
        throw new LauncherCommandError(
          action,
          this.vmiKey,
          `the libvirt connection is lost and not back after ${RECONNECT_WAIT_MS} ms: ${
            detail(error)
          }`,
          { cause: error },
        );
      }
      log.info("Retrying after reconnecting to libvirt", { ...this.vmi, action });
      return await fn();
    }
  }

  #run<T>(action: string, fn: () => Promise<T>, retry = true): Promise<T> {
    const result = this.#lock.then(async () => {
      try {
        return await this.#reconnecting(action, fn, retry);
      } catch (error) {
        if (error instanceof LauncherCommandError) throw error;
        throw new LauncherCommandError(action, this.vmiKey, detail(error), { cause: error });
      }
    });
    // The caller gets the error through result; the lock only orders the commands.
    this.#lock = result.catch(() => {});
    return result;
  }

  /**
   * The VMI's domain, or `undefined` when libvirt has none of the VMI by our name. In
   * pod-less mode every VMI's domain lives in the host's libvirtd, where a domain of our
   * name may be another's (an earlier run's, or no KubeVirt domain): that one is never
   * returned, so no command of this launcher touches it.
   */
  async lookup(): Promise<LibvirtDomain | undefined> {
    const found = await this.#find();
    return found && found.holderUid === OURS ? found.domain : undefined;
  }

  /**
   * The domain of our name and whose it is: {@linkcode OURS} when its KubeVirt metadata
   * names this VMI's UID (or this launcher knows no UID), else the UID it names, or
   * undefined for no KubeVirt domain. A domain once found ours is known by its libvirt
   * UUID, which a definition of another domain of this name does not keep.
   */
  async #find(): Promise<{ domain: LibvirtDomain; holderUid: Holder } | undefined> {
    let domain: LibvirtDomain;
    try {
      domain = await this.#conn.lookupByName(this.domainName);
    } catch (error) {
      if (isNoDomain(error)) return undefined;
      throw error;
    }
    if (domain.uuid === this.#ownUuid || this.vmi.uid === undefined) {
      return { domain, holderUid: OURS };
    }
    let holderUid: Holder;
    try {
      holderUid = vmiUidOfDomainXml(await domain.getXMLDesc());
    } catch (error) {
      if (isNoDomain(error)) return undefined;
      throw error;
    }
    if (holderUid !== this.vmi.uid) {
      this.#foreignUuids.add(domain.uuid);
      return { domain, holderUid };
    }
    this.#ownUuid = domain.uuid;
    return { domain, holderUid: OURS };
  }

  /**
   * Whether the libvirt domain of `uuid` was found to be another's (see
   * {@linkcode DomainManager.lookup}): its events say nothing of this VMI's domain.
   */
  isForeignDomain(uuid: string): boolean {
    return this.#foreignUuids.has(uuid);
  }

  /** Checks that a request's VMI is this launcher's; returns the parsed value. */
  #checkVmi(action: string, vmiJson: Uint8Array | string | null | undefined): unknown {
    let vmi: unknown;
    try {
      vmi = parseVmiJson(vmiJson);
    } catch (error) {
      throw new LauncherCommandError(action, this.vmiKey, detail(error), { cause: error });
    }
    const meta = (vmi as { metadata?: { namespace?: unknown; name?: unknown; uid?: unknown } })
      ?.metadata;
    if (typeof vmi !== "object" || vmi === null || Array.isArray(vmi) || !meta) {
      throw new LauncherCommandError(action, this.vmiKey, "the VMI JSON has no metadata");
    }
    const namespace = meta.namespace ?? "default";
    if (meta.name !== this.vmi.name || namespace !== this.vmi.namespace) {
      throw new LauncherCommandError(
        action,
        this.vmiKey,
        `the request is for VMI "${String(namespace)}/${String(meta.name)}"`,
      );
    }
    if (this.vmi.uid && meta.uid !== undefined && meta.uid !== this.vmi.uid) {
      throw new LauncherCommandError(
        action,
        this.vmiKey,
        `the request is for UID "${String(meta.uid)}", this launcher serves "${this.vmi.uid}"`,
      );
    }
    return vmi;
  }

  /**
   * Defines and starts the domain of `vmiJson`, or leaves an existing active domain as it
   * is. A stopped domain is started only for a VMI that has not run yet (as KubeVirt's
   * launcher does): once a VMI was Running, a domain that went down (QEMU crashed or was
   * killed) stays down, and its VMI fails when this launcher exits.
   */
  syncVmi(
    vmiJson: Uint8Array | string | null | undefined,
    options?: Record<string, unknown> | null,
  ): Promise<void> {
    return this.#run("sync", async () => {
      const raw = this.#checkVmi("sync", vmiJson);
      // Pure checks first, so a bad spec is reported even when the domain runs.
      const vmi: VirtualMachineInstance = validateVmi(raw);
      checkVmiSemantics(vmi);
      const found = await this.#find();
      if (found && found.holderUid !== OURS) {
        // Another VMI's domain goes to the handler as that VMI's, which removes it once
        // that VMI is gone (as an older VMI's domain); the next sync then defines ours.
        if (found.holderUid !== undefined) this.#onChange();
        throw new DomainNameTakenError(this.domainName, found.holderUid);
      }
      const existing = found?.domain;
      if (existing) {
        const info = await existing.getState();
        const state = domainStateFromLibvirt(info.state, info.reason);
        if (isDomainActive(state.status)) {
          await this.#syncHotplugDisks(existing, vmi, state);
          await this.#placeThreads(existing, vmi);
          return;
        }
        if (isFinalPhase(vmi.status?.phase) || vmi.status?.phase === VmiPhase.Running) return;
      }
      const xml = await this.#prepareEnvironment(raw, vmi, options);
      let domain: LibvirtDomain;
      try {
        domain = await this.#conn.defineXML(xml);
        this.#ownUuid = domain.uuid;
        this.#stopRequested = false;
        await domain.start();
      } catch (error) {
        // No domain runs with them: another VMI may have the CPUs.
        this.releaseCpus();
        throw error;
      }
      await this.#placeThreads(domain, vmi);
      log.info("Domain started", { ...this.vmi, domain: this.domainName });
    });
  }

  /**
   * The host CPUs of a VMI with `dedicatedCpuPlacement`, taken from the pool (the same ones
   * again for the same VMI); undefined for other VMIs, or without a pool (the converter
   * then refuses the VMI). Throws {@linkcode DedicatedCpusError} when too few are free.
   */
  #claimCpus(vmi: VirtualMachineInstance): number[] | undefined {
    const count = dedicatedCpuCount(vmi);
    const pool = this.#converter.cpuPool;
    if (count === undefined || !pool) return undefined;
    return pool.claim(this.vmi.uid ?? this.vmiKey, count);
  }

  /**
   * A dedicated-CPU VMI's QEMU threads placed as virt-handler places them after the start
   * (mod/cpus): what is no vCPU on the emulator's CPUs with
   * `isolateEmulatorThread`, the KVM PIT thread beside vCPU 0. Runs on every sync of such a
   * running domain (it is idempotent), so a failure is tried again.
   */
  async #placeThreads(domain: LibvirtDomain, vmi: VirtualMachineInstance): Promise<void> {
    const cpu = vmi.spec.domain.cpu;
    if (cpu?.dedicatedCpuPlacement !== true) return;
    const emulator = /<emulatorpin\b[^>]*\bcpuset=['"]([^'"]+)['"]/.exec(await domain.getXMLDesc());
    const qemu = this.#qemu.locate(this.domainName, this.domainName);
    if (!qemu) {
      throw new LauncherCommandError("place the threads of", this.vmiKey, "no QEMU process found");
    }
    const placed = placeQemuThreads(qemu.pid, {
      housekeeping: cpu.isolateEmulatorThread === true && emulator
        ? parseCpuList(emulator[1])
        : undefined,
      realtime: cpu.realtime !== undefined,
      // libvirt's <vcpusched> covers the vCPUs the domain started with; plugged ones too.
      fifo: cpu.realtime !== undefined ? realtimeMask(cpu.realtime.mask) : undefined,
      pit: qemu.fresh,
    });
    if (placed.moved.length > 0 || placed.pit !== undefined) {
      log.info("QEMU threads placed", { ...this.vmi, housekeeping: placed.moved, pit: placed.pit });
    }
  }

  /** Gives the VMI's dedicated CPUs back to the pool (its domain is gone or never started). */
  releaseCpus(): void {
    this.#converter.cpuPool?.release(this.vmi.uid ?? this.vmiKey);
  }

  /**
   * Takes back the CPUs the VMI's running domain pins (a launcher host adopting it after a
   * restart), so that no other VMI is given them.
   */
  async holdPinnedCpus(): Promise<void> {
    const pool = this.#converter.cpuPool;
    const domain = pool && await this.lookup();
    if (!domain) return;
    pool.hold(this.vmi.uid ?? this.vmiKey, pinnedCpusOfDomainXml(await domain.getXMLDesc()));
  }

  /**
   * Makes what the VMI's domain uses here (folders, the guest's network side, its disks)
   * and lets QEMU reach them; returns the domain's XML.
   */
  async #prepareEnvironment(
    raw: unknown,
    vmi: VirtualMachineInstance,
    options: Record<string, unknown> | null | undefined,
  ): Promise<string> {
    // Dedicated CPUs first: a VMI that cannot have them makes nothing on the node.
    const dedicated = this.#claimCpus(vmi);
    await this.#prepareDirs();
    const interfaces = await this.#prepareNetwork(vmi);
    const { xml, volumes, efi } = await convertVmiToDomainXml(raw, {
      ...this.#converter,
      domainType: this.#converter.domainType ?? (kvmUsable() ? "kvm" : "qemu"),
      interfaces,
      cluster: domainClusterOptions(options),
      dedicatedCpus: dedicated,
      hostNumaCells: hostNumaCellsOfOptions(options),
    });
    letQemuReach(this.#converter.qemuUser, [
      ...Object.values(volumes).map((v) => v.path),
      ...(efi ? [efi.nvram] : []),
    ]);
    return xml;
  }

  /**
   * Brings the running domain's hotplugged disks to the VMI, as KubeVirt's launcher does on
   * a sync: each volume the VMI's status marks as hotplugged gets its disk attached when the
   * spec has it and the domain does not, and detached when the spec no longer has it. No
   * other disk of the domain is ever touched.
   */
  async #syncHotplugDisks(
    domain: LibvirtDomain,
    vmi: VirtualMachineInstance,
    state: DomainState,
  ): Promise<void> {
    const hotplugged = (vmi.status?.volumeStatus ?? []).filter((s) => s.hotplugVolume);
    if (hotplugged.length === 0) return;
    const disks = domainFromXml(this.vmi, await domain.getXMLDesc(), state).spec.devices.disks;
    const attached = new Map(disks.map((d) => [d.alias?.name?.replace(/^ua-/, ""), d]));
    const taken = new Set(disks.flatMap((d) => d.target.dev ? [d.target.dev] : []));
    const inSpec = new Set((vmi.spec.volumes ?? []).map((v) => v.name));
    for (const { name } of hotplugged) {
      const disk = attached.get(name);
      if (inSpec.has(name) && !disk) {
        const prepared = await prepareVolume(vmi, name, this.#converter);
        letQemuReach(this.#converter.qemuUser, [prepared.path]);
        const { xml, dev } = hotplugDiskXml(vmi, name, prepared, taken);
        await domain.attachDevice(xml);
        taken.add(dev);
        log.info("Hotplugged disk attached", { ...this.vmi, volume: name, target: dev });
      } else if (!inSpec.has(name) && disk) {
        const source = disk.source.dev !== undefined
          ? { dev: disk.source.dev }
          : { file: disk.source.file };
        await domain.detachDevice(renderXml(el(
          "disk",
          { type: disk.type, device: disk.device },
          el("source", source),
          el("target", { dev: disk.target.dev, bus: disk.target.bus }),
        )));
        log.info("Hotplugged disk detached", {
          ...this.vmi,
          volume: name,
          target: disk.target.dev,
        });
      }
    }
  }

  /** The guest's side of its pod network: DHCP servers, and what its interfaces open. */
  async #prepareNetwork(vmi: VirtualMachineInstance): Promise<Record<string, PreparedInterface>> {
    const plans = podNetworkPlan(vmi);
    this.#netPlans = plans.map((p) => ({ name: p.name, tap: p.tap }));
    if (plans.length === 0) return {};
    const network = this.#converter.network;
    if (!network) {
      throw new Error(
        `interface "${plans[0].name}" needs a pod network, and this launcher has none`,
      );
    }
    return await prepareGuestNetwork(vmi, {
      ...network,
      privateDir: network.privateDir ?? this.#converter.runDir,
    });
  }

  /** Stops the DHCP servers of this VMI's guest. */
  stopNetwork(): void {
    this.#converter.network?.dhcp.stopAll(`${this.vmi.uid}/`);
  }

  async #prepareDirs(): Promise<void> {
    const dirs = [this.#converter.runDir, this.#converter.diskDir];
    for (const dir of dirs) await Deno.mkdir(dir, { recursive: true, mode: 0o750 });
    prepareForQemuUser(this.#converter.qemuUser, {
      writable: [this.#converter.runDir],
      readable: [this.#converter.diskDir],
      files: Object.values(this.#converter.containerDisks ?? {}),
    });
  }

  async #withDomain(
    action: string,
    vmiJson: Uint8Array | string | null | undefined,
    fn: (domain: LibvirtDomain, state: DomainState) => Promise<void>,
    whenMissing: "ok" | "error" = "error",
    retry = true,
  ): Promise<void> {
    return await this.#run(action, async () => {
      if (vmiJson !== undefined) this.#checkVmi(action, vmiJson);
      const domain = await this.lookup();
      if (!domain) {
        if (whenMissing === "ok") return;
        throw new LauncherCommandError(
          action,
          this.vmiKey,
          `domain "${this.domainName}" not found`,
        );
      }
      const info = await domain.getState();
      await fn(domain, domainStateFromLibvirt(info.state, info.reason));
    }, retry);
  }

  /**
   * Plugs or unplugs vCPUs until the guest has the VMI's topology's (sockets × cores ×
   * threads), live and in the definition, as KubeVirt's launcher answers
   * SyncVirtualMachineCPUs; the domain's maximum is `cpu.maxSockets`' (a count past it is
   * refused naming the field).
   */
  syncCpus(vmiJson: Uint8Array | string | null | undefined): Promise<void> {
    const action = "set the vCPUs of";
    return this.#run(action, async () => {
      const vmi = this.#checkVmi(action, vmiJson) as VirtualMachineInstance;
      const topology = cpuTopology(vmi);
      const perSocket = topology.cores * topology.threads;
      const count = topology.sockets * perSocket;
      const max = maxCpuSockets(vmi) * perSocket;
      const domain = await this.lookup();
      if (!domain) {
        throw new LauncherCommandError(
          action,
          this.vmiKey,
          `domain "${this.domainName}" not found`,
        );
      }
      const live = Number(/<vcpu\b[^>]*>(\d+)<\/vcpu>/.exec(await domain.getXMLDesc())?.[1]);
      if (Number.isInteger(live) && count > live) {
        throw new LauncherCommandError(
          action,
          this.vmiKey,
          `spec.domain.cpu: ${count} vCPUs are more than the domain's ${live} (cpu.maxSockets ${
            max / perSocket
          } when it started)`,
        );
      }
      const pinned = await this.#pinPluggedVcpus(domain, vmi, count);
      await domain.setVcpus(count);
      log.info("vCPUs set", { ...this.vmi, vcpus: count, sockets: topology.sockets, pinned });
      await this.#placeThreads(domain, vmi);
    });
  }

  /**
   * A dedicated-CPU VMI's vCPUs below `count` that no `<vcpupin>` pins yet (the ones a plug
   * brings) each get a free CPU of the pool, pinned before they are plugged, so they never
   * run beside another VMI's; the CPUs pinned already stay. Returns the new pins. Throws
   * {@linkcode DedicatedCpusError} when the pool has too few, before anything is plugged.
   */
  async #pinPluggedVcpus(
    domain: LibvirtDomain,
    vmi: VirtualMachineInstance,
    count: number,
  ): Promise<Record<number, number>> {
    const pool = this.#converter.cpuPool;
    if (vmi.spec.domain.cpu?.dedicatedCpuPlacement !== true || !pool) return {};
    const xml = await domain.getXMLDesc();
    const pins = new Set(
      [...xml.matchAll(/<vcpupin\b[^>]*\bvcpu=['"](\d+)['"]/g)].map((m) => Number(m[1])),
    );
    const unpinned = Array.from({ length: count }, (_, i) => i).filter((v) => !pins.has(v));
    const owner = this.vmi.uid ?? this.vmiKey;
    const cpus = pool.grow(owner, unpinned.length);
    const placed: Record<number, number> = {};
    try {
      for (const [i, vcpu] of unpinned.entries()) {
        await domain.pinVcpu(vcpu, [cpus[i]]);
        placed[vcpu] = cpus[i];
      }
    } catch (error) {
      // The pool holds what the domain pins, no more: a retry takes the rest again.
      pool.hold(owner, pinnedCpusOfDomainXml(await domain.getXMLDesc()));
      throw error;
    }
    return placed;
  }

  /**
   * Plugs or unplugs guest memory through the domain's virtio-mem device, as KubeVirt's
   * launcher answers SyncVirtualMachineMemory: the first call attaches the device (live and
   * in the definition; `maxGuest` less the memory at boot in size), later ones change its
   * requested size live. The guest gets what it was asked for as its driver plugs blocks.
   */
  syncMemory(vmiJson: Uint8Array | string | null | undefined): Promise<void> {
    const action = "set the memory of";
    return this.#run(action, async () => {
      const vmi = this.#checkVmi(action, vmiJson) as VirtualMachineInstance;
      const device = virtioMemDevice(vmi);
      const domain = await this.lookup();
      if (!domain) {
        throw new LauncherCommandError(
          action,
          this.vmiKey,
          `domain "${this.domainName}" not found`,
        );
      }
      const present = /<memory model=['"]virtio-mem['"][\s\S]*?<\/memory>/.exec(
        await domain.getXMLDesc(),
      )?.[0];
      if (present) {
        // The device as libvirt has it (its alias and address find it), asked for more or
        // less; its current size is libvirt's to report, not to be set.
        const asked = present
          .replace(/<current\b[^>]*>[^<]*<\/current>\s*/, "")
          .replace(
            /<requested\b[^>]*>[^<]*<\/requested>/,
            `<requested unit='b'>${device.requested}</requested>`,
          );
        await domain.updateDevice(asked, VIR_DOMAIN_AFFECT_LIVE);
      } else {
        await domain.attachDevice(device.xml);
      }
      log.info("Guest memory requested", {
        ...this.vmi,
        requestedBytes: device.requested,
        pluggableBytes: device.size,
      });
    });
  }

  /** Pauses a running domain; a paused one stays paused. */
  pause(vmiJson?: Uint8Array | string | null): Promise<void> {
    return this.#withDomain("pause", vmiJson, async (domain, state) => {
      if (state.status === LifeCycle.Paused) return;
      await domain.suspend();
    });
  }

  /** Resumes a paused domain; a running one stays running. */
  unpause(vmiJson?: Uint8Array | string | null): Promise<void> {
    return this.#withDomain("unpause", vmiJson, async (domain, state) => {
      if (state.status !== LifeCycle.Paused) return;
      await domain.resume();
    });
  }

  /** Presses the ACPI power button of an active domain (no-op when it is down). */
  shutdown(vmiJson?: Uint8Array | string | null): Promise<void> {
    return this.#withDomain("shut down", vmiJson, async (domain, state) => {
      if (!isDomainActive(state.status)) return;
      this.#stopRequested = true;
      try {
        await domain.shutdown({ acpi: true });
      } catch (error) {
        // Drivers without the ACPI flag (the test driver) choose their own method.
        if (!isUnsupportedFlags(error)) throw error;
        await domain.shutdown();
      }
    }, "ok");
  }

  /** Stops an active domain at once (`virDomainDestroy`); no-op when it is down. */
  kill(vmiJson?: Uint8Array | string | null): Promise<void> {
    return this.#withDomain("kill", vmiJson, async (domain, state) => {
      if (!isDomainActive(state.status)) return;
      this.#stopRequested = true;
      await domain.destroy();
    }, "ok");
  }

  /** Destroys the domain if it is active and removes its definition; no-op when gone. */
  deleteDomain(vmiJson?: Uint8Array | string | null): Promise<void> {
    return this.#withDomain("delete", vmiJson, async (domain, state) => {
      this.#stopRequested = true;
      if (isDomainActive(state.status)) await domain.destroy();
      try {
        await domain.undefine({ nvram: true });
      } catch (error) {
        if (!isUnsupportedFlags(error)) throw error;
        await domain.undefine();
      }
    }, "ok");
  }

  /** Asks the guest to reboot. */
  softReboot(vmiJson?: Uint8Array | string | null): Promise<void> {
    return this.#withDomain(
      "soft reboot",
      vmiJson,
      async (domain, state) => {
        if (state.status !== LifeCycle.Running) {
          throw new Error(`domain is ${state.status}, not Running`);
        }
        await domain.reboot();
      },
      "error",
      false,
    );
  }

  /** Resets the domain like a reset button. */
  reset(vmiJson?: Uint8Array | string | null): Promise<void> {
    return this.#withDomain(
      "reset",
      vmiJson,
      async (domain, state) => {
        if (!isDomainActive(state.status)) {
          throw new Error(`domain is ${state.status}, not active`);
        }
        await domain.reset();
      },
      "error",
      false,
    );
  }

  /**
   * Freezes the guest's filesystems through its agent, as KubeVirt's launcher does before a
   * snapshot: already frozen is done; otherwise `virDomainFSFreeze`, and unless
   * `unfreezeTimeoutSeconds` is 0 a thaw of its own after that long, in case no unfreeze
   * ever comes (a later freeze or unfreeze replaces it).
   */
  freeze(
    vmiJson: Uint8Array | string | null | undefined,
    unfreezeTimeoutSeconds: number,
  ): Promise<void> {
    return this.#withDomain(
      "freeze",
      vmiJson,
      async (domain, state) => {
        if (state.status !== LifeCycle.Running) {
          throw new Error(`domain is ${state.status}, not Running`);
        }
        if (await this.#fsFreezeStatus(domain) === "frozen") return this.#setFreezeStatus("frozen");
        await domain.fsFreeze();
        // What the agent says now: a guest with nothing it can freeze stays thawed.
        this.#setFreezeStatus(await this.#fsFreezeStatus(domain) ?? "frozen");
        this.#cancelSafetyThaw();
        if (unfreezeTimeoutSeconds > 0) {
          const timer = setTimeout(() => {
            this.#safetyThaw = undefined;
            log.warn("No unfreeze came in time: thawing the guest's filesystems", {
              ...this.vmi,
              unfreezeTimeoutSeconds,
            });
            this.unfreeze(undefined).catch((error) =>
              log.error("Cannot thaw the guest's filesystems", {
                ...this.vmi,
                error: detail(error),
              })
            );
          }, unfreezeTimeoutSeconds * 1000);
          Deno.unrefTimer(timer);
          this.#safetyThaw = timer;
        }
      },
      "error",
      false,
    );
  }

  /**
   * Dumps the guest's memory to `dumpPath` (raw, memory only: an ELF core), in the
   * background, as KubeVirt's launcher answers VirtualMachineMemoryDump: resolves once the
   * dump has started; the domain's `MemoryDump` metadata tells its file, start, end and how it
   * ended. A dump asked for while one is written, or of the file already dumped, changes
   * nothing. The dumps before it in the same folder (files named `*memory.dump*`) are removed
   * first. The file must be in the VMI's namespace's folder of the host disk root (where
   * pod-less claims are), links resolved: libvirt writes it as root.
   */
  async memoryDump(
    vmiJson: Uint8Array | string | null | undefined,
    requestedPath: string,
  ): Promise<void> {
    const action = "dump the memory of";
    this.#checkVmi(action, vmiJson);
    const refuse = (why: string, cause?: unknown) =>
      new LauncherCommandError(action, this.vmiKey, why, { cause });
    const root = this.#converter.hostDiskRoot;
    if (!root) throw refuse("this launcher has no host disk root to dump memory into");
    if (!isAbsolute(requestedPath)) {
      throw refuse(`the dump path "${requestedPath}" is not absolute`);
    }
    let dumpPath: string;
    try {
      dumpPath = await confineToNamespace(root, this.vmi.namespace, requestedPath);
    } catch (error) {
      throw refuse(`the dump path "${requestedPath}": ${detail(error)}`, error);
    }
    const fileName = basename(dumpPath);
    if (this.#dumping) {
      log.info("A memory dump is in progress", { ...this.vmi, fileName });
      return;
    }
    if (this.#memoryDump?.fileName === fileName) return;
    this.#dumping = true;
    this.#memoryDump = { fileName, startTimestamp: kubeTime() };
    this.#onChange();
    void (async () => {
      let failureReason: string | undefined;
      try {
        const domain = await this.lookup();
        if (!domain) throw new Error(`domain "${this.domainName}" not found`);
        await removePreviousDumps(dirname(dumpPath));
        log.info("Starting memory dump", { ...this.vmi, fileName });
        await domain.coreDump(dumpPath);
        log.info("Completed memory dump", { ...this.vmi, fileName });
      } catch (error) {
        failureReason = `Domain memory dump failed: ${detail(error)}`;
        log.error("Memory dump failed", { ...this.vmi, fileName, error: detail(error) });
      } finally {
        this.#memoryDump = {
          ...this.#memoryDump,
          endTimestamp: kubeTime(),
          completed: true,
          ...(failureReason ? { failed: true, failureReason } : {}),
        };
        this.#dumping = false;
        this.#onChange();
      }
    })();
  }

  /** Thaws the guest's filesystems; thawed already is done. */
  unfreeze(vmiJson: Uint8Array | string | null | undefined): Promise<void> {
    this.#cancelSafetyThaw();
    return this.#withDomain(
      "unfreeze",
      vmiJson,
      async (domain) => {
        if (await this.#fsFreezeStatus(domain) === "thawed") return this.#setFreezeStatus("thawed");
        await domain.fsThaw();
        this.#setFreezeStatus(await this.#fsFreezeStatus(domain) ?? "thawed");
      },
      "error",
      false,
    );
  }

  #cancelSafetyThaw(): void {
    if (this.#safetyThaw !== undefined) clearTimeout(this.#safetyThaw);
    this.#safetyThaw = undefined;
  }

  /** `frozen` or `thawed` as the agent says (`guest-fsfreeze-status`); undefined when it cannot. */
  async #fsFreezeStatus(domain: LibvirtDomain): Promise<string | undefined> {
    return fsFreezeStatusFromAgent(await this.#askAgent(domain, "guest-fsfreeze-status"));
  }

  /**
   * Starts migrating the running domain to the target that the VMI's
   * `status.migrationState` names, through the handler's proxy sockets (see
   * `migration_source.ts`), and returns once it runs; its progress and outcome come with
   * the domain as KubeVirt's migration metadata. A second call for the same migration
   * changes nothing; one for another while one runs is refused.
   */
  migrate(
    vmiJson: Uint8Array | string | null | undefined,
    optionsJson: Uint8Array | string | null | undefined,
  ): Promise<void> {
    return this.#run("migrate", async () => {
      const vmi = this.#checkVmi("migrate", vmiJson) as VirtualMachineInstance;
      let options;
      try {
        options = parseMigrationOptions(optionsJson);
      } catch (error) {
        throw new LauncherCommandError("migrate", this.vmiKey, detail(error));
      }
      const migrationUid = vmi.status?.migrationState?.migrationUid;
      if (!migrationUid) {
        throw new LauncherCommandError(
          "migrate",
          this.vmiKey,
          "the VMI's status.migrationState names no migrationUid",
        );
      }
      const current = this.#migration;
      if (current && current.metadata.uid === migrationUid) return;
      if (current && !current.over) {
        throw new LauncherCommandError(
          "migrate",
          this.vmiKey,
          `migration ${current.metadata.uid} is still running`,
        );
      }
      const domain = await this.lookup();
      if (!domain) {
        throw new LauncherCommandError(
          "migrate",
          this.vmiKey,
          `domain "${this.domainName}" not found`,
        );
      }
      const info = await domain.getState();
      const state = domainStateFromLibvirt(info.state, info.reason);
      if (state.status !== LifeCycle.Running && state.status !== LifeCycle.Paused) {
        throw new LauncherCommandError(
          "migrate",
          this.vmiKey,
          `domain is ${state.status}, not Running`,
        );
      }
      const destinationXml = await this.#pinnedForTarget(domain, vmi);
      log.info("Starting live migration", { ...this.vmi, migration: migrationUid });
      this.#migration = new SourceMigration(domain, {
        vmiUid: vmi.metadata.uid ?? this.vmi.uid ?? "",
        migrationUid,
        options,
        dataGiB: migrationDataGiB(vmi),
        socketDir: this.#migrationSocketDir,
        destinationXml,
        onChange: () => this.#onChange(),
      });
      this.#onChange();
    }, false);
  }

  /**
   * A dedicated-CPU VMI's domain as the target is to define it, pinned to the CPUs the
   * target reported (`status.migrationState.targetCPUSet`, over `targetNodeTopology`), as
   * KubeVirt's source launcher sends it; undefined for other VMIs (the domain goes as it is).
   */
  async #pinnedForTarget(
    domain: LibvirtDomain,
    vmi: VirtualMachineInstance,
  ): Promise<string | undefined> {
    if (vmi.spec.domain.cpu?.dedicatedCpuPlacement !== true) return undefined;
    const state = vmi.status?.migrationState;
    if (!state?.targetCPUSet?.length) {
      throw new LauncherCommandError(
        "migrate",
        this.vmiKey,
        "the VMI has dedicated CPUs and its target reported none " +
          "(status.migrationState.targetCPUSet)",
      );
    }
    let cells: ReturnType<typeof hostNumaCellsOfOptions> = [];
    try {
      cells = state.targetNodeTopology
        ? hostNumaCellsOfOptions({ topology: JSON.parse(state.targetNodeTopology) })
        : [];
    } catch (error) {
      throw new LauncherCommandError(
        "migrate",
        this.vmiKey,
        `status.migrationState.targetNodeTopology is not JSON: ${detail(error)}`,
      );
    }
    const xml = await domain.getXMLDesc(VIR_DOMAIN_XML_MIGRATABLE);
    try {
      return pinnedForTarget(
        vmi,
        xml,
        this.#converter.domainType ?? (kvmUsable() ? "kvm" : "qemu"),
        state.targetCPUSet,
        cells,
      );
    } catch (error) {
      throw new LauncherCommandError("migrate", this.vmiKey, detail(error));
    }
  }

  /**
   * Readies this launcher as a migration's target (`SyncMigrationTarget`), as KubeVirt's
   * launcher prepares its pod: the VMI must convert, and everything its domain will use
   * here is made as a start would make it (folders, the guest's network side, disks:
   * containerDisks, empty disks, cloud-init ISOs), but nothing is defined or started, since
   * the domain comes with the migration. The folder of the migration's sockets is made for
   * QEMU. A domain already active here (the migration arrived) is left alone; a source that
   * cannot migrate over unix sockets is refused, as virtnode's proxy carries nothing else.
   */
  prepareMigrationTarget(vmiJson: Uint8Array | string | null | undefined): Promise<void> {
    return this.#run("prepare the migration target of", async () => {
      const raw = this.#checkVmi("prepare the migration target of", vmiJson);
      const vmi: VirtualMachineInstance = validateVmi(raw);
      checkVmiSemantics(vmi);
      if (vmi.status?.migrationTransport !== "Unix") {
        throw new LauncherCommandError(
          "prepare the migration target of",
          this.vmiKey,
          `the source migrates over ${
            vmi.status?.migrationTransport ? `"${vmi.status.migrationTransport}"` : "TCP"
          }; virtnode's launcher takes migrations over unix sockets only ` +
            `(status.migrationTransport "Unix")`,
        );
      }
      const existing = await this.lookup();
      if (existing) {
        const info = await existing.getState();
        if (isDomainActive(domainStateFromLibvirt(info.state, info.reason).status)) return;
      }
      // Dedicated CPUs are chosen here, before anything else is made; the handler reports
      // them (targetCPUSet) and the source pins the domain it sends to them. They go back
      // to the pool when this launcher is stopped (a migration that failed or was aborted).
      this.#claimCpus(vmi);
      const migrationUid = vmi.status?.migrationState?.migrationUid ?? "";
      if (this.#incoming?.uid !== migrationUid) {
        this.#incoming = new IncomingMigration(migrationUid, {
          onChange: () => this.#onChange(),
          log: { ...this.vmi },
        });
      }
      await this.#prepareEnvironment(raw, vmi, undefined);
      const sockets = join(this.#migrationSocketDir, "migrationproxy");
      await Deno.mkdir(sockets, { recursive: true, mode: 0o750 });
      prepareForQemuUser(this.#converter.qemuUser, { writable: [sockets], readable: [] });
      log.info("Prepared migration target", {
        ...this.vmi,
        migration: vmi.status?.migrationState?.migrationUid,
      });
    });
  }

  /**
   * Ends a migration on its target (`FinalizeVirtualMachineMigration`), as KubeVirt's
   * launcher does: each interface the options name for `link-refresh` goes down and up
   * again, so that its guest asks DHCP anew on the new node; then the guest's clock is set
   * to the host's through its agent, once per launcher, in the background (every second
   * for up to a minute while the agent does not answer).
   */
  finalizeMigration(
    vmiJson: Uint8Array | string | null | undefined,
    options?: { interfaceMigration?: Record<string, { method?: string } | null> } | null,
  ): Promise<void> {
    return this.#run("finalize the migration of", async () => {
      this.#checkVmi("finalize the migration of", vmiJson);
      const refresh = Object.entries(options?.interfaceMigration ?? {})
        .filter(([, o]) => o?.method === "link-refresh").map(([name]) => name);
      const domain = await this.lookup();
      if (!domain) {
        throw new LauncherCommandError(
          "finalize the migration of",
          this.vmiKey,
          `domain "${this.domainName}" not found`,
        );
      }
      if (refresh.length > 0) await this.#refreshLinks(domain, new Set(refresh));
      this.#syncGuestTime(domain);
    }, false);
  }

  async #refreshLinks(domain: LibvirtDomain, names: ReadonlySet<string>): Promise<void> {
    const devices = xmlChild(parseXml(await domain.getXMLDesc()), "devices");
    for (const iface of xmlChildren(devices, "interface")) {
      const name = xmlChild(iface, "alias")?.attrs.name?.replace(/^ua-/, "");
      if (name === undefined || !names.has(name)) continue;
      const up = renderable(iface);
      const down = {
        ...up,
        children: [
          ...up.children.filter((c) => typeof c === "string" || c.name !== "link"),
          el("link", { state: "down" }),
        ],
      };
      await domain.updateDevice(renderXml(down));
      await new Promise((resolve) => setTimeout(resolve, 100));
      await domain.updateDevice(renderXml(up));
      log.info("Interface link refreshed", { ...this.vmi, interface: name });
    }
  }

  #syncGuestTime(domain: LibvirtDomain): void {
    if (this.#guestTimeSynced) return;
    this.#guestTimeSynced = true;
    const deadline = Date.now() + 60_000;
    let last = "";
    const attempt = async () => {
      try {
        await domain.setTime();
        log.info("Guest time synced", { ...this.vmi });
        return;
      } catch (error) {
        const code = error instanceof LibvirtError ? error.code : undefined;
        if (
          code === LIBVIRT_ERROR_CODES.VIR_ERR_OPERATION_UNSUPPORTED ||
          code === LIBVIRT_ERROR_CODES.VIR_ERR_ARGUMENT_UNSUPPORTED ||
          code === LIBVIRT_ERROR_CODES.VIR_ERR_NO_DOMAIN || code === undefined
        ) {
          log.warn("Cannot sync the guest's time", { ...this.vmi, error: detail(error) });
          return;
        }
        last = detail(error);
      }
      if (Date.now() >= deadline) {
        log.warn("Cannot sync the guest's time", { ...this.vmi, error: last });
        return;
      }
      const timer = setTimeout(attempt, 1_000);
      Deno.unrefTimer(timer);
    };
    void attempt();
  }

  /**
   * This launcher was readied as a migration's target and the migration has not ended here:
   * a domain that goes down meanwhile is the failed migration's, which the handler cleans up.
   */
  get awaitingMigration(): boolean {
    return this.#incoming !== undefined && !this.#incoming.ended;
  }

  /**
   * Hears of a libvirt event of this domain before it is forwarded: a migration to here
   * learns from them when it started and ended.
   */
  noteEvent(event: DomainEvent): void {
    this.#incoming?.noteEvent(event, () => this.lookup());
  }

  /**
   * `SignalTargetPodCleanup`: a failed migration's target is to be cleaned up. As KubeVirt's
   * launcher, this only takes note; the handler (or, for a pod, virt-controller) ends it.
   */
  signalTargetPodCleanup(vmiJson: Uint8Array | string | null | undefined): Promise<void> {
    return this.#run("signal the target cleanup of", () => {
      const vmi = this.#checkVmi("signal the target cleanup of", vmiJson) as VirtualMachineInstance;
      log.info("Signaled to clean up as a failed migration's target", {
        ...this.vmi,
        migration: vmi.status?.migrationState?.migrationUid,
      });
      return Promise.resolve();
    }, false);
  }

  /** Aborts the running migration (`CancelVirtualMachineMigration`); none running: nothing. */
  cancelMigration(vmiJson: Uint8Array | string | null | undefined): Promise<void> {
    return this.#run("cancel the migration of", async () => {
      this.#checkVmi("cancel the migration of", vmiJson);
      await this.#migration?.cancel();
    }, false);
  }

  /** Resolves once the migration started last is over (none: at once). */
  migrationDone(): Promise<void> {
    return this.#migration?.done ?? Promise.resolve();
  }

  /** A picture of the guest's primary screen, as libvirt takes it (QEMU: PPM). */
  screenshot(vmiJson?: Uint8Array | string | null): Promise<{ mime: string; data: Uint8Array }> {
    let shot: { mime: string; data: Uint8Array } | undefined;
    return this.#withDomain(
      "take a screenshot of",
      vmiJson,
      async (domain, state) => {
        if (!isDomainActive(state.status)) {
          throw new Error(`domain is ${state.status}, not active`);
        }
        shot = await domain.screenshot(0);
      },
      "error",
      false,
    ).then(() => shot!);
  }

  /**
   * The domain as KubeVirt's Domain object; `undefined` when it does not exist. A domain
   * that disappears between calls reads as `undefined` too.
   */
  async getDomain(): Promise<Domain | undefined> {
    try {
      return await this.#reconnecting("get domain of", async () => {
        const found = await this.#find();
        // Another VMI's domain is reported as that VMI's (its UID from the XML): the handler
        // then removes it as an older VMI's once that VMI is gone. No KubeVirt domain is
        // reported at all.
        if (!found || found.holderUid === undefined) return undefined;
        const info = await found.domain.getState();
        const domain = domainFromXml(
          this.vmi,
          await found.domain.getXMLDesc(),
          domainStateFromLibvirt(info.state, info.reason),
        );
        if (found.holderUid !== OURS) return domain;
        const { osInfo, fsFreezeStatus, interfaces } = this.#agentInfo;
        if (osInfo) domain.status.osInfo = { ...osInfo };
        if (interfaces) domain.status.interfaces = interfaces.map((i) => ({ ...i }));
        if (fsFreezeStatus) domain.status.fsFreezeStatus = { status: fsFreezeStatus };
        if (this.#memoryDump) domain.spec.metadata.kubevirt.memoryDump = { ...this.#memoryDump };
        if (this.#accessCredential) {
          domain.spec.metadata.kubevirt.accessCredential = { ...this.#accessCredential };
        }
        const migration = this.#migration?.metadata ?? this.#incoming?.metadata;
        if (migration) domain.spec.metadata.kubevirt.migration = migration;
        return domain;
      });
    } catch (error) {
      if (error instanceof LauncherCommandError) throw error;
      if (isNoDomain(error)) return undefined;
      throw new LauncherCommandError("get domain of", this.vmiKey, detail(error), {
        cause: error,
      });
    }
  }

  /** A domain that no longer exists: NoState/NonExistent, for the final notify event. */
  nonExistentDomain(): Domain {
    const domain = newDomain(this.vmi, {
      status: LifeCycle.NoState,
      reason: StateChangeReason.NonExistent,
    });
    domain.metadata.deletionTimestamp = new Date().toISOString().replace(/\.\d+Z$/, "Z");
    return domain;
  }

  /** The domain's statistics as KubeVirt's DomainStats JSON; `undefined` without a domain. */
  async getDomainStats(): Promise<Record<string, unknown> | undefined> {
    try {
      // This domain's statistics alone: a scrape of every VMI of a launcher host stays
      // linear in its VMIs (all domains' statistics for each VMI would be quadratic).
      const found = await this.#reconnecting("get statistics of", async () => {
        const domain = await this.lookup();
        const stats = domain ? await domain.getStats() : undefined;
        return domain && stats ? { domain, stats } : undefined;
      }).catch((error) => {
        if (isNoDomain(error)) return undefined;
        throw error;
      });
      if (!found) return undefined;
      const { domain, stats: mine } = found;
      // Drives and interfaces go by their VMI names (the `ua-` aliases), as KubeVirt's do.
      const xml = await domain.getXMLDesc().catch(() => "");
      const stats = domainStatsToKubevirt(mine, deviceAliases(xml));
      // A migration from here: its progress, as the monitor last saw it.
      const job = this.#migration?.jobInfo;
      if (job) stats.MigrateDomainJobInfo = job;
      // Which host CPUs each vCPU may run on, as KubeVirt's launcher adds it.
      const cpuMap = await domain.vcpuPinInfo().catch(() => undefined);
      if (cpuMap) Object.assign(stats, { CPUMapSet: true, CPUMap: cpuMap });
      await this.#podNetStats(stats);
      return stats;
    } catch (error) {
      if (error instanceof LauncherCommandError) throw error;
      throw new LauncherCommandError("get statistics of", this.vmiKey, detail(error), {
        cause: error,
      });
    }
  }

  /**
   * The guest's memory dirty rate in MB/s, measured over a second as KubeVirt's launcher
   * measures it (libvirt's page sampling) and kept for 3 seconds, so that scrapes close
   * together measure once. Throws when it cannot be measured (no domain, a migration in
   * progress, a measurement that did not finish).
   */
  getDomainDirtyRateStats(): Promise<number> {
    const now = performance.now();
    const cached = this.#dirtyRate;
    if (cached && now - cached.at < DIRTY_RATE_CACHE_MS) return cached.value;
    const value = this.#measureDirtyRate();
    this.#dirtyRate = { at: now, value };
    // Fresh for 3 s from when the measurement came in; a failed one is not kept.
    value.then(() => {
      if (this.#dirtyRate?.value === value) this.#dirtyRate.at = performance.now();
    }, () => {
      if (this.#dirtyRate?.value === value) this.#dirtyRate = undefined;
    });
    return value;
  }

  async #measureDirtyRate(): Promise<number> {
    const domain = await this.lookup();
    if (!domain) {
      throw new LauncherCommandError("measure the dirty rate of", this.vmiKey, "no domain");
    }
    try {
      await domain.startDirtyRateCalc(1);
      await new Promise((r) => setTimeout(r, 1_000));
      // The measurement ends shortly after its second: asked every 200 ms for a second more.
      for (let tries = 0;; tries++) {
        const stats = await domain.getStats(VIR_DOMAIN_STATS_DIRTYRATE);
        const status = Number(stats?.params["dirtyrate.calc_status"]);
        const rate = stats?.params["dirtyrate.megabytes_per_second"];
        if (status === VIR_DOMAIN_DIRTYRATE_MEASURED && rate !== undefined) return Number(rate);
        if (tries >= 5) throw new Error(`the measurement did not finish (status ${status})`);
        await new Promise((r) => setTimeout(r, 200));
      }
    } catch (error) {
      if (error instanceof LauncherCommandError) throw error;
      throw new LauncherCommandError("measure the dirty rate of", this.vmiKey, detail(error), {
        cause: error,
      });
    }
  }

  /**
   * Pod-less mode: the host's libvirtd cannot count traffic on taps that moved into the
   * VM's pod namespace, so their counters are read there (`/proc/net/dev` as a thread of
   * the namespace sees it), from the guest's side as libvirt gives them (the tap's
   * transmit is the guest's receive).
   */
  async #podNetStats(stats: Record<string, unknown>): Promise<void> {
    const network = this.#converter.network;
    if (!network?.netns || this.#netPlans.length === 0) return;
    // libvirt still names the tap (by its host name) but gives no counters for it.
    const known =
      (Array.isArray(stats.Net) ? stats.Net as { Alias?: string; RxBytesSet?: boolean }[] : [])
        .filter((n) => n.RxBytesSet === true);
    const missing = this.#netPlans.filter((p) => !known.some((n) => n.Alias === p.name));
    if (missing.length === 0) return;
    let dev: string;
    try {
      [dev] = await network.runner.run(network.netns, [{
        op: "readFile",
        path: "/proc/thread-self/net/dev",
      }]) as string[];
    } catch (error) {
      log.debug("Cannot read the pod's interface counters", { ...this.vmi, error: detail(error) });
      return;
    }
    const counters = parseNetDev(dev);
    const added = missing.flatMap((p) => {
      const c = counters.get(p.tap);
      if (!c) return [];
      return [{
        NameSet: true,
        Name: p.tap,
        AliasSet: true,
        Alias: p.name,
        RxBytesSet: true,
        RxBytes: c.txBytes,
        RxPktsSet: true,
        RxPkts: c.txPackets,
        RxErrsSet: true,
        RxErrs: c.txErrors,
        RxDropSet: true,
        RxDrop: c.txDropped,
        TxBytesSet: true,
        TxBytes: c.rxBytes,
        TxPktsSet: true,
        TxPkts: c.rxPackets,
        TxErrsSet: true,
        TxErrs: c.rxErrors,
        TxDropSet: true,
        TxDrop: c.rxDropped,
      }];
    });
    stats.Net = [...known, ...added];
  }

  /** The hypervisor (QEMU) version, `QEMU major.minor.release`. */
  async qemuVersion(): Promise<string> {
    try {
      const v = await this.#reconnecting(
        "get QEMU version for",
        () => this.#conn.getHypervisorVersion(),
      );
      // As KubeVirt's launcher words it (downward metrics' VirtProductInfo shows it).
      return `QEMU ${v.major}.${v.minor}.${v.release}`;
    } catch (error) {
      if (error instanceof LauncherCommandError) throw error;
      throw new LauncherCommandError("get QEMU version for", this.vmiKey, detail(error), {
        cause: error,
      });
    }
  }

  /**
   * The domain whose guest agent is asked, or `undefined` when there is none to ask: no
   * domain, or libvirt cannot tell (the guest queries then answer empty, not fail).
   */
  async #agentDomain(): Promise<LibvirtDomain | undefined> {
    try {
      return await this.lookup();
    } catch (error) {
      log.debug("Cannot look up the domain for the guest agent", {
        ...this.vmi,
        error: detail(error),
      });
      return undefined;
    }
  }

  /** The agent's reply to `command`, or `undefined` when it does not answer in time. */
  async #askAgent(domain: LibvirtDomain, command: string): Promise<string | undefined> {
    try {
      return await domain.agentCommand(
        JSON.stringify({ execute: command }),
        GUEST_AGENT_TIMEOUT_SECONDS,
      );
    } catch (error) {
      log.debug("Guest agent did not answer", { ...this.vmi, command, error: detail(error) });
      return undefined;
    }
  }

  /**
   * What the guest agent reports, in the shape of KubeVirt's
   * `VirtualMachineInstanceGuestAgentInfo` (`GuestAgentInfo` of `guest_agent.ts`); the
   * empty object when no agent answers `guest-info`. Commands an older agent lacks leave
   * their fields out.
   *
   * KubeVirt's launcher answers from what its agent poller cached; this one asks the agent
   * on each call, one command at a time (the REST route is called on a user's request; a
   * poller would keep every guest's agent busy for answers nobody asked for).
   */
  async guestInfo(): Promise<object> {
    const domain = await this.#agentDomain();
    if (!domain) return emptyGuestAgentInfo();
    const info = await this.#askAgent(domain, "guest-info");
    if (info === undefined) return emptyGuestAgentInfo();
    return guestAgentInfoFromAgent({
      info,
      osInfo: await this.#askAgent(domain, "guest-get-osinfo"),
      hostName: await this.#askAgent(domain, "guest-get-host-name"),
      timezone: await this.#askAgent(domain, "guest-get-timezone"),
      users: await this.#askAgent(domain, "guest-get-users"),
      filesystems: await this.#askAgent(domain, "guest-get-fsinfo"),
    });
  }

  /**
   * The domain the probe rpcs name (`domainName`, `<namespace>_<name>`; empty means this
   * launcher's), when it is this launcher's and libvirt has it; throws
   * {@linkcode LauncherCommandError} naming `action` otherwise.
   */
  async #probedDomain(action: string, domainName: string): Promise<LibvirtDomain> {
    if (domainName !== "" && domainName !== this.domainName) {
      throw new LauncherCommandError(
        action,
        this.vmiKey,
        `this launcher serves domain "${this.domainName}", not "${domainName}"`,
      );
    }
    const domain = await this.lookup().catch((error) => {
      throw new LauncherCommandError(action, this.vmiKey, detail(error), { cause: error });
    });
    if (!domain) {
      throw new LauncherCommandError(action, this.vmiKey, `domain "${this.domainName}" not found`);
    }
    return domain;
  }

  /**
   * Pings the guest agent (`guest-ping`), as KubeVirt's launcher answers GuestPing for a
   * probe of the `guestAgentPing` kind: resolves when the agent answered within
   * `timeoutSeconds` (at least 1), throws {@linkcode LauncherCommandError} otherwise.
   */
  async guestPing(domainName: string, timeoutSeconds: number): Promise<void> {
    const action = "ping the guest agent of";
    const domain = await this.#probedDomain(action, domainName);
    try {
      await domain.agentPing(Math.max(1, timeoutSeconds));
    } catch (error) {
      throw new LauncherCommandError(action, this.vmiKey, detail(error), { cause: error });
    }
  }

  /**
   * Runs `command` with `args` in the guest through the agent (`guest-exec`, output
   * captured) and polls `guest-exec-status` every tenth of `timeoutSeconds` until it exits,
   * as KubeVirt's launcher answers Exec for a probe of the `exec` kind. Resolves with its
   * exit code and standard output (the first {@linkcode GUEST_EXEC_OUTPUT_LIMIT} bytes:
   * the guest writes it); throws {@linkcode LauncherCommandError} when the agent cannot
   * start it or it has not exited after `timeoutSeconds` (at least 1).
   */
  async guestExec(
    domainName: string,
    command: string,
    args: readonly string[],
    timeoutSeconds: number,
  ): Promise<{ exitCode: number; stdOut: string }> {
    const action = `run "${command}" in the guest of`;
    const domain = await this.#probedDomain(action, domainName);
    const seconds = Math.max(1, timeoutSeconds);
    const ask = async (request: object): Promise<string> => {
      try {
        return await domain.agentCommand(JSON.stringify(request), seconds);
      } catch (error) {
        throw new LauncherCommandError(action, this.vmiKey, detail(error), { cause: error });
      }
    };
    const started = await ask({
      execute: "guest-exec",
      arguments: { path: command, arg: [...args], "capture-output": true },
    });
    const pid = guestExecPid(started);
    if (pid === undefined) {
      throw new LauncherCommandError(
        action,
        this.vmiKey,
        `the guest agent answered guest-exec without a process id`,
      );
    }
    const deadline = Date.now() + seconds * 1000;
    for (;;) {
      const status = guestExecStatus(
        await ask({ execute: "guest-exec-status", arguments: { pid } }),
        GUEST_EXEC_OUTPUT_LIMIT,
      );
      if (!status) {
        throw new LauncherCommandError(
          action,
          this.vmiKey,
          `the guest agent's answer to guest-exec-status is not one`,
        );
      }
      if (status.exited) return { exitCode: status.exitCode, stdOut: status.stdOut };
      if (Date.now() >= deadline) {
        throw new LauncherCommandError(
          action,
          this.vmiKey,
          `guest process ${pid} has not exited after ${seconds} s`,
        );
      }
      await new Promise((resolve) => setTimeout(resolve, seconds * 100));
    }
  }

  /**
   * The users logged in to the guest (`guest-get-users`) as KubeVirt's
   * `VirtualMachineInstanceGuestOSUser` list (`GuestOSUser` of `guest_agent.ts`); empty
   * when no agent answers. Asked on each call, not cached.
   */
  async guestUsers(): Promise<object[]> {
    const domain = await this.#agentDomain();
    return domain ? guestUsersFromAgent(await this.#askAgent(domain, "guest-get-users")) : [];
  }

  /**
   * The guest's mounted filesystems (`guest-get-fsinfo`) as KubeVirt's
   * `VirtualMachineInstanceFileSystem` list (`GuestFileSystem` of `guest_agent.ts`); empty
   * when no agent answers. Asked on each call, not cached.
   */
  async guestFilesystems(): Promise<object[]> {
    const domain = await this.#agentDomain();
    return domain
      ? guestFilesystemsFromAgent(await this.#askAgent(domain, "guest-get-fsinfo"))
      : [];
  }
}

/** A parsed element as one the serializer writes back: its attributes, text and children. */
function renderable(element: XmlElement): RenderedElement {
  const text = element.text.trim();
  return el(
    element.name,
    { ...element.attrs },
    text ? text : undefined,
    element.children.map(renderable),
  );
}

/** Removes the earlier memory dumps in `dir` (files whose name holds `memory.dump`). */
async function removePreviousDumps(dir: string): Promise<void> {
  try {
    // Read synchronously: Deno 2.9.3 may close a node:net socket's descriptor twice, and a
    // directory's read on another thread must not fall in between (docs/compatibility.md).
    for (const entry of Deno.readDirSync(dir)) {
      if (!entry.name.includes("memory.dump")) continue;
      // A link is removed itself, never what it points at.
      await Deno.remove(join(dir, entry.name)).catch((error) =>
        log.warn("Cannot remove an earlier memory dump", { file: entry.name, error: detail(error) })
      );
    }
  } catch (error) {
    log.warn("Cannot list the earlier memory dumps", { dir, error: detail(error) });
  }
}

/**
 * The source side of a live migration in the launcher, as KubeVirt's launcher runs it
 * (`MigrateVirtualMachine`): the domain is migrated with `virDomainMigrateToURI3`, peer to
 * peer, to the target's libvirt through the handler's migration proxy socket
 * `<dir>/migrationproxy/<vmi uid>-source.sock`, its memory through
 * `<vmi uid>-49152-source.sock`, with KubeVirt's flags (live, peer to peer, persisted on
 * the destination; unsafe, auto-converge, post-copy and parallel when the options say so)
 * and parameters (migration URI, bandwidth in MiB/s, parallel connections). The call runs
 * in the background; a {@linkcode MigrationMonitor} looks at the job every 400 ms and
 * aborts, pauses the guest or switches to post-copy. What happened is kept as KubeVirt's
 * migration metadata (`uid`, `startTimestamp`, `endTimestamp`, `failed`, `failureReason`,
 * `abortStatus`, `mode`), which goes to the handler with the domain.
 *
 * @module
 */
import {
  type Domain as LibvirtDomain,
  type MigrateParam,
  VIR_DOMAIN_JOB_UNBOUNDED,
  VIR_MIGRATE_AUTO_CONVERGE,
  VIR_MIGRATE_LIVE,
  VIR_MIGRATE_PARALLEL,
  VIR_MIGRATE_PEER2PEER,
  VIR_MIGRATE_PERSIST_DEST,
  VIR_MIGRATE_POSTCOPY,
  VIR_MIGRATE_UNSAFE,
} from "../../ffi/mod.ts";
import { parseQuantity, type VirtualMachineInstance } from "../api/mod.ts";
import { getLogger } from "../log/mod.ts";
import { LIBVIRT_DIRECT_MIGRATION_PORT, proxyKey, sourceUnixFile } from "../migration/mod.ts";
import { MIGRATION_MONITOR_MS, MigrationMonitor } from "./migration_monitor.ts";

const log = getLogger("launcher", "migration");

/** Where KubeVirt's launcher finds the handler's migration proxy sockets (its share dir). */
export const DEFAULT_MIGRATION_SOCKET_DIR = "/var/run/kubevirt";

/** KubeVirt's `MigrationOptions`, as the handler sends them (Go field names), checked. */
export interface MigrationOptions {
  /** MiB/s; 0: no limit. */
  bandwidthMiB: number;
  /** Seconds without progress before an abort; 0: never. */
  progressTimeout: number;
  /** Seconds per GiB of guest memory before an abort; 0: no limit. */
  completionTimeoutPerGiB: number;
  /** `VIR_MIGRATE_UNSAFE`. */
  unsafeMigration: boolean;
  /** `VIR_MIGRATE_AUTO_CONVERGE`. */
  allowAutoConverge: boolean;
  /** `VIR_MIGRATE_POSTCOPY`, and the monitor may switch to it. */
  allowPostCopy: boolean;
  /** Parallel connections for the memory; undefined: one. */
  parallelMigrationThreads?: number;
  /** Whether the monitor may pause the guest or go post-copy to finish. */
  allowWorkloadDisruption: boolean;
}

/** Reads the options JSON of a `MigrationRequest`; throws a plain Error naming the field. */
export function parseMigrationOptions(
  bytes: Uint8Array | string | null | undefined,
): MigrationOptions {
  const text = typeof bytes === "string" ? bytes : new TextDecoder().decode(bytes ?? undefined);
  let raw: Record<string, unknown> = {};
  if (text.trim() !== "") {
    try {
      const parsed: unknown = JSON.parse(text);
      if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
        throw new Error("not an object");
      }
      raw = parsed as Record<string, unknown>;
    } catch (error) {
      throw new Error(`malformed migration options: ${(error as Error).message}`);
    }
  }
  const int = (field: string, dflt: number): number => {
    const v = raw[field];
    if (v === undefined || v === null) return dflt;
    if (typeof v !== "number" || !Number.isInteger(v) || v < 0) {
      throw new Error(
        `migration option ${field} must be a whole number of seconds, not ${JSON.stringify(v)}`,
      );
    }
    return v;
  };
  const bool = (field: string): boolean => {
    const v = raw[field];
    if (v === undefined || v === null) return false;
    if (typeof v !== "boolean") throw new Error(`migration option ${field} must be true or false`);
    return v;
  };
  let bandwidthMiB = 0;
  const bandwidth = raw.Bandwidth;
  if (bandwidth !== undefined && bandwidth !== null && bandwidth !== "") {
    if (typeof bandwidth !== "string" && typeof bandwidth !== "number") {
      throw new Error('migration option Bandwidth must be a quantity, e.g. "64Mi"');
    }
    try {
      bandwidthMiB = Math.ceil(parseQuantity(bandwidth) / (1024 * 1024));
    } catch {
      throw new Error(`migration option Bandwidth ${JSON.stringify(bandwidth)} is not a quantity`);
    }
  }
  const threads = raw.ParallelMigrationThreads;
  if (
    threads !== undefined && threads !== null &&
    (typeof threads !== "number" || !Number.isInteger(threads) || threads < 1)
  ) {
    throw new Error(
      "migration option ParallelMigrationThreads must be a whole number of at least 1",
    );
  }
  return {
    bandwidthMiB,
    progressTimeout: int("ProgressTimeout", 150),
    completionTimeoutPerGiB: int("CompletionTimeoutPerGiB", 150),
    unsafeMigration: bool("UnsafeMigration"),
    allowAutoConverge: bool("AllowAutoConverge"),
    allowPostCopy: bool("AllowPostCopy"),
    parallelMigrationThreads: typeof threads === "number" ? threads : undefined,
    allowWorkloadDisruption: bool("AllowWorkloadDisruption"),
  };
}

/** KubeVirt's migration flags for `options`. */
export function migrationFlags(options: MigrationOptions): number {
  let flags = VIR_MIGRATE_LIVE | VIR_MIGRATE_PEER2PEER | VIR_MIGRATE_PERSIST_DEST;
  if (options.unsafeMigration) flags |= VIR_MIGRATE_UNSAFE;
  if (options.allowAutoConverge) flags |= VIR_MIGRATE_AUTO_CONVERGE;
  if (options.allowPostCopy) flags |= VIR_MIGRATE_POSTCOPY;
  if (options.parallelMigrationThreads !== undefined) flags |= VIR_MIGRATE_PARALLEL;
  return flags;
}

/** libvirt's URI of the target, through the proxy socket of `vmiUid` under `dir`. */
export function migrationDestinationUri(vmiUid: string, dir: string): string {
  return `qemu+unix:///system?socket=${sourceUnixFile(dir, vmiUid)}`;
}

/** KubeVirt's migration parameters: the memory's socket, bandwidth, connections. */
export function migrationParams(
  vmiUid: string,
  dir: string,
  options: MigrationOptions,
): MigrateParam[] {
  const memory = sourceUnixFile(dir, proxyKey(vmiUid, LIBVIRT_DIRECT_MIGRATION_PORT));
  const params: MigrateParam[] = [["migrate_uri", `unix://${memory}`]];
  if (options.bandwidthMiB > 0) params.push(["bandwidth", BigInt(options.bandwidthMiB)]);
  if (options.parallelMigrationThreads !== undefined) {
    params.push(["parallel.connections", options.parallelMigrationThreads]);
  }
  return params;
}

/** GiB of data a migration of `vmi` moves, as KubeVirt counts it: its memory, rounded up. */
export function migrationDataGiB(vmi: VirtualMachineInstance): number {
  const domain = vmi.spec.domain as {
    memory?: { guest?: string | number };
    resources?: { requests?: Record<string, string | number> };
  };
  const memory = domain.memory?.guest ?? domain.resources?.requests?.memory;
  if (memory === undefined) return 1;
  try {
    return Math.max(1, Math.ceil(parseQuantity(memory) / 1e9));
  } catch {
    return 1;
  }
}

/** KubeVirt's migration metadata in the domain. */
export interface MigrationMetadata {
  /** The migration's UID. */
  uid: string;
  /** When it started (RFC 3339). */
  startTimestamp: string;
  /** When it ended. */
  endTimestamp?: string;
  /** Whether it failed. */
  failed?: boolean;
  /** Why. */
  failureReason?: string;
  /** `Aborting`, `Succeeded` or `Failed` once an abort was asked for or made. */
  abortStatus?: string;
  /** `PreCopy`, `PostCopy` or `Paused`. */
  mode?: string;
}

/**
 * KubeVirt's `DomainJobInfo` (the migration part of `GetDomainStats`) from libvirt's job
 * statistics: data total, processed and remaining, the memory's transfer rate, and the
 * dirty rate in bytes per second (pages per second times the page size).
 */
export function jobInfoToKubevirt(params: Record<string, unknown>): Record<string, unknown> {
  const n = (key: string) => typeof params[key] === "number" ? params[key] as number : undefined;
  const out: Record<string, unknown> = {};
  for (
    const [field, key] of [
      ["DataTotal", "data_total"],
      ["DataProcessed", "data_processed"],
      ["MemoryBps", "memory_bps"],
      ["DataRemaining", "data_remaining"],
    ] as const
  ) {
    const v = n(key);
    out[`${field}Set`] = v !== undefined;
    out[field] = v ?? 0;
  }
  const rate = n("memory_dirty_rate");
  const page = n("memory_page_size");
  out.MemDirtyRateSet = rate !== undefined && page !== undefined;
  out.MemDirtyRate = rate !== undefined && page !== undefined ? rate * page : 0;
  return out;
}

function now(): string {
  return new Date().toISOString().replace(/\.\d+Z$/, "Z");
}

/** One migration of a domain from this launcher; see the module doc. */
export class SourceMigration {
  readonly #domain: LibvirtDomain;
  readonly #onChange: () => void;
  readonly #monitor: MigrationMonitor;
  readonly #done: Promise<void>;
  #metadata: MigrationMetadata;
  #over = false;
  #abortReason: string | undefined;
  #job: Record<string, unknown> | undefined;

  /**
   * Starts migrating `domain` for the VMI `vmiUid` (migration `migrationUid`) through the
   * proxy sockets under `socketDir`; `onChange` hears of each change of the metadata.
   */
  constructor(
    domain: LibvirtDomain,
    spec: {
      vmiUid: string;
      migrationUid: string;
      options: MigrationOptions;
      dataGiB: number;
      socketDir: string;
      /** The domain as the target defines it (a dedicated-CPU VMI's, pinned there). */
      destinationXml?: string;
      onChange: () => void;
    },
  ) {
    this.#domain = domain;
    this.#onChange = spec.onChange;
    this.#metadata = { uid: spec.migrationUid, startTimestamp: now(), mode: "PreCopy" };
    this.#monitor = new MigrationMonitor(spec.options, spec.dataGiB, Date.now());
    const params = migrationParams(spec.vmiUid, spec.socketDir, spec.options);
    if (spec.destinationXml !== undefined) params.push(["destination_xml", spec.destinationXml]);
    const call = domain.migrateToURI3(
      migrationDestinationUri(spec.vmiUid, spec.socketDir),
      params,
      migrationFlags(spec.options),
    );
    this.#done = call.then(
      () => this.#finish(undefined),
      (error) => this.#finish(error instanceof Error ? error : new Error(String(error))),
    );
    this.#watch();
  }

  /** The migration's metadata now. */
  get metadata(): MigrationMetadata {
    return { ...this.#metadata };
  }

  /** Resolves once the migration is over (either way). */
  get done(): Promise<void> {
    return this.#done;
  }

  /** Whether it is over. */
  get over(): boolean {
    return this.#over;
  }

  /**
   * The job's statistics at the monitor's last look, as KubeVirt's `DomainJobInfo`; none
   * once the migration is over (KubeVirt's launcher empties them then too).
   */
  get jobInfo(): Record<string, unknown> | undefined {
    return this.#over ? undefined : this.#job;
  }

  /** Asks libvirt to abort the migration (`CancelVirtualMachineMigration`). */
  async cancel(): Promise<void> {
    if (this.#over) return;
    this.#set({ abortStatus: "Aborting" });
    this.#abortReason = "Live migration aborted";
    try {
      await this.#domain.abortJob();
    } catch (error) {
      this.#set({ abortStatus: "Failed" });
      throw error;
    }
  }

  #set(change: Partial<MigrationMetadata>): void {
    this.#metadata = { ...this.#metadata, ...change };
    this.#onChange();
  }

  #finish(error: Error | undefined): void {
    this.#over = true;
    if (!error) {
      log.info("Live migration succeeded", { migration: this.#metadata.uid });
      this.#set({ endTimestamp: now() });
      return;
    }
    const aborted = this.#abortReason !== undefined || /canceled by client/i.test(error.message);
    const reason = this.#abortReason ?? `Live migration failed ${error.message}`;
    log.warn("Live migration failed: {reason}", { migration: this.#metadata.uid, reason });
    this.#set({
      endTimestamp: now(),
      failed: true,
      failureReason: reason,
      ...(aborted ? { abortStatus: "Succeeded" } : {}),
    });
  }

  #watch(): void {
    const look = async () => {
      if (this.#over) return;
      try {
        const job = await this.#domain.jobStats();
        if (!this.#over && job.type === VIR_DOMAIN_JOB_UNBOUNDED) {
          this.#job = jobInfoToKubevirt(job.params);
          const remaining = Number(job.params.data_remaining ?? 0);
          const action = this.#monitor.look(remaining, Date.now());
          if (action.kind === "abort") {
            this.#abortReason = action.reason;
            await this.#domain.abortJob();
          } else if (action.kind === "postCopy") {
            log.info("Starting post-copy to finish the migration", {
              migration: this.#metadata.uid,
            });
            await this.#domain.migrateStartPostCopy();
            this.#set({ mode: "PostCopy" });
          } else if (action.kind === "pause") {
            log.info("Pausing the guest to finish the migration", {
              migration: this.#metadata.uid,
            });
            await this.#domain.suspend();
            this.#set({ mode: "Paused" });
          }
        }
      } catch (error) {
        log.debug("Cannot look at the migration job: {error}", { error: String(error) });
      }
      if (!this.#over) {
        const timer = setTimeout(look, MIGRATION_MONITOR_MS);
        Deno.unrefTimer(timer);
      }
    };
    const timer = setTimeout(look, MIGRATION_MONITOR_MS);
    Deno.unrefTimer(timer);
  }
}

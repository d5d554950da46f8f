/**
 * What a running live migration's monitor decides at each look (every 400 ms), as
 * KubeVirt's launcher decides it: a migration whose remaining data has not shrunk from one
 * look to the next for `progressTimeout` seconds is stuck and aborted; one still running after
 * `completionTimeoutPerGiB` seconds per GiB of guest memory is aborted, or, when the
 * workload may be disrupted, helped to finish: switched to post-copy when that is allowed,
 * else the guest is paused (and the allowed time doubled). Nothing is aborted once in
 * post-copy: the target already runs the guest.
 *
 * @module
 */

/** How often the monitor looks at the migration job, ms (KubeVirt's). */
export const MIGRATION_MONITOR_MS = 400;

/** The options of a migration that the monitor needs (KubeVirt's `MigrationOptions`). */
export interface MonitorOptions {
  /** Seconds without progress before the migration is aborted; 0: never. */
  progressTimeout: number;
  /** Seconds allowed per GiB of guest memory; 0: no limit. */
  completionTimeoutPerGiB: number;
  /** Whether the guest may be paused or moved to post-copy to finish. */
  allowWorkloadDisruption: boolean;
  /** Whether post-copy is allowed. */
  allowPostCopy: boolean;
}

/** What to do after a look. */
export type MonitorAction =
  | { kind: "continue" }
  | { kind: "postCopy" }
  | { kind: "pause" }
  | { kind: "abort"; reason: string };

/** Decides a running migration's fate from its job statistics; see the module doc. */
export class MigrationMonitor {
  readonly #o: MonitorOptions;
  readonly #start: number;
  #acceptableSeconds: number;
  #watermark = 0;
  #lastProgress: number;
  #mode: "precopy" | "postcopy" | "paused" = "precopy";

  /** A monitor of a migration that starts `now` (ms) for a guest of `dataGiB` (at least 1). */
  constructor(options: MonitorOptions, dataGiB: number, now: number) {
    this.#o = options;
    this.#start = now;
    this.#lastProgress = now;
    this.#acceptableSeconds = options.completionTimeoutPerGiB * Math.max(1, Math.ceil(dataGiB));
  }

  /** The migration's mode as the monitor made it. */
  get mode(): "precopy" | "postcopy" | "paused" {
    return this.#mode;
  }

  /** Seconds the migration may take (doubled once the guest was paused to finish). */
  get acceptableSeconds(): number {
    return this.#acceptableSeconds;
  }

  /** The decision at `now` (ms), given the job's `dataRemaining` bytes. */
  look(dataRemaining: number, now: number): MonitorAction {
    if (this.#watermark === 0 || dataRemaining < this.#watermark) this.#lastProgress = now;
    this.#watermark = dataRemaining;
    if (this.#mode === "postcopy") return { kind: "continue" };
    const elapsed = Math.floor((now - this.#start) / 1000);
    const overtime = this.#acceptableSeconds !== 0 && elapsed > this.#acceptableSeconds;
    if (overtime && this.#o.allowWorkloadDisruption && this.#mode !== "paused") {
      if (this.#o.allowPostCopy) {
        this.#mode = "postcopy";
        return { kind: "postCopy" };
      }
      this.#mode = "paused";
      this.#acceptableSeconds *= 2;
      return { kind: "pause" };
    }
    const stuck = Math.floor((now - this.#lastProgress) / 1000);
    if (this.#o.progressTimeout !== 0 && stuck > this.#o.progressTimeout) {
      return {
        kind: "abort",
        reason: `Live migration stuck for ${stuck} seconds and has been aborted`,
      };
    }
    if (overtime) {
      return {
        kind: "abort",
        reason:
          `Live migration is not completed after ${this.#acceptableSeconds} seconds and has been aborted`,
      };
    }
    return { kind: "continue" };
  }
}

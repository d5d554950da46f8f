/**
 * The target side of a live migration in the launcher, as KubeVirt's launcher watches it
 * (`live-migration-target.go`): the domain arrives with the migration, and once libvirt
 * says the guest resumed here (or stayed paused, as it was on the source), the launcher
 * waits until libvirt's incoming migration job is over and marks the migration's end in the
 * domain's migration metadata. The target handler reads that end (`endTimestamp`) to take
 * the VMI over; the source handler learns it from there in turn.
 *
 * @module
 */
import {
  type Domain as LibvirtDomain,
  type DomainEvent,
  VIR_DOMAIN_EVENT_RESUMED,
  VIR_DOMAIN_EVENT_RESUMED_MIGRATED,
  VIR_DOMAIN_EVENT_STARTED,
  VIR_DOMAIN_EVENT_STARTED_MIGRATED,
  VIR_DOMAIN_EVENT_SUSPENDED,
  VIR_DOMAIN_EVENT_SUSPENDED_PAUSED,
} from "../../ffi/mod.ts";
import { kubeTime } from "../api/mod.ts";
import { getLogger } from "../log/mod.ts";
import type { MigrationMetadata } from "./migration_source.ts";

const log = getLogger("launcher", "migration");

/** `VIR_DOMAIN_JOB_OPERATION_MIGRATION_IN`. */
const JOB_OPERATION_MIGRATION_IN = 4;
/** `VIR_DOMAIN_JOB_NONE`. */
const JOB_NONE = 0;

/** How long, and how often, the incoming job is looked at (KubeVirt's: 100 ms for 3 s, 3 more tries). */
const POLL_MS = 100;
const POLL_FOR_MS = 3_000;
const RETRY_DELAYS_MS = [1_000, 2_000, 3_000];

/** Whether an event tells that the incoming migration handed the guest over. */
export function endsIncomingMigration(event: DomainEvent): boolean {
  if (event.type !== "lifecycle") return false;
  return (event.event === VIR_DOMAIN_EVENT_RESUMED &&
    event.detail === VIR_DOMAIN_EVENT_RESUMED_MIGRATED) ||
    (event.event === VIR_DOMAIN_EVENT_SUSPENDED &&
      event.detail === VIR_DOMAIN_EVENT_SUSPENDED_PAUSED);
}

/** Whether an event tells that the incoming migration's domain started here. */
export function startsIncomingMigration(event: DomainEvent): boolean {
  return event.type === "lifecycle" && event.event === VIR_DOMAIN_EVENT_STARTED &&
    event.detail === VIR_DOMAIN_EVENT_STARTED_MIGRATED;
}

/** The migration a target launcher takes in; see the module doc. */
export class IncomingMigration {
  #metadata: MigrationMetadata;
  #ending: Promise<void> | undefined;
  readonly #onChange: () => void;
  readonly #log: Record<string, unknown>;

  /** The migration `uid` (the VMI's `status.migrationState.migrationUid`) is expected here. */
  constructor(uid: string, o: { onChange: () => void; log: Record<string, unknown> }) {
    this.#metadata = { uid, startTimestamp: "" };
    this.#onChange = o.onChange;
    this.#log = o.log;
  }

  /** The migration's UID. */
  get uid(): string {
    return this.#metadata.uid;
  }

  /** KubeVirt's migration metadata as the target knows it (no start: none yet). */
  get metadata(): MigrationMetadata | undefined {
    const m = this.#metadata;
    return m.startTimestamp || m.endTimestamp ? { ...m } : undefined;
  }

  /** Whether the end was marked. */
  get ended(): boolean {
    return this.#metadata.endTimestamp !== undefined;
  }

  /**
   * Follows the domain's events: its start by migration is the migration's start here,
   * its resume (or pause) after the migration begins the wait for the job's end.
   */
  noteEvent(event: DomainEvent, lookup: () => Promise<LibvirtDomain | undefined>): void {
    if (startsIncomingMigration(event) && !this.#metadata.startTimestamp) {
      this.#metadata = { ...this.#metadata, startTimestamp: kubeTime() };
      this.#onChange();
      return;
    }
    if (!endsIncomingMigration(event) || this.ended || this.#ending) return;
    this.#ending = this.#markEnd(lookup).finally(() => this.#ending = undefined);
  }

  async #markEnd(lookup: () => Promise<LibvirtDomain | undefined>): Promise<void> {
    let over = false;
    for (let attempt = 0; attempt <= RETRY_DELAYS_MS.length && !over; attempt++) {
      const deadline = Date.now() + POLL_FOR_MS;
      while (!over && Date.now() < deadline) {
        over = await this.#jobOver(lookup);
        if (!over) await new Promise((r) => setTimeout(r, POLL_MS));
      }
      if (!over && attempt < RETRY_DELAYS_MS.length) {
        await new Promise((r) => setTimeout(r, RETRY_DELAYS_MS[attempt]));
      }
    }
    log.info(
      over
        ? "Incoming migration job completed, marking the migration's end"
        : "Incoming migration job still reported, marking the migration's end anyway",
      { ...this.#log, migration: this.#metadata.uid },
    );
    const now = kubeTime();
    this.#metadata = {
      ...this.#metadata,
      startTimestamp: this.#metadata.startTimestamp || now,
      endTimestamp: now,
    };
    this.#onChange();
  }

  /** No incoming migration job runs on the domain (or it cannot be asked: over too). */
  async #jobOver(lookup: () => Promise<LibvirtDomain | undefined>): Promise<boolean> {
    try {
      const domain = await lookup();
      if (!domain) return true;
      const job = await domain.jobStats();
      return job.type === JOB_NONE || job.params.operation !== JOB_OPERATION_MIGRATION_IN;
    } catch {
      // A job that cannot be asked about: KubeVirt tries again.
      return false;
    }
  }
}

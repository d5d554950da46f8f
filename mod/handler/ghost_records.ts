/**
 * Ghost records: the handler's memory across restarts.
 *
 * One small JSON file per VMI UID, `{name, namespace, socketFile, uid}` as
 * KubeVirt writes it, created before the first call to a VMI's launcher and
 * removed after its cleanup. At start-up they give back the UID and the launcher
 * socket of every VMI the informer has not shown yet, so a restarted handler
 * re-adopts running VMs instead of forgetting (or stopping) them.
 *
 * Files are written whole and durably (temporary file, fsync, rename, fsync of the
 * directory: `writeFileDurably`) with mode 0600. A file that cannot be read as a record
 * is reported and moved aside into `<dir>/.set-aside/`, never fatal.
 *
 * @module
 */
import { join } from "node:path";
import { vmiKey } from "../api/mod.ts";
import {
  errorText,
  SET_ASIDE_DIR,
  setFileAside,
  TEMP_FILE_PREFIX,
  writeFileDurably,
} from "../../ffi/mod.ts";
import { getLogger } from "../log/mod.ts";
import { removeIfPresent } from "../lifecycle/mod.ts";

const log = getLogger("handler", "ghost-records");

/** What a ghost record remembers of one VMI. */
export interface GhostRecord {
  /** The VMI's name. */
  name: string;
  /** The VMI's namespace. */
  namespace: string;
  /** The launcher's cmd socket. */
  socketFile: string;
  /** The VMI's UID (also the file's name). */
  uid: string;
}

/** A file found in the ghost record directory that is not a valid record. */
export interface SetAsideFile {
  /** Where the file was. */
  file: string;
  /** Where it was moved. */
  movedTo: string;
  /** Why it is not a record. */
  reason: string;
}

/** A ghost record could not be written or removed. */
export class GhostRecordError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "GhostRecordError";
  }
}

const UID = /^[0-9a-zA-Z][0-9a-zA-Z._-]{0,127}$/;
const DNS_LABELISH = /^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/;

/** Checks a parsed value is a well-formed record; returns why not, or undefined. */
export function validateGhostRecord(value: unknown, fileName?: string): string | undefined {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    return "not a JSON object";
  }
  const r = value as Record<string, unknown>;
  for (const k of ["name", "namespace", "socketFile", "uid"]) {
    if (typeof r[k] !== "string" || r[k] === "") return `field "${k}" missing or not a string`;
  }
  if (!UID.test(r.uid as string)) return `uid ${JSON.stringify(r.uid)} is not a UID`;
  if (!DNS_LABELISH.test(r.name as string)) return `name ${JSON.stringify(r.name)} is invalid`;
  if (!DNS_LABELISH.test(r.namespace as string)) {
    return `namespace ${JSON.stringify(r.namespace)} is invalid`;
  }
  if (!(r.socketFile as string).startsWith("/")) return "socketFile is not an absolute path";
  if (fileName !== undefined && fileName !== r.uid) {
    return `file name ${JSON.stringify(fileName)} does not match uid ${JSON.stringify(r.uid)}`;
  }
  return undefined;
}

/** The ghost records of one handler, on disk and in memory. */
export class GhostRecordStore {
  readonly #dir: string;
  readonly #byUid = new Map<string, GhostRecord>();
  /** `namespace/name` -> UIDs, so the per-sync lookups do not scan every record. */
  readonly #byKey = new Map<string, Set<string>>();

  /** A store over `dir` (KubeVirt: `/var/run/kubevirt-private/ghost-records`). */
  constructor(dir: string) {
    this.#dir = dir;
  }

  /** The directory the records live in. */
  get dir(): string {
    return this.#dir;
  }

  /**
   * Reads every record on disk into memory. Files that are not valid records are
   * moved to `.set-aside/` and returned, so the caller can report them.
   */
  async load(): Promise<SetAsideFile[]> {
    await Deno.mkdir(this.#dir, { recursive: true, mode: 0o700 });
    const setAside: SetAsideFile[] = [];
    // Read synchronously: Deno 2.9.3 may close a node:net socket's descriptor twice, and a
    // directory's read on another thread must not fall in between (docs/compatibility.md).
    for (const entry of Deno.readDirSync(this.#dir)) {
      if (entry.name === SET_ASIDE_DIR) continue;
      const file = join(this.#dir, entry.name);
      if (entry.name.startsWith(TEMP_FILE_PREFIX)) {
        // A write that never finished its rename: nothing was promised by it, so one that
        // cannot be removed is only reported, and loading goes on.
        await removeIfPresent(file).catch((error) =>
          log.warn("Cannot remove the unfinished record {file}: {error}", { file, error })
        );
        continue;
      }
      let reason: string | undefined;
      let record: GhostRecord | undefined;
      if (!entry.isFile) {
        reason = entry.isSymlink ? "a symbolic link" : "not a regular file";
      } else {
        try {
          const text = await Deno.readTextFile(file);
          const parsed: unknown = JSON.parse(text);
          reason = validateGhostRecord(parsed, entry.name);
          if (reason === undefined) record = parsed as GhostRecord;
        } catch (error) {
          reason = `unreadable: ${errorText(error)}`;
        }
      }
      if (record) {
        this.#remember(record);
        continue;
      }
      const movedTo = await setFileAside(file);
      log.error("Set aside invalid ghost record {file}: {reason}", { file, reason, movedTo });
      setAside.push({ file, movedTo, reason: reason! });
    }
    return setAside;
  }

  /** All records in memory. */
  list(): GhostRecord[] {
    return [...this.#byUid.values()];
  }

  /** The record of a UID. */
  get(uid: string): GhostRecord | undefined {
    return this.#byUid.get(uid);
  }

  /** The records of a `namespace/name` key (usually one; more after a UID change). */
  findByKey(key: string): GhostRecord[] {
    const uids = this.#byKey.get(key);
    return uids ? [...uids].map((uid) => this.#byUid.get(uid)!) : [];
  }

  #remember(record: GhostRecord): void {
    this.#byUid.set(record.uid, pick(record));
    const key = vmiKey(record);
    const uids = this.#byKey.get(key) ?? new Set<string>();
    uids.add(record.uid);
    this.#byKey.set(key, uids);
  }

  #forget(uid: string): void {
    const record = this.#byUid.get(uid);
    if (!record) return;
    this.#byUid.delete(uid);
    const key = vmiKey(record);
    const uids = this.#byKey.get(key);
    uids?.delete(uid);
    if (uids?.size === 0) this.#byKey.delete(key);
  }

  /** The UID last known for `namespace/name` (the last fallback for a key the informer lost), or undefined. */
  lastKnownUid(key: string): string | undefined {
    return this.findByKey(key)[0]?.uid;
  }

  /**
   * Writes a record atomically before the first launcher call. Writing the same
   * record again is a no-op; a different record for the same UID is an error.
   */
  async add(record: GhostRecord): Promise<void> {
    const why = validateGhostRecord(record);
    if (why) throw new GhostRecordError(`Cannot write ghost record: ${why}`);
    const existing = this.#byUid.get(record.uid);
    if (existing) {
      if (existing.socketFile === record.socketFile && existing.name === record.name) return;
      throw new GhostRecordError(
        `Cannot write ghost record for uid "${record.uid}": a record with socket ` +
          `"${existing.socketFile}" exists`,
      );
    }
    try {
      await writeFileDurably(join(this.#dir, record.uid), JSON.stringify(pick(record)), {
        mode: 0o600,
        dirMode: 0o700,
      });
    } catch (error) {
      throw new GhostRecordError(`Cannot write ghost record for uid "${record.uid}"`, {
        cause: error,
      });
    }
    this.#remember(record);
  }

  /** Removes a UID's record after cleanup; removing a missing one is fine. */
  async delete(uid: string): Promise<void> {
    try {
      await Deno.remove(join(this.#dir, uid));
    } catch (error) {
      if (!(error instanceof Deno.errors.NotFound)) {
        throw new GhostRecordError(`Cannot remove ghost record for uid "${uid}"`, {
          cause: error,
        });
      }
    }
    this.#forget(uid);
  }
}

function pick(r: GhostRecord): GhostRecord {
  return { name: r.name, namespace: r.namespace, socketFile: r.socketFile, uid: r.uid };
}

/**
 * The files virtnode keeps as its own state (ghost records, mount records, PID files, the
 * launcher host's VM records, network caches) are written whole and durably: the new
 * content goes to a temporary file beside the target, is fsynced, renamed over the target,
 * and the directory is fsynced. A kill at any moment leaves the old content or the new,
 * never a torn file, and a power cut after the write returns keeps the new content.
 *
 * A file that is there but cannot be read as what it should hold (left by an older
 * version, or by hand) is moved into `.set-aside/` beside it for a human to read, so that
 * it blocks nothing.
 *
 * @module
 */
import { basename, dirname, join } from "node:path";
import { errorText } from "./errors.ts";

/**
 * A write a kill cut short leaves `<this><name>.tmp` beside the target (never a record); the
 * next write of the target replaces it.
 */
export const TEMP_FILE_PREFIX = ".tmp-";
/** The folder, beside the records, of files that could not be read as records. */
export const SET_ASIDE_DIR = ".set-aside";

/** Options of {@linkcode writeFileDurably}. */
export interface DurableWriteOptions {
  /** The new file's mode (0o600 unless told). */
  mode?: number;
  /** Make the directory (and its parents) with this mode when it is missing. */
  dirMode?: number;
}

/** A file could not be written whole. */
export class DurableWriteError extends Error {
  /** Creates `Cannot write "<path>": <detail>`. */
  constructor(path: string, detail: string, options?: ErrorOptions) {
    super(`Cannot write "${path}": ${detail}`, options);
    this.name = "DurableWriteError";
  }
}

/**
 * fsyncs that may run at once, over every caller: each async file call holds a thread of
 * Deno's blocking pool, and a burst of 200 VMIs left one idle thread per call that had run
 * at the same time (~5 MB of RSS in stacks and malloc arenas, kept for good).
 */
const SYNC_SLOTS = 2;
let syncing = 0;
const syncWaiters: (() => void)[] = [];
/** The last write of each path, so writes of one path land in the order they were asked. */
const pending = new Map<string, Promise<void>>();

/**
 * Writes `data` to `path` whole and durably (see the module doc); writes of the same path
 * are applied in call order. Throws {@linkcode DurableWriteError}.
 */
export function writeFileDurably(
  path: string,
  data: string | Uint8Array,
  options: DurableWriteOptions = {},
): Promise<void> {
  const previous = pending.get(path) ?? Promise.resolve();
  const write = previous.then(() => writeNow(path, data, options));
  // The caller gets the error through write; settled only orders the next write to the path.
  const settled = write.catch(() => {});
  pending.set(path, settled);
  settled.then(() => {
    if (pending.get(path) === settled) pending.delete(path);
  });
  return write;
}

async function writeNow(
  path: string,
  data: string | Uint8Array,
  options: DurableWriteOptions,
): Promise<void> {
  const dir = dirname(path);
  // One name per target, so the next write replaces what a kill left; `.tmp` at the end, so
  // a reader that picks files by their ending (`*.json`) never takes it for a record.
  const temp = join(dir, `${TEMP_FILE_PREFIX}${basename(path)}.tmp`);
  const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
  // Everything but the fsyncs is synchronous: a small local file takes microseconds, and
  // an async call each would hold a blocking-pool thread (see SYNC_SLOTS).
  let madeDir = false;
  try {
    // What a kill left under this name is not followed, whatever it is: O_EXCL after unlink.
    removeIfThere(temp);
    const open = () =>
      Deno.openSync(temp, { write: true, createNew: true, mode: options.mode ?? 0o600 });
    let file: Deno.FsFile;
    try {
      file = open();
    } catch (error) {
      if (!(error instanceof Deno.errors.NotFound) || options.dirMode === undefined) throw error;
      Deno.mkdirSync(dir, { recursive: true, mode: options.dirMode });
      madeDir = true;
      file = open();
    }
    try {
      for (let done = 0; done < bytes.length;) done += file.writeSync(bytes.subarray(done));
      await inSyncSlot(() => file.sync());
    } finally {
      file.close();
    }
    Deno.renameSync(temp, path);
  } catch (error) {
    try {
      removeIfThere(temp);
    } catch { /* the error above says more */ }
    throw new DurableWriteError(path, errorText(error), {
      cause: error,
    });
  }
  try {
    // The rename is durable once the directory is; a directory just made needs its parent's.
    await syncDirectory(dir);
    if (madeDir) await syncDirectory(dirname(dir));
  } catch (error) {
    throw new DurableWriteError(path, `its directory cannot be synced: ${String(error)}`, {
      cause: error,
    });
  }
}

/** fsyncs a directory, so the names made, renamed or removed in it last. */
export async function syncDirectory(dir: string): Promise<void> {
  const handle = Deno.openSync(dir, { read: true });
  try {
    await inSyncSlot(() => handle.sync());
  } finally {
    handle.close();
  }
}

/**
 * Moves `file` into `.set-aside/` beside it (made when missing), under its name and the
 * time, so that it stops standing for anything; returns where it went.
 */
export async function setFileAside(file: string): Promise<string> {
  const dir = join(dirname(file), SET_ASIDE_DIR);
  await Deno.mkdir(dir, { recursive: true, mode: 0o700 });
  const target = join(dir, `${basename(file)}.${Date.now()}`);
  await Deno.rename(file, target);
  return target;
}

function removeIfThere(path: string): void {
  try {
    Deno.removeSync(path);
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  }
}

/** Runs `fn` in one of the {@linkcode SYNC_SLOTS}, waiting for one to free up. */
async function inSyncSlot(fn: () => Promise<void>): Promise<void> {
  if (syncing >= SYNC_SLOTS) {
    await new Promise<void>((resolve) => syncWaiters.push(resolve));
  } else {
    syncing++;
  }
  try {
    await fn();
  } finally {
    // The slot passes straight to the next waiter, or is given back.
    const next = syncWaiters.shift();
    if (next) next();
    else syncing--;
  }
}

/**
 * Log files with a size bound: {@linkcode RotatingFile} appends to a file and, before a
 * write would take it past {@linkcode LOG_FILE_MAX_BYTES}, moves its content to `<path>.1`
 * (the older `.1` to `.2`, up to {@linkcode LOG_FILE_KEEP} copies) and starts it again from
 * empty. A guest that makes its launcher log without end costs the host at most
 * `(keep + 1) × maxBytes` of disk per log, and the newest lines are always in `<path>`.
 *
 * The content is copied and the file truncated in place, not renamed: a launcher's own
 * standard error is appended to the same file by a descriptor opened before it started
 * (its last words when it crashes), and a rename would leave that descriptor writing to
 * the old copy, or to a deleted one, for good. Both descriptors append (`O_APPEND`), so
 * after a truncation each write lands at the new end.
 *
 * @module
 */
import { errorText } from "../../ffi/mod.ts";

/** The size a log file may reach before it is rotated, bytes (10 MiB, as the kubelet's `containerLogMaxSize`). */
export const LOG_FILE_MAX_BYTES = 10 * 1024 * 1024;

/** How many rotated copies of a log file are kept (`<path>.1` newest, `<path>.2`). */
export const LOG_FILE_KEEP = 2;

/**
 * The environment variable a process is told its log file by (`--log-file`); the handler
 * sets it for the launcher host it starts, whose output goes to that file.
 */
export const LOG_FILE_ENV = "VIRTNODE_LOG_FILE";

/** Bounds of a log file; both default to the constants above. */
export interface RotatingFileOptions {
  /** The size the file may reach, bytes; {@linkcode LOG_FILE_MAX_BYTES} unless told. */
  maxBytes?: number;
  /** Rotated copies kept; {@linkcode LOG_FILE_KEEP} unless told (0: the file is only emptied). */
  keep?: number;
}

/** A log file could not be opened or rotated. */
export class LogFileError extends Error {
  /** The log file. */
  readonly path: string;
  /** Creates `<action> "<path>": <cause>`. */
  constructor(action: string, path: string, options: { cause: unknown }) {
    const detail = errorText(options.cause);
    super(`${action} "${path}": ${detail}`, options);
    this.name = "LogFileError";
    this.path = path;
  }
}

function bounds(options: RotatingFileOptions): { maxBytes: number; keep: number } {
  const maxBytes = options.maxBytes ?? LOG_FILE_MAX_BYTES;
  const keep = options.keep ?? LOG_FILE_KEEP;
  if (!Number.isInteger(maxBytes) || maxBytes < 1) {
    throw new RangeError(`Invalid log file bound ${maxBytes}: expected a positive integer`);
  }
  if (!Number.isInteger(keep) || keep < 0) {
    throw new RangeError(`Invalid count of rotated log files ${keep}: expected 0 or more`);
  }
  return { maxBytes, keep };
}

function sizeOf(path: string): number {
  try {
    return Deno.statSync(path).size;
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return 0;
    throw error;
  }
}

/** Moves `<path>` to `<path>.1` (and each older copy one up) and empties `<path>` in place. */
function rotate(path: string, keep: number): void {
  try {
    // The oldest copy goes; `.2` becomes `.3` and so on, before `.1` is written again.
    for (let i = keep - 1; i >= 1; i--) {
      try {
        Deno.renameSync(`${path}.${i}`, `${path}.${i + 1}`);
      } catch (error) {
        if (!(error instanceof Deno.errors.NotFound)) throw error;
      }
    }
    if (keep >= 1) {
      // Whole or not at all: a copy cut short by a crash would pass for a complete one.
      Deno.copyFileSync(path, `${path}.1.tmp`);
      Deno.renameSync(`${path}.1.tmp`, `${path}.1`);
    }
    Deno.truncateSync(path, 0);
  } catch (cause) {
    throw new LogFileError("Cannot rotate the log file", path, { cause });
  }
}

/**
 * Rotates the log file at `path` if it has reached its bound; whether it did. For a file
 * written by a process that does not rotate it (a launcher's start-up output appended on
 * every start).
 */
export function rotateLogFileIfFull(path: string, options: RotatingFileOptions = {}): boolean {
  const { maxBytes, keep } = bounds(options);
  let size: number;
  try {
    size = sizeOf(path);
  } catch (cause) {
    throw new LogFileError("Cannot read the size of the log file", path, { cause });
  }
  if (size < maxBytes) return false;
  rotate(path, keep);
  return true;
}

const encoder = new TextEncoder();

/** A log file kept within its bound; see the module doc. Writes are synchronous, as a log sink's are. */
export class RotatingFile {
  /** The file. */
  readonly path: string;
  readonly #maxBytes: number;
  readonly #keep: number;
  #file: Deno.FsFile;
  /** The file's size as last known: its size at open plus what this writer wrote since. */
  #size: number;

  /** Opens (or creates, mode 0600) `path` for appending; throws {@linkcode LogFileError}. */
  constructor(path: string, options: RotatingFileOptions = {}) {
    const { maxBytes, keep } = bounds(options);
    this.path = path;
    this.#maxBytes = maxBytes;
    this.#keep = keep;
    try {
      this.#file = Deno.openSync(path, { append: true, create: true, mode: 0o600 });
      this.#size = this.#file.statSync().size;
    } catch (cause) {
      throw new LogFileError("Cannot open the log file", path, { cause });
    }
  }

  /**
   * Appends `data`, rotating first when it would not fit. A record longer than the bound
   * is cut to it: a bound that one line can break is none.
   */
  write(data: string | Uint8Array): void {
    let bytes = typeof data === "string" ? encoder.encode(data) : data;
    if (bytes.length > this.#maxBytes) bytes = bytes.subarray(0, this.#maxBytes);
    if (this.#size + bytes.length > this.#maxBytes) {
      // The file as it is: others append to it too (the launcher's standard error), and
      // someone may have emptied it.
      this.#size = this.#file.statSync().size;
      if (this.#size + bytes.length > this.#maxBytes) {
        rotate(this.path, this.#keep);
        this.#size = 0;
      }
    }
    let written = 0;
    while (written < bytes.length) written += this.#file.writeSync(bytes.subarray(written));
    this.#size += bytes.length;
  }

  /** Closes the file. */
  close(): void {
    try {
      this.#file.close();
    } catch {
      // closed already
    }
  }
}

/**
 * LogTape set up for virtnode: formats, levels and loggers; the folder's face is `mod.ts`.
 *
 * @module
 */
import { configureSync, getLogger as logtapeLogger, resetSync, type Sink } from "@logtape/logtape";
import { RotatingFile } from "./rotating_file.ts";

// Logger, LogLevel and LogRecord are our own, narrowed to what virtnode uses: the public API
// names no LogTape type, so `deno doc` documents it whole and LogTape stays swappable.

/** A log level, as LogTape names it. */
export type LogLevel = "trace" | "debug" | "info" | "warning" | "error" | "fatal";

/** The parts of a LogTape record that the formatters read. */
export interface LogRecord {
  /** The logger's category, `["virtnode", ...parts]`. */
  readonly category: readonly string[];
  /** The record's level. */
  readonly level: LogLevel;
  /** The message: template pieces at even indexes, the values put between them at odd ones. */
  readonly message: readonly unknown[];
  /** When the record was made, in milliseconds since the Unix epoch. */
  readonly timestamp: number;
  /** The key/value context, including the values of the message's `{key}` placeholders. */
  readonly properties: Record<string, unknown>;
}

/**
 * A logger of one part of virtnode: a constant message with `{key}` placeholders, and the
 * context as properties (`log.info("Labelled node", { name })`).
 */
export interface Logger {
  /** Logs at level `trace`. */
  trace(message: string, properties?: Record<string, unknown>): void;
  /** Logs at level `debug`. */
  debug(message: string, properties?: Record<string, unknown>): void;
  /** Logs at level `info`. */
  info(message: string, properties?: Record<string, unknown>): void;
  /** Logs at level `warning`. */
  warn(message: string, properties?: Record<string, unknown>): void;
  /** Logs at level `error`. */
  error(message: string, properties?: Record<string, unknown>): void;
  /** Logs at level `fatal`. */
  fatal(message: string, properties?: Record<string, unknown>): void;
}

/** The log levels virtnode accepts, lowest first. */
export const LOG_LEVELS: readonly LogLevel[] = [
  "trace",
  "debug",
  "info",
  "warning",
  "error",
  "fatal",
];

/** How records are written: JSON lines, text, or text on a terminal and JSON elsewhere. */
export type LogFormat = "json" | "text" | "auto";

/** The formats `--log-format` accepts. */
export const LOG_FORMATS: readonly LogFormat[] = ["json", "text", "auto"];

/** The record properties that KubeVirt puts at the top level of a log line. */
const KUBEVIRT_KEYS = ["namespace", "name", "uid", "kind", "reason"] as const;

/** Root category of every virtnode logger. */
const ROOT = "virtnode";

/** Renders a record's message parts (template pieces and values) as one string. */
export function renderMessage(record: LogRecord): string {
  let out = "";
  for (let i = 0; i < record.message.length; i++) {
    const part = record.message[i];
    if (i % 2 === 0) out += String(part);
    else out += typeof part === "string" ? part : stringifyValue(part);
  }
  return out;
}

function stringifyValue(value: unknown): string {
  if (value instanceof Error) return value.message;
  if (typeof value === "string") return value;
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}

function errorField(value: unknown): unknown {
  if (!(value instanceof Error)) return value;
  const cause = value.cause instanceof Error ? value.cause.message : undefined;
  return cause === undefined ? value.message : `${value.message}: ${cause}`;
}

/**
 * Formats a record as one JSON line with KubeVirt's keys.
 *
 * `component` is the role (`virt-handler`, `virt-launcher`, ...) the process runs
 * as; sub-loggers below the role are reported under `logger`.
 */
export function formatJson(record: LogRecord, component: string): string {
  const line: Record<string, unknown> = {
    timestamp: new Date(record.timestamp).toISOString(),
    level: record.level,
    component,
    msg: renderMessage(record),
  };
  const sub = record.category.slice(1).join(".");
  if (sub) line.logger = sub;
  for (const key of KUBEVIRT_KEYS) {
    const value = record.properties[key];
    if (value !== undefined) line[key] = value;
  }
  for (const [key, value] of Object.entries(record.properties)) {
    if (key in line || (KUBEVIRT_KEYS as readonly string[]).includes(key)) continue;
    line[key] = errorField(value);
  }
  return JSON.stringify(line, (_k, v) => typeof v === "bigint" ? v.toString() : v) + "\n";
}

const LEVEL_TAGS: Record<LogLevel, string> = {
  trace: "TRC",
  debug: "DBG",
  info: "INF",
  warning: "WRN",
  error: "ERR",
  fatal: "FTL",
};

/** Formats a record as one human-readable line: time, level, logger, message, key=value pairs. */
export function formatText(record: LogRecord, component: string): string {
  const time = new Date(record.timestamp).toISOString().slice(11, 23);
  const sub = record.category.slice(1).join(".");
  const who = sub ? `${component}/${sub}` : component;
  const pairs = Object.entries(record.properties)
    .filter(([, v]) => v !== undefined)
    .map(([k, v]) => `${k}=${quoteIfNeeded(stringifyValue(errorField(v)))}`);
  const tail = pairs.length > 0 ? " " + pairs.join(" ") : "";
  return `${time} ${LEVEL_TAGS[record.level]} ${who}: ${renderMessage(record)}${tail}\n`;
}

function quoteIfNeeded(s: string): string {
  return /[\s"=]/.test(s) || s === "" ? JSON.stringify(s) : s;
}

/** Options of {@linkcode setupLogging}. */
export interface LoggingOptions {
  /** Lowest level written. */
  level: LogLevel;
  /** Output format; `auto` picks text on a terminal and JSON otherwise. */
  format: LogFormat;
  /** The role reported as `component`, e.g. `virt-handler`. */
  component: string;
  /** Where lines go; standard error by default. */
  write?: (line: string) => void;
  /**
   * A file lines go to instead of standard error, kept within its bound by a
   * {@linkcode RotatingFile} (`--log-file`); ignored when `write` is given.
   */
  file?: string;
}

const encoder = new TextEncoder();

function writeStderr(line: string): void {
  const bytes = encoder.encode(line);
  let off = 0;
  while (off < bytes.length) off += Deno.stderr.writeSync(bytes.subarray(off));
}

/** Picks the concrete format for `auto`: text when standard error is a terminal. */
export function resolveFormat(format: LogFormat): "json" | "text" {
  if (format !== "auto") return format;
  return Deno.stderr.isTerminal() ? "text" : "json";
}

/** The log file of the last {@linkcode setupLogging}, closed when it is called again. */
let logFile: RotatingFile | undefined;

/** Writes to `file`; a line that cannot be written there goes to standard error. */
function fileWriter(file: RotatingFile): (line: string) => void {
  return (line) => {
    try {
      file.write(line);
    } catch {
      // A full disk or a file removed under us: the line is not lost, and a log sink that
      // threw would throw out of whatever was logging.
      writeStderr(line);
    }
  };
}

/**
 * Configures LogTape for this process. Safe to call again (e.g. in tests): the
 * previous configuration is replaced. Throws `LogFileError` when `file` cannot
 * be opened.
 */
export function setupLogging(options: LoggingOptions): void {
  const format = resolveFormat(options.format);
  logFile?.close();
  logFile = options.write || !options.file ? undefined : new RotatingFile(options.file);
  const write = options.write ?? (logFile ? fileWriter(logFile) : writeStderr);
  const sink: Sink = (record) => {
    write(
      format === "json"
        ? formatJson(record, options.component)
        : formatText(record, options.component),
    );
  };
  active = { sink, level: options.level };
  configure(active.sink, active.level);
}

/** The sink and level of the last {@linkcode setupLogging}. */
let active: { sink: Sink; level: LogLevel } | undefined;

function configure(sink: Sink, level: LogLevel): void {
  resetSync();
  configureSync({
    reset: true,
    sinks: { main: sink },
    loggers: [
      { category: [ROOT], lowestLevel: level, sinks: ["main"] },
      { category: ["logtape", "meta"], lowestLevel: "warning", sinks: ["main"] },
    ],
  });
}

/**
 * Changes the lowest level written, keeping the format and the destination (the KubeVirt
 * CR's handler verbosity, followed live); the current level again changes nothing.
 */
export function setLogLevel(level: LogLevel): void {
  if (!active || active.level === level) return;
  active.level = level;
  configure(active.sink, level);
}

/** The lowest level written now; undefined before {@linkcode setupLogging}. */
export function currentLogLevel(): LogLevel | undefined {
  return active?.level;
}

/** Returns the logger for a part of virtnode, e.g. `getLogger("handler", "queue")`. */
export function getLogger(...parts: string[]): Logger {
  return logtapeLogger([ROOT, ...parts]);
}

/**
 * Logging for every virtnode role, on LogTape.
 *
 * Production output is one JSON object a line with the keys KubeVirt's components
 * use (`timestamp`, `level`, `component`, `msg`, and `namespace`, `name`, `uid`,
 * `kind`, `reason` where a record carries them), so that log pipelines built for
 * virt-handler read virtnode unchanged. On a terminal the same records are
 * rendered as one readable line each. A process told a log file (`--log-file`) writes
 * there instead, within a size bound, rotating older lines to `.1` and `.2`
 * ({@linkcode RotatingFile}); every log file virtnode writes is bounded so.
 *
 * @module
 */

export {
  currentLogLevel,
  formatJson,
  formatText,
  getLogger,
  LOG_FORMATS,
  LOG_LEVELS,
  type LogFormat,
  type Logger,
  type LoggingOptions,
  type LogLevel,
  type LogRecord,
  renderMessage,
  resolveFormat,
  setLogLevel,
  setupLogging,
} from "./log.ts";
export {
  LOG_FILE_ENV,
  LOG_FILE_KEEP,
  LOG_FILE_MAX_BYTES,
  LogFileError,
  rotateLogFileIfFull,
  RotatingFile,
  type RotatingFileOptions,
} from "./rotating_file.ts";

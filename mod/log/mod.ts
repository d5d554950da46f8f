/**
 * Logging for every virtnode role, on LogTape.
 *
 * Production output is one JSON object a line with the keys KubeVirt's components
 * use (`timestamp`, `level`, `component`, `msg`, and `namespace`, `name`, `uid`,
 * `kind`, `reason` where a record carries them), so that log pipelines built for
 * virt-handler read virtnode unchanged. On a terminal the same records are
 * rendered as one readable line each.
 *
 * @module
 */

export {
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
  setupLogging,
} from "./log.ts";

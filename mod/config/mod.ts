/**
 * The agent's configuration: flags and environment parsed into one typed,
 * validated object. Every invalid value is reported as a {@linkcode ConfigError}
 * naming the flag, the environment variable, the value and what is allowed, and
 * the CLI turns it into exit code 2.
 *
 * @module
 */

export {
  type Config,
  ConfigError,
  LIBVIRT_SCHEMES,
  parseConfig,
  type RawConfig,
  type Setting,
  SETTINGS,
  V8_FLAGS,
} from "./config.ts";

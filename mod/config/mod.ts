/**
 * The agent's configuration: flags and environment parsed into one typed,
 * validated object. Every invalid value is reported as a {@linkcode ConfigError}
 * naming the flag, the environment variable, the value and what is allowed, and
 * the CLI turns it into exit code 2. And the cluster's: the KubeVirt CR's
 * `spec.configuration` read as KubeVirt's components read it (`kubevirt.ts`).
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
export {
  featureGateEnabled,
  GA_FEATURE_GATES,
  KUBEVIRT_DEFAULTS,
  KUBEVIRT_KEYS,
  type KubevirtConfig,
  KubevirtConfigError,
  type KubevirtConfigSource,
  type KubevirtKey,
  logLevelForVerbosity,
  parseKubevirtConfiguration,
  type Smbios,
  VGA_DISPLAY_EFI_ANNOTATION,
} from "./kubevirt.ts";

/**
 * The configuration itself: settings, validation and {@linkcode parseConfig}; the
 * folder's face is `mod.ts`.
 *
 * @module
 */
import {
  LOG_FILE_ENV,
  LOG_FORMATS,
  LOG_LEVELS,
  type LogFormat,
  type LogLevel,
} from "../log/mod.ts";

/** The validated configuration every role reads. */
export interface Config {
  /** The Kubernetes node this agent serves (`kubevirt.io/nodeName` label value). */
  nodeName: string;
  /** Path of the kubeconfig; undefined means in-cluster service account or none. */
  kubeconfig: string | undefined;
  /** libvirt connection URI the launchers and the labeller open. */
  libvirtUri: string;
  /** Persistent state (ghost records and the like). */
  stateDir: string;
  /** Runtime directory for sockets (KubeVirt's `/var/run/kubevirt`). */
  runDir: string;
  /** Lowest log level written. */
  logLevel: LogLevel;
  /** Log line format. */
  logFormat: LogFormat;
  /** A file to log to instead of standard error, size-bounded and rotated; none: stderr. */
  logFile?: string;
}

/** Raw values as the CLI received them (flags win over environment). */
export interface RawConfig {
  /** `--node-name` / `NODE_NAME`. */
  nodeName?: string;
  /** `--kubeconfig` / `KUBECONFIG`. */
  kubeconfig?: string;
  /** `--libvirt-uri` / `VIRTNODE_LIBVIRT_URI`. */
  libvirtUri?: string;
  /** `--state-dir` / `VIRTNODE_STATE_DIR`. */
  stateDir?: string;
  /** `--run-dir` / `VIRTNODE_RUN_DIR`. */
  runDir?: string;
  /** `--log-level` / `VIRTNODE_LOG_LEVEL`. */
  logLevel?: string;
  /** `--log-format` / `VIRTNODE_LOG_FORMAT`. */
  logFormat?: string;
  /** `--log-file` / `VIRTNODE_LOG_FILE`. */
  logFile?: string;
}

/** One configuration setting: its flag, its environment variable and its default. */
export interface Setting {
  /** The {@linkcode RawConfig} field the value goes to. */
  key: keyof RawConfig;
  /** The command-line flag, e.g. `--node-name`. */
  flag: string;
  /** The environment variable read when the flag is absent. */
  env: string;
  /** The `--help` text. */
  description: string;
  /** The value when neither flag nor environment sets one. */
  default?: () => string | undefined;
}

/** libvirt URI schemes the agent can use. */
export const LIBVIRT_SCHEMES = [
  "test",
  "test+unix",
  "qemu",
  "qemu+unix",
  "qemu+tcp",
  "qemu+tls",
  "qemu+ssh",
];

/** The settings, in the order `--help` lists them. */
export const SETTINGS: readonly Setting[] = [
  {
    key: "nodeName",
    flag: "--node-name",
    env: "NODE_NAME",
    description: "Kubernetes node this agent serves",
    default: () => Deno.hostname().toLowerCase(),
  },
  {
    key: "kubeconfig",
    flag: "--kubeconfig",
    env: "KUBECONFIG",
    description: "kubeconfig path (in-cluster service account when unset)",
  },
  {
    key: "libvirtUri",
    flag: "--libvirt-uri",
    env: "VIRTNODE_LIBVIRT_URI",
    description: "libvirt connection URI",
    default: () => "qemu:///system",
  },
  {
    key: "stateDir",
    flag: "--state-dir",
    env: "VIRTNODE_STATE_DIR",
    description: "directory for persistent state such as ghost records",
    default: () => "/var/lib/virtnode",
  },
  {
    key: "runDir",
    flag: "--run-dir",
    env: "VIRTNODE_RUN_DIR",
    description: "directory for runtime sockets",
    default: () => "/var/run/kubevirt",
  },
  {
    key: "logLevel",
    flag: "--log-level",
    env: "VIRTNODE_LOG_LEVEL",
    description: `lowest log level (${LOG_LEVELS.join(", ")})`,
    default: () => "info",
  },
  {
    key: "logFormat",
    flag: "--log-format",
    env: "VIRTNODE_LOG_FORMAT",
    description: "log format: json, text, or auto (text on a terminal)",
    default: () => "auto",
  },
  {
    key: "logFile",
    flag: "--log-file",
    env: LOG_FILE_ENV,
    description: "log to this file instead of standard error, rotated at 10 MiB (two old copies)",
  },
];

/** An invalid configuration value; the CLI exits with code 2 on it. */
export class ConfigError extends Error {
  /** The flag that carries the value. */
  readonly flag: string;
  /** The rejected value. */
  readonly value: string;
  /** What would have been accepted. */
  readonly allowed: string;

  /** Creates the error for `value` of `setting`, read from a flag or from the environment. */
  constructor(setting: Setting, value: string, allowed: string, source: "flag" | "env") {
    const from = source === "env" ? ` (from ${setting.env})` : "";
    super(`Invalid value ${JSON.stringify(value)} for ${setting.flag}${from}: allowed: ${allowed}`);
    this.name = "ConfigError";
    this.flag = setting.flag;
    this.value = value;
    this.allowed = allowed;
  }
}

const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

type Validator = (value: string) => string | undefined;

/** Returns what is allowed when the value is invalid, undefined when it is fine. */
const VALIDATORS: Record<keyof RawConfig, Validator> = {
  nodeName: (v) =>
    v.length <= 253 && DNS_SUBDOMAIN.test(v)
      ? undefined
      : "a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', at most 253 characters)",
  kubeconfig: (v) => v.trim() !== "" ? undefined : "a non-empty path",
  libvirtUri: (v) => {
    const scheme = /^([a-z][a-z0-9+.-]*):\/\//.exec(v)?.[1];
    return scheme && LIBVIRT_SCHEMES.includes(scheme)
      ? undefined
      : `a libvirt URI with scheme ${LIBVIRT_SCHEMES.join(", ")} (e.g. qemu:///system)`;
  },
  stateDir: absolutePath,
  runDir: absolutePath,
  logLevel: (v) =>
    (LOG_LEVELS as readonly string[]).includes(v) ? undefined : LOG_LEVELS.join(", "),
  logFormat: (v) =>
    (LOG_FORMATS as readonly string[]).includes(v) ? undefined : LOG_FORMATS.join(", "),
  logFile: absolutePath,
};

function absolutePath(v: string): string | undefined {
  return v.startsWith("/") && !v.split("/").includes("..")
    ? undefined
    : "an absolute path without '..'";
}

/**
 * Builds the configuration from flags, then environment, then defaults.
 *
 * @throws {ConfigError} on the first invalid value.
 */
export function parseConfig(
  flags: RawConfig,
  env: Record<string, string | undefined> = Deno.env.toObject(),
): Config {
  const out: Record<string, string | undefined> = {};
  for (const setting of SETTINGS) {
    const fromFlag = flags[setting.key];
    const fromEnv = env[setting.env];
    const source = fromFlag !== undefined ? "flag" : "env";
    const value = fromFlag ?? (fromEnv === "" ? undefined : fromEnv) ?? setting.default?.();
    if (value !== undefined) {
      const allowed = VALIDATORS[setting.key](value);
      if (allowed !== undefined) throw new ConfigError(setting, value, allowed, source);
    }
    out[setting.key] = value;
  }
  return {
    nodeName: out.nodeName!,
    kubeconfig: out.kubeconfig,
    libvirtUri: out.libvirtUri!,
    stateDir: out.stateDir!.replace(/\/+$/, "") || "/",
    runDir: out.runDir!.replace(/\/+$/, "") || "/",
    logLevel: out.logLevel as LogLevel,
    logFormat: out.logFormat as LogFormat,
    logFile: out.logFile,
  };
}

/**
 * V8 flags of every virtnode process. Lite mode runs JavaScript in the interpreter only
 * (no JIT code, 1 MB young generation): a launcher's anonymous memory drops from 42 to
 * 35 MB and an idle handler's from 60 to 42 MB with 20 VMIs, and both use less CPU
 * (nothing gets compiled twice). The `compile` task in deno.json bakes the same flags
 * into the binary; `deno run` needs them on its command line.
 */
export const V8_FLAGS = "--lite-mode";

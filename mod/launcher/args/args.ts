/**
 * Command line of `virtnode launcher`: `--namespace --name --uid --socket-dir
 * --libvirt-uri --notify-socket --grace-period` and the converter's directories.
 * The handler writes it ({@linkcode formatLauncherArgs}) and the launcher reads it
 * ({@linkcode parseLauncherArgs}); a round trip gives back the same options.
 *
 * @module
 */

import { DEFAULT_GRACE_PERIOD_SECONDS, Paths } from "../../api/mod.ts";

/** Everything {@linkcode runLauncher} needs, as parsed from the command line. */
export interface LauncherOptions {
  /** The VMI's namespace. */
  namespace: string;
  /** The VMI's name. */
  name: string;
  /** The VMI's UID. */
  uid: string;
  /** Directory of `launcher-init-sock` / `launcher-sock` (KubeVirt: `/var/run/kubevirt/sockets`). */
  socketDir: string;
  /** libvirt URI; `qemu:///system` unless told. */
  libvirtUri: string;
  /** The handler's notify socket; without it no events are sent. */
  notifySocket?: string;
  /** Seconds a guest gets to shut down after SIGTERM before it is destroyed. */
  gracePeriodSeconds: number;
  /** The VMI's private run directory (serial console and VNC sockets). */
  runDir: string;
  /** Writable per-VMI directory for overlays, empty disks, ISOs, NVRAM. */
  diskDir: string;
  /** Directory of local containerDisk images. */
  imageDir: string;
  /** The only directory hostDisk paths may point into; hostDisk is refused without it. */
  hostDiskRoot?: string;
  /** `kvm` or `qemu`; detected from `/dev/kvm` unless told. */
  domainType?: "kvm" | "qemu";
  /** Directory of the OVMF firmware files. */
  ovmfDir?: string;
  /**
   * Where the migration's sockets are (`<dir>/migrationproxy`); KubeVirt's share folder of
   * the pod, `/var/run/kubevirt`, unless told (tests).
   */
  migrationSocketDir?: string;
}

/** A bad or missing command line argument. */
export class LauncherArgsError extends Error {
  /** The argument at fault, e.g. `--grace-period`. */
  readonly argument: string;
  /** Creates `Invalid argument "<arg>": <detail>`. */
  constructor(argument: string, detail: string, options?: ErrorOptions) {
    super(`Invalid argument "${argument}": ${detail}`, options);
    this.name = "LauncherArgsError";
    this.argument = argument;
  }
}

/** Each flag with its value's name and what it sets; the required ones first. */
const FLAG_HELP = [
  ["--namespace", "N", "the VMI's namespace (required)"],
  ["--name", "V", "the VMI's name (required)"],
  ["--uid", "U", "the VMI's UID (required)"],
  ["--socket-dir", "D", "where launcher-init-sock and launcher-sock are made (required)"],
  ["--libvirt-uri", "URI", "libvirt connection URI (qemu:///system)"],
  ["--notify-socket", "P", "the handler's notify socket; without it no events are sent"],
  [
    "--grace-period",
    "S",
    `seconds a guest gets to shut down after SIGTERM (${DEFAULT_GRACE_PERIOD_SECONDS})`,
  ],
  ["--run-dir", "D", "the VMI's private run folder: console and VNC sockets"],
  ["--disk-dir", "D", "writable per-VMI folder: overlays, empty disks, ISOs, NVRAM"],
  ["--image-dir", "D", "folder of local containerDisk images"],
  ["--host-disk-root", "D", "the only folder hostDisk paths may point into (none: refused)"],
  ["--domain-type", "T", "kvm or qemu (from /dev/kvm when not given)"],
  ["--ovmf-dir", "D", "folder of the OVMF firmware files"],
  ["--migration-socket-dir", "D", "where the migration's sockets are (/var/run/kubevirt)"],
] as const;
const FLAGS = FLAG_HELP.map(([flag]) => flag);
type Flag = typeof FLAG_HELP[number][0];

/** `virtnode launcher --help`: the flags {@linkcode parseLauncherArgs} takes. */
export const LAUNCHER_USAGE: string = [
  "Usage: virtnode launcher --namespace N --name V --uid U --socket-dir D [options]",
  "",
  "run one VMI's launcher (KubeVirt's virt-launcher role): its cmd server, its domain and",
  "the events it sends the handler",
  "",
  "Options (--flag value or --flag=value):",
  ...FLAG_HELP.map(([flag, value, help]) => `  ${`${flag} ${value}`.padEnd(28)}${help}`),
  `  ${"-h, --help".padEnd(28)}this text`,
].join("\n");

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const UID = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;

function absolutePath(flag: Flag, value: string): string {
  if (!value.startsWith("/")) {
    throw new LauncherArgsError(flag, `"${value}" is not an absolute path`);
  }
  if (value.split("/").includes("..")) {
    throw new LauncherArgsError(flag, `"${value}" must not contain ".."`);
  }
  return value.length > 1 ? value.replace(/\/+$/, "") : value;
}

/**
 * Parses `virtnode launcher` arguments (`--flag value` or `--flag=value`). Throws
 * {@linkcode LauncherArgsError} naming the first bad argument.
 */
export function parseLauncherArgs(args: readonly string[]): LauncherOptions {
  const values = new Map<Flag, string>();
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    const eq = arg.indexOf("=");
    const flag = (eq > 0 ? arg.slice(0, eq) : arg) as Flag;
    if (!(FLAGS as readonly string[]).includes(flag)) {
      throw new LauncherArgsError(flag, arg.startsWith("--") ? "unknown flag" : "unexpected value");
    }
    let value: string | undefined;
    if (eq > 0) value = arg.slice(eq + 1);
    else {
      value = args[i + 1];
      if (value === undefined || value.startsWith("--")) {
        throw new LauncherArgsError(flag, "missing value");
      }
      i++;
    }
    if (values.has(flag)) throw new LauncherArgsError(flag, "given more than once");
    values.set(flag, value);
  }
  const required = (flag: Flag): string => {
    const value = values.get(flag);
    if (value === undefined || value === "") throw new LauncherArgsError(flag, "required");
    return value;
  };

  const namespace = required("--namespace");
  if (!DNS_LABEL.test(namespace) || namespace.length > 63) {
    throw new LauncherArgsError("--namespace", `"${namespace}" is not a valid namespace`);
  }
  const name = required("--name");
  if (!DNS_SUBDOMAIN.test(name) || name.length > 253) {
    throw new LauncherArgsError("--name", `"${name}" is not a valid VMI name`);
  }
  const uid = required("--uid");
  if (!UID.test(uid) || uid.length > 128) {
    throw new LauncherArgsError("--uid", `"${uid}" is not a valid UID`);
  }
  const socketDir = absolutePath("--socket-dir", required("--socket-dir"));
  const libvirtUri = values.get("--libvirt-uri") ?? "qemu:///system";
  if (!/^[a-z][a-z0-9+.-]*:\/\//.test(libvirtUri)) {
    throw new LauncherArgsError("--libvirt-uri", `"${libvirtUri}" is not a libvirt URI`);
  }
  const notifySocket = values.has("--notify-socket")
    ? absolutePath("--notify-socket", required("--notify-socket"))
    : undefined;
  const graceText = values.get("--grace-period") ?? String(DEFAULT_GRACE_PERIOD_SECONDS);
  if (!/^\d+$/.test(graceText) || Number(graceText) > 86_400 * 365) {
    throw new LauncherArgsError(
      "--grace-period",
      `"${graceText}" is not a whole number of seconds`,
    );
  }
  const domainType = values.get("--domain-type");
  if (domainType !== undefined && domainType !== "kvm" && domainType !== "qemu") {
    throw new LauncherArgsError("--domain-type", `"${domainType}" is neither "kvm" nor "qemu"`);
  }
  const optionalPath = (flag: Flag) =>
    values.has(flag) ? absolutePath(flag, required(flag)) : undefined;

  return {
    namespace,
    name,
    uid,
    socketDir,
    libvirtUri,
    notifySocket,
    gracePeriodSeconds: Number(graceText),
    runDir: optionalPath("--run-dir") ?? `${Paths.VirtPrivateDir}/${uid}`,
    diskDir: optionalPath("--disk-dir") ?? `${Paths.EphemeralDiskDir}/${uid}`,
    imageDir: optionalPath("--image-dir") ?? Paths.ContainerDiskDir,
    hostDiskRoot: optionalPath("--host-disk-root"),
    domainType,
    ovmfDir: optionalPath("--ovmf-dir"),
    migrationSocketDir: optionalPath("--migration-socket-dir"),
  };
}

/** The flag of each option, in the order {@linkcode formatLauncherArgs} writes them. */
const FLAG_OF: Readonly<Record<keyof LauncherOptions, Flag>> = {
  namespace: "--namespace",
  name: "--name",
  uid: "--uid",
  socketDir: "--socket-dir",
  libvirtUri: "--libvirt-uri",
  notifySocket: "--notify-socket",
  gracePeriodSeconds: "--grace-period",
  runDir: "--run-dir",
  diskDir: "--disk-dir",
  imageDir: "--image-dir",
  hostDiskRoot: "--host-disk-root",
  domainType: "--domain-type",
  ovmfDir: "--ovmf-dir",
  migrationSocketDir: "--migration-socket-dir",
};

/**
 * Writes the command line that {@linkcode parseLauncherArgs} reads back into the same
 * options: every option that is set, as `--flag value`. Throws
 * {@linkcode LauncherArgsError} for options the parser would refuse.
 */
export function formatLauncherArgs(options: LauncherOptions): string[] {
  const args: string[] = [];
  for (const [key, flag] of Object.entries(FLAG_OF) as [keyof LauncherOptions, Flag][]) {
    const value = options[key];
    if (value === undefined) continue;
    args.push(flag, String(value));
  }
  // The parser is the one definition of what is valid: refuse here what it would refuse.
  parseLauncherArgs(args);
  return args;
}

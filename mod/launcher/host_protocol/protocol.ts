/**
 * What the handler and the launcher host say to each other over the host's control
 * socket (see `mod/launcher/host.ts`): the spec of a VMI to serve, its status, the host's
 * settings, and line framing. The handler imports this without the launcher itself.
 *
 * @module
 */

/** What the handler asks the host to serve for one VMI. */
export interface HostedVmSpec {
  /** The VMI's namespace. */
  namespace: string;
  /** The VMI's name. */
  name: string;
  /** The VMI's UID. */
  uid: string;
  /** Seconds the guest gets to shut down on `stop`. */
  gracePeriodSeconds: number;
  /** Directory of the VMI's cmd socket. */
  socketDir: string;
  /** The VMI's private run directory. */
  runDir: string;
  /** Writable per-VMI directory for overlays, empty disks, ISOs, NVRAM. */
  diskDir: string;
  /**
   * The VM's pod network namespace (a pinned namespace file), when the VMI has a
   * pod-network interface: its DHCP servers listen there, and its taps, made in the host's
   * namespace, are named by `hostTapFor`.
   */
  netns?: string;
  /** containerDisk base images the handler stored (pod-less mode's OCI images), by volume name. */
  containerDisks?: Record<string, string>;
}

/** A hosted VMI as `start` and `list` report it. */
export interface HostedVmStatus {
  /** The VMI's UID. */
  uid: string;
  /** `starting` until the cmd socket is ready; `exited` once the domain died unrequested. */
  state: "starting" | "ready" | "stopping" | "exited";
  /** The cmd socket (`<socketDir>/launcher-sock`). */
  socket: string;
  /** For `exited`: the exit code a launcher process would have had. */
  code?: number;
  /** For `exited`: why. */
  why?: string;
  /** The stored containerDisk files the VMI's domain reads (pod-less mode's store). */
  containerDisks?: string[];
  /** The host CPUs the host's pool gave the VMI (`dedicatedCpuPlacement`), ascending. */
  dedicatedCpus?: number[];
}

/** Options of `runLauncherHost`. */
export interface LauncherHostOptions {
  /** The host's directory: `control.sock` and `vms/`. */
  dir: string;
  /** libvirt URI. */
  libvirtUri: string;
  /** The handler's notify socket; without it no events are sent. */
  notifySocket?: string;
  /** Directory of local containerDisk images. */
  imageDir: string;
  /** The only directory hostDisk paths may point into. */
  hostDiskRoot?: string;
  /** `kvm` or `qemu`; detected from `/dev/kvm` unless told. */
  domainType?: "kvm" | "qemu";
  /** Directory of the OVMF firmware files. */
  ovmfDir?: string;
  /** Most libvirt call workers (V8 isolates of about 10 MB; two always run); 8 unless told. */
  maxWorkers?: number;
  /**
   * The folder of the handler's migration proxy sockets (`migrationproxy/` in it) as
   * libvirtd and QEMU see it; KubeVirt's `/var/run/kubevirt` unless told.
   */
  migrationSocketDir?: string;
}

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
/** The UIDs the host accepts. */
export const UID = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;

/** A spec the host refuses. */
export class HostedVmSpecError extends Error {
  /** Creates `Invalid launcher spec: <detail>`. */
  constructor(detail: string) {
    super(`Invalid launcher spec: ${detail}`);
    this.name = "HostedVmSpecError";
  }
}

/** Checks a spec from the control socket or a file; returns it typed or throws. */
export function checkHostedVmSpec(raw: unknown): HostedVmSpec {
  if (typeof raw !== "object" || raw === null) throw new HostedVmSpecError("not an object");
  const r = raw as Record<string, unknown>;
  const text = (key: string, pattern?: RegExp): string => {
    const v = r[key];
    if (typeof v !== "string" || v === "") throw new HostedVmSpecError(`${key} is missing`);
    if (pattern && !pattern.test(v)) throw new HostedVmSpecError(`${key} "${v}" is not valid`);
    return v;
  };
  const path = (key: string): string => {
    const v = text(key);
    if (!v.startsWith("/") || v.split("/").includes("..")) {
      throw new HostedVmSpecError(`${key} "${v}" is not an absolute path without ".."`);
    }
    return v;
  };
  const disks = (raw: unknown): Record<string, string> => {
    if (typeof raw !== "object" || raw === null || Array.isArray(raw)) {
      throw new HostedVmSpecError("containerDisks is not an object");
    }
    for (const [name, file] of Object.entries(raw)) {
      if (typeof file !== "string" || !file.startsWith("/") || file.split("/").includes("..")) {
        throw new HostedVmSpecError(`containerDisks.${name} is not an absolute path without ".."`);
      }
    }
    return raw as Record<string, string>;
  };
  const grace = r.gracePeriodSeconds;
  if (typeof grace !== "number" || !Number.isInteger(grace) || grace < 0) {
    throw new HostedVmSpecError(
      `gracePeriodSeconds ${JSON.stringify(grace)} is not a whole number`,
    );
  }
  return {
    namespace: text("namespace", DNS_LABEL),
    name: text("name", DNS_SUBDOMAIN),
    uid: text("uid", UID),
    gracePeriodSeconds: grace,
    socketDir: path("socketDir"),
    runDir: path("runDir"),
    diskDir: path("diskDir"),
    ...(r.netns === undefined ? {} : { netns: path("netns") }),
    ...(r.containerDisks === undefined ? {} : { containerDisks: disks(r.containerDisks) }),
  };
}

/** The lines of a byte stream (without their newlines). */
export async function* readLines(stream: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  const decoder = new TextDecoder();
  let buffered = "";
  for await (const chunk of stream) {
    buffered += decoder.decode(chunk, { stream: true });
    let newline: number;
    while ((newline = buffered.indexOf("\n")) >= 0) {
      yield buffered.slice(0, newline);
      buffered = buffered.slice(newline + 1);
    }
  }
  buffered += decoder.decode();
  if (buffered !== "") yield buffered;
}

/** Writes all of `bytes` (a socket's `write` may take fewer at a time). */
export async function writeAll(
  writer: { write(p: Uint8Array): Promise<number> },
  bytes: Uint8Array,
): Promise<void> {
  for (let done = 0; done < bytes.length;) done += await writer.write(bytes.subarray(done));
}

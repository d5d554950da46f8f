/**
 * Pod-less mode's {@linkcode LauncherProvider}: no kubelet, no virt-controller. The
 * handler starts one launcher host (`virtnode launcher-host`) on this host and asks it,
 * over its control socket, to serve each VMI's launcher; it plays virt-controller's part
 * too: it schedules Pending VMIs to this node and owns their `Ready` condition.
 *
 * The host is started like a launcher was: in its own session, with a PID file whose
 * process is checked behind a pidfd, so that neither the handler's death nor a signal to
 * its terminal stops a VM, and a restarted handler finds the running host instead of
 * starting a second one. The handler supervises it: a host that exits is started again
 * (1 s, doubling to 30 s), and the new host takes every VMI back from its own records
 * with no status change. A VMI's ghost record is written before the host is asked to
 * serve it. A launcher whose domain died is reported by the host and fails its VMI
 * (restart policy none, as for a pod).
 *
 * @module
 */
import { PodlessProber, type ProberOptions } from "./prober.ts";
import type { VirtualMachineOptions } from "../../proto/mod.ts";
import { join } from "node:path";
import { errorText } from "../../../ffi/mod.ts";
import {
  type ClaimInfo,
  DOWNWARD_METRICS_VMI_SOCKET,
  SocketNames,
  type VirtualMachineInstance,
  vmiKey,
  type Volume,
} from "../../api/mod.ts";
import { orAborted, removeIfPresent, sleep } from "../../lifecycle/mod.ts";
import type { HostedVmStatus, LauncherHostOptions } from "../../launcher/host_protocol/mod.ts";
import { getLogger } from "../../log/mod.ts";
import {
  claimNameOf,
  type ContainerDiskStore,
  type HostClaim,
  HostClaimError,
  isHotplugVolume,
  VolumeError,
} from "../../storage/mod.ts";
import {
  hostTapFor,
  hostTapName,
  parseNetworkConfig,
  POD_INTERFACE,
  type PodlessNetworks,
  podNetworkPlan,
  type PodNetworkTarget,
  type SecondaryAttachment,
} from "../../network/mod.ts";
import { scheduledStatus } from "./scheduler.ts";
import {
  type CredentialSecrets,
  hasAgentCredentials,
  readCredentialSecrets,
  type SecretReader,
} from "./credentials.ts";
import type { GhostRecordStore } from "../ghost_records.ts";
import {
  type ControllerStandIn,
  type LauncherProvider,
  launchersOfGhostRecords,
  type LauncherStart,
  type MigrationSourceDir,
} from "../launcher_provider.ts";
import { migrationPorts, proxyKey, type ProxyTarget } from "../../migration/mod.ts";
import { LauncherSpawner } from "./spawner.ts";
import { dialDirectly, type DialResolver, LAUNCHER_TIMEOUTS } from "../launcher_clients.ts";
import { LauncherHostClient } from "./host_client.ts";
import { gracePeriodSeconds } from "../_vmi.ts";
import { type BeneathSocket, openSocketBeneath } from "../../../ffi/mod.ts";

const log = getLogger("handler", "podless");

/**
 * How soon a VMI whose launcher is not served yet is looked at again, ms; the provider
 * wakes it as soon as the host is back.
 */
export const PODLESS_NOT_READY_REQUEUE_MS = 1_000;

/**
 * How often the Secrets of running VMIs' access credentials are read again and handed to
 * the host, ms (the kubelet refreshes a pod's Secret volumes about this often).
 */
export const CREDENTIALS_REFRESH_MS = 60_000;

/** Extra time, beyond the VMI's grace period, a launcher gets to stop its guest. */
export const LAUNCHER_STOP_EXTRA_MS = 5_000;

/** The launcher host's settings that {@linkcode PodlessLaunchers} passes on. */
export type HostSettings = Omit<LauncherHostOptions, "dir">;

/** Options of {@linkcode PodlessLaunchers}. */
export interface PodlessLaunchersOptions {
  /** The ghost record store the handler keeps. */
  ghosts: GhostRecordStore;
  /** Where launcher sockets go: `<socketRoot>/<uid>/launcher-sock`. */
  socketRoot: string;
  /** The handler's state directory (the host's directory, PID file and log go below it). */
  stateDir: string;
  /** Per-VMI run directories go below it. */
  runRoot: string;
  /** Per-VMI disk directories go below it. */
  diskRoot: string;
  /** The launcher host's settings. */
  host: HostSettings;
  /** The command line that runs `virtnode launcher-host` with these options. */
  hostCommand(options: LauncherHostOptions & { hostId: string }): { cmd: string; args: string[] };
  /** Wakes a VMI's key (the host is back, or its launcher is served). */
  wake(key: string): void;
  /** Tells that a VMI's launcher ended (its domain died). */
  exited(uid: string, why: string): void;
  /**
   * Runs the VMIs' readiness and liveness probes, the kubelet's part (prober.ts); none: the
   * probes are not run and a VMI is ready once its guest runs.
   */
  probes?: Omit<ProberOptions, "wake">;
  /** First wait before restarting a host that exited, ms (1 s; doubles to 30 s). */
  restartBackoffMs?: number;
  /** The VMs' pod networks (namespaces from the CNI plugins); none: no pod network on this host. */
  networks?: PodlessNetworks;
  /**
   * Reads a NetworkAttachmentDefinition's CNI configuration (`spec.config`) for a secondary
   * network (the handler's client); none: a VMI with a secondary network fails its sync.
   */
  networkAttachments?: (namespace: string, name: string) => Promise<string>;
  /** containerDisks from OCI images on this host; none: only the launcher's image directory. */
  containerDisks?: ContainerDiskStore;
  /**
   * Finds a hotplugged claim on this host (`resolveHostClaim`; `folder`: a memory dump's);
   * none: hotplug is refused.
   */
  claims?: (
    ref: { namespace: string; name: string },
    use: { folder?: boolean },
  ) => Promise<HostClaim>;
  /**
   * Reads the Secrets of VMIs' access credentials (the handler's client); none: a VMI with
   * agent-propagated access credentials fails its sync.
   */
  secrets?: SecretReader;
  /**
   * Live migration on this host: where the proxy's sockets go (the folder the launcher host
   * gives libvirt as its migration socket folder, as the handler reaches it) and libvirtd's
   * socket (the target's listener carries the source libvirt's connection there).
   */
  migration?: { socketDir: string; libvirtSocket: string };
}

/**
 * virt-controller's part as pod-less mode plays it; `claims` gives a VMI's hotplugged
 * volumes' claim info found on this host.
 */
export function podlessStandIn(
  claims: (uid: string) => ReadonlyMap<string, ClaimInfo>,
  prober?: PodlessProber,
): ControllerStandIn {
  return {
    facts: (vmi, guest) => ({
      hotplugClaims: claims(vmi.metadata.uid!),
      podInterfaceName: POD_INTERFACE,
      readiness: prober?.observe(vmi, guest),
    }),
    scheduledStatus,
  };
}

/**
 * The VMI's hotplugged claims, with the field each is named at; `dump`: a memory dump's
 * (`virtctl memory-dump`), whose folder the dump is written into.
 */
function hotplugClaims(
  vmi: VirtualMachineInstance,
): { name: string; claim: string; field: string; dump: boolean }[] {
  return (vmi.spec.volumes ?? []).flatMap((volume, i) => {
    const claim = claimNameOf(volume) ?? volume.memoryDump?.claimName;
    if (claim === undefined || !isHotplugVolume(vmi, volume)) return [];
    const field = volume.persistentVolumeClaim
      ? `spec.volumes[${i}].persistentVolumeClaim.claimName`
      : volume.dataVolume
      ? `spec.volumes[${i}].dataVolume.name`
      : `spec.volumes[${i}].memoryDump.claimName`;
    return [{ name: volume.name, claim, field, dump: volume.memoryDump !== undefined }];
  });
}

/** Whether a VMI has an interface on the pod network (a spec the plan refuses counts as none). */
function hasPodNetwork(vmi: VirtualMachineInstance): boolean {
  try {
    return podNetworkPlan(vmi).length > 0;
  } catch {
    return false;
  }
}

/** The launcher host's identifier for a state directory (in its command line and files). */
export function launcherHostId(stateDir: string): string {
  // FNV-1a: short, stable, and distinct for the handlers of one machine (tests run several).
  let hash = 0x811c9dc5;
  for (const byte of new TextEncoder().encode(stateDir)) {
    hash = Math.imul(hash ^ byte, 0x01000193) >>> 0;
  }
  return `host-${hash.toString(16).padStart(8, "0")}`;
}

/** How often the handler asks the launcher host whether it is alive (KubeVirt's monitor: 11 s). */
const HOST_PING_MS = 11_000;
/** How long one ping may take. */
const HOST_PING_TIMEOUT_MS = 5_000;
/** A host silent this long is hung (KubeVirt: a launcher silent for 30 s is unresponsive). */
const HOST_HUNG_MS = 30_000;

/** How long a start waits for the host's control connection before it asks to be woken. */
const CONNECT_WAIT_MS = 2_000;

/** Launchers served by one launcher host process. */
export class PodlessLaunchers implements LauncherProvider {
  /** For logs. */
  readonly name = "podless";
  /** The handler schedules Pending VMIs and owns `Ready` here. */
  /** Pod-less mode plays virt-controller's part; see {@linkcode ControllerStandIn}. */
  readonly standIn: ControllerStandIn;
  /** Runs the VMIs' probes, when asked to. */
  readonly #prober?: PodlessProber;
  /** The host reports every launcher that ends, and is pinged itself. */
  readonly watchesLaunchers = true;
  /** See {@linkcode PODLESS_NOT_READY_REQUEUE_MS}. */
  readonly notReadyRequeueMs: number = PODLESS_NOT_READY_REQUEUE_MS;
  /** Sockets live in directories the handler made (0700) for the host it started. */
  readonly dialResolver: DialResolver = dialDirectly;
  /** The host's identifier. */
  readonly hostId: string;
  /** The host's directory. */
  readonly hostDir: string;
  readonly #o: PodlessLaunchersOptions;
  readonly #spawner: LauncherSpawner;
  /** What the host serves, as it last said. */
  readonly #served = new Map<string, HostedVmStatus>();
  /** The stored containerDisks of VMIs being started, by UID (not served yet). */
  readonly #starting = new Map<string, string[]>();
  /** The hotplugged claims found on this host, by VMI UID and volume name. */
  readonly #hostClaims = new Map<string, Map<string, HostClaim>>();
  /** The VMIs whose access credentials are handed to the host again and again, by UID. */
  readonly #credentialVmis = new Map<string, VirtualMachineInstance>();
  /** Keys to wake once the host is connected. */
  readonly #waiting = new Set<string>();
  #client: LauncherHostClient | undefined;
  #connected: Promise<void>;
  #setConnected!: () => void;
  /** Whether the host's list was read since the last (re)connect. */
  #listed = false;

  /** Creates the provider; the host starts when {@linkcode run} does. */
  constructor(options: PodlessLaunchersOptions) {
    this.#o = options;
    this.#prober = options.probes
      ? new PodlessProber({ ...options.probes, wake: (key) => options.wake(key) })
      : undefined;
    this.standIn = podlessStandIn((uid) => this.#hotplugClaims(uid), this.#prober);
    this.hostId = launcherHostId(options.stateDir);
    this.hostDir = join(options.stateDir, "launcher-host");
    this.#connected = new Promise((resolve) => this.#setConnected = resolve);
    this.#spawner = new LauncherSpawner({
      stateDir: options.stateDir,
      identity: { subcommand: "launcher-host", keyFlag: "--host-id" },
      command: () =>
        options.hostCommand({ ...options.host, dir: this.hostDir, hostId: this.hostId }),
    });
  }

  /** The PID of the running launcher host, if one runs. */
  hostPid(): Promise<number | undefined> {
    return this.#spawner.alivePid(this.hostId);
  }

  /** The log file of the launcher host. */
  get hostLog(): string {
    return this.#spawner.logFile(this.hostId);
  }

  #socketDir(uid: string): string {
    return join(this.#o.socketRoot, uid);
  }

  /** The ghost record's socket, once the host serves (or served) the VMI. */
  socketOf(vmi: VirtualMachineInstance): Promise<string | undefined> {
    const uid = vmi.metadata.uid!;
    const socket = this.#o.ghosts.get(uid)?.socketFile;
    return Promise.resolve(socket && this.#served.has(uid) ? socket : undefined);
  }

  async #whenConnected(timeoutMs: number): Promise<LauncherHostClient | undefined> {
    if (this.#client?.open && this.#listed) return this.#client;
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([
      this.#connected,
      new Promise((resolve) => timer = setTimeout(resolve, timeoutMs)),
    ]);
    clearTimeout(timer);
    return this.#client?.open && this.#listed ? this.#client : undefined;
  }

  /**
   * Asks the host to serve the VMI's launcher (idempotent); waits for the host if it is
   * away. With `sync`, a launcher not served yet is started and synced in one control
   * request; a served one is left for the caller to sync over its cmd socket.
   */
  async start(
    vmi: VirtualMachineInstance,
    sync?: { vmi: VirtualMachineInstance; options?: VirtualMachineOptions },
  ): Promise<LauncherStart> {
    const uid = vmi.metadata.uid!;
    const known = this.#served.get(uid);
    if (known && known.state !== "starting") return { socket: known.socket };
    const client = await this.#whenConnected(CONNECT_WAIT_MS);
    if (!client) {
      this.#waiting.add(vmiKey(vmi.metadata));
      return { waiting: "the launcher host is not running yet" };
    }
    // The Secrets of its access credentials, then the images: one that cannot be had fails
    // the sync before anything is served.
    const secrets = hasAgentCredentials(vmi) ? await this.#readSecrets(vmi) : undefined;
    const containerDisks = await this.#o.containerDisks?.prepare(vmi) ?? {};
    // Until the host serves it, the store's collector learns of its disks from here.
    this.#starting.set(uid, Object.values(containerDisks));
    const socketDir = this.#socketDir(uid);
    const socket = join(socketDir, SocketNames.Launcher);
    await this.#o.ghosts.add({
      name: vmi.metadata.name,
      namespace: vmi.metadata.namespace!,
      socketFile: socket,
      uid,
    });
    log.info("Asking the launcher host to serve the VMI", {
      namespace: vmi.metadata.namespace,
      name: vmi.metadata.name,
      uid,
    });
    const spec = {
      namespace: vmi.metadata.namespace!,
      name: vmi.metadata.name,
      uid,
      gracePeriodSeconds: gracePeriodSeconds(vmi),
      socketDir,
      runDir: join(this.#o.runRoot, uid),
      diskDir: join(this.#o.diskRoot, uid),
      ...(this.#o.networks && hasPodNetwork(vmi) ? { netns: this.#o.networks.netnsPath(uid) } : {}),
      ...(Object.keys(containerDisks).length > 0 ? { containerDisks } : {}),
    };
    let started;
    try {
      started = sync
        ? await client.startAndSync(
          spec,
          JSON.stringify(sync.vmi),
          LAUNCHER_TIMEOUTS.sync,
          sync.options,
        )
        : { status: await client.start(spec), synced: undefined };
    } finally {
      this.#starting.delete(uid);
    }
    const { status, synced } = started;
    this.#served.set(uid, { ...status, containerDisks: Object.values(containerDisks) });
    if (status.state === "exited") this.#o.exited(uid, status.why ?? "the launcher ended");
    if (secrets && status.state !== "exited") {
      this.#credentialVmis.set(uid, vmi);
      await this.#handCredentials(client, vmi, secrets);
    }
    return synced ? { socket: status.socket, synced } : { socket: status.socket };
  }

  /** The host stops the guest (ACPI, then destroy after the grace period) and forgets it. */
  async stop(vmi: VirtualMachineInstance): Promise<void> {
    const uid = vmi.metadata.uid!;
    // Its probes end with it, also when the VMI itself is already gone.
    this.#prober?.forget(uid);
    const client = await this.#whenConnected(10_000);
    if (!client) throw new Error("the launcher host is not running; cannot stop the VMI's guest");
    // The host also removes the domain a launcher that ended left for inspection.
    await client.stop(uid, gracePeriodSeconds(vmi) * 1000 + LAUNCHER_STOP_EXTRA_MS, {
      namespace: vmi.metadata.namespace,
      name: vmi.metadata.name,
    });
    this.#served.delete(uid);
    this.#hostClaims.delete(uid);
    this.#credentialVmis.delete(uid);
    await this.#collectContainerDisks();
    // What the VMI had on this host: its socket directory, its run directory (DHCP facts,
    // console sockets) and its disks (overlays, empty disks, cloud-init ISOs, NVRAM).
    for (
      const dir of [this.#socketDir(uid), join(this.#o.runRoot, uid), join(this.#o.diskRoot, uid)]
    ) {
      await Deno.remove(dir, { recursive: true }).catch((error) => {
        if (!(error instanceof Deno.errors.NotFound)) throw error;
      });
    }
  }

  /** libvirtd's socket, then QEMU's incoming sockets in the migration socket folder. */
  migrationTargets(vmi: VirtualMachineInstance): Promise<ProxyTarget[]> {
    const m = this.#migration();
    const uid = vmi.metadata.uid!;
    // Folders this handler (and libvirtd, as root) made: nobody else's links are on the way.
    const at = (path: string) => () => Promise.resolve({ path, release() {} });
    return Promise.resolve([
      { port: 0, open: at(m.libvirtSocket) },
      ...migrationPorts(vmi.status?.migrationMethod === "BlockMigration").map((port) => ({
        port,
        open: at(join(m.socketDir, "migrationproxy", `${proxyKey(uid, port)}-source.sock`)),
      })),
    ]);
  }

  /** What the launcher host's CPU pool gave the VMI (its target launcher's claim). */
  async dedicatedCpus(vmi: VirtualMachineInstance): Promise<number[] | undefined> {
    const client = await this.#whenConnected(5_000);
    const hosted = (await client?.list())?.find((v) => v.uid === vmi.metadata.uid);
    return hosted?.dedicatedCpus;
  }

  /** The migration socket folder; the proxy makes `migrationproxy/` in it. */
  migrationSourceDir(): Promise<MigrationSourceDir> {
    return Promise.resolve({ baseDir: this.#migration().socketDir, release() {} });
  }

  #migration(): { socketDir: string; libvirtSocket: string } {
    const m = this.#o.migration;
    if (!m) throw new Error("live migration is not set up on this host");
    return m;
  }

  /** Nothing: the launcher host reads the disks (containerDisks come from the store at start). */
  prepareDisks(): Promise<"ready"> {
    return Promise.resolve("ready");
  }

  /**
   * Finds each hotplugged claim of the VMI on this host, once per volume (no attachment
   * pod: the claim's PersistentVolume is a path under the host disk root, which the launcher
   * host attaches as it is). A claim that cannot be found fails the sync naming its field.
   */
  async hotplug(vmi: VirtualMachineInstance): Promise<void> {
    // A running VMI this handler has not handed credentials yet (it restarted): now, and
    // again every CREDENTIALS_REFRESH_MS.
    if (hasAgentCredentials(vmi) && !this.#credentialVmis.has(vmi.metadata.uid!)) {
      this.#credentialVmis.set(vmi.metadata.uid!, vmi);
      void this.#refreshCredentials(vmi.metadata.uid!);
    }
    const wanted = hotplugClaims(vmi);
    if (wanted.length === 0) return;
    const uid = vmi.metadata.uid!;
    const found = this.#hostClaims.get(uid) ?? new Map<string, HostClaim>();
    for (const { name, claim, field, dump } of wanted) {
      // Known already, for this claim (a volume removed and added back may name another).
      if (found.get(name)?.claimInfo.claimName === claim) continue;
      const resolve = this.#o.claims;
      if (!resolve) throw new VolumeError(field, "this host cannot hotplug claims");
      try {
        const ref = { namespace: vmi.metadata.namespace!, name: claim };
        found.set(name, await resolve(ref, { folder: dump }));
      } catch (error) {
        if (!(error instanceof HostClaimError)) throw error;
        throw new VolumeError(field, `cannot hotplug volume "${name}": ${error.message}`, {
          cause: error,
        });
      }
      this.#hostClaims.set(uid, found);
      log.info("Hotplugged claim found", {
        key: `${vmi.metadata.namespace}/${vmi.metadata.name}`,
        uid,
        volume: name,
        claim,
      });
    }
  }

  async #readSecrets(vmi: VirtualMachineInstance): Promise<CredentialSecrets> {
    if (!this.#o.secrets) {
      throw new Error("spec.accessCredentials: this host reads no Secrets");
    }
    return await readCredentialSecrets(this.#o.secrets, vmi);
  }

  /** Hands the host a VMI's credentials; a failure is told in the log (the next round retries). */
  async #handCredentials(
    client: LauncherHostClient,
    vmi: VirtualMachineInstance,
    secrets: CredentialSecrets,
  ): Promise<void> {
    try {
      await client.credentials(vmi.metadata.uid!, vmi.spec.accessCredentials, secrets);
    } catch (error) {
      log.warn("Cannot hand the launcher host the access credentials: {error}", {
        namespace: vmi.metadata.namespace,
        name: vmi.metadata.name,
        error,
      });
    }
  }

  /**
   * Reads a tracked VMI's Secrets again and hands them to the host; a Secret that cannot be
   * read now leaves the guest with what it has (as a kubelet keeps a Secret volume's last
   * content), and is told in the log.
   */
  async #refreshCredentials(uid: string): Promise<void> {
    const vmi = this.#credentialVmis.get(uid);
    const client = this.#client;
    if (!vmi || !client?.open || !this.#served.has(uid)) return;
    let secrets: CredentialSecrets;
    try {
      secrets = await this.#readSecrets(vmi);
    } catch (error) {
      log.warn("Cannot read the Secrets of the access credentials again: {error}", {
        namespace: vmi.metadata.namespace,
        name: vmi.metadata.name,
        error,
      });
      return;
    }
    await this.#handCredentials(client, vmi, secrets);
  }

  /** Removes the stored containerDisks of replaced or removed images no served VMI reads. */
  async #collectContainerDisks(): Promise<void> {
    if (!this.#o.containerDisks || !this.#listed) return;
    const inUse = new Set([
      ...[...this.#served.values()].flatMap((vm) => vm.containerDisks ?? []),
      ...[...this.#starting.values()].flat(),
    ]);
    await this.#o.containerDisks.collect(inUse).catch((error) =>
      log.warn("Cannot collect the containerDisk store: {error}", { error: String(error) })
    );
  }

  /** Opens `name` in the VMI's run directory, never through a link. */
  openPrivateSocket(vmi: VirtualMachineInstance, name: string): Promise<BeneathSocket> {
    return Promise.resolve(openSocketBeneath(this.#o.runRoot, `${vmi.metadata.uid}/${name}`));
  }

  /** The downward metrics channel, which virtnode's launcher puts in the VMI's run directory. */
  openDownwardMetricsChannel(vmi: VirtualMachineInstance): Promise<BeneathSocket> {
    return this.openPrivateSocket(vmi, DOWNWARD_METRICS_VMI_SOCKET);
  }

  /** None: virtnode's launcher host runs in the node's root. */
  launcherRoot(): Promise<string | undefined> {
    return Promise.resolve(undefined);
  }

  /** The VMI's hotplugged claims found on this host (the launcher host can attach them). */
  hotplugMounted(uid: string): Promise<ReadonlySet<string>> {
    return Promise.resolve(new Set(this.#hostClaims.get(uid)?.keys()));
  }

  /** The claim info of the VMI's hotplugged claims found on this host, for their status. */
  #hotplugClaims(uid: string): ReadonlyMap<string, ClaimInfo> {
    return new Map([...this.#hostClaims.get(uid) ?? []].map(([name, c]) => [name, c.claimInfo]));
  }

  /** Forgets the claims gone from the VMI's spec (the launcher host detached them). */
  unplug(vmi: VirtualMachineInstance): Promise<void> {
    const found = this.#hostClaims.get(vmi.metadata.uid!);
    if (found) {
      const inSpec = new Set(hotplugClaims(vmi).map((c) => c.name));
      for (const name of found.keys()) if (!inSpec.has(name)) found.delete(name);
      if (found.size === 0) this.#hostClaims.delete(vmi.metadata.uid!);
    }
    return Promise.resolve();
  }

  /**
   * Where a memory dump volume's dump goes: the folder of its claim found on this host
   * (which the launcher host confines to the namespace's folder of the host disk root).
   */
  memoryDumpFolder(vmi: VirtualMachineInstance, volume: string): string | undefined {
    return this.#hostClaims.get(vmi.metadata.uid!)?.get(volume)?.path;
  }

  /**
   * The VMI as the launcher host reads it: each hotplugged claim found on this host as the
   * host disk it is (marked hotplugged in the status, which is what the host attaches
   * live), and one not found yet left out with its disk; a memory dump volume is no disk,
   * and is left out.
   */
  forLauncher(vmi: VirtualMachineInstance): VirtualMachineInstance {
    const claims = hotplugClaims(vmi);
    if (claims.length === 0) return vmi;
    const dumps = new Set(claims.filter((c) => c.dump).map((c) => c.name));
    const found = new Map(
      [...this.#hostClaims.get(vmi.metadata.uid!) ?? []].filter(([name]) => !dumps.has(name)),
    );
    const missing = new Set(
      claims.filter((c) => c.dump || !found.has(c.name)).map((c) => c.name),
    );
    const volumes = (vmi.spec.volumes ?? []).flatMap((volume): Volume[] => {
      if (missing.has(volume.name)) return [];
      const claim = found.get(volume.name);
      return claim
        ? [{ name: volume.name, hostDisk: { path: claim.path, type: "Disk" } }]
        : [volume];
    });
    const devices = vmi.spec.domain.devices;
    const statuses = (vmi.status?.volumeStatus ?? []).filter((s) => !dumps.has(s.name));
    for (const name of found.keys()) {
      if (!statuses.some((s) => s.name === name)) {
        statuses.push({ name, target: "", hotplugVolume: {}, phase: "MountedToPod" });
      }
    }
    return {
      ...vmi,
      spec: {
        ...vmi.spec,
        volumes,
        domain: {
          ...vmi.spec.domain,
          devices: { ...devices, disks: devices.disks?.filter((d) => !missing.has(d.name)) },
        },
      },
      status: { ...vmi.status, volumeStatus: statuses },
    };
  }

  /**
   * The VM's pod: a network namespace of its own from the CNI plugins (made now, once),
   * the VMI's run directory as the launcher's private directory, and its taps made in the
   * host's namespace, where libvirtd opens them. The ghost record comes first, so a
   * restarted handler cleans up a pod it made even if the VMI is gone by then.
   */
  async podNetwork(vmi: VirtualMachineInstance): Promise<PodNetworkTarget | undefined> {
    const uid = vmi.metadata.uid!;
    const networks = this.#o.networks;
    if (!networks) {
      throw new Error(
        "this host has no pod network for the VMI's interfaces (the handler runs without --pod-network-cidr)",
      );
    }
    if (!this.#o.ghosts.get(uid)) {
      await this.#o.ghosts.add({
        name: vmi.metadata.name,
        namespace: vmi.metadata.namespace!,
        socketFile: join(this.#socketDir(uid), SocketNames.Launcher),
        uid,
      });
    }
    const secondaries: SecondaryAttachment[] = [];
    for (const plan of podNetworkPlan(vmi)) {
      if (plan.source !== "multus" || await networks.attached(uid, plan.podInterface)) continue;
      secondaries.push({
        network: plan.name,
        podInterface: plan.podInterface,
        config: await this.#attachmentConfig(vmi, plan.name, plan.networkName!),
        hostTap: hostTapFor(uid, plan),
      });
    }
    const netns = await networks.ensure(uid, secondaries);
    const runDir = join(this.#o.runRoot, uid);
    return {
      netns,
      owner: 0,
      openLauncherDir: () => {
        Deno.mkdirSync(runDir, { recursive: true, mode: 0o750 });
        return { path: runDir, release() {} };
      },
      hostTap: (plan) => hostTapFor(uid, plan),
    };
  }

  /**
   * The CNI configuration of a secondary network's NetworkAttachmentDefinition
   * (`<name>` in the VMI's namespace, or `<namespace>/<name>`), checked as the CNI calls
   * will read it; throws naming the definition and the network.
   */
  async #attachmentConfig(
    vmi: VirtualMachineInstance,
    network: string,
    networkName: string,
  ): Promise<string> {
    const [namespace, name] = networkName.includes("/")
      ? networkName.split("/", 2)
      : [vmi.metadata.namespace!, networkName];
    const what = `NetworkAttachmentDefinition "${namespace}/${name}" of network "${network}"`;
    const read = this.#o.networkAttachments;
    if (!read) throw new Error(`${what}: this handler reads no NetworkAttachmentDefinitions`);
    let config: string;
    try {
      config = await read(namespace, name);
    } catch (error) {
      throw new Error(`Cannot read ${what}: ${errorText(error)}`, { cause: error });
    }
    try {
      parseNetworkConfig(config);
    } catch (error) {
      throw new Error(`${what}: ${errorText(error)}`, { cause: error });
    }
    return config;
  }

  /** The VMI's pod network, as {@linkcode PodlessLaunchers.podNetwork} gives it. */
  adoptedPodNetwork(vmi: VirtualMachineInstance): Promise<PodNetworkTarget | undefined> {
    return this.podNetwork(vmi);
  }

  /** Removes the VM's pod namespace, gives its address back and deletes taps it never took. */
  async releasePodNetwork(vmi: VirtualMachineInstance): Promise<void> {
    const networks = this.#o.networks;
    if (!networks) return;
    const uid = vmi.metadata.uid!;
    // The pod network's tap; the secondary networks' taps are in their records.
    await networks.release(uid, [hostTapName(uid)]);
  }

  /** Every ghost record's launcher. */
  adoptable(): { uid: string; socket: string; namespace: string; name: string }[] {
    return launchersOfGhostRecords(this.#o.ghosts);
  }

  /**
   * Finds or starts the launcher host and keeps it running until `signal` aborts; then
   * lets go of it without stopping it (VMs keep running).
   */
  async run(signal: AbortSignal): Promise<void> {
    const refresher = setInterval(() => {
      for (const uid of this.#credentialVmis.keys()) void this.#refreshCredentials(uid);
    }, CREDENTIALS_REFRESH_MS);
    signal.addEventListener("abort", () => clearInterval(refresher), { once: true });
    const initial = this.#o.restartBackoffMs ?? 1_000;
    let backoff = initial;
    while (!signal.aborted) {
      const up = performance.now();
      try {
        await this.#superviseOnce(signal);
      } catch (error) {
        log.warn("Launcher host failed: {error}", { error, hostLog: this.hostLog });
      }
      if (signal.aborted) break;
      // A host that ran for a minute was healthy: start over with a short wait.
      if (performance.now() - up > 60_000) backoff = initial;
      log.warn("Launcher host is gone; starting it again in {ms} ms", {
        ms: backoff,
        hostLog: this.hostLog,
      });
      await sleep(backoff, signal);
      backoff = Math.min(backoff * 2, 30_000);
    }
    this.#prober?.stop();
    await this.#client?.close();
    this.#spawner.release();
  }

  async #superviseOnce(signal: AbortSignal): Promise<void> {
    let pid = await this.#spawner.alivePid(this.hostId);
    if (pid === undefined) {
      await Deno.mkdir(this.hostDir, { recursive: true, mode: 0o700 });
      // A stale control socket would look like a host that is up.
      await removeIfPresent(join(this.hostDir, "control.sock"));
      await this.#spawner.start({
        namespace: "",
        name: "launcher-host",
        uid: this.hostId,
        gracePeriodSeconds: 0,
        socketDir: this.hostDir,
        readyName: "control.sock",
      });
      pid = await this.#spawner.alivePid(this.hostId);
    } else {
      log.info("Launcher host {pid} is running; taking it over", { pid });
    }
    const client = await this.#connect(signal);
    if (!client) return;
    this.#client = client;
    // Ends this host's ping loop with the host: left to itself, its 11 s sleep would hold a
    // listener on the handler's signal after every restart.
    const session = new AbortController();
    try {
      const vms = await client.list();
      this.#served.clear();
      for (const vm of vms) this.#served.set(vm.uid, vm);
      this.#listed = true;
      await this.#collectContainerDisks();
      this.#setConnected();
      for (const vm of vms) {
        if (vm.state === "exited") this.#o.exited(vm.uid, vm.why ?? "the launcher ended");
      }
      for (const key of [...this.#waiting]) {
        this.#waiting.delete(key);
        this.#o.wake(key);
      }
      // orAborted takes its listener off again: a host restarted again and again must not
      // leave one behind on the handler's signal each time.
      const pinging = this.#pingUntilHung(client, AbortSignal.any([signal, session.signal]));
      await orAborted(Promise.race([client.closed, pinging]), signal);
    } finally {
      session.abort();
      this.#listed = false;
      this.#connected = new Promise((resolve) => this.#setConnected = resolve);
      if (signal.aborted) await client.close();
    }
  }

  /**
   * Asks the host for its list every {@linkcode HOST_PING_MS} (a missed "exited" report is
   * caught here too); a host that has not answered for {@linkcode HOST_HUNG_MS} is hung:
   * it is killed (its guests keep running) and the supervisor starts another, which takes
   * every VMI back. Resolves once the host is gone or killed, or on abort.
   */
  async #pingUntilHung(client: LauncherHostClient, signal: AbortSignal): Promise<void> {
    let lastAnswer = performance.now();
    while (!signal.aborted && client.open) {
      await sleep(HOST_PING_MS, signal);
      if (signal.aborted || !client.open) return;
      try {
        const vms = await client.list(HOST_PING_TIMEOUT_MS);
        lastAnswer = performance.now();
        for (const vm of vms) {
          const known = this.#served.get(vm.uid);
          this.#served.set(vm.uid, vm);
          if (vm.state === "exited" && known?.state !== "exited") {
            this.#o.exited(vm.uid, vm.why ?? "the launcher ended");
          }
        }
      } catch (error) {
        if (!client.open) return;
        if (performance.now() - lastAnswer < HOST_HUNG_MS) continue;
        log.error("The launcher host has not answered for {seconds} s; killing it: {error}", {
          seconds: Math.round((performance.now() - lastAnswer) / 1000),
          error,
          hostLog: this.hostLog,
        });
        await this.#spawner.stop(this.hostId, 2_000);
        await client.close();
        return;
      }
    }
  }

  /** Connects to the host's control socket while the host lives (up to a minute). */
  async #connect(signal: AbortSignal): Promise<LauncherHostClient | undefined> {
    const socket = join(this.hostDir, "control.sock");
    const deadline = Date.now() + 60_000;
    while (!signal.aborted && Date.now() < deadline) {
      try {
        return await LauncherHostClient.connect(socket, (exit) => {
          const served = this.#served.get(exit.uid);
          if (served) this.#served.set(exit.uid, { ...served, state: "exited", ...exit });
          this.#o.exited(exit.uid, exit.why);
          const rec = this.#o.ghosts.get(exit.uid);
          if (rec) this.#o.wake(vmiKey(rec));
        });
      } catch {
        if ((await this.#spawner.alivePid(this.hostId)) === undefined) return undefined;
        await sleep(50, signal);
      }
    }
    return undefined;
  }
}

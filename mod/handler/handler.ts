/**
 * `virtnode handler`, assembled: the Kubernetes layer, the launcher clients, the
 * notify server, ghost records, the launcher provider of the mode it runs in, and the
 * controller, as one {@linkcode Runnable}.
 *
 * Start-up re-adopts what already runs before anything else: ghost records give each
 * launcher's socket, the launchers are asked for their domains, and only then does the
 * VMI informer feed the queue, so a restarted handler finds every VM where it left it
 * and never stops one. When its signal aborts, the handler turns not ready, stops
 * taking work, lets in-flight syncs finish, then closes its watch, its notify socket
 * and its launcher connections, and leaves every VM running.
 *
 * @module
 */
import { join } from "node:path";
import {
  DOWNWARD_METRICS_VMI_SOCKET,
  KUBEVIRT_RELEASE,
  Labels,
  MAX_SOCKET_PATH,
  SocketNames,
  USB_CLIENT_PASSTHROUGH_SLOTS,
  usbRedirSocket,
  type VirtualMachineInstance,
  type VirtualMachineInstanceStatus,
  VMI_RESOURCE,
  vmiKey,
} from "../api/mod.ts";
import { type Config, featureGateEnabled } from "../config/mod.ts";
import { DownwardMetricsChannels } from "./downward_metrics.ts";
import {
  EventRecorder,
  EventSpamFilter,
  Expectations,
  Informer,
  type KubeClient,
  type KubeObject,
  type KubevirtCrWatch,
  restClientStats,
  StatusWriter,
  WorkQueue,
} from "../kube/mod.ts";
import type { LauncherHostOptions } from "../launcher/host_protocol/mod.ts";
import {
  aborted,
  every,
  forEachLimited,
  type Runnable,
  runnable,
  runStages,
} from "../lifecycle/mod.ts";
import {
  isLoopbackAddress,
  type PodlessNetworkConfig,
  PodlessNetworks,
  PodNetworks,
} from "../network/mod.ts";
import { ContainerDiskStore, resolveHostClaim } from "../storage/mod.ts";
import { NetnsRunner } from "../../ffi/mod.ts";
import { getLogger } from "../log/mod.ts";
import { type RestBackend, RestServer, type TlsMaterial } from "../rest/mod.ts";
import {
  addHandlerSamples,
  addVmiSamples,
  Exposition,
  type GuestFilesystemStat,
  TEXT_CONTENT_TYPE,
} from "../metrics/mod.ts";
import { VmiController } from "./controller.ts";
import { MigrationProxyManager } from "../migration/mod.ts";
import { MigrationSourceController } from "./migration_source.ts";
import { MigrationTargetController } from "./migration_target.ts";
import { omitEmptyMigrationState } from "./migration_state.ts";
import { type HealthAnswer, HealthStatus } from "./healthz.ts";
import { GhostRecordStore } from "./ghost_records.ts";
import { LauncherClients } from "./launcher_clients.ts";
import type { LauncherProvider } from "./launcher_provider.ts";
import type { HostCpuSource } from "./migratable.ts";
import {
  type K8sEventNotification,
  type NotifyHandlers,
  notifyRefusals,
  NotifyServer,
} from "./notify_server.ts";
import { PodLaunchers } from "./pods/mod.ts";
import {
  networkAttachmentConfig,
  PodlessLaunchers,
  PodlessMigrations,
  PodlessScheduler,
  PodlessVms,
} from "./podless/mod.ts";

const log = getLogger("handler");

/** Every launcher's domain is asked for again this often (KubeVirt's resync). */
export const DOMAIN_RESYNC_MS = 5 * 60_000;
/** How long one `/metrics` scrape may take asking the launchers (KubeVirt's 10 s). */
export const METRICS_BUDGET_MS = 10_000;
/** Scrapes of `/metrics` served at once (virt-handler's default). */
const MAX_METRICS_REQUESTS = 3;
/** Launchers asked for their statistics at once during a scrape. */
const METRICS_CONCURRENCY = 8;
/** Launchers asked for their domain at once while re-adopting. */
const ADOPT_CONCURRENCY = 32;

/** The part of a ConfigMap the handler reads (the client CA bundle). */
interface ConfigMap extends KubeObject {
  data?: Record<string, string>;
}

/** Options of {@linkcode Handler.create} beyond the shared configuration. */
export interface HandlerOptions {
  /**
   * Pod-less mode: the command line that runs `virtnode launcher-host` with the given
   * options; KubeVirt mode (launcher pods) when absent.
   */
  hostCommand?: (
    options: LauncherHostOptions & { hostId: string },
  ) => { cmd: string; args: string[] };
  /** Pod-less mode: containerDisk images; `<stateDir>/images` unless told. */
  imageDir?: string;
  /** Pod-less mode: the only directory hostDisk volumes may use. */
  hostDiskRoot?: string;
  /**
   * `host:port` of the health endpoints (`/healthz`, `/readyz`), which answer anyone (the
   * kubelet's probes); none when undefined. `/metrics` is there too, for loopback clients
   * only unless {@linkcode HandlerOptions.metricsAddress} says otherwise.
   */
  healthAddress?: string;
  /**
   * `host:port` where `/metrics` answers every client (a ServiceMonitor's scrape, as
   * virt-handler's port 8443 does): the health address itself, or a listener of its own.
   * Without it `/metrics` lists the node's VMIs to loopback clients only.
   */
  metricsAddress?: string;
  /** Concurrent syncs (KubeVirt's handler threadiness). */
  workers?: number;
  /**
   * This node's host-model CPU as the labeller reads it (LiveMigratable of host-model VMIs);
   * none: the node has no host model.
   */
  hostCpu?: HostCpuSource;
  /** The machine types this node's QEMU calls deprecated (the labeller's capabilities). */
  deprecatedMachineTypes?: () => readonly string[];
  /** virtnode's version, for `kubevirt_info`. */
  version?: string;
  /** The KubeVirt CR's watch (run by the caller): `/healthz` reports its version. */
  kubevirtCr?: KubevirtCrWatch;
  /** The kubelet's pods directory (KubeVirt mode). */
  podsDir?: string;
  /** Resync of every launcher's domain; {@linkcode DOMAIN_RESYNC_MS} unless told. */
  resyncMs?: number;
  /**
   * The REST server (console, VNC, lifecycle, guest queries) for virt-api: where it
   * listens, its TLS material, and the ConfigMap (`namespace/name`, key `ca-bundle`) of
   * the client CA bundle unless the material has a CA file. None when absent.
   */
  rest?: { hostname?: string; port?: number; tls: TlsMaterial; caConfigMap?: string };
  /** Serve the health endpoints and `/metrics` over TLS with this certificate. */
  healthTls?: TlsMaterial;
  /**
   * Pod-less mode: the VMs' pod network (node bridge and address ranges; the CNI plugins
   * make it). Without it a pod-less VMI with a pod-network interface is refused.
   */
  podNetwork?: PodlessNetworkConfig;
  /** Live migration; none: this node neither sends nor takes migrations. */
  migration?: HandlerMigrationOptions;
}

/** The handler's live migration settings. */
export interface HandlerMigrationOptions {
  /** The address other nodes' handlers reach this node's migration listeners at. */
  address: string;
  /** The server certificate the target listeners present, and the CA clients must chain to. */
  serverTls: TlsMaterial;
  /** The client certificate the source presents, and the CA the target must chain to. */
  clientTls: TlsMaterial;
  /** The ConfigMap (`namespace/name`, key `ca-bundle`) of the CA, unless the material has a CA file. */
  caConfigMap?: string;
  /**
   * The common names a migration client's certificate may have (`--migration-cn-types`);
   * KubeVirt's default (`kubevirt.io:system:client:virt-handler` and `...:migration`) unless given.
   */
  clientCommonNames?: readonly string[];
  /**
   * Pod-less mode: the folder of the proxy's sockets (`migrationproxy/` in it), which
   * libvirtd and QEMU see at the same path. It must be the same path on every node: the
   * target's QEMU listens where the source's migration URI points.
   */
  socketDir: string;
  /** Pod-less mode: libvirtd's socket, where the target listener carries libvirt's connection. */
  libvirtSocket: string;
}

/** The socket a libvirt URI connects to: its `socket` parameter, else the system daemon's. */
export function libvirtSocketOfUri(uri: string): string {
  const socket = /[?&]socket=([^&]+)/.exec(uri)?.[1];
  if (socket) return decodeURIComponent(socket);
  for (const path of ["/run/libvirt/virtqemud-sock", "/run/libvirt/libvirt-sock"]) {
    try {
      if (Deno.statSync(path).isSocket) return path;
    } catch { /* the next */ }
  }
  return "/run/libvirt/libvirt-sock";
}

/** The interface KubeVirt's operator puts a handler pod on the migration network with. */
export const MIGRATION_INTERFACE = "migration0";

/**
 * The address of the migration network, as virt-handler finds it: the first global unicast
 * address of {@linkcode MIGRATION_INTERFACE} (KubeVirt's operator adds that interface to the
 * handler's pod when the KubeVirt CR's `migrations.network` names a network; it rolls the
 * DaemonSet on a change, so this is read at start). Undefined when there is no such interface;
 * throws when it has no usable address, as virt-handler refuses to start then.
 */
export function migrationNetworkAddress(
  interfaces: Deno.NetworkInterfaceInfo[] = Deno.networkInterfaces(),
): string | undefined {
  const mine = interfaces.filter((i) => i.name === MIGRATION_INTERFACE);
  if (mine.length === 0) return undefined;
  const usable = mine.find((i) =>
    !i.address.startsWith("127.") && i.address !== "::1" &&
    !/^fe[89ab]/i.test(i.address) && !/^(22[4-9]|23\d)\./.test(i.address) &&
    !/^ff/i.test(i.address) && i.address !== "0.0.0.0" && !i.address.startsWith("169.254.")
  );
  if (!usable) throw new Error(`no IP found on ${MIGRATION_INTERFACE}`);
  return usable.address;
}

/** This host's first global IPv4 address (else IPv6), for migration listeners. */
export function defaultMigrationAddress(): string | undefined {
  const all = Deno.networkInterfaces().filter((i) =>
    i.name !== "lo" && !i.address.startsWith("fe80:") && !i.address.startsWith("127.") &&
    i.address !== "::1"
  );
  return (all.find((i) => i.family === "IPv4") ?? all[0])?.address;
}

/** The paths the handler uses below the configured directories. */
export function handlerPaths(config: Config): {
  ghostDir: string;
  socketRoot: string;
  /** Pod-less mode: the VMIs' private folders (console and VNC sockets), one per UID. */
  privateRoot: string;
  notifySocket: string;
  networkCacheDir: string;
  netnsDir: string;
  ipamDir: string;
} {
  return {
    ghostDir: join(config.stateDir, "ghost-records"),
    socketRoot: join(config.runDir, "sockets"),
    privateRoot: join(config.runDir, "private"),
    notifySocket: join(config.runDir, SocketNames.DomainNotify),
    // Network state lives as long as the namespaces it describes: in the run directory.
    networkCacheDir: join(config.runDir, "network-info-cache"),
    netnsDir: join(config.runDir, "netns"),
    ipamDir: join(config.runDir, "cni-ipam"),
  };
}

/**
 * Pod-less mode binds its launchers' sockets below `--run-dir` and the launcher host's
 * below `--state-dir`, one folder per VMI UID (36 characters). Why they would not fit a
 * unix socket address, naming the flag to shorten; undefined when they fit. Checked at
 * start-up: otherwise every launcher would fail to serve and its VMI wait for nothing.
 */
export function podlessSocketPathProblem(config: Config): string | undefined {
  const uid = "00000000-0000-0000-0000-000000000000";
  const paths = handlerPaths(config);
  const longest: [string, string][] = [
    ["--run-dir", join(paths.socketRoot, uid, SocketNames.LauncherInit)],
    // The longest name in a VMI's private folder.
    ...[
      SocketNames.Serial0,
      usbRedirSocket(USB_CLIENT_PASSTHROUGH_SLOTS - 1),
      DOWNWARD_METRICS_VMI_SOCKET,
    ].map((name): [string, string] => ["--run-dir", join(paths.privateRoot, uid, name)]),
    ["--state-dir", join(config.stateDir, "launcher-host", "control.sock")],
  ];
  for (const [flag, path] of longest) {
    const length = new TextEncoder().encode(path).length;
    if (length > MAX_SOCKET_PATH) {
      return `${flag}: sockets below it would be ${length} bytes long (${path}); ` +
        `unix sockets allow ${MAX_SOCKET_PATH}: shorten ${flag} by ${
          length - MAX_SOCKET_PATH
        } characters`;
    }
  }
  return undefined;
}

/** What the handler runs for live migration. */
interface MigrationParts {
  informer: Informer<VirtualMachineInstance>;
  proxy: MigrationProxyManager;
  source: MigrationSourceController;
  target: MigrationTargetController;
  podless?: PodlessMigrations;
}

/** The node agent's VMI side; see the module doc. */
export class Handler implements Runnable {
  /** For logs. */
  readonly name = "handler";
  readonly #controller: VmiController;
  readonly #informer: Informer<VirtualMachineInstance>;
  readonly #config: Config;
  readonly #options: HandlerOptions;
  readonly #ghosts: GhostRecordStore;
  readonly #launchers: LauncherClients;
  readonly #provider: LauncherProvider;
  readonly #recorder: EventRecorder;
  /** Events launchers ask for, per VMI: client-go's spam filter, as KubeVirt's recorder. */
  readonly #launcherEvents = new EventSpamFilter();
  /** Where launchers' messages go: the notify socket and every pod's pipe. */
  readonly #notify: NotifyHandlers = {
    onDomainEvent: (e) => {
      this.#controller.domainEvent(e.type, e.domain);
      if (this.#migration) {
        const key = vmiKey(e.domain.metadata);
        this.#migration.source.wake(key);
        this.#migration.target.wake(key);
      }
    },
    onK8sEvent: (e) => this.#launcherEvent(e),
  };
  readonly #scheduler?: PodlessScheduler;
  /** Pod-less mode's VirtualMachine controller, for the VMs placed on this node. */
  readonly #vms?: PodlessVms;
  /** The worker thread that enters pods' network namespaces (started on first use). */
  readonly #netns: NetnsRunner;
  readonly #client: KubeClient;
  /** The migration's controllers and proxies, when this node takes part in migrations. */
  readonly #migration?: MigrationParts;
  #ready = false;
  #started = performance.now();
  #adopted = 0;

  private constructor(
    config: Config,
    client: KubeClient,
    options: HandlerOptions,
    ghosts: GhostRecordStore,
  ) {
    this.#config = config;
    this.#client = client;
    this.#options = options;
    this.#ghosts = ghosts;
    const paths = handlerPaths(config);
    const queue = new WorkQueue<string>();
    this.#informer = new Informer<VirtualMachineInstance>(client, {
      path: `/apis/kubevirt.io/v1/${VMI_RESOURCE}`,
      labelSelector: `${Labels.NodeName}=${config.nodeName}`,
      onError: (error) => log.warn("VMI watch interrupted, retrying: {error}", { error }),
      // managedFields grows with every status write and is never read; an update without
      // it leaves the server's copy as it is.
      transform: (vmi) => {
        delete (vmi.metadata as { managedFields?: unknown }).managedFields;
        return vmi;
      },
    });
    this.#recorder = new EventRecorder(client, { host: config.nodeName });
    if (options.hostCommand) {
      this.#scheduler = new PodlessScheduler(client, config.nodeName);
      const informer = this.#informer;
      const vms = new PodlessVms({
        nodeName: config.nodeName,
        client,
        recorder: this.#recorder,
        cachedVmi: (key) => informer.get(key),
        liveUpdates: () =>
          (options.kubevirtCr?.config().vmRolloutStrategy ?? "LiveUpdate") === "LiveUpdate",
      });
      this.#vms = vms;
      this.#informer.addHandlers({
        onAdd: (vmi) => vms.vmiChanged(vmi),
        onUpdate: (_old, vmi) => vms.vmiChanged(vmi),
        onDelete: (vmi) => vms.vmiChanged(vmi),
      });
    }
    this.#netns = new NetnsRunner();
    const networks = new PodNetworks({ runner: this.#netns, cacheDir: paths.networkCacheDir });
    // The controller is built after the provider and the pool; their callbacks run later.
    this.#provider = options.hostCommand
      ? new PodlessLaunchers({
        ghosts,
        socketRoot: paths.socketRoot,
        stateDir: config.stateDir,
        hostCommand: options.hostCommand,
        runRoot: paths.privateRoot,
        diskRoot: join(config.stateDir, "disks"),
        host: {
          libvirtUri: config.libvirtUri,
          notifySocket: paths.notifySocket,
          imageDir: options.imageDir ?? join(config.stateDir, "images"),
          hostDiskRoot: options.hostDiskRoot,
          migrationSocketDir: options.migration?.socketDir,
        },
        wake: (key) => this.#controller.wake(key),
        exited: (uid, why) => void this.#launchers.markUnresponsive(uid, why),
        // The kubelet's part: the VMIs' probes. A liveness probe that fails ends the VMI as
        // the kubelet ends its launcher pod: the launcher counts as gone, so the VMI fails
        // (not Succeeded, as a guest killed by hand would), and the guest is killed.
        probes: {
          launcher: (uid) => this.#launchers.get(uid),
          unhealthy: (vmi, message) => {
            this.#recorder.record(vmi, "Warning", "Unhealthy", message)
              .catch((error) => log.warn("Cannot record an Event: {error}", { error }));
            const client = this.#launchers.get(vmi.metadata.uid!);
            void this.#launchers.markUnresponsive(vmi.metadata.uid!, message).then(() =>
              client?.killVirtualMachine(vmi)
            ).catch((error) => log.warn("Cannot kill an unhealthy guest: {error}", { error }));
          },
        },
        networks: options.podNetwork
          ? new PodlessNetworks({
            ...options.podNetwork,
            runner: this.#netns,
            netnsDir: paths.netnsDir,
            ipamDir: paths.ipamDir,
          })
          : undefined,
        containerDisks: new ContainerDiskStore({
          imageDir: options.imageDir ?? join(config.stateDir, "images"),
          storeDir: join(config.stateDir, "containerdisks"),
        }),
        claims: (ref, use) =>
          resolveHostClaim(
            client,
            ref,
            { root: options.hostDiskRoot, node: config.nodeName },
            use,
          ),
        secrets: client,
        networkAttachments: (namespace, name) => networkAttachmentConfig(client, namespace, name),
        migration: options.migration
          ? {
            socketDir: options.migration.socketDir,
            libvirtSocket: options.migration.libvirtSocket,
          }
          : undefined,
      })
      : new PodLaunchers({
        nodeName: config.nodeName,
        ghosts,
        podsDir: options.podsDir ?? "/var/lib/kubelet/pods",
        notify: this.#notify,
        mountRecordDir: join(config.runDir, "container-disk-mounts"),
        hotplugRecordDir: join(config.runDir, "hotplug-volume-mounts"),
        emulation: options.kubevirtCr ? () => options.kubevirtCr!.config().useEmulation : undefined,
        memoryOverheadRatio: options.kubevirtCr
          ? () => options.kubevirtCr!.config().additionalGuestMemoryOverheadRatio
          : undefined,
        imageVolume: options.kubevirtCr
          ? () => featureGateEnabled(options.kubevirtCr!.config(), "ImageVolume")
          : undefined,
      });
    this.#launchers = new LauncherClients({
      onUnresponsive: (uid) => this.#controller.launcherGone(uid),
      markerDir: join(config.stateDir, "unresponsive"),
      dialResolver: this.#provider.dialResolver,
      dial: !this.#provider.watchesLaunchers,
    });
    const launchers = this.#launchers;
    const statusWriter = new StatusWriter<VirtualMachineInstanceStatus, VirtualMachineInstance>(
      client,
      {
        groupVersionPath: "/apis/kubevirt.io/v1",
        plural: VMI_RESOURCE,
        normalize: omitEmptyMigrationState,
      },
    );
    this.#migration = options.migration
      ? this.#migrationParts(options.migration, { statusWriter, networks, queue })
      : undefined;
    this.#controller = new VmiController({
      nodeName: config.nodeName,
      provider: this.#provider,
      standIn: this.#provider.standIn,
      informer: this.#informer,
      queue,
      expectations: new Expectations(),
      statusWriter,
      recorder: this.#recorder,
      ghosts,
      launchers,
      networks,
      workers: options.workers,
      onStarted: () => this.#onStarted(),
      hostCpu: options.hostCpu,
      handledElsewhere: (key) => this.#migration?.target.handles(key) ?? false,
      stopMigrationProxies: this.#migration
        ? async (uid) => {
          const proxy = this.#migration!.proxy;
          await Promise.all([proxy.stopTargetListener(uid), proxy.stopSourceListener(uid)]);
        }
        : undefined,
      clusterConfig: options.kubevirtCr ? () => options.kubevirtCr!.config() : undefined,
      configReady: options.kubevirtCr ? () => options.kubevirtCr!.synced() : undefined,
    });
  }

  /** The migration controllers, proxies and, pod-less, the VMIM controller. */
  #migrationParts(
    m: HandlerMigrationOptions,
    o: {
      statusWriter: StatusWriter<VirtualMachineInstanceStatus, VirtualMachineInstance>;
      networks: PodNetworks;
      queue: WorkQueue<string>;
    },
  ): MigrationParts {
    const config = this.#config;
    const proxy = new MigrationProxyManager({
      serverTls: () => m.serverTls.context(),
      clientTls: () => m.clientTls.context(),
      bindAddress: m.address,
      clientNames: m.clientCommonNames,
    });
    const informer = new Informer<VirtualMachineInstance>(this.#client, {
      path: `/apis/kubevirt.io/v1/${VMI_RESOURCE}`,
      labelSelector: `${Labels.MigrationTargetNodeName}=${config.nodeName}`,
      resource: "virtualmachineinstances (migration targets)",
      onError: (error) =>
        log.warn("Migration target watch interrupted, retrying: {error}", { error }),
      transform: (vmi) => {
        delete (vmi.metadata as { managedFields?: unknown }).managedFields;
        return vmi;
      },
    });
    const domains = () => this.#controller.domains;
    const common = {
      nodeName: config.nodeName,
      provider: this.#provider,
      launchers: this.#launchers,
      statusWriter: o.statusWriter,
      recorder: this.#recorder,
      proxy,
    };
    const target = new MigrationTargetController({
      ...common,
      migrationAddress: m.address,
      informer,
      queue: new WorkQueue<string>(),
      get domains() {
        return domains();
      },
      networks: o.networks,
      cleanup: (vmi) => this.#controller.cleanupLocal(vmi),
      bindingMemoryOverheads: this.#options.kubevirtCr
        ? () => this.#options.kubevirtCr!.config().bindingMemoryOverheads
        : undefined,
    });
    const source = new MigrationSourceController({
      ...common,
      clusterConfig: this.#options.kubevirtCr
        ? () => this.#options.kubevirtCr!.config()
        : undefined,
      informer: this.#informer,
      queue: new WorkQueue<string>(),
      expectations: new Expectations(),
      get domains() {
        return domains();
      },
    });
    const podless = this.#provider.standIn
      ? new PodlessMigrations({
        nodeName: config.nodeName,
        client: this.#client,
        recorder: this.#recorder,
        clusterConfig: this.#options.kubevirtCr
          ? () => this.#options.kubevirtCr!.config()
          : undefined,
      })
      : undefined;
    if (podless) {
      this.#informer.addHandlers({
        onAdd: (vmi) => podless.vmiChanged(vmi),
        onUpdate: (_old, vmi) => podless.vmiChanged(vmi),
        onDelete: (vmi) => podless.vmiChanged(vmi),
      });
    }
    return { informer, proxy, source, target, podless };
  }

  /** Builds the handler of this node; reads its ghost records (setting bad ones aside). */
  static async create(
    config: Config,
    client: KubeClient,
    options: HandlerOptions = {},
  ): Promise<Handler> {
    const started = performance.now();
    const ghosts = new GhostRecordStore(handlerPaths(config).ghostDir);
    for (const bad of await ghosts.load()) {
      log.error("Ghost record set aside: {reason}", {
        file: bad.file,
        movedTo: bad.movedTo,
        reason: bad.reason,
      });
    }
    const handler = new Handler(config, client, options, ghosts);
    handler.#started = started;
    return handler;
  }

  /** Whether `/readyz` answers 200: the workers run and no stop has begun. */
  ready(): boolean {
    return this.#ready;
  }

  /**
   * Records the Event a launcher asked for, as KubeVirt's handler does: only about a VMI
   * of this node's cache with the same UID, and no more than the spam filter lets through
   * per VMI. Throws (the launcher is answered `success: false`) otherwise.
   */
  #launcherEvent(e: K8sEventNotification): void {
    const vmi = this.#informer.get(`${e.namespace}/${e.name}`);
    if (!vmi || vmi.metadata.uid !== e.uid) {
      notifyRefusals.k8sEvents++;
      throw new Error(`VMI "${e.namespace}/${e.name}" with UID "${e.uid ?? ""}" not found`);
    }
    if (!this.#launcherEvents.allow(vmi.metadata.uid!)) {
      notifyRefusals.k8sEvents++;
      throw new Error(`Too many events for VMI "${e.namespace}/${e.name}": dropped`);
    }
    this.#recorder.record(
      {
        apiVersion: "kubevirt.io/v1",
        kind: "VirtualMachineInstance",
        metadata: { namespace: e.namespace, name: e.name, uid: e.uid },
      },
      e.type,
      e.reason,
      e.message,
    ).catch((error) => log.warn("Cannot record launcher event: {error}", { error }));
  }

  #onStarted(): void {
    this.#ready = true;
    log.info("Handler ready: {vmis} VMIs on this node, {adopted} launchers re-adopted", {
      vmis: this.#informer.list().length,
      adopted: this.#adopted,
      startupMs: Math.round(performance.now() - this.#started),
    });
  }

  /**
   * Serves the notify socket, re-adopts running launchers, then runs until `signal`
   * aborts: workers first to stop (in-flight syncs finish), then the watch, the notify
   * socket, the launcher monitor, the provider and the health endpoints.
   */
  async run(signal: AbortSignal): Promise<void> {
    const controller = this.#controller;
    const migration = this.#migration;
    const notify = await NotifyServer.start(
      handlerPaths(this.#config).notifySocket,
      this.#notify,
    );
    this.#adopted = await this.#adopt();
    signal.addEventListener("abort", () => {
      this.#ready = false;
      log.info("Handler stopping: draining in-flight syncs; VMs keep running");
    }, { once: true });

    const resync = runnable(
      "domain-resync",
      (s) =>
        every(this.#options.resyncMs ?? DOMAIN_RESYNC_MS, () => this.#adopt(), s, {
          immediate: false,
          onError: (error) => log.warn("Domain resync failed: {error}", { error }),
        }),
    );
    const parts: Runnable[] = [this.#informer, notify, this.#launchers, this.#provider];
    if (this.#scheduler) parts.push(this.#scheduler);
    if (this.#vms) parts.push(this.#vms);
    const provider = this.#provider;
    const launchers = this.#launchers;
    const downward = new DownwardMetricsChannels({
      nodeName: this.#config.nodeName,
      vmis: () => this.#informer.list().filter((v) => v.status?.nodeName === this.#config.nodeName),
      open: (vmi) => provider.openDownwardMetricsChannel(vmi),
      disk: provider.openDownwardMetricsDisk?.bind(provider),
      launcher: async (vmi) => {
        const socket = await provider.socketOf(vmi);
        if (!socket) throw new Error(`VMI ${vmiKey(vmi.metadata)} has no launcher on this node`);
        return launchers.getOrCreate(vmi.metadata.uid!, socket);
      },
    });
    const workers: Runnable[] = [controller, resync, downward];
    if (migration) {
      workers.push(migration.source, migration.target);
      if (migration.podless) workers.push(migration.podless);
      parts.push(
        migration.informer,
        runnable("migration-proxy", async (s) => {
          await aborted(s);
          await migration.proxy.shutdown();
        }),
      );
    }
    const { healthAddress, metricsAddress } = this.#options;
    const health = new HealthStatus(
      this.#client,
      () => this.#options.kubevirtCr?.resourceVersion() ?? "",
    );
    if (healthAddress || metricsAddress) parts.push(...health.parts());
    const endpoints = {
      health: () => health.answer(),
      ready: () => this.#ready,
      metrics: () => this.metrics(),
      tls: this.#options.healthTls,
    };
    if (healthAddress) {
      const metricsFrom = metricsAddress === healthAddress
        ? "anyone"
        : metricsAddress
        ? "nobody"
        : "loopback";
      parts.push(healthServer("health", healthAddress, { ...endpoints, metricsFrom }));
    }
    if (metricsAddress && metricsAddress !== healthAddress) {
      parts.push(healthServer("metrics", metricsAddress, { ...endpoints, metricsFrom: "anyone" }));
    }
    if (healthAddress || metricsAddress) {
      // The REST server's watch reloads material it shares; material of its own is watched here.
      const tls = this.#options.healthTls;
      if (tls && tls !== this.#options.rest?.tls) {
        parts.push(runnable("health-tls", (s) => tls.watch(s)));
      }
    }
    if (this.#options.rest) parts.push(...this.#restParts(this.#options.rest));
    parts.push(...this.#caParts());
    await runStages([workers, parts], signal);
    this.#netns.close();
    log.info("Handler stopped");
  }

  /**
   * One scrape of `/metrics`: the handler's own families, then each Running VMI's domain
   * statistics (and its guest filesystems where an agent is connected), asked of the
   * launchers {@linkcode METRICS_CONCURRENCY} at a time within `budgetMs`. A VMI whose
   * launcher does not answer in time is left out of this scrape, not reported as 0.
   */
  async metrics(budgetMs = METRICS_BUDGET_MS): Promise<string> {
    const exp = new Exposition();
    addHandlerSamples(exp, {
      info: {
        goversion: `deno${Deno.version.deno}`,
        kubeversion: `${KUBEVIRT_RELEASE}+virtnode.${this.#options.version ?? "unknown"}`,
      },
      machineTypes: {
        node: this.#config.nodeName,
        deprecated: this.#options.deprecatedMachineTypes?.() ?? [],
      },
      ready: this.#ready,
      syncs: this.#controller.syncs,
      refused: {
        domain: notifyRefusals.domainEvents,
        domain_without_uid: this.#controller.foreignDomains,
        k8s_event: notifyRefusals.k8sEvents,
      },
      queue: this.#controller.queueStats(),
      requests: restClientStats.requests(),
      latencies: restClientStats.latencies(),
    });
    const deadline = performance.now() + budgetMs;
    const vmis = this.#informer.list().filter((v) =>
      v.status?.nodeName === this.#config.nodeName && v.status?.phase === "Running"
    );
    const results: (undefined | {
      stats: Record<string, unknown>;
      fs: GuestFilesystemStat[];
    })[] = vmis.map(() => undefined);
    // The dirty rates take a second to measure: they run beside the rest, outside its
    // limit, as KubeVirt's own collector measures them, and are waited for at the end.
    const dirtyRates: (number | undefined)[] = vmis.map(() => undefined);
    const measuring: Promise<void>[] = [];
    await forEachLimited(vmis, METRICS_CONCURRENCY, async (vmi, i) => {
      const left = deadline - performance.now();
      if (left <= 0) return;
      try {
        const socket = await this.#provider.socketOf(vmi);
        if (!socket) return;
        const client = this.#launchers.getOrCreate(vmi.metadata.uid!, socket);
        // Measured over a second beside the rest, as KubeVirt's dirty-rate collector does;
        // not during a migration, which measures it itself (and would refuse).
        const migration = vmi.status?.migrationState;
        const migrating = migration?.startTimestamp && !migration.completed && !migration.failed;
        if (!migrating) {
          measuring.push(
            client.getDomainDirtyRateStats(left).then(
              (mbs) => void (dirtyRates[i] = mbs),
              (error) => {
                log.debug("No dirty rate of {name} for this scrape: {error}", {
                  namespace: vmi.metadata.namespace,
                  name: vmi.metadata.name,
                  error,
                });
              },
            ),
          );
        }
        const stats = await client.getDomainStats(left);
        if (!stats) return;
        const agent = (vmi.status?.conditions ?? []).some((c) =>
          c.type === "AgentConnected" && c.status === "True"
        );
        const fs = agent && deadline > performance.now()
          ? (await client.guestQuery("GetFilesystems").catch(() => [])) as GuestFilesystemStat[]
          : [];
        results[i] = { stats, fs: Array.isArray(fs) ? fs : [] };
      } catch (error) {
        log.debug("No statistics of {name} for this scrape: {error}", {
          namespace: vmi.metadata.namespace,
          name: vmi.metadata.name,
          error,
        });
      }
    });
    // Whatever was measured by the deadline.
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([
      Promise.all(measuring),
      new Promise((r) => timer = setTimeout(r, Math.max(0, deadline - performance.now()))),
    ]);
    clearTimeout(timer);
    vmis.forEach((vmi, i) => {
      const r = results[i];
      if (r) addVmiSamples(exp, vmi, r.stats, r.fs, dirtyRates[i]);
    });
    return exp.toString();
  }

  /** The REST server, its TLS material's watch and, if it comes from one, the CA ConfigMap's. */
  #restParts(rest: NonNullable<HandlerOptions["rest"]>): Runnable[] {
    const provider = this.#provider;
    const launchers = this.#launchers;
    const backend: RestBackend = {
      vmi: (namespace, name) => {
        const vmi = this.#informer.get(`${namespace}/${name}`);
        return vmi?.status?.nodeName === this.#config.nodeName ? vmi : undefined;
      },
      launcher: async (vmi) => {
        const socket = await provider.socketOf(vmi);
        if (!socket) throw new Error(`VMI ${vmiKey(vmi.metadata)} has no launcher on this node`);
        return launchers.getOrCreate(vmi.metadata.uid!, socket);
      },
      openSocket: (vmi, name) => provider.openPrivateSocket(vmi, name),
      record: (vmi, type, reason, message) => {
        this.#recorder.record(vmi, type, reason, message).catch((error) =>
          log.warn("Cannot record event: {error}", { error })
        );
      },
    };
    const server = new RestServer({
      hostname: rest.hostname,
      port: rest.port,
      tls: rest.tls,
      backend,
    });
    const parts: Runnable[] = [
      server,
      runnable("rest-tls", (signal) => rest.tls.watch(signal)),
    ];
    return parts;
  }

  /**
   * The CA ConfigMap's watch, which hands its bundle to every TLS material that takes its
   * CA from there (the REST server's, the migration's), and the migration client's file
   * watch.
   */
  #caParts(): Runnable[] {
    const rest = this.#options.rest;
    const m = this.#options.migration;
    const byMap = new Map<string, Set<TlsMaterial>>();
    const add = (map: string | undefined, tls: TlsMaterial) => {
      if (!map) return;
      if (!byMap.has(map)) byMap.set(map, new Set());
      byMap.get(map)!.add(tls);
    };
    if (rest) add(rest.caConfigMap, rest.tls);
    if (m) {
      add(m.caConfigMap, m.serverTls);
      add(m.caConfigMap, m.clientTls);
    }
    const parts: Runnable[] = [];
    for (const [map, materials] of byMap) {
      const [namespace, name] = map.split("/");
      const configMaps = new Informer<ConfigMap>(this.#client, {
        path: `/api/v1/namespaces/${namespace}/configmaps`,
        fieldSelector: `metadata.name=${name}`,
        onError: (error) =>
          log.warn("CA ConfigMap watch interrupted, retrying: {error}", { error }),
      });
      const take = (cm: ConfigMap) => {
        for (const tls of materials) tls.setCaBundle(cm.data?.["ca-bundle"] ?? "");
      };
      configMaps.addHandlers({ onAdd: take, onUpdate: (_old, cm) => take(cm) });
      parts.push(configMaps);
    }
    if (m) {
      parts.push(runnable("migration-client-tls", (signal) => m.clientTls.watch(signal)));
      const watched = [rest?.tls, this.#options.healthTls];
      if (!watched.includes(m.serverTls)) {
        parts.push(runnable("migration-server-tls", (signal) => m.serverTls.watch(signal)));
      }
    }
    return parts;
  }

  /** Asks every launcher a ghost record names for its domain; returns how many answered. */
  async #adopt(): Promise<number> {
    let adopted = 0;
    const all = this.#provider.adoptable();
    await forEachLimited(all, ADOPT_CONCURRENCY, async (l) => {
      const client = this.#launchers.getOrCreate(l.uid, l.socket);
      try {
        await Deno.lstat(l.socket);
        const domain = await client.getDomain();
        if (domain) this.#controller.domainEvent("ADDED", domain);
        adopted++;
      } catch (error) {
        log.warn("Launcher of ghost record not answering yet: {error}", {
          namespace: l.namespace,
          name: l.name,
          uid: l.uid,
          error,
        });
      }
    });
    return adopted;
  }
}

/**
 * A URL path as Go's `path.Clean` leaves it (repeated slashes one, `.` and `..` resolved,
 * rooted), keeping a trailing slash as Go's ServeMux does.
 */
export function cleanUrlPath(path: string): string {
  const out: string[] = [];
  for (const part of path.split("/")) {
    if (part === "" || part === ".") continue;
    if (part === "..") out.pop();
    else out.push(part);
  }
  const cleaned = `/${out.join("/")}`;
  return path.endsWith("/") && cleaned !== "/" ? `${cleaned}/` : cleaned;
}

/**
 * `/healthz` (alive: virt-handler's JSON, healthz.ts), `/readyz` (`ready()`) and `/metrics` (to the clients `metricsFrom`
 * names) on `address` until the signal aborts; over TLS with `tls`'s certificate when
 * given (served anew when it changes).
 */
function healthServer(
  name: string,
  address: string,
  o: {
    health: () => Promise<HealthAnswer>;
    ready: () => boolean;
    metrics: () => Promise<string>;
    tls?: TlsMaterial;
    metricsFrom: "anyone" | "loopback" | "nobody";
  },
): Runnable {
  const [hostname, port] = splitHostPort(address);
  let scraping = 0;
  const handler = async (req: Request, info: Deno.ServeHandlerInfo<Deno.Addr>) => {
    const url = new URL(req.url);
    const path = url.pathname;
    // As Go's ServeMux, which serves virt-handler's: a path with repeated slashes or dot
    // segments is sent to its clean form (KubeVirt's suite asks for `//healthz`).
    const clean = cleanUrlPath(path);
    if (clean !== path) {
      return new Response(null, {
        status: 301,
        headers: { Location: `${clean}${url.search}` },
      });
    }
    if (path === "/healthz") {
      const { status, body } = await o.health();
      return Response.json(body, { status });
    }
    if (path === "/readyz") {
      return o.ready() ? new Response("ok\n") : new Response("not ready\n", { status: 503 });
    }
    if (path === "/metrics" && o.metricsFrom !== "anyone") {
      // It names every VMI of the node: beyond this host only where a scraper is meant to be.
      const peer = info.remoteAddr.transport === "tcp" ? info.remoteAddr.hostname : "";
      if (o.metricsFrom === "nobody") return new Response("not found\n", { status: 404 });
      if (!isLoopbackAddress(peer)) {
        return new Response("/metrics answers loopback clients only here\n", { status: 403 });
      }
    }
    if (path === "/metrics") {
      if (req.method !== "GET") return new Response("method not allowed\n", { status: 405 });
      // As virt-handler's default --max-metric-requests: more scrapes at once are refused.
      if (scraping >= MAX_METRICS_REQUESTS) {
        return new Response("too many metrics requests at once\n", { status: 503 });
      }
      scraping++;
      try {
        return new Response(await o.metrics(), { headers: { "Content-Type": TEXT_CONTENT_TYPE } });
      } finally {
        scraping--;
      }
    }
    return new Response("not found\n", { status: 404 });
  };
  return runnable(name, async (signal) => {
    const serve = () => {
      const material = o.tls?.serverMaterial();
      return Deno.serve({ hostname, port, onListen: () => {}, ...material }, handler);
    };
    let server = serve();
    let changing = Promise.resolve();
    o.tls?.onChange(() => {
      changing = changing.then(async () => {
        await server.shutdown();
        if (!signal.aborted) server = serve();
      });
    });
    await aborted(signal);
    await changing;
    await server.shutdown();
  });
}

function splitHostPort(address: string): [string, number] {
  const i = address.lastIndexOf(":");
  const port = Number(address.slice(i + 1));
  if (i < 0 || !Number.isInteger(port) || port < 0 || port > 65535) {
    throw new Error(`Invalid listen address ${JSON.stringify(address)}: expected host:port`);
  }
  return [address.slice(0, i) || "0.0.0.0", port];
}

/**
 * virtnode: a KubeVirt-compatible node agent in one binary.
 *
 * This file is the composition root: it parses the command line and the
 * configuration, sets up logging, and wires the modules under `mod/` and `ffi/`
 * for each subcommand. No other file knows every module, and heavy modules
 * (the Kubernetes client, libvirt) are loaded only by the subcommands that use
 * them, which keeps each role's memory small.
 *
 * @module
 */
import { Command, CommanderError, InvalidArgumentError, Option } from "commander";
import denoJson from "./deno.json" with { type: "json" };
import {
  type Config,
  ConfigError,
  featureGateEnabled,
  KUBEVIRT_DEFAULTS,
  logLevelForVerbosity,
  parseConfig,
  type RawConfig,
  SETTINGS,
  V8_FLAGS,
} from "./mod/config/mod.ts";
import { errorText } from "./ffi/mod.ts";
import { getLogger, setLogLevel, setupLogging } from "./mod/log/mod.ts";
import type { TlsMaterial } from "./mod/rest/mod.ts";
import type { KubeClient, KubevirtCrWatch } from "./mod/kube/mod.ts";
import type { HandlerOptions } from "./mod/handler/mod.ts";

/** virtnode's own version, from deno.json. */
export const VERSION: string = denoJson.version;

/** Exit code for a bad flag or configuration value. */
const EXIT_USAGE = 2;

/**
 * A bad flag or configuration value: {@linkcode main} prints `virtnode <command>: <message>`
 * and exits {@linkcode EXIT_USAGE}. Every subcommand reports its usage errors this way.
 */
class UsageError extends Error {
  /** `command` names the subcommand (`handler`), or none for the program's own flags. */
  constructor(readonly command: string | undefined, message: string) {
    super(message);
    this.name = "UsageError";
  }
}

/** Reads and validates the configuration of a subcommand; exits 2 on a bad value. */
function loadConfig(command: Command, component: string): Config {
  const opts = command.optsWithGlobals() as RawConfig;
  let config: Config;
  try {
    config = parseConfig(opts);
  } catch (error) {
    if (error instanceof ConfigError) {
      throw new UsageError(undefined, error.message);
    }
    throw error;
  }
  try {
    setupLogging({
      level: config.logLevel,
      format: config.logFormat,
      component,
      file: config.logFile,
    });
  } catch (error) {
    // --log-file names a file that cannot be opened.
    throw new UsageError(undefined, errorText(error));
  }
  return config;
}

/** The command line that runs this same program with `args` (compiled or from source). */
function selfCommand(args: string[]): { cmd: string; args: string[] } {
  if (Deno.build.standalone) return { cmd: Deno.execPath(), args };
  const main = new URL(import.meta.url).pathname;
  return {
    cmd: Deno.execPath(),
    args: ["run", "-A", "--no-prompt", `--v8-flags=${V8_FLAGS}`, main, ...args],
  };
}

function positiveInt(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1 || n > 1000) {
    throw new InvalidArgumentError("allowed: a whole number from 1 to 1000");
  }
  return n;
}

function absoluteDir(value: string): string {
  if (!value.startsWith("/") || value.split("/").includes("..")) {
    throw new InvalidArgumentError("allowed: an absolute path without '..'");
  }
  return value;
}

function portNumber(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0 || n > 65535) {
    throw new InvalidArgumentError("allowed: a port from 0 to 65535 (0: any free one)");
  }
  return n;
}

function hostPort(value: string): string {
  const m = /^(.*):(\d{1,5})$/.exec(value);
  if (!m || Number(m[2]) > 65535) {
    throw new InvalidArgumentError("allowed: host:port, e.g. 0.0.0.0:8186");
  }
  return value;
}

/**
 * A long-running role (handler, launcher) survives a promise nobody awaited: logged as
 * an error instead of ending the process, which would leave a node or a VM unmanaged.
 */
async function keepAliveOnUnhandledRejections(): Promise<void> {
  const { surviveUnhandledRejections } = await import("./mod/lifecycle/mod.ts");
  surviveUnhandledRejections((error) =>
    getLogger().error("Unhandled promise rejection: {error}", { error })
  );
}

/** Loads the Kubernetes client, retrying with backoff until it works or `signal` aborts. */
async function kubeClientWithRetry(config: Config, signal: AbortSignal) {
  const { loadKubeClient } = await import("./mod/kube/mod.ts");
  const { sleep } = await import("./mod/lifecycle/mod.ts");
  const log = getLogger("kube");
  let delay = 1_000;
  for (;;) {
    try {
      return await loadKubeClient({ kubeconfigPath: config.kubeconfig });
    } catch (error) {
      if (signal.aborted) throw error;
      log.error("Cannot load Kubernetes credentials, retrying in {seconds} s: {error}", {
        seconds: delay / 1000,
        error,
      });
      await sleep(delay, signal);
      delay = Math.min(delay * 2, 30_000);
    }
  }
}

/** Adds `virtnode version`: virtnode's, Deno's, V8's and libvirt's versions. */
function versionCommand(program: Command): void {
  program.command("version")
    .description("print virtnode's, Deno's, V8's and libvirt's versions")
    .action(async () => {
      const lines = [
        `virtnode ${VERSION}`,
        `deno ${Deno.version.deno}`,
        `v8 ${Deno.version.v8}`,
        `typescript ${Deno.version.typescript}`,
      ];
      try {
        const { hostProbes } = await import("./mod/preflight/mod.ts");
        lines.push(`libvirt ${await hostProbes.libvirtVersion()}`);
      } catch (error) {
        lines.push(`libvirt unavailable: ${errorText(error)}`);
      }
      console.log(lines.join("\n"));
    });
}

/** Adds `virtnode check`: the preflight, each check PASS/WARN/FAIL. */
function checkCommand(program: Command): void {
  program.command("check")
    .description("preflight: libvirt, KVM, apiserver and directories, each PASS/WARN/FAIL")
    .option(
      "--local",
      "local mode (deno task start): libvirt without a security driver is a WARN, not a FAIL",
    )
    .action(async (opts: { local?: boolean }, command: Command) => {
      const config = loadConfig(command, "virtnode-check");
      const { runPreflight, formatReport, hostProbes } = await import("./mod/preflight/mod.ts");
      const results = await runPreflight(config, hostProbes, { local: opts.local === true });
      console.log(formatReport(results));
      const failed = results.filter((r) => r.verdict === "FAIL").length;
      if (failed > 0) {
        console.log(`\n${failed} check(s) failed`);
        Deno.exit(1);
      }
    });
}

/**
 * The handler's live migration settings: the address its listeners are reached at, its
 * server and client TLS material (the client certificate from `--client-cert-dir`; no
 * files there: no migration, said once), and in pod-less mode where the proxy's sockets go
 * and libvirtd's socket. Exits with a usage error for a bad address.
 */
async function migrationOptions(
  opts: {
    clientCertDir: string;
    clientCaFile?: string;
    migrationIp?: string;
    migrationSocketDir?: string;
    migrationCnTypes?: string[];
  },
  o: {
    config: { runDir: string; libvirtUri: string };
    serverTls: () => TlsMaterial | Promise<TlsMaterial>;
    caConfigMap?: string;
  },
): Promise<HandlerOptions["migration"]> {
  const { defaultMigrationAddress, libvirtSocketOfUri, migrationNetworkAddress } = await import(
    "./mod/handler/mod.ts"
  );
  // As virt-handler: the migration network's interface, when the operator gave the pod one,
  // wins over the pod's address.
  let onMigrationNetwork: string | undefined;
  try {
    onMigrationNetwork = migrationNetworkAddress();
  } catch (error) {
    throw new UsageError("handler", errorText(error));
  }
  const address = opts.migrationIp ?? onMigrationNetwork ?? Deno.env.get("MY_POD_IP") ??
    defaultMigrationAddress();
  if (!address || !/^[0-9a-fA-F.:]+$/.test(address)) {
    throw new UsageError(
      "handler",
      `--migration-ip ${JSON.stringify(address ?? "")}: expected an IP address`,
    );
  }
  const { TlsMaterial } = await import("./mod/rest/mod.ts");
  const clientTls = new TlsMaterial({
    certFile: `${opts.clientCertDir}/tls.crt`,
    keyFile: `${opts.clientCertDir}/tls.key`,
    caFile: opts.clientCaFile,
    role: "client",
  });
  try {
    await clientTls.load();
  } catch (error) {
    // A node without the client certificate (local mode, a bare pod-less host) runs its VMIs
    // but neither sends nor takes migrations.
    getLogger("handler").info("Live migration is off: {why}", {
      why: `${(error as Error).message} (--client-cert-dir)`,
    });
    return undefined;
  }
  return {
    address,
    serverTls: await o.serverTls(),
    clientTls,
    caConfigMap: o.caConfigMap,
    clientCommonNames: opts.migrationCnTypes?.map((t) => `kubevirt.io:system:client:${t}`),
    socketDir: opts.migrationSocketDir ?? o.config.runDir,
    libvirtSocket: libvirtSocketOfUri(o.config.libvirtUri),
  };
}

/** Adds `virtnode handler`: the node agent, the handler and the node services under one signal. */
function handlerCommand(program: Command): void {
  program.command("handler")
    .description("run the node agent: sync this node's VMIs with their launchers and libvirt")
    .option("--podless", "start launchers as processes of this host (no launcher pods)")
    .option(
      "--health-address <host:port>",
      "serve /healthz and /readyz here (and /metrics, to loopback clients only)",
      hostPort,
      "0.0.0.0:8186",
    )
    .option(
      "--metrics-address <host:port>",
      "serve /metrics to every client here, for a ServiceMonitor's scrape (it lists every VMI of the node); may be --health-address itself",
      hostPort,
    )
    .option("--workers <n>", "concurrent VMI syncs", positiveInt, 8)
    .option(
      "--kubelet-pods-dir <dir>",
      "kubelet pods directory",
      absoluteDir,
      "/var/lib/kubelet/pods",
    )
    .option("--image-dir <dir>", "containerDisk images (pod-less mode)", absoluteDir)
    .option("--host-disk-root <dir>", "the only directory hostDisk volumes may use", absoluteDir)
    .option(
      "--device-plugins-dir <dir>",
      "kubelet device-plugins directory (KubeVirt mode)",
      absoluteDir,
      "/var/lib/kubelet/device-plugins",
    )
    .option("--max-devices <n>", "devices each device plugin advertises", positiveInt, 1000)
    .option("--cpu-manager-state <file>", "kubelet CPU manager state file", absoluteDir)
    .option("--no-node-labeller", "do not label this node from libvirt's capabilities")
    .option(
      "--node-labeller-dir <dir>",
      "read libvirt's capabilities from the files KubeVirt's node-labeller init container writes here, when it holds them",
      absoluteDir,
      "/var/lib/kubevirt-node-labeller",
    )
    .option(
      "--pod-network-cidr <cidrs>",
      "pod-less mode: the VMs' pod address ranges, one per family, comma-separated",
      "10.245.0.0/16",
    )
    .option(
      "--pod-network-bridge <name>",
      "pod-less mode: the node bridge the VMs' pod interfaces join",
      "virtnode0",
    )
    .option("--cni-bin-dir <dir>", "pod-less mode: the CNI plugins", absoluteDir, "/usr/lib/cni")
    .option(
      "--console-server-port <port>",
      "serve the REST API virt-api calls (console, VNC, pause, guest info) on this port, mutual TLS (KubeVirt: 8186)",
      portNumber,
    )
    .option("--console-server-address <host>", "address of the REST API", "0.0.0.0")
    .option(
      "--migration-cn-types <type>",
      "a migration client's certificate must be kubevirt.io:system:client:<type>; repeatable, as virt-handler's (default: virt-handler, migration)",
      (value: string, previous?: string[]) => [...(previous ?? []), value],
    )
    .option(
      "--health-tls",
      "serve /healthz, /readyz and /metrics over TLS with --server-cert-dir's certificate (as virt-handler serves 8443)",
    )
    .option(
      "--server-cert-dir <dir>",
      "the REST API's certificate and key (tls.crt, tls.key)",
      absoluteDir,
      "/etc/virt-handler/servercertificates",
    )
    .option(
      "--client-ca-file <file>",
      "CA bundle REST clients' certificates must chain to (instead of the CA ConfigMap)",
      absoluteDir,
    )
    .option(
      "--ca-configmap <namespace/name>",
      "ConfigMap whose ca-bundle REST clients' certificates must chain to (watched)",
      "kubevirt/kubevirt-ca",
    )
    .option(
      "--client-cert-dir <dir>",
      "the certificate and key this handler presents to another node's migration listener (tls.crt, tls.key); live migration needs it",
      absoluteDir,
      "/etc/virt-handler/clientcertificates",
    )
    .option(
      "--migration-ip <address>",
      "the address other nodes' handlers reach this node's migration listeners at (default: the migration network's interface migration0, else MY_POD_IP, else this host's first global address)",
    )
    .option(
      "--migration-socket-dir <dir>",
      "pod-less mode: the folder of the migration proxy sockets, the same path on every node (default: --run-dir)",
      absoluteDir,
    )
    .action(async (opts: HandlerFlags, command: Command) => {
      await runHandler(opts, loadConfig(command, "virt-handler"));
    });
}

/** The `handler` subcommand's flags, as commander gives them. */
interface HandlerFlags {
  podless?: boolean;
  healthAddress: string;
  metricsAddress?: string;
  workers: number;
  kubeletPodsDir: string;
  imageDir?: string;
  hostDiskRoot?: string;
  devicePluginsDir: string;
  maxDevices: number;
  cpuManagerState?: string;
  nodeLabeller: boolean;
  nodeLabellerDir: string;
  podNetworkCidr: string;
  podNetworkBridge: string;
  cniBinDir: string;
  consoleServerPort?: number;
  consoleServerAddress: string;
  migrationCnTypes?: string[];
  healthTls?: boolean;
  serverCertDir: string;
  clientCaFile?: string;
  caConfigmap: string;
  clientCertDir: string;
  migrationIp?: string;
  migrationSocketDir?: string;
}

/** Runs the node agent until SIGTERM or SIGINT: checks its flags, then starts every part. */
async function runHandler(opts: HandlerFlags, config: Config): Promise<void> {
  checkListenerPorts(opts);
  const { rest, healthTls, serverCerts } = await handlerTls(opts);
  const migration = await migrationOptions(opts, {
    config,
    serverTls: () => rest?.tls ?? healthTls ?? serverCerts(),
    caConfigMap: opts.clientCaFile ? undefined : opts.caConfigmap,
  });
  const podNetwork = await podlessNetwork(opts);
  if (opts.podless) {
    const { podlessSocketPathProblem } = await import("./mod/handler/mod.ts");
    const problem = podlessSocketPathProblem(config);
    if (problem) throw new UsageError("handler", problem);
  }
  await keepAliveOnUnhandledRejections();
  const [{ Handler }, kube, { runStages }] = await Promise.all([
    import("./mod/handler/mod.ts"),
    import("./mod/kube/mod.ts"),
    import("./mod/lifecycle/mod.ts"),
  ]);
  // One signal for everything the handler runs; SIGTERM and SIGINT abort it.
  const stop = new AbortController();
  Deno.addSignalListener("SIGTERM", () => stop.abort());
  Deno.addSignalListener("SIGINT", () => stop.abort());
  const client = await kubeClientWithRetry(config, stop.signal);
  const globals = ["--log-level", config.logLevel, "--log-format", "json"];
  // The KubeVirt CR: the cluster's configuration, followed live (mod/config/kubevirt.ts);
  // /healthz reports the version in force.
  // virt-handler's apiserver budget from the start, until the CR says otherwise.
  if (!opts.podless) client.setRateLimit(KUBEVIRT_DEFAULTS.handlerRateLimit);
  const kubevirtCr = new kube.KubevirtCrWatch(client, {
    nodeName: config.nodeName,
    podless: opts.podless,
  });
  const services = await handlerNodeServices(opts, config, client, kubevirtCr, globals);
  const handler = await Handler.create(config, client, {
    kubevirtCr,
    // Host-model VMIs are synced again once the labeller has read the host's CPU.
    hostCpu: services.labeller,
    deprecatedMachineTypes: services.labeller
      ? () => services.labeller!.deprecatedMachineTypes
      : undefined,
    version: VERSION,
    healthAddress: opts.healthAddress,
    metricsAddress: opts.metricsAddress,
    rest,
    healthTls,
    workers: opts.workers,
    podsDir: opts.kubeletPodsDir,
    imageDir: opts.imageDir,
    hostDiskRoot: opts.hostDiskRoot,
    podNetwork: opts.podless ? podNetwork : undefined,
    migration,
    hostCommand: opts.podless ? (o) => launcherHostInvocation(globals, o) : undefined,
  });
  // Unschedulable first, so no new VMI lands here while the handler drains.
  await runStages([...services.stages, [handler], [kubevirtCr]], stop.signal);
  Deno.exit(0);
}

/**
 * Two listeners on one port cannot both bind (port 0 is any free one, never the same);
 * --metrics-address may name --health-address itself, which is then one listener.
 */
function checkListenerPorts(opts: HandlerFlags): void {
  const portOf = (address: string) => address.slice(address.lastIndexOf(":") + 1);
  const listeners = [
    ["--health-address", opts.healthAddress, portOf(opts.healthAddress)],
    ...(opts.metricsAddress !== undefined && opts.metricsAddress !== opts.healthAddress
      ? [["--metrics-address", opts.metricsAddress, portOf(opts.metricsAddress)]]
      : []),
    ...(opts.consoleServerPort !== undefined
      ? [[
        "--console-server-port",
        String(opts.consoleServerPort),
        String(opts.consoleServerPort),
      ]]
      : []),
  ];
  for (const [i, [flag, value, port]] of listeners.entries()) {
    const clash = listeners.slice(i + 1).find((other) => port !== "0" && other[2] === port);
    if (clash) {
      throw new UsageError(
        "handler",
        `${flag} ${value} and ${clash[0]} ${clash[1]} need different ports`,
      );
    }
  }
}

/**
 * The handler's TLS: the REST API's listener (with --console-server-port), the health
 * endpoints' (with --health-tls), and the server certificate both and migrations use.
 */
async function handlerTls(opts: HandlerFlags): Promise<{
  rest?: { hostname: string; port: number; tls: TlsMaterial; caConfigMap?: string };
  healthTls?: TlsMaterial;
  serverCerts: () => Promise<TlsMaterial>;
}> {
  const serverCerts = async () => {
    const { TlsMaterial } = await import("./mod/rest/mod.ts");
    const tls = new TlsMaterial({
      certFile: `${opts.serverCertDir}/tls.crt`,
      keyFile: `${opts.serverCertDir}/tls.key`,
      caFile: opts.clientCaFile,
    });
    try {
      await tls.load();
    } catch (error) {
      throw new UsageError("handler", errorText(error));
    }
    return tls;
  };
  let rest: { hostname: string; port: number; tls: TlsMaterial; caConfigMap?: string } | undefined;
  if (opts.consoleServerPort !== undefined) {
    if (!/^[^/\s]+\/[^/\s]+$/.test(opts.caConfigmap)) {
      throw new UsageError(
        "handler",
        `--ca-configmap ${opts.caConfigmap}: expected namespace/name`,
      );
    }
    rest = {
      hostname: opts.consoleServerAddress,
      port: opts.consoleServerPort,
      tls: await serverCerts(),
      caConfigMap: opts.clientCaFile ? undefined : opts.caConfigmap,
    };
  }
  const healthTls = opts.healthTls ? rest?.tls ?? await serverCerts() : undefined;
  return { rest, healthTls, serverCerts };
}

/** Pod-less mode's pod network from its flags, checked (KubeVirt mode reads none of it). */
async function podlessNetwork(opts: HandlerFlags) {
  const podNetwork = {
    bridge: opts.podNetworkBridge,
    subnets: String(opts.podNetworkCidr).split(",").map((c: string) => c.trim()).filter(Boolean),
    binDir: opts.cniBinDir,
  };
  const { checkPodlessNetwork } = await import("./mod/network/mod.ts");
  const wrong = checkPodlessNetwork(podNetwork);
  if (wrong) {
    throw new UsageError(
      "handler",
      `invalid pod network (--pod-network-cidr, --pod-network-bridge): ${wrong}`,
    );
  }
  return podNetwork;
}

/** The command line of the launcher host the pod-less handler starts. */
function launcherHostInvocation(
  globals: string[],
  o: {
    libvirtUri: string;
    hostId: string;
    dir: string;
    imageDir: string;
    notifySocket?: string;
    hostDiskRoot?: string;
    migrationSocketDir?: string;
  },
): ReturnType<typeof selfCommand> {
  return selfCommand([
    ...globals,
    "--libvirt-uri",
    o.libvirtUri,
    "launcher-host",
    "--host-id",
    o.hostId,
    "--dir",
    o.dir,
    "--image-dir",
    o.imageDir,
    ...(o.notifySocket ? ["--notify-socket", o.notifySocket] : []),
    ...(o.hostDiskRoot ? ["--host-disk-root", o.hostDiskRoot] : []),
    ...(o.migrationSocketDir ? ["--migration-socket-dir", o.migrationSocketDir] : []),
  ]);
}

/**
 * The node's services beside the handler (heartbeat, labeller, device plugins, host
 * devices), and what of them follows the KubeVirt CR at once, as in virt-handler.
 */
async function handlerNodeServices(
  opts: HandlerFlags,
  config: Config,
  client: KubeClient,
  kubevirtCr: KubevirtCrWatch,
  globals: string[],
) {
  const [node, kube] = await Promise.all([
    import("./mod/node/mod.ts"),
    import("./mod/kube/mod.ts"),
  ]);
  // Mediated devices follow the cluster's configuration and the node's labels, which each
  // heartbeat brings back (KubeVirt mode: the plugins are the kubelet's).
  let hostDevices: InstanceType<typeof node.HostDeviceConfiguration> | undefined;
  const services = node.nodeServices(client, {
    nodeName: config.nodeName,
    libvirtUri: config.libvirtUri,
    // libvirt's libraries and workers cost the handler ~30 MB RSS for as long as they
    // are mapped; a child reads them (what KubeVirt's node-labeller script does).
    // Under virt-operator, KubeVirt's init container has written them: no libvirt here.
    readCapabilities: async (uri, gather) =>
      await node.readCapabilityFiles(opts.nodeLabellerDir, gather) ??
        node.readCapabilitiesInChild(
          selfCommand([
            ...globals,
            "--libvirt-uri",
            uri,
            "labeller",
            "--print-documents",
            ...(gather.virttype ? ["--virttype", gather.virttype] : []),
          ]),
          gather,
        ),
    // Pod-less hosts have no kubelet to register with: no device plugins there.
    devicePlugins: opts.podless
      ? false
      : { pluginDir: opts.devicePluginsDir, maxDevices: opts.maxDevices },
    heartbeat: {
      ...(opts.cpuManagerState ? { cpuManagerStatePaths: [opts.cpuManagerState] } : {}),
      cpuManagerGate: () => featureGateEnabled(kubevirtCr.config(), "CPUManager"),
      onNode: (n) => hostDevices?.nodeLabels(n.metadata?.labels ?? {}),
    },
    labeller: opts.nodeLabeller ? {} : false,
    recorder: new kube.EventRecorder(client, {
      host: config.nodeName,
      component: "node-labeller",
    }),
  });
  if (services.devicePlugins) {
    hostDevices = new node.HostDeviceConfiguration(services.devicePlugins);
  }
  // What follows the cluster's configuration at once, as in virt-handler: the labeller's
  // obsolete CPU models, the CPU manager labels (one beat now) and the log level.
  let cpuManagerGate = false;
  kubevirtCr.onChange(() => {
    const cluster = kubevirtCr.config();
    setLogLevel(
      cluster.handlerLogVerbositySet
        ? logLevelForVerbosity(cluster.handlerLogVerbosity)
        : config.logLevel,
    );
    services.labeller?.setObsoleteModels(cluster.obsoleteCpuModels?.slice());
    hostDevices?.configure({
      permittedHostDevices: cluster.permittedHostDevices,
      mediatedDevicesConfiguration: cluster.mediatedDevicesConfiguration,
      mdevHandling: !featureGateEnabled(cluster, node.DISABLE_MDEV_CONFIGURATION_GATE),
    });
    // KubeVirt mode stands where virt-handler stands: its apiserver budget too. Pod-less
    // mode also does virt-controller's writes, and is not limited.
    if (!opts.podless) {
      try {
        client.setRateLimit(cluster.handlerRateLimit);
      } catch (error) {
        getLogger("handler").warn("Keeping the apiserver rate limit in force: {error}", {
          error,
        });
      }
    }
    const gate = featureGateEnabled(cluster, "CPUManager");
    if (gate !== cpuManagerGate) {
      cpuManagerGate = gate;
      services.heartbeat.beatNow();
    }
  });
  return services;
}

/** Adds `virtnode heartbeat`: one beat by hand, or the node's heartbeat state. */
function heartbeatCommand(program: Command): void {
  program.command("heartbeat")
    .description("write one heartbeat of this node, or --show its heartbeat state")
    .option("--show", "print the node's schedulable label, heartbeat and its age; write nothing")
    .addOption(
      new Option("--schedulable <value>", "also set kubevirt.io/schedulable")
        .choices(["true", "false"]),
    )
    .option("--cpu-manager-state <file>", "kubelet CPU manager state file", absoluteDir)
    .action(async (opts, command: Command) => {
      const config = loadConfig(command, "virtnode-heartbeat");
      const { loadKubeClient } = await import("./mod/kube/mod.ts");
      const { Heartbeat, readNodeHeartbeat } = await import("./mod/node/mod.ts");
      const client = await loadKubeClient({ kubeconfigPath: config.kubeconfig });
      try {
        if (opts.show) {
          console.log(JSON.stringify(await readNodeHeartbeat(client, config.nodeName), null, 2));
          return;
        }
        const heartbeat = new Heartbeat(
          client,
          config.nodeName,
          opts.cpuManagerState ? { cpuManagerStatePaths: [opts.cpuManagerState] } : {},
        );
        const state = await heartbeat.beatOnce({
          schedulable: opts.schedulable === undefined ? "unchanged" : opts.schedulable === "true",
        });
        console.log(JSON.stringify({ node: config.nodeName, ...state }, null, 2));
      } finally {
        client.close();
      }
    });
}

/** Adds `virtnode labeller`: the labels libvirt's capabilities give, printed or applied. */
function labellerCommand(program: Command): void {
  program.command("labeller")
    .description("print the node labels libvirt's capabilities give; --apply writes them")
    .option("--apply", "replace this node's labeller labels (guarded by a test of the labels read)")
    .addOption(
      new Option("--virttype <type>", "domain type to ask libvirt about (default: kvm if /dev/kvm)")
        .choices(["kvm", "qemu"]),
    )
    .addOption(
      // The handler's labeller runs this to keep libvirt out of its own process.
      new Option("--print-documents", "print the capability documents read, as JSON")
        .hideHelp(),
    )
    .action(async (opts, command: Command) => {
      const config = loadConfig(command, "virtnode-labeller");
      const { capabilityDocuments, computeNodeLabels, NodeLabeller, readCapabilities } =
        await import("./mod/node/mod.ts");
      const gathered = await readCapabilities(
        config.libvirtUri,
        opts.virttype ? { virttype: opts.virttype } : {},
      );
      if (opts.printDocuments) {
        console.log(JSON.stringify(capabilityDocuments(gathered)));
        return;
      }
      if (!opts.apply) {
        const { labels, obsoleteHostModel, invalid } = computeNodeLabels(gathered.info);
        for (const key of Object.keys(labels).sort()) console.log(`${key}=${labels[key]}`);
        if (obsoleteHostModel) {
          console.error(`virtnode: host-model CPU "${obsoleteHostModel}" is obsolete`);
        }
        for (const key of invalid) console.error(`virtnode: left out invalid label "${key}"`);
        return;
      }
      const { EventRecorder, loadKubeClient } = await import("./mod/kube/mod.ts");
      const client = await loadKubeClient({ kubeconfigPath: config.kubeconfig });
      try {
        const labeller = new NodeLabeller(client, config.nodeName, {
          source: () => Promise.resolve(gathered.info),
          recorder: new EventRecorder(client, {
            host: config.nodeName,
            component: "node-labeller",
          }),
        });
        const result = await labeller.labelOnce();
        console.log(
          `node "${config.nodeName}": ${result.outcome}, ${
            Object.keys(result.labels).length
          } labels, ${result.removed.length} removed`,
        );
      } finally {
        client.close();
      }
    });
}

/** Adds the hidden `__mntns-child`: a compiled virtnode's mount-namespace worker (see ffi/mntns.ts). */
function mountNamespaceChildCommand(program: Command): void {
  program.command("__mntns-child", { hidden: true })
    .description("internal: perform actions in another mount namespace (see ffi/mntns.ts)")
    .argument("<request>")
    .action(async (request: string) => {
      const { mountNamespaceChild } = await import("./ffi/mod.ts");
      console.log(JSON.stringify(mountNamespaceChild(request)));
    });
}

/** Adds `virtnode launcher`: one VMI's launcher (KubeVirt's virt-launcher role). */
function launcherCommand(program: Command): void {
  program.command("launcher")
    .description(
      "run one VMI's launcher (KubeVirt's virt-launcher role); see 'virtnode launcher --help'",
    )
    .helpOption(false)
    .allowUnknownOption()
    .passThroughOptions()
    .argument("[args...]")
    .action(async (args: string[], _opts, command: Command) => {
      const config = loadConfig(command, "virt-launcher");
      await keepAliveOnUnhandledRejections();
      const { parseLauncherArgs, runLauncher, LauncherArgsError, LAUNCHER_USAGE } = await import(
        "./mod/launcher/mod.ts"
      );
      if (args.includes("--help") || args.includes("-h")) {
        console.log(LAUNCHER_USAGE);
        Deno.exit(0);
      }
      let options;
      try {
        options = parseLauncherArgs(args);
      } catch (error) {
        if (error instanceof LauncherArgsError) {
          throw new UsageError("launcher", `${error.message}\n${helpHint("launcher")}`);
        }
        throw error;
      }
      if (
        options.libvirtUri === "qemu:///system" && config.libvirtUri !== "qemu:///system" &&
        !args.some((a) => a.startsWith("--libvirt-uri"))
      ) {
        options.libvirtUri = config.libvirtUri;
      }
      Deno.exit(await runLauncher(options));
    });
}

/**
 * Adds `virtnode launcher-host`: pod-less mode's one process serving every VMI's launcher
 * on this host (the handler starts and supervises it).
 */
function launcherHostCommand(program: Command): void {
  program.command("launcher-host")
    .description("serve the launchers of every pod-less VMI on this host (started by the handler)")
    .requiredOption(
      "--dir <dir>",
      "the host's directory (control socket, served VMIs)",
      absoluteDir,
    )
    .requiredOption("--host-id <id>", "the name the handler knows this host by")
    .option("--notify-socket <path>", "the handler's notify socket", absoluteDir)
    .requiredOption("--image-dir <dir>", "containerDisk images", absoluteDir)
    .option("--host-disk-root <dir>", "the only directory hostDisk volumes may use", absoluteDir)
    .option("--domain-type <type>", "kvm or qemu (detected from /dev/kvm unless told)")
    .option("--ovmf-dir <dir>", "OVMF firmware directory", absoluteDir)
    .option("--max-workers <n>", "most libvirt call threads", positiveInt, 8)
    .option(
      "--migration-socket-dir <dir>",
      "the folder of the handler's migration proxy sockets, as libvirtd sees it",
      absoluteDir,
      "/var/run/kubevirt",
    )
    .action(async (opts, command: Command) => {
      const config = loadConfig(command, "virt-launcher");
      await keepAliveOnUnhandledRejections();
      if (
        opts.domainType !== undefined && opts.domainType !== "kvm" && opts.domainType !== "qemu"
      ) {
        throw new UsageError(
          "launcher-host",
          `--domain-type must be kvm or qemu, not "${opts.domainType}"`,
        );
      }
      const { runLauncherHost } = await import("./mod/launcher/mod.ts");
      Deno.exit(
        await runLauncherHost({
          dir: opts.dir,
          libvirtUri: config.libvirtUri,
          notifySocket: opts.notifySocket,
          imageDir: opts.imageDir,
          hostDiskRoot: opts.hostDiskRoot,
          domainType: opts.domainType,
          ovmfDir: opts.ovmfDir,
          maxWorkers: opts.maxWorkers,
          migrationSocketDir: opts.migrationSocketDir,
        }),
      );
    });
}

/** The line after a usage error: where the usage of `command` (or the program) is. */
function helpHint(command?: string): string {
  return `(run 'virtnode${command ? ` ${command}` : ""} --help' for usage)`;
}

function buildProgram(): Command {
  const program = new Command("virtnode")
    .description(
      "KubeVirt-compatible node agent: runs VirtualMachineInstances on this node through libvirt",
    )
    .version(VERSION, "-V, --version", "print virtnode's version")
    .showHelpAfterError(helpHint())
    .enablePositionalOptions()
    .exitOverride();
  for (const s of SETTINGS) {
    program.addOption(
      new Option(`${s.flag} <value>`, `${s.description} (env: ${s.env})`),
    );
  }
  versionCommand(program);
  checkCommand(program);
  handlerCommand(program);
  heartbeatCommand(program);
  labellerCommand(program);
  mountNamespaceChildCommand(program);
  launcherCommand(program);
  launcherHostCommand(program);
  // A mistake in a subcommand's flags points at that subcommand's own usage.
  for (const command of program.commands) command.showHelpAfterError(helpHint(command.name()));
  return program;
}

/** Runs the CLI with the given arguments (without the program name). */
export async function main(args: string[]): Promise<void> {
  const program = buildProgram();
  try {
    await program.parseAsync(args, { from: "user" });
  } catch (error) {
    if (error instanceof CommanderError) {
      Deno.exit(error.exitCode === 0 ? 0 : EXIT_USAGE);
    }
    if (error instanceof UsageError) {
      console.error(`virtnode${error.command ? ` ${error.command}` : ""}: ${error.message}`);
      Deno.exit(EXIT_USAGE);
    }
    getLogger().fatal("virtnode failed: {error}", { error });
    console.error(`virtnode: ${errorText(error)}`);
    Deno.exit(1);
  }
}

if (import.meta.main) await main(Deno.args);

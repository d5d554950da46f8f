/**
 * The cluster's configuration: the KubeVirt CR's `spec.configuration`, read as KubeVirt
 * v1.7.0's components read it (`pkg/virt-config`), into one typed value with KubeVirt's
 * defaults. Pure: the watch that feeds it is `mod/kube/kubevirt_cr.ts`.
 *
 * How KubeVirt reads it, and so how this does:
 * - The CR's configuration goes over a fresh copy of the defaults as a JSON merge: nested
 *   objects merge field by field, lists replace, and a field at its zero value (`0`,
 *   `false`, `""`, an empty list or map) is no field at all (Go's `omitempty` drops it on
 *   the way), so it cannot override a default. `memBalloonStatsPeriod` is the exception:
 *   a pointer, so `0` is kept (no balloon statistics).
 * - Five values are checked ({@linkcode parseKubevirtConfiguration}); one bad value refuses
 *   the whole resourceVersion with KubeVirt's message, and the last good configuration
 *   stays in force.
 * - A feature gate is on when it is GA in v1.7.0 or listed in
 *   `developerConfiguration.featureGates`; Beta gates are off until listed.
 *
 * Every key virt-handler or virt-launcher reads, with KubeVirt's default, what in virtnode
 * follows it, and the test that shows it ({@linkcode KUBEVIRT_KEYS} is this table as data;
 * docs/cluster-configuration.md has it for operators). Every row takes effect without a
 * handler restart, as in virt-handler (`migrations.network` is read at start, as there);
 * launcher options reach the domains defined after.
 *
 * | key (under `spec.configuration`) | KubeVirt's default | virtnode | test |
 * |---|---|---|---|
 * | `developerConfiguration.featureGates: CPUManager` | off (Alpha) | heartbeat's `cpumanager` label | I1 |
 * | `developerConfiguration.featureGates: ExpandDisks` | off (Alpha) | launcher options | U2 |
 * | `developerConfiguration.featureGates: ImageVolume` | off (Beta) | containerDisks: nothing to mount | U3, N1 |
 * | `developerConfiguration.useEmulation` | `false` | a launcher may lack `/dev/kvm` | U4 |
 * | `developerConfiguration.logVerbosity.virtHandler, .nodeVerbosity` | `2` | the handler's log level | I1 |
 * | `smbios` | KubeVirt, None, KubeVirt | launcher options | U2, U7 |
 * | `memBalloonStatsPeriod` | `10` | launcher options | U2, U7 |
 * | `virtualMachineOptions.disableFreePageReporting` | absent | launcher options | U2, U7 |
 * | `virtualMachineOptions.disableSerialConsoleLog` | absent | KubeVirt's launcher only | U2 |
 * | `annotation kubevirt.io/vga-display-efi-x86` | absent (Bochs) | launcher options | U2 |
 * | `migrations` | KubeVirt's migration defaults | migration options; pod-less migrations | U1, E1 |
 * | `migrations.network` | absent | KubeVirt mode: migrations listen on `migration0`'s address (read at start) | U9 |
 * | `obsoleteCPUModels` | none | node labeller | I2 |
 * | `evictionStrategy` | None | a Warning Event when such a VMI cannot migrate | U5 |
 * | `vmRolloutStrategy` | `LiveUpdate` | pod-less VMs: CPU and memory changes go live (`Stage`: they wait for a restart) | U1, S1 |
 * | `minCPUModel` | `""` | nothing (nor in KubeVirt v1.7.0) | U1 |
 * | `handlerConfiguration.restClient.rateLimiter.tokenBucketRateLimiter` | 50 QPS, burst 100 | KubeVirt mode: the apiserver token bucket | U6 |
 * | `supportedGuestAgentVersions` | `2.*` to `5.*` | `AgentVersionNotSupported` when the launcher names no agent commands | U1, U10 |
 * | `developerConfiguration.pvcTolerateLessSpaceUpToPercent` | `10` | validated; not applied | U1 |
 * | `permittedHostDevices` | none | PCI, mediated and USB devices: a device plugin per resource | I3 |
 * | `mediatedDevicesConfiguration` | none: every mediated device not externally provided is removed | mediated devices created and removed to match | U8, I4 |
 * | `developerConfiguration.featureGates: DisableMDEVConfiguration` | off (Alpha) | mediated devices left as they are | U8 |
 * | `network.binding.<plugin>.computeResourceOverhead.requests.memory` | none | KubeVirt mode: a migration target's memory hot-plug counts it | U11 |
 * | `additionalGuestMemoryOverheadRatio` | none | KubeVirt mode: the locked-memory limits of a VFIO, realtime or SEV VMI's virtqemud and QEMU | U12 |
 *
 * Tests: U1 tests/unit/kubevirt_config_test.ts (parsing and checks), U2 the same file
 * (launcher options), U3 tests/unit/container_disk_image_volume_test.ts, U4
 * tests/unit/handler_device_ownership_test.ts, U5 tests/unit/handler_status_test.ts, U6
 * tests/unit/kube_rate_limit_test.ts, U7 tests/unit/converter_volumes_test.ts, U8
 * tests/unit/mdev_types_test.ts, U9 tests/unit/migration_network_test.ts, U10
 * tests/unit/guest_agent_support_test.ts, U11 tests/unit/migration_target_hotplug_test.ts, U12
 * tests/unit/launcher_memlock_test.ts, I3 tests/integration/node_device_plugins_test.ts, I1 and I2
 * tests/integration/kubevirt_cr_config_test.ts (a running handler; the labeller), I4
 * tests/integration/node_apiserver_test.ts (the heartbeat hands on the node's labels), E1
 * tests/e2e/migration_qemu_test.ts (pod-less bandwidth), N1 tests/node/image_volume_node_test.ts
 * (the gate turned on live on a real node with containerd 2: a VMI boots from its image volume),
 * S1 tests/soak/hotplug_qemu_test.ts (a VM's new socket and memory reach its guest).
 *
 * @module
 */
import { MIGRATION_DEFAULTS, type MigrationConfiguration } from "../api/mod.ts";

/** KubeVirt v1.7.0's GA feature gates: on whether listed or not. */
export const GA_FEATURE_GATES: readonly string[] = Object.freeze([
  "LiveMigration",
  "SRIOVLiveMigration",
  "NonRoot",
  "PSA",
  "CPUNodeDiscovery",
  "NUMA",
  "CommonInstancetypesDeploymentGate",
  "GPU",
  "HotplugNICs",
  "BochsDisplayForEFIGuests",
  "VMLiveUpdateFeatures",
  "NetworkBindingPlugins",
  "DynamicPodInterfaceNaming",
  "VolumesUpdateStrategy",
  "VolumeMigration",
  "DisableCustomSELinuxPolicy",
  "AutoResourceLimitsGate",
  "ClusterProfiler",
  "VMPersistentState",
  "InstancetypeReferencePolicy",
]);

/** The SMBIOS system fields every domain gets. */
export interface Smbios {
  /** `<entry name="manufacturer">`. */
  manufacturer: string;
  /** `<entry name="product">`. */
  product: string;
  /** `<entry name="version">`. */
  version: string;
  /** `<entry name="sku">`. */
  sku: string;
  /** `<entry name="family">`. */
  family: string;
}

/** The cluster's configuration as the handler uses it. */
export interface KubevirtConfig {
  /** The CR's resourceVersion it came from; `""`: KubeVirt's defaults, no CR read. */
  resourceVersion: string;
  /** The gates listed in `developerConfiguration.featureGates`. */
  featureGates: readonly string[];
  /** `developerConfiguration.useEmulation`. */
  useEmulation: boolean;
  /** The handler's verbosity on this node (`nodeVerbosity[node]` over `virtHandler`). */
  handlerLogVerbosity: number;
  /** Whether the CR set that verbosity (else the handler's own `--log-level` stays). */
  handlerLogVerbositySet: boolean;
  /** The handler's apiserver token bucket. */
  handlerRateLimit: { qps: number; burst: number };
  /** `developerConfiguration.pvcTolerateLessSpaceUpToPercent`. */
  pvcTolerateLessSpaceUpToPercent: number;
  /** `developerConfiguration.minimumReservePVCBytes`. */
  minimumReservePVCBytes: number;
  /** `smbios`, merged field by field over KubeVirt's. */
  smbios: Smbios;
  /** `memBalloonStatsPeriod`, seconds; 0: no statistics. */
  memBalloonStatsPeriod: number;
  /** `virtualMachineOptions.disableFreePageReporting` is present. */
  freePageReportingDisabled: boolean;
  /** `virtualMachineOptions.disableSerialConsoleLog` is present. */
  serialConsoleLogDisabled: boolean;
  /** Bochs display for EFI guests unless the CR's VGA annotation says otherwise. */
  bochsDisplayForEfiGuests: boolean;
  /** `supportedGuestAgentVersions`: regular expressions. */
  supportedGuestAgentVersions: readonly string[];
  /** `evictionStrategy`. */
  evictionStrategy: string;
  /** `vmRolloutStrategy`: whether a running VM's CPU and memory changes go live. */
  vmRolloutStrategy: "LiveUpdate" | "Stage";
  /** `migrations`, over KubeVirt's defaults. */
  migrations: MigrationConfiguration;
  /** `obsoleteCPUModels`' keys; undefined when the CR names none. */
  obsoleteCpuModels: readonly string[] | undefined;
  /** `minCPUModel`. */
  minCpuModel: string;
  /** `permittedHostDevices`, as the CR has it. */
  permittedHostDevices: Record<string, unknown> | undefined;
  /** `mediatedDevicesConfiguration`, as the CR has it. */
  mediatedDevicesConfiguration: Record<string, unknown> | undefined;
  /** The memory each network binding plugin's sidecar asks for, by plugin name. */
  bindingMemoryOverheads: Readonly<Record<string, string>>;
  /** `additionalGuestMemoryOverheadRatio`: scales the launcher's memory overhead. */
  additionalGuestMemoryOverheadRatio: string | undefined;
}

/** KubeVirt v1.7.0's configuration when no CR says otherwise. */
export const KUBEVIRT_DEFAULTS: Readonly<KubevirtConfig> = Object.freeze({
  resourceVersion: "",
  featureGates: [],
  useEmulation: false,
  handlerLogVerbosity: 2,
  handlerLogVerbositySet: false,
  handlerRateLimit: { qps: 50, burst: 100 },
  pvcTolerateLessSpaceUpToPercent: 10,
  minimumReservePVCBytes: 131072,
  smbios: { manufacturer: "KubeVirt", product: "None", version: "", sku: "", family: "KubeVirt" },
  memBalloonStatsPeriod: 10,
  freePageReportingDisabled: false,
  serialConsoleLogDisabled: false,
  bochsDisplayForEfiGuests: true,
  supportedGuestAgentVersions: ["2.*", "3.*", "4.*", "5.*"],
  evictionStrategy: "None",
  vmRolloutStrategy: "LiveUpdate",
  migrations: { ...MIGRATION_DEFAULTS, allowWorkloadDisruption: false },
  obsoleteCpuModels: undefined,
  minCpuModel: "",
  permittedHostDevices: undefined,
  mediatedDevicesConfiguration: undefined,
  bindingMemoryOverheads: {},
  additionalGuestMemoryOverheadRatio: undefined,
});

/** The KubeVirt CR's annotation that gives EFI guests VGA instead of Bochs. */
export const VGA_DISPLAY_EFI_ANNOTATION = "kubevirt.io/vga-display-efi-x86";

/** One row of the key table: a key, KubeVirt's default, what follows it here, its tests. */
export interface KubevirtKey {
  /** The key under `spec.configuration` (or the CR's annotation). */
  key: string;
  /** KubeVirt v1.7.0's default. */
  kubevirtDefault: string;
  /** What in virtnode follows it. */
  virtnode: string;
  /** The module doc's test names (U1, I1, ...). */
  tests: string;
}

/** The module doc's table, as data. */
export const KUBEVIRT_KEYS: readonly KubevirtKey[] = Object.freeze([
  {
    key: "developerConfiguration.featureGates: CPUManager",
    kubevirtDefault: "off (Alpha)",
    virtnode: "the heartbeat's cpumanager label",
    tests: "I1",
  },
  {
    key: "developerConfiguration.featureGates: ExpandDisks",
    kubevirtDefault: "off (Alpha)",
    virtnode: "launcher options",
    tests: "U2",
  },
  {
    key: "developerConfiguration.featureGates: ImageVolume",
    kubevirtDefault: "off (Beta)",
    virtnode: "containerDisks: nothing to mount",
    tests: "U3, N1",
  },
  {
    key: "developerConfiguration.useEmulation",
    kubevirtDefault: "false",
    virtnode: "a launcher may lack /dev/kvm",
    tests: "U4",
  },
  {
    key: "developerConfiguration.logVerbosity.virtHandler, .nodeVerbosity",
    kubevirtDefault: "2",
    virtnode: "the handler's log level",
    tests: "I1",
  },
  {
    key: "smbios",
    kubevirtDefault: "KubeVirt, None, KubeVirt",
    virtnode: "launcher options",
    tests: "U2, U7",
  },
  {
    key: "memBalloonStatsPeriod",
    kubevirtDefault: "10",
    virtnode: "launcher options",
    tests: "U2, U7",
  },
  {
    key: "virtualMachineOptions.disableFreePageReporting",
    kubevirtDefault: "absent",
    virtnode: "launcher options",
    tests: "U2, U7",
  },
  {
    key: "virtualMachineOptions.disableSerialConsoleLog",
    kubevirtDefault: "absent",
    virtnode: "KubeVirt's launcher only",
    tests: "U2",
  },
  {
    key: "annotation kubevirt.io/vga-display-efi-x86",
    kubevirtDefault: "absent (Bochs)",
    virtnode: "launcher options",
    tests: "U2",
  },
  {
    key: "migrations",
    kubevirtDefault: "KubeVirt's migration defaults",
    virtnode: "migration options; pod-less migrations",
    tests: "U1, E1",
  },
  {
    key: "migrations.network",
    kubevirtDefault: "absent",
    virtnode: "KubeVirt mode: migrations listen on `migration0`'s address (read at start)",
    tests: "U9",
  },
  { key: "obsoleteCPUModels", kubevirtDefault: "none", virtnode: "node labeller", tests: "I2" },
  {
    key: "evictionStrategy",
    kubevirtDefault: "None",
    virtnode: "a Warning Event when such a VMI cannot migrate",
    tests: "U5",
  },
  {
    key: "vmRolloutStrategy",
    kubevirtDefault: "`LiveUpdate`",
    virtnode: "pod-less VMs: CPU and memory changes go live (`Stage`: they wait for a restart)",
    tests: "U1, S1",
  },
  {
    key: "minCPUModel",
    kubevirtDefault: '""',
    virtnode: "nothing (nor in KubeVirt v1.7.0)",
    tests: "U1",
  },
  {
    key: "handlerConfiguration.restClient.rateLimiter.tokenBucketRateLimiter",
    kubevirtDefault: "50 QPS, burst 100",
    virtnode: "KubeVirt mode: the apiserver token bucket",
    tests: "U6",
  },
  {
    key: "supportedGuestAgentVersions",
    kubevirtDefault: "2.* to 5.*",
    virtnode: "AgentVersionNotSupported when the launcher names no agent commands",
    tests: "U1, U10",
  },
  {
    key: "developerConfiguration.pvcTolerateLessSpaceUpToPercent",
    kubevirtDefault: "10",
    virtnode: "validated; not applied",
    tests: "U1",
  },
  {
    key: "permittedHostDevices",
    kubevirtDefault: "none",
    virtnode: "PCI, mediated and USB devices: a device plugin per resource",
    tests: "I3",
  },
  {
    key: "mediatedDevicesConfiguration",
    kubevirtDefault: "none: every mediated device not externally provided is removed",
    virtnode: "mediated devices created and removed to match",
    tests: "U8, I4",
  },
  {
    key: "developerConfiguration.featureGates: DisableMDEVConfiguration",
    kubevirtDefault: "off (Alpha)",
    virtnode: "mediated devices left as they are",
    tests: "U8",
  },
  {
    key: "network.binding.<plugin>.computeResourceOverhead.requests.memory",
    kubevirtDefault: "none",
    virtnode: "KubeVirt mode: a migration target's memory hot-plug counts it",
    tests: "U11",
  },
  {
    key: "additionalGuestMemoryOverheadRatio",
    kubevirtDefault: "none",
    virtnode:
      "KubeVirt mode: the locked-memory limits of a VFIO, realtime or SEV VMI's virtqemud and QEMU",
    tests: "U12",
  },
]);

/** Why a configuration was refused, in KubeVirt's words. */
export class KubevirtConfigError extends Error {
  /** Creates the error. */
  constructor(message: string) {
    super(message);
    this.name = "KubevirtConfigError";
  }
}

type Json = Record<string, unknown>;

function object(value: unknown): Json | undefined {
  return value !== null && typeof value === "object" && !Array.isArray(value)
    ? value as Json
    : undefined;
}

/** Go's `omitempty`: the zero value of a field is no field. */
function set(value: unknown): boolean {
  if (value === undefined || value === null || value === false || value === 0 || value === "") {
    return false;
  }
  if (Array.isArray(value)) return value.length > 0;
  if (typeof value === "object") return Object.keys(value).length > 0;
  return true;
}

function integer(value: unknown, fallback: number): number {
  return set(value) && typeof value === "number" && Number.isFinite(value) ? value : fallback;
}

function text(value: unknown, fallback: string): string {
  return set(value) && typeof value === "string" ? value : fallback;
}

/** Where the configuration came from: the CR's metadata and the node reading it. */
export interface KubevirtConfigSource {
  /** The CR's resourceVersion. */
  resourceVersion: string;
  /** The CR's annotations. */
  annotations?: Record<string, string>;
  /** This node's name, for `nodeVerbosity`. */
  nodeName: string;
}

/**
 * The configuration a CR's `spec.configuration` gives, over KubeVirt's defaults. Throws a
 * {@linkcode KubevirtConfigError} with KubeVirt's message for the values KubeVirt refuses:
 * an image pull policy other than Always, Never or IfNotPresent, a memory overcommit or a
 * CPU allocation ratio at or below 0, a PVC tolerance outside 0..100, and a default network
 * interface other than bridge, slirp or masquerade.
 */
export function parseKubevirtConfiguration(
  configuration: unknown,
  source: KubevirtConfigSource,
): KubevirtConfig {
  const c = object(configuration) ?? {};
  const dev = object(c.developerConfiguration) ?? {};
  const network = object(c.network) ?? {};

  // KubeVirt's checks, on the merged values, in its order and words.
  const pullPolicy = text(c.imagePullPolicy, "IfNotPresent");
  if (!["Always", "Never", "IfNotPresent"].includes(pullPolicy)) {
    throw new KubevirtConfigError(`invalid dev.imagePullPolicy in config: ${pullPolicy}`);
  }
  const overcommit = integer(dev.memoryOvercommit, 100);
  if (overcommit <= 0) {
    throw new KubevirtConfigError(`invalid memoryOvercommit in ConfigMap: ${overcommit}`);
  }
  const ratio = integer(dev.cpuAllocationRatio, 10);
  if (ratio <= 0) {
    throw new KubevirtConfigError(`invalid cpu allocation ratio in ConfigMap: ${ratio}`);
  }
  const tolerance = integer(
    dev.pvcTolerateLessSpaceUpToPercent,
    KUBEVIRT_DEFAULTS.pvcTolerateLessSpaceUpToPercent,
  );
  if (tolerance < 0 || tolerance > 100) {
    throw new KubevirtConfigError(`invalid lessPVCSpaceToleration in ConfigMap: ${tolerance}`);
  }
  const defaultInterface = text(network.defaultNetworkInterface, "bridge");
  if (!["bridge", "slirp", "masquerade"].includes(defaultInterface)) {
    throw new KubevirtConfigError(
      `invalid default-network-interface in config: ${defaultInterface}`,
    );
  }

  const verbosity = object(dev.logVerbosity) ?? {};
  const nodeVerbosity = integer(object(verbosity.nodeVerbosity)?.[source.nodeName], 0);
  const handlerVerbosity = nodeVerbosity > 0
    ? nodeVerbosity
    : integer(verbosity.virtHandler, KUBEVIRT_DEFAULTS.handlerLogVerbosity);

  const bucket = object(
    object(object(object(c.handlerConfiguration)?.restClient)?.rateLimiter)
      ?.tokenBucketRateLimiter,
  ) ?? {};

  const smbios = object(c.smbios) ?? {};
  const d = KUBEVIRT_DEFAULTS.smbios;

  const migrationsSet = object(c.migrations) ?? {};
  const migrations: MigrationConfiguration = { ...MIGRATION_DEFAULTS };
  for (const [field, value] of Object.entries(migrationsSet)) {
    if (set(value)) migrations[field] = value;
  }
  if (migrations.allowWorkloadDisruption === undefined) {
    migrations.allowWorkloadDisruption = migrations.allowPostCopy === true;
  }

  const vmOptions = object(c.virtualMachineOptions) ?? {};
  const gates = Array.isArray(dev.featureGates)
    ? dev.featureGates.filter((g): g is string => typeof g === "string")
    : [];
  const agentVersions = Array.isArray(c.supportedGuestAgentVersions) &&
      c.supportedGuestAgentVersions.length > 0
    ? c.supportedGuestAgentVersions.filter((v): v is string => typeof v === "string")
    : KUBEVIRT_DEFAULTS.supportedGuestAgentVersions;
  const bindingMemory: Record<string, string> = {};
  for (const [name, plugin] of Object.entries(object(network.binding) ?? {})) {
    const memory = object(object(object(plugin)?.computeResourceOverhead)?.requests)?.memory;
    if (typeof memory === "string" || typeof memory === "number") {
      bindingMemory[name] = String(memory);
    }
  }
  const obsolete = object(c.obsoleteCPUModels);
  const obsoleteModels = obsolete ? Object.keys(obsolete).sort() : [];

  return {
    resourceVersion: source.resourceVersion,
    featureGates: gates,
    useEmulation: dev.useEmulation === true,
    handlerLogVerbosity: handlerVerbosity,
    handlerLogVerbositySet: nodeVerbosity > 0 || set(verbosity.virtHandler),
    handlerRateLimit: {
      qps: typeof bucket.qps === "number" ? bucket.qps : KUBEVIRT_DEFAULTS.handlerRateLimit.qps,
      burst: typeof bucket.burst === "number"
        ? bucket.burst
        : KUBEVIRT_DEFAULTS.handlerRateLimit.burst,
    },
    pvcTolerateLessSpaceUpToPercent: tolerance,
    minimumReservePVCBytes: integer(
      dev.minimumReservePVCBytes,
      KUBEVIRT_DEFAULTS.minimumReservePVCBytes,
    ),
    smbios: {
      manufacturer: text(smbios.manufacturer, d.manufacturer),
      product: text(smbios.product, d.product),
      version: text(smbios.version, d.version),
      sku: text(smbios.sku, d.sku),
      family: text(smbios.family, d.family),
    },
    // A pointer in KubeVirt's type: 0 is kept.
    memBalloonStatsPeriod: typeof c.memBalloonStatsPeriod === "number" &&
        Number.isInteger(c.memBalloonStatsPeriod) && c.memBalloonStatsPeriod >= 0
      ? c.memBalloonStatsPeriod
      : KUBEVIRT_DEFAULTS.memBalloonStatsPeriod,
    freePageReportingDisabled: vmOptions.disableFreePageReporting !== undefined &&
      vmOptions.disableFreePageReporting !== null,
    serialConsoleLogDisabled: vmOptions.disableSerialConsoleLog !== undefined &&
      vmOptions.disableSerialConsoleLog !== null,
    bochsDisplayForEfiGuests: source.annotations?.[VGA_DISPLAY_EFI_ANNOTATION] === undefined,
    supportedGuestAgentVersions: agentVersions,
    evictionStrategy: text(c.evictionStrategy, KUBEVIRT_DEFAULTS.evictionStrategy),
    vmRolloutStrategy: c.vmRolloutStrategy === "Stage" ? "Stage" : "LiveUpdate",
    migrations,
    obsoleteCpuModels: obsoleteModels.length > 0 ? obsoleteModels : undefined,
    minCpuModel: text(c.minCPUModel, ""),
    permittedHostDevices: object(c.permittedHostDevices),
    mediatedDevicesConfiguration: object(c.mediatedDevicesConfiguration),
    bindingMemoryOverheads: bindingMemory,
    additionalGuestMemoryOverheadRatio: typeof c.additionalGuestMemoryOverheadRatio === "string" &&
        c.additionalGuestMemoryOverheadRatio !== ""
      ? c.additionalGuestMemoryOverheadRatio
      : undefined,
  };
}

/** Whether `gate` is on in `config`: GA in KubeVirt v1.7.0, or listed. */
export function featureGateEnabled(config: KubevirtConfig, gate: string): boolean {
  return GA_FEATURE_GATES.includes(gate) || config.featureGates.includes(gate);
}

/** The log level a KubeVirt verbosity means here: 4 and up is debug, below it info. */
export function logLevelForVerbosity(verbosity: number): "debug" | "info" {
  return verbosity >= 4 ? "debug" : "info";
}

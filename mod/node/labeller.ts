/**
 * The node labeller, as KubeVirt's virt-handler runs it: labels that tell the scheduler
 * which CPU models, CPU features, machine types, TSC frequency and confidential-computing
 * technologies this node offers. Everything is read straight from libvirt through
 * `ffi/` (host capabilities, domain capabilities and the host-model baseline); the
 * labels are computed by pure functions; the Node is written by a JSON patch guarded by
 * a `test` of the labels as read, so a concurrent writer makes the patch fail safe and
 * the labeller re-reads and retries.
 *
 * @module
 */

import { kvmUsable } from "../host/mod.ts";
import { LIBVIRT_ERROR_CODES } from "../../ffi/mod.ts";
import { Annotations, Labels } from "../api/mod.ts";
import {
  detailOf,
  type EventRecorder,
  type KubeClient,
  type KubeObject,
  PatchConflictError,
  patchNodeJson,
  replaceMapWithTest,
} from "../kube/mod.ts";
import { sleep } from "../lifecycle/mod.ts";
import { getLogger } from "../log/mod.ts";
import {
  type DomainCapabilitiesInfo,
  type HostCapabilitiesInfo,
  hostModelCpuXml,
  parseCpuFeatures,
  parseDomainCapabilities,
  parseHostCapabilities,
} from "./capabilities.ts";

const log = getLogger("node-labeller");

/** Label keys and prefixes the labeller owns, with KubeVirt's values. */
export const LabellerLabels = {
  CpuModelPrefix: Labels.CpuModelPrefix,
  CpuModelMigrationPrefix: "cpu-model-migration.node.kubevirt.io/",
  CpuFeaturePrefix: Labels.CpuFeaturePrefix,
  CpuVendorPrefix: Labels.CpuVendorPrefix,
  CpuTimerPrefix: Labels.CpuTimerPrefix,
  HostModelCpuPrefix: Labels.HostModelCpuPrefix,
  HostModelRequiredFeaturesPrefix: Labels.HostModelRequiredFeaturesPrefix,
  HypervPrefix: Labels.HypervPrefix,
  MachineTypePrefix: Labels.MachineTypePrefix,
  ObsoleteHostModel: "node-labeller.kubevirt.io/obsolete-host-model",
  Realtime: "kubevirt.io/realtime",
  Sev: "kubevirt.io/sev",
  SevEs: "kubevirt.io/sev-es",
  SevSnp: "kubevirt.io/sev-snp",
  Tdx: "kubevirt.io/tdx",
  SecureExecution: "kubevirt.io/s390-pv",
  VmArchPrefix: "kubevirt.io/vm-arch-",
} as const;

/**
 * Every key or prefix whose labels the labeller replaces on each run (KubeVirt's
 * `nodeLabellerLabels`): a label starting with one of these and not computed this time
 * is stale and removed.
 */
export const LABELLER_LABEL_PREFIXES: readonly string[] = Object.freeze([
  LabellerLabels.CpuFeaturePrefix,
  LabellerLabels.CpuModelPrefix,
  LabellerLabels.CpuModelMigrationPrefix,
  LabellerLabels.CpuTimerPrefix,
  LabellerLabels.HypervPrefix,
  LabellerLabels.Realtime,
  LabellerLabels.Sev,
  LabellerLabels.SevEs,
  LabellerLabels.SevSnp,
  LabellerLabels.Tdx,
  LabellerLabels.SecureExecution,
  LabellerLabels.HostModelCpuPrefix,
  LabellerLabels.HostModelRequiredFeaturesPrefix,
  LabellerLabels.ObsoleteHostModel,
  LabellerLabels.MachineTypePrefix,
  LabellerLabels.VmArchPrefix,
  LabellerLabels.CpuVendorPrefix,
]);

/** KubeVirt's default `obsoleteCPUModels`: never labelled, and flagged as host model. */
export const DEFAULT_OBSOLETE_CPU_MODELS: readonly string[] = Object.freeze(
  [
    "486",
    "pentium",
    "pentium2",
    "pentium3",
    "pentiumpro",
    "coreduo",
    "n270",
    "core2duo",
    "Conroe",
    "athlon",
    "phenom",
    "qemu64",
    "qemu32",
    "kvm64",
    "kvm32",
    "Opteron_G1",
    "Opteron_G2",
  ].flatMap((m) => [m, `${m}-v1`]),
);

/** Event reason KubeVirt records on the Node when the host model is obsolete. */
export const HOST_MODEL_OBSOLETE_REASON = "HostModelIsObsolete";

/** Everything the labels are computed from. */
export interface NodeLabelInfo {
  /** From the host capabilities. */
  host: HostCapabilitiesInfo;
  /** From the domain capabilities. */
  domain: DomainCapabilitiesInfo;
  /** Required features of the host-model baseline (`cpu-feature` labels). */
  supportedFeatures: string[];
  /** `kernel.sched_rt_runtime_us` is -1: the node can run realtime workloads. */
  realtime?: boolean;
}

/** Options of {@linkcode computeNodeLabels}. */
export interface ComputeLabelsOptions {
  /**
   * The cluster's obsolete models: never labelled, and the host model among them is marked
   * obsolete. Unset, {@linkcode DEFAULT_OBSOLETE_CPU_MODELS} are not labelled and no host
   * model is marked, as virt-handler does without `obsoleteCPUModels`.
   */
  obsoleteModels?: Iterable<string>;
}

/** The result of {@linkcode computeNodeLabels}. */
export interface ComputedLabels {
  /** The labeller's labels for this node. */
  labels: Record<string, string>;
  /** The host-model CPU name when it is in the obsolete list. */
  obsoleteHostModel?: string;
  /** Label keys left out because Kubernetes would reject them. */
  invalid: string[];
}

const LABEL_NAME = /^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$/;
const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;

/** Whether `key` (with a DNS prefix) and `value` are a valid Kubernetes label. */
export function isValidLabel(key: string, value: string): boolean {
  const slash = key.lastIndexOf("/");
  const name = slash === -1 ? key : key.slice(slash + 1);
  const prefix = slash === -1 ? "" : key.slice(0, slash);
  return name.length <= 63 && LABEL_NAME.test(name) && prefix.length <= 253 &&
    value.length <= 63 && LABEL_VALUE.test(value);
}

/** Whether the labeller owns `key` (see {@linkcode LABELLER_LABEL_PREFIXES}). */
export function isLabellerLabel(key: string): boolean {
  return LABELLER_LABEL_PREFIXES.some((prefix) => key.startsWith(prefix));
}

/**
 * Computes the labeller's labels, KubeVirt's rules:
 * - `cpu-model`: models of the custom mode that are usable (`usable` not "no"), minus obsolete;
 * - `cpu-model-migration`: every model libvirt rated for this host (any `usable`), minus
 *   obsolete: the targets a host-model VMI started here may migrate as;
 * - `cpu-feature`: required features of the host-model baseline;
 * - `host-model-cpu`, `host-model-required-features`, `cpu-vendor`: the host-model mode;
 * - `machine-type`: machine types of the host capabilities;
 * - `cpu-timer`: `tsc-frequency` and `tsc-scalable` from the TSC counter;
 * - `obsolete-host-model`, SEV, SEV-ES, SEV-SNP, TDX, s390-pv, realtime.
 */
export function computeNodeLabels(
  info: NodeLabelInfo,
  options: ComputeLabelsOptions = {},
): ComputedLabels {
  const listed = options.obsoleteModels ? [...options.obsoleteModels] : undefined;
  const obsolete = new Set(listed ?? DEFAULT_OBSOLETE_CPU_MODELS);
  // The host model is marked obsolete only by a list the cluster configured: virt-handler
  // looks it up in the configured map, which is nil without one (then nothing is obsolete).
  const configured = new Set(listed ?? []);
  const labels: Record<string, string> = {};
  const invalid: string[] = [];
  const set = (key: string, value = "true") => {
    if (isValidLabel(key, value)) labels[key] = value;
    else invalid.push(key);
  };
  const { host, domain } = info;

  for (const feature of info.supportedFeatures) set(LabellerLabels.CpuFeaturePrefix + feature);
  for (const model of domain.customModels) {
    if (obsolete.has(model.name)) continue;
    if (model.usable !== "no") set(LabellerLabels.CpuModelPrefix + model.name);
    set(LabellerLabels.CpuModelMigrationPrefix + model.name);
  }
  for (const machine of host.machines) set(LabellerLabels.MachineTypePrefix + machine);
  if (host.tsc) {
    set(LabellerLabels.CpuTimerPrefix + "tsc-frequency", String(host.tsc.frequency));
    set(LabellerLabels.CpuTimerPrefix + "tsc-scalable", String(host.tsc.scalable));
  }
  let obsoleteHostModel: string | undefined;
  const hostModel = domain.hostModel;
  if (hostModel) {
    if (configured.has(hostModel.name)) {
      obsoleteHostModel = hostModel.name;
      set(LabellerLabels.ObsoleteHostModel);
    }
    for (const feature of hostModel.requiredFeatures) {
      set(LabellerLabels.HostModelRequiredFeaturesPrefix + feature);
    }
    const vendor = hostModel.vendor || host.vendor;
    if (vendor) set(LabellerLabels.CpuVendorPrefix + vendor);
    set(LabellerLabels.HostModelCpuPrefix + hostModel.name);
  }
  if (info.realtime) set(LabellerLabels.Realtime);
  if (domain.sev) set(LabellerLabels.Sev);
  if (domain.sevEs) set(LabellerLabels.SevEs);
  if (domain.sevSnp) set(LabellerLabels.SevSnp);
  if (domain.tdx) set(LabellerLabels.Tdx);
  if (domain.secureExecution) set(LabellerLabels.SecureExecution);
  return { labels, ...(obsoleteHostModel ? { obsoleteHostModel } : {}), invalid };
}

/** The node's labels with the labeller's replaced: stale ones removed, `computed` added. */
export function mergeLabellerLabels(
  current: Record<string, string> | undefined,
  computed: Record<string, string>,
): Record<string, string> {
  const next: Record<string, string> = {};
  for (const [key, value] of Object.entries(current ?? {})) {
    if (!isLabellerLabel(key)) next[key] = value;
  }
  return { ...next, ...computed };
}

/** Whether two label maps hold the same keys and values. */
export function sameLabels(
  a: Record<string, string> | undefined,
  b: Record<string, string> | undefined,
): boolean {
  const ka = Object.keys(a ?? {});
  if (ka.length !== Object.keys(b ?? {}).length) return false;
  return ka.every((k) => b?.[k] === a?.[k]);
}

/** The libvirt calls the labeller needs; `ffi`'s `Connection` has them. */
export interface CapabilitySource {
  /** Host capabilities XML. */
  getCapabilities(): Promise<string>;
  /** Domain capabilities XML for the query. */
  getDomainCapabilities(
    options: { arch?: string; machine?: string; virttype?: string },
  ): Promise<string>;
  /** Baseline CPU of the given `<cpu>` documents (features expanded). */
  baselineHypervisorCPU(
    cpuXmls: string[],
    options: { arch?: string; machine?: string; virttype?: string },
  ): Promise<string>;
}

/** Options of {@linkcode gatherNodeLabelInfo}. */
export interface GatherOptions {
  /** "kvm" or "qemu"; "kvm" where KVM can run guests (`kvmUsable`) unless told. */
  virttype?: string;
  /** Machine type to query; q35 on x86_64, virt on aarch64, s390-ccw-virtio on s390x. */
  machine?: string;
  /** Guest architecture; the host's unless told. */
  arch?: string;
  /** Path of `/dev/kvm` (tests). */
  kvmPath?: string;
  /** Path of the realtime sysctl; `/proc/sys/kernel/sched_rt_runtime_us`. */
  schedRtRuntimePath?: string;
}

/** The raw documents read from libvirt, kept for `virtnode labeller` and debugging. */
export interface GatheredCapabilities {
  /** Host capabilities XML. */
  capabilities: string;
  /** Domain capabilities XML; absent when the connection's driver has none. */
  domainCapabilities?: string;
  /** Baseline CPU XML of the host model, when there is a host model. */
  baseline?: string;
  /** The parsed data. */
  info: NodeLabelInfo;
}

const MACHINE_BY_ARCH: Record<string, string> = {
  x86_64: "q35",
  aarch64: "virt",
  s390x: "s390-ccw-virtio",
};

async function readRealtime(path: string): Promise<boolean> {
  try {
    return (await Deno.readTextFile(path)).trim() === "-1";
  } catch {
    return false;
  }
}

/** What domain capabilities say of a driver that has none: no CPU models, no features. */
function noDomainCapabilities(arch: string, virttype: string, machine?: string): string {
  const text = (v: string) => v.replace(/[<>&]/g, "");
  return `<domainCapabilities><arch>${text(arch)}</arch><domain>${text(virttype)}</domain>` +
    `<machine>${text(machine ?? "")}</machine></domainCapabilities>`;
}

/**
 * Reads host capabilities, domain capabilities and the host-model baseline from
 * libvirt, the way KubeVirt's node-labeller script does with virsh.
 */
export async function gatherNodeLabelInfo(
  source: CapabilitySource,
  options: GatherOptions = {},
): Promise<GatheredCapabilities> {
  const capabilities = await source.getCapabilities();
  const host = parseHostCapabilities(capabilities);
  const arch = options.arch ?? (host.arch || Deno.build.arch);
  // The launcher's rule: guests run under KVM only where it can run them.
  const virttype = options.virttype ??
    (kvmUsable("/sys/module", options.kvmPath ?? "/dev/kvm") ? "kvm" : "qemu");
  const machine = options.machine ?? MACHINE_BY_ARCH[arch];
  const query = { arch, virttype, ...(machine ? { machine } : {}) };
  let domainCapabilities: string | undefined;
  try {
    domainCapabilities = await source.getDomainCapabilities(query);
  } catch (error) {
    // libvirt's test driver has no domain capabilities: that is not fixed by a retry (each
    // of which costs a child process), so the node gets the labels host capabilities give.
    if ((error as { code?: unknown })?.code !== LIBVIRT_ERROR_CODES.VIR_ERR_NO_SUPPORT) throw error;
  }
  const domain = parseDomainCapabilities(
    domainCapabilities ?? noDomainCapabilities(query.arch, query.virttype, machine),
  );
  let baseline: string | undefined;
  let supportedFeatures: string[] = [];
  if (domain.hostModel) {
    baseline = await source.baselineHypervisorCPU([hostModelCpuXml(domain.hostModel)], query);
    supportedFeatures = parseCpuFeatures(baseline);
  }
  const realtime = await readRealtime(
    options.schedRtRuntimePath ?? "/proc/sys/kernel/sched_rt_runtime_us",
  );
  return {
    capabilities,
    ...(domainCapabilities !== undefined ? { domainCapabilities } : {}),
    ...(baseline ? { baseline } : {}),
    info: { host, domain, supportedFeatures, realtime },
  };
}

/** What one labeller run did. */
export interface LabelRunResult {
  /** "skipped": the node carries the skip annotation; "unchanged": nothing to write. */
  outcome: "patched" | "unchanged" | "skipped";
  /** The labeller's labels computed in this run. */
  labels: Record<string, string>;
  /** Labeller labels removed from the node. */
  removed: string[];
  /** Patch attempts made (more than one after `test` conflicts). */
  attempts: number;
}

/** Options of {@linkcode NodeLabeller}. */
export interface NodeLabellerOptions {
  /** Where the label inputs come from (e.g. `() => gatherNodeLabelInfo(conn).then(g => g.info)`). */
  source: () => Promise<NodeLabelInfo>;
  /** Records the obsolete-host-model Warning on the Node. */
  recorder?: EventRecorder;
  /** The cluster's obsolete models, as {@linkcode ComputeLabelsOptions.obsoleteModels}. */
  obsoleteModels?: Iterable<string>;
  /** Period of the labelling loop (3 min, KubeVirt's); jittered by up to 1.2 times. */
  intervalMs?: number;
  /** Jitter factor of the period (1.2). */
  jitterFactor?: number;
  /** Patch attempts per run before giving up on conflicts (5). */
  maxAttempts?: number;
  /** Per-request timeout (10 s). */
  timeoutMs?: number;
  /** Random source in [0, 1) for the jitter (tests). */
  random?: () => number;
}

/** Labelling failed; `cause` has the failure. */
export class NodeLabellerError extends Error {
  /** Creates the error. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "NodeLabellerError";
  }
}

/** Labels one node periodically and on demand; see the module doc. */
export class NodeLabeller {
  readonly #client: KubeClient;
  readonly #nodeName: string;
  #options: NodeLabellerOptions;
  #info: NodeLabelInfo | undefined;
  readonly #hostCpuListeners = new Set<() => void>();
  /** For logs. */
  readonly name = "node-labeller";
  #wake: AbortController | undefined;
  #pending = false;
  #lastObsoleteWarning: string | undefined;

  /** Creates a labeller for `nodeName`; nothing runs until {@linkcode labelOnce} or {@linkcode run}. */
  constructor(client: KubeClient, nodeName: string, options: NodeLabellerOptions) {
    this.#client = client;
    this.#nodeName = nodeName;
    this.#options = options;
  }

  /** The inputs, read once from the source and cached (KubeVirt loads them at start-up). */
  async info(refresh = false): Promise<NodeLabelInfo> {
    if (!this.#info || refresh) {
      const before = this.hostCpuModel;
      this.#info = await this.#options.source();
      if (this.hostCpuModel !== before) this.#tellHostCpuModel();
    }
    return this.#info;
  }

  /**
   * The host-model CPU of this node: its name once the capabilities were read, empty when
   * the node has none, undefined before the first read.
   */
  get hostCpuModel(): string | undefined {
    return this.#info ? this.#info.domain.hostModel?.name ?? "" : undefined;
  }

  /**
   * The machine types QEMU on this node calls deprecated, from the host capabilities;
   * empty before the first read.
   */
  get deprecatedMachineTypes(): readonly string[] {
    return this.#info?.host.deprecatedMachines ?? [];
  }

  /**
   * Calls `listener` whenever {@linkcode NodeLabeller.hostCpuModel} changes, the first read
   * included (the handler then syncs the VMIs whose migratability hangs on it); returns what
   * takes the listener off.
   */
  onHostCpuModel(listener: () => void): () => void {
    this.#hostCpuListeners.add(listener);
    return () => this.#hostCpuListeners.delete(listener);
  }

  #tellHostCpuModel(): void {
    for (const listener of this.#hostCpuListeners) {
      try {
        listener();
      } catch (error) {
        log.error("A host CPU model listener failed: {error}", { error });
      }
    }
  }

  /** The labels this node should carry, without touching the node. */
  async computeLabels(): Promise<ComputedLabels> {
    return computeNodeLabels(await this.info(), { obsoleteModels: this.#options.obsoleteModels });
  }

  async #getNode(): Promise<KubeObject> {
    try {
      return await this.#client.request<KubeObject>(
        "GET",
        `/api/v1/nodes/${encodeURIComponent(this.#nodeName)}`,
        undefined,
        { timeoutMs: this.#options.timeoutMs ?? 10_000 },
      );
    } catch (error) {
      throw new NodeLabellerError(
        `Cannot read node "${this.#nodeName}": ${detailOf(error)}`,
        { cause: error },
      );
    }
  }

  /**
   * One labelling pass: read the node, honour the skip annotation, replace the
   * labeller's labels under a `test` of the labels as read; on a conflict re-read and
   * retry up to `maxAttempts` times.
   */
  async labelOnce(options: { refresh?: boolean } = {}): Promise<LabelRunResult> {
    const computed = computeNodeLabels(await this.info(options.refresh), {
      obsoleteModels: this.#options.obsoleteModels,
    });
    if (computed.invalid.length > 0) {
      log.warn("Left out labels Kubernetes would reject", { keys: computed.invalid });
    }
    const maxAttempts = this.#options.maxAttempts ?? 5;
    for (let attempt = 1;; attempt++) {
      const node = await this.#getNode();
      const meta = node.metadata ?? {};
      if (meta.annotations && Annotations.LabellerSkipNode in meta.annotations) {
        log.debug("Node carries the skip annotation; not labelling", { name: this.#nodeName });
        return { outcome: "skipped", labels: computed.labels, removed: [], attempts: attempt - 1 };
      }
      const current = meta.labels;
      const desired = mergeLabellerLabels(current, computed.labels);
      const removed = Object.keys(current ?? {}).filter((k) => !(k in desired));
      if (computed.obsoleteHostModel) this.#warnObsolete(node, computed.obsoleteHostModel);
      if (sameLabels(current, desired)) {
        return { outcome: "unchanged", labels: computed.labels, removed, attempts: attempt - 1 };
      }
      try {
        await patchNodeJson(
          this.#client,
          this.#nodeName,
          replaceMapWithTest("labels", current, desired),
          { timeoutMs: this.#options.timeoutMs ?? 10_000 },
        );
        log.info("Labelled node", {
          name: this.#nodeName,
          labels: Object.keys(computed.labels).length,
          removed: removed.length,
        });
        return { outcome: "patched", labels: computed.labels, removed, attempts: attempt };
      } catch (error) {
        if (!(error instanceof PatchConflictError) || attempt >= maxAttempts) {
          throw new NodeLabellerError(
            `Cannot label node "${this.#nodeName}": ${detailOf(error)}`,
            { cause: error },
          );
        }
        log.debug("Node labels changed since read; retrying", { name: this.#nodeName, attempt });
      }
    }
  }

  #warnObsolete(node: KubeObject, model: string): void {
    // One event per model per process; the recorder aggregates repeats anyway.
    if (!this.#options.recorder || this.#lastObsoleteWarning === model) return;
    this.#lastObsoleteWarning = model;
    // Only a configured list marks a host model obsolete (computeNodeLabels).
    const obsolete = [...new Set(this.#options.obsoleteModels ?? [])];
    this.#options.recorder.record(
      { ...node, kind: node.kind ?? "Node", apiVersion: node.apiVersion ?? "v1" },
      "Warning",
      HOST_MODEL_OBSOLETE_REASON,
      `This node has ${model} host-model cpu that is included in ObsoleteCPUModels: ${
        obsolete.join(", ")
      }`,
    ).catch((error) => {
      this.#lastObsoleteWarning = undefined;
      log.warn("Cannot record the obsolete host-model event: {error}", { error });
    });
  }

  /**
   * Labels now, then every 3 min (jittered) until `signal` aborts; a failed pass is
   * retried with backoff (5 ms doubling, capped at the period). A pass in progress
   * when the signal aborts is awaited.
   */
  async run(signal: AbortSignal): Promise<void> {
    let failures = 0;
    while (!signal.aborted) {
      let delay: number;
      try {
        await this.labelOnce();
        delay = this.#period();
        failures = 0;
      } catch (error) {
        failures++;
        delay = Math.min(5 * 2 ** Math.min(failures, 20), this.#period());
        log.error("Node labelling failed: {error}", { error, name: this.#nodeName });
      }
      if (this.#pending) {
        this.#pending = false;
        continue;
      }
      const wake = new AbortController();
      this.#wake = wake;
      await sleep(delay, AbortSignal.any([signal, wake.signal]));
      this.#wake = undefined;
    }
  }

  /**
   * Follows the cluster's obsolete CPU models (the KubeVirt CR's `obsoleteCPUModels`;
   * KubeVirt's list when undefined) and labels the node anew when they change.
   */
  setObsoleteModels(models: Iterable<string> | undefined): void {
    const next = models === undefined ? undefined : [...models].sort();
    const current = this.#options.obsoleteModels === undefined
      ? undefined
      : [...this.#options.obsoleteModels].sort();
    if (JSON.stringify(next) === JSON.stringify(current)) return;
    this.#options = { ...this.#options, obsoleteModels: next };
    this.#lastObsoleteWarning = undefined;
    log.info("Obsolete CPU models changed", { models: next ?? "KubeVirt's default list" });
    this.trigger();
  }

  /** Asks {@linkcode run} for a pass as soon as the current one (if any) is done. */
  trigger(): void {
    if (this.#wake) this.#wake.abort();
    else this.#pending = true;
  }

  #period(): number {
    const interval = this.#options.intervalMs ?? 3 * 60_000;
    const random = this.#options.random ?? Math.random;
    return interval + random() * (this.#options.jitterFactor ?? 1.2) * interval;
  }
}

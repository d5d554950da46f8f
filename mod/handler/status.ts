/**
 * What the handler writes into a VMI's status: the phase (the table in
 * `mod/domain/phase.ts`), the conditions, interfaces, guest OS info and volume status a
 * domain gives, and the Events a phase change deserves. Pure functions: the
 * controller applies them to a copy of the informer's VMI and the status writer
 * decides whether anything changed.
 *
 * @module
 */
import {
  awaitsNodeFacts,
  joinBlockers,
  migratability,
  type MigratableContext,
} from "./migratable.ts";
import {
  ConditionReason,
  ConditionType,
  isFinalPhase,
  MigrationMode,
  parseQuantity,
  type Quantity,
  type VirtualMachineInstance,
  type VirtualMachineInstanceStatus,
  type VmiCondition,
  type VmiNetworkInterface,
  VmiPhase,
  type VolumeStatus,
} from "../api/mod.ts";
import {
  CHANNEL_CONNECTED,
  type Domain,
  GUEST_AGENT_CHANNEL,
  type LauncherState,
  LifeCycle,
  pausedConditionReason,
  type PhaseDecision,
  vmiPhaseFromDomain,
} from "../domain/mod.ts";
import { isHotplugVolume, LAUNCHER_HOTPLUG_DIR } from "../storage/mod.ts";
import { hashedPodInterfaceName, type PodAddresses } from "../network/mod.ts";
import type { AgentSupport } from "./guest_agent_support.ts";
import type { StandInFacts } from "./launcher_provider.ts";

/** KubeVirt's reason on `Synchronized=False`. */
export const SYNC_FAILED_REASON = "Synchronizing with the Domain failed.";

/** Event reasons KubeVirt's handler records. */
export const EventReason = {
  Created: "Created",
  Started: "Started",
  ShuttingDown: "ShuttingDown",
  Stopped: "Stopped",
  Deleted: "Deleted",
  SyncFailed: "SyncFailed",
  Resumed: "Resumed",
  IOError: "IOerror",
  AccessCredentialsSyncSuccess: "AccessCredentialsSyncSuccess",
  AccessCredentialsSyncFailed: "AccessCredentialsSyncFailed",
} as const;

/** An Event a status change deserves. */
export interface StatusEvent {
  /** The Event's type. */
  type: "Normal" | "Warning";
  /** KubeVirt's reason. */
  reason: string;
  /** KubeVirt's message. */
  message: string;
}

/** Everything the status of one VMI is computed from. */
export interface StatusInput {
  /** The domain the launcher reports, if any. */
  domain: Domain | undefined;
  /** How the launcher answers. */
  launcher: LauncherState;
  /** The error of this sync round, if it failed. */
  syncError?: string;
  /** This node's name. */
  nodeName: string;
  /**
   * Where the handler plays virt-controller's part (pod-less mode): it also owns `Ready`
   * and the volume status entries, with the hotplugged volumes' claims found on this host.
   */
  standIn?: StandInFacts;
  /** Now, RFC 3339 (injectable for tests). */
  now: string;
  /** The pod IPs of the VMI's pod networks set up on this node, by network name. */
  podAddresses?: ReadonlyMap<string, PodAddresses>;
  /** The hotplugged volumes mounted into the launcher now, by name. */
  hotplugMounted?: ReadonlySet<string>;
  /** The launcher's SELinux label (`none` without SELinux), once known. */
  selinuxContext?: string;
  /**
   * What this node adds to whether a VMI can migrate (its host-model CPU); while a fact a
   * VMI's verdict needs is not known, its migration conditions are left as they are.
   */
  migratable?: MigratableContext;
  /** The KubeVirt CR's `evictionStrategy`, for a VMI that sets none (KubeVirt's: None). */
  clusterEvictionStrategy?: string;
  /**
   * The connected guest agent's verdict (guest_agent_support.ts); undefined leaves
   * `AgentVersionNotSupported` as it is, as virt-handler does while no agent is connected.
   */
  agentSupport?: AgentSupport;
  /** What the handler plugged into the running guest (pod-less mode's in-place hot-plug). */
  hotplugged?: Hotplugged;
}

/** The vCPUs and memory a pod-less handler plugged in place, and a memory plug that failed. */
export interface Hotplugged {
  /** The topology the guest has since its vCPUs were plugged. */
  cpu?: { sockets?: number; cores?: number; threads?: number };
  /** `memory.guest` as last asked of the launcher. */
  memoryGuest?: Quantity;
  /** The memory plug of this `memory.guest` failed. */
  memoryFailed?: Quantity;
}

/** vCPUs of a topology (a field left out counts 1). */
function vcpusOf(t: { sockets?: number; cores?: number; threads?: number } | undefined): number {
  return (t?.sockets || 1) * (t?.cores || 1) * (t?.threads || 1);
}

/**
 * What a running VMI's spec asks to plug that its status does not have yet, as
 * virt-controller judges it: vCPUs when the topology's count differs from
 * `status.currentCPUTopology`'s (and `maxSockets` is set), memory when `memory.guest`
 * differs from `status.memory.guestRequested` (and `maxGuest` is set).
 */
export function hotplugWanted(vmi: VirtualMachineInstance): { cpu: boolean; memory: boolean } {
  const cpu = vmi.spec.domain.cpu;
  const current = vmi.status?.currentCPUTopology;
  const memory = vmi.spec.domain.memory;
  const requested = vmi.status?.memory?.guestRequested;
  return {
    cpu: !!current && !!cpu?.maxSockets && vcpusOf(cpu) !== vcpusOf(current),
    memory: !!memory?.guest && !!memory.maxGuest && requested !== undefined &&
      parseQuantity(memory.guest) !== parseQuantity(requested),
  };
}

/** libvirt's amount in bytes; undefined for a unit libvirt does not write. */
function memoryBytes(m: { value: number; unit: string }): number | undefined {
  const units: Record<string, number> = {
    b: 1,
    bytes: 1,
    KiB: 1024,
    k: 1024,
    MiB: 2 ** 20,
    M: 2 ** 20,
    GiB: 2 ** 30,
    G: 2 ** 30,
  };
  const unit = units[m.unit];
  return unit === undefined ? undefined : m.value * unit;
}

/** Bytes as a Kubernetes binary quantity, with the largest suffix that is exact (`128Mi`). */
export function binaryQuantity(bytes: number): string {
  for (const [suffix, size] of [["Ti", 2 ** 40], ["Gi", 2 ** 30], ["Mi", 2 ** 20], ["Ki", 1024]]) {
    if (bytes >= (size as number) && bytes % (size as number) === 0) {
      return `${bytes / (size as number)}${suffix}`;
    }
  }
  return String(bytes);
}

/** The phase change a status update makes, for Events. */
export interface PhaseChange {
  /** The phase before. */
  from: VmiPhase;
  /** The phase after. */
  to: VmiPhase;
}

/** Result of {@linkcode computeStatus}. */
export interface ComputedStatus {
  /** The status to write. */
  status: VirtualMachineInstanceStatus;
  /** Set when the phase changes. */
  phaseChange?: PhaseChange;
  /** The launcher is not ready yet: look at the VMI again soon. */
  requeue: boolean;
  /** Events the new status deserves once written (besides the phase change's). */
  events: StatusEvent[];
}

/**
 * Sets a condition, keeping `lastTransitionTime` when its status did not change
 * (so recomputing an unchanged status never causes a write).
 */
export function setCondition(
  conditions: VmiCondition[],
  condition: Omit<VmiCondition, "lastTransitionTime" | "lastProbeTime">,
  now: string,
): VmiCondition[] {
  const old = conditions.find((c) => c.type === condition.type);
  const next: VmiCondition = {
    ...condition,
    lastProbeTime: null,
    lastTransitionTime: old && old.status === condition.status ? old.lastTransitionTime : now,
  };
  if (
    old && old.status === next.status && old.reason === next.reason &&
    old.message === next.message
  ) {
    return conditions;
  }
  return [...conditions.filter((c) => c.type !== condition.type), next];
}

/** Removes a condition type. */
export function removeCondition(conditions: VmiCondition[], type: string): VmiCondition[] {
  return conditions.some((c) => c.type === type)
    ? conditions.filter((c) => c.type !== type)
    : conditions;
}

/**
 * Whether the guest agent is connected: the domain's guest agent channel is
 * `connected`, as virt-handler decides `AgentConnected`.
 */
export function guestAgentConnected(domain: Domain | undefined): boolean {
  return domain?.spec.devices.channels.some((channel) =>
    channel.target?.name === GUEST_AGENT_CHANNEL && channel.target.state === CHANNEL_CONNECTED
  ) ?? false;
}

function stripAlias(name: string | undefined): string | undefined {
  return name?.startsWith("ua-") ? name.slice(3) : name;
}

/** What {@linkcode interfacesFromDomain} adds to the domain's view. */
export interface InterfaceSources {
  /** The pod IPs of the VMI's pod and secondary networks, by network name. */
  podAddresses?: ReadonlyMap<string, PodAddresses>;
  /** The VMI's current `status.interfaces` (virt-controller's `podInterfaceName` is kept). */
  previous?: VmiNetworkInterface[];
  /** Pod-less mode: the handler names the pod interface, as virt-controller would (`eth0`). */
  podInterfaceName?: string;
  /** Pod-less mode: the secondary networks' pod interfaces by network, as virt-controller names them. */
  secondaryPodInterfaces?: ReadonlyMap<string, string>;
  /** The name of the VMI's pod network (`spec.networks[].pod`), whose interface goes first. */
  primary?: string;
  /** The names of the VMI's interfaces in its spec (Multus-reported ones outside it are not kept). */
  specNames?: readonly string[];
  /** The MACs the spec gives its interfaces, by name (an SR-IOV interface's status has it). */
  specMacs?: ReadonlyMap<string, string>;
}

/** The alias prefix of an SR-IOV interface's host device in KubeVirt's domain. */
export const SRIOV_ALIAS_PREFIX = "sriov-";

function familyOfAddress(address: string): 4 | 6 {
  return address.includes(":") ? 6 : 4;
}

/** KubeVirt's `infoSource` tag of an interface that Multus reported on the launcher pod. */
export const INFO_SOURCE_MULTUS = "multus-status";

/** Whether an `infoSource` has `tag` (KubeVirt's tags are joined with ", "). */
export function hasInfoSource(infoSource: string | undefined, tag: string): boolean {
  return infoSource ? infoSource.split(", ").includes(tag) : false;
}

/** `infoSource` with `tag` added once (KubeVirt's tags are joined with ", "). */
function addInfoSource(infoSource: string | undefined, tag: string): string {
  const tags = infoSource ? infoSource.split(", ") : [];
  return (tags.includes(tag) ? tags : [...tags, tag]).join(", ");
}

/**
 * `status.interfaces` as KubeVirt's handler reports them: one entry per interface of the
 * domain (MAC, queues, link state), the pod's IP for an interface on the pod network
 * (bridge or masquerade: the address the pod has, which the guest's is reached by) or a
 * secondary network's pod IP where its attachment has one, the guest agent's name and
 * addresses where it reports the interface (its addresses only for a family the pod gave
 * none), the pod network's interface first, and `multus-status` kept in `infoSource` of
 * each interface virt-controller found in the pod's network-status (an interface of the
 * spec that the domain does not have yet keeps an entry of that tag alone). An interface the
 * agent reports with a MAC no entry has is added with `infoSource: guest-agent` and no name.
 */
export function interfacesFromDomain(
  domain: Domain,
  sources: InterfaceSources = {},
): VmiNetworkInterface[] {
  const guest = domain.status.interfaces ?? [];
  // The guest agent's view of the interface with the entry's MAC, where it reports one.
  const fromAgent = (entry: VmiNetworkInterface) => {
    const g = guest.find((x) =>
      x.mac && entry.mac && x.mac.toLowerCase() === entry.mac.toLowerCase()
    );
    if (g) {
      const agentIps = g.ips?.length ? g.ips : g.ip ? [g.ip] : [];
      const have = new Set((entry.ipAddresses ?? []).map(familyOfAddress));
      const added = agentIps.filter((ip) => !have.has(familyOfAddress(ip)));
      if (added.length > 0) {
        entry.ipAddresses = [...(entry.ipAddresses ?? []), ...added];
        entry.ipAddress ??= entry.ipAddresses[0];
      }
      if (g.interfaceName) entry.interfaceName = g.interfaceName;
      entry.infoSource = "domain, guest-agent";
    } else {
      entry.infoSource = "domain";
    }
  };
  const out = domain.spec.devices.interfaces.map((iface) => {
    const name = stripAlias(iface.alias?.name);
    const entry: VmiNetworkInterface = { name, mac: iface.mac };
    const pod = name !== undefined ? sources.podAddresses?.get(name) : undefined;
    if (pod?.podIP) {
      entry.ipAddress = pod.podIP;
      entry.ipAddresses = [...pod.podIPs];
    }
    fromAgent(entry);
    // Neither multiqueue nor a link state is converted: one queue, link up.
    entry.queueCount = 1;
    entry.linkState = "up";
    const primary = "primary" in sources ? name === sources.primary : pod !== undefined;
    const podInterfaceName = sources.previous?.find((p) => p.name === name)?.podInterfaceName ??
      (primary
        ? sources.podInterfaceName
        : name !== undefined
        ? sources.secondaryPodInterfaces?.get(name)
        : undefined);
    if (podInterfaceName) entry.podInterfaceName = podInterfaceName;
    return { entry, primary };
  });
  // SR-IOV interfaces are host devices of the domain, aliased `sriov-<name>` by KubeVirt's
  // launcher: the name, and the MAC the spec gives (the VF's own is not in the domain).
  for (const device of domain.spec.devices.hostDevices ?? []) {
    const alias = stripAlias(device.alias?.name);
    if (!alias?.startsWith(SRIOV_ALIAS_PREFIX)) continue;
    const name = alias.slice(SRIOV_ALIAS_PREFIX.length);
    const entry: VmiNetworkInterface = { name };
    const mac = sources.specMacs?.get(name);
    if (mac) entry.mac = mac;
    fromAgent(entry);
    const podInterfaceName = sources.previous?.find((p) => p.name === name)?.podInterfaceName;
    if (podInterfaceName) entry.podInterfaceName = podInterfaceName;
    out.push({ entry, primary: false });
  }
  const ordered = [...out.filter((o) => o.primary), ...out.filter((o) => !o.primary)]
    .map((o) => o.entry);
  // An interface the guest agent reports that no entry has the MAC of (one the guest made
  // itself, a VLAN, a bond) gets an entry of the agent's alone, as virt-handler adds it.
  for (const g of guest) {
    const mac = g.mac?.toLowerCase();
    if (mac && ordered.some((e) => e.mac?.toLowerCase() === mac)) continue;
    const ips = g.ips?.length ? g.ips : g.ip ? [g.ip] : [];
    const entry: VmiNetworkInterface = {};
    if (g.mac) entry.mac = g.mac;
    if (g.ip ?? ips[0]) entry.ipAddress = g.ip ?? ips[0];
    if (ips.length > 0) entry.ipAddresses = [...ips];
    if (g.interfaceName) entry.interfaceName = g.interfaceName;
    entry.infoSource = "guest-agent";
    ordered.push(entry);
  }
  for (const reported of sources.previous ?? []) {
    if (!reported.name || !hasInfoSource(reported.infoSource, INFO_SOURCE_MULTUS)) continue;
    const entry = ordered.find((e) => e.name === reported.name);
    if (entry) {
      entry.infoSource = addInfoSource(entry.infoSource, INFO_SOURCE_MULTUS);
    } else if (sources.specNames === undefined || sources.specNames.includes(reported.name)) {
      const kept: VmiNetworkInterface = { name: reported.name, infoSource: INFO_SOURCE_MULTUS };
      if (reported.podInterfaceName) kept.podInterfaceName = reported.podInterfaceName;
      ordered.push(kept);
    }
  }
  return ordered;
}

/** Options of {@linkcode volumeStatusFromDomain}. */
export interface VolumeStatusOptions {
  /** The hotplugged volumes mounted into the launcher now, by name. */
  hotplugMounted?: ReadonlySet<string>;
  /** Where the handler stands in for virt-controller (pod-less mode): it owns the entries. */
  standIn?: StandInFacts;
  /** The time of this status (RFC 3339), for a memory dump's file name. */
  now?: string;
}

/**
 * `status.volumeStatus` with each volume's disk target from the domain. virt-controller
 * writes the entries (claim info, hotplug phases) and the handler only fills `target`, as
 * KubeVirt's does: the list is replaced whole by a status patch, so every entry and field
 * already there is kept. Where no virt-controller runs (pod-less mode) the handler writes
 * the entries itself: one for each volume the domain has a disk for, one for each
 * hotplugged volume from the moment it is in the spec, and a hotplugged volume's entry goes
 * once the volume left the spec and its disk the domain. Sorted by name, as virt-controller
 * sorts.
 */
export function volumeStatusFromDomain(
  vmi: VirtualMachineInstance,
  domain: Domain,
  options: VolumeStatusOptions = {},
): VolumeStatus[] {
  const hotplugMounted = options.hotplugMounted ?? new Set<string>();
  const owner = options.standIn !== undefined;
  const targets = new Map<string, string>();
  for (const disk of domain.spec.devices.disks) {
    const name = stripAlias(disk.alias?.name);
    if (name && disk.target.dev && (disk.source.file || disk.source.dev)) {
      targets.set(name, disk.target.dev);
    }
  }
  const inSpec = new Set((vmi.spec.volumes ?? []).map((v) => v.name));
  const byName = new Map<string, VolumeStatus>();
  const entries = [...vmi.status?.volumeStatus ?? []];
  if (owner) {
    for (const v of vmi.spec.volumes ?? []) {
      if (isHotplugVolume(vmi, v) && !entries.some((e) => e.name === v.name)) {
        entries.push({
          name: v.name,
          target: "",
          hotplugVolume: {},
          ...(v.memoryDump ? { memoryDumpVolume: { claimName: v.name } } : {}),
          phase: "Pending",
        });
      }
    }
  }
  for (const entry of entries) {
    // The domain's word only: a disk it no longer has (detached) has no target.
    const next: VolumeStatus = { ...entry, target: targets.get(entry.name) ?? "" };
    if (entry.hotplugVolume) {
      if (owner && !inSpec.has(entry.name) && !next.target) continue;
      const claim = options.standIn?.hotplugClaims?.get(entry.name);
      if (claim && !next.persistentVolumeClaimInfo) next.persistentVolumeClaimInfo = claim;
      Object.assign(next, hotplugPhase(next, inSpec.has(entry.name), hotplugMounted));
    }
    if (next.memoryDumpVolume) memoryDumpProgress(next, vmi, domain, options.now);
    byName.set(entry.name, next);
  }
  for (const v of vmi.spec.volumes ?? []) {
    const target = targets.get(v.name);
    if (target && !byName.has(v.name)) byName.set(v.name, { name: v.name, target });
  }
  return [...byName.values()].sort((a, b) => a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
}

/** The hotplug phases the handler moves a volume from, to `MountedToPod` and to `UnMountedFromPod`. */
const TO_MOUNTED = new Set(["Bound", "Pending", "AttachedToNode"]);
const TO_UNMOUNTED = new Set(["Ready", "MountedToPod", "AttachedToNode"]);

/**
 * A hotplugged volume's next phase, as KubeVirt's handler moves it: `Ready` once the domain
 * has its disk; `MountedToPod` once it is mounted into the launcher (still in the spec);
 * `UnMountedFromPod` once it is out of the spec and unmounted. Nothing otherwise.
 */
function hotplugPhase(
  entry: VolumeStatus,
  inSpec: boolean,
  mounted: ReadonlySet<string>,
): Partial<VolumeStatus> {
  const name = entry.name;
  if (entry.target) {
    return {
      phase: "Ready",
      reason: "VolumeReady",
      message: `Successfully attach hotplugged volume ${name} to VM`,
    };
  }
  const phase = entry.phase ?? "";
  if (mounted.has(name)) {
    if (inSpec && TO_MOUNTED.has(phase)) {
      return {
        phase: "MountedToPod",
        reason: "VolumeMountedToPod",
        message: `Volume ${name} has been mounted in virt-launcher pod`,
      };
    }
  } else if (!inSpec && TO_UNMOUNTED.has(phase)) {
    return {
      phase: "UnMountedFromPod",
      reason: "VolumeUnMountedFromPod",
      message: `Volume ${name} has been unmounted from virt-launcher pod`,
    };
  }
  return {};
}

/** A memory dump volume's phases, as virt-controller and KubeVirt's handler name them. */
export const MemoryDumpPhase = {
  InProgress: "MemoryDumpInProgress",
  Completed: "MemoryDumpCompleted",
  Failed: "MemoryDumpFailed",
} as const;

/**
 * Moves a memory dump volume's entry on, as KubeVirt's handler does: once its claim is
 * mounted into the launcher it is `MemoryDumpInProgress` with the dump's file name
 * (`<vmi>-<volume>-<yyyymmdd-hhmmss>.memory.dump`); the launcher's record of that file in
 * the domain's metadata then gives its start, and its end, `Completed` or `Failed`.
 */
function memoryDumpProgress(
  entry: VolumeStatus,
  vmi: VirtualMachineInstance,
  domain: Domain,
  now = new Date().toISOString(),
) {
  const dump = entry.memoryDumpVolume!;
  const name = entry.name;
  if (entry.phase === "MountedToPod") {
    entry.memoryDumpVolume = {
      ...dump,
      targetFileName: dumpFileName(vmi.metadata.name, name, now),
    };
    entry.phase = MemoryDumpPhase.InProgress;
    entry.reason = "VolumeMountedToPod";
    entry.message = `Memory dump Volume ${name} is attached, getting memory dump`;
    return;
  }
  if (entry.phase !== MemoryDumpPhase.InProgress) return;
  const taken = domain.spec.metadata.kubevirt.memoryDump;
  if (!taken || taken.fileName !== dump.targetFileName) return; // not asked for yet
  const next = { ...dump };
  if (taken.startTimestamp) next.startTimestamp = taken.startTimestamp;
  if (taken.endTimestamp && taken.failed) {
    entry.phase = MemoryDumpPhase.Failed;
    entry.message = `Memory dump to pvc ${name} failed: ${taken.failureReason ?? ""}`;
    next.endTimestamp = taken.endTimestamp;
  } else if (taken.completed) {
    entry.phase = MemoryDumpPhase.Completed;
    entry.reason = "VolumeReady";
    entry.message = `Memory dump to Volume ${name} has completed successfully`;
    next.endTimestamp = taken.endTimestamp;
  }
  entry.memoryDumpVolume = next;
}

/** KubeVirt's memory dump file name: `<vmi>-<volume>-<yyyymmdd-hhmmss>.memory.dump` (UTC). */
export function dumpFileName(vmiName: string, volume: string, now: string): string {
  const t = new Date(now).toISOString(); // 2026-12-06T19:30:05.123Z
  const stamp = `${t.slice(0, 10).replaceAll("-", "")}-${t.slice(11, 19).replaceAll(":", "")}`;
  return `${vmiName}-${volume}-${stamp}.memory.dump`;
}

/**
 * Where the launcher writes a memory dump volume's dump, in its own view: the claim's
 * `folder` (by default its directory in the launcher's hotplug folder), and the file name
 * the status gives.
 */
export function memoryDumpPath(
  entry: VolumeStatus,
  folder = `${LAUNCHER_HOTPLUG_DIR}/${entry.name}`,
): string | undefined {
  const file = entry.memoryDumpVolume?.targetFileName;
  if (entry.phase !== MemoryDumpPhase.InProgress || !file) return undefined;
  return `${folder}/${file}`;
}

/** The Events for hotplugged volumes whose phase the status changes (KubeVirt's reasons). */
export function volumePhaseEvents(
  before: readonly VolumeStatus[] | undefined,
  after: readonly VolumeStatus[] | undefined,
): { reason: string; message: string }[] {
  const old = new Map((before ?? []).map((s) => [s.name, s.phase]));
  return (after ?? []).filter((s) =>
    s.hotplugVolume && s.phase !== old.get(s.name) && s.reason && s.message
  ).map((s) => ({ reason: s.reason!, message: s.message! }));
}

/** What the phase of a VMI depends on: a subset of {@linkcode StatusInput}. */
export type PhaseInputs = Pick<StatusInput, "domain" | "launcher">;

function phaseDecision(vmi: VirtualMachineInstance, input: PhaseInputs): PhaseDecision {
  const current = (vmi.status?.phase ?? VmiPhase.Unset) as VmiPhase;
  if (isFinalPhase(current)) return { phase: current, requeue: false };
  const domain = input.domain;
  const migration = vmi.status?.migrationState;
  return vmiPhaseFromDomain({
    domain: domain ? domain.status : undefined,
    vmiPhase: current,
    launcher: input.launcher,
    terminationGracePeriodSeconds: vmi.spec.terminationGracePeriodSeconds,
    domainHasAcpi: domain?.spec.features?.acpi === true,
    postCopyMigrationFailed: migration?.failed === true &&
      migration.mode === MigrationMode.PostCopy,
  });
}

/** The phase {@linkcode computeStatus} would give the VMI now; a final phase stays. */
export function nextPhase(vmi: VirtualMachineInstance, input: PhaseInputs): VmiPhase {
  return phaseDecision(vmi, input).phase;
}

/**
 * Computes the status a VMI should have now. `vmi` is not modified. The phase
 * follows {@linkcode vmiPhaseFromDomain}; a final phase never changes again.
 */
export function computeStatus(vmi: VirtualMachineInstance, input: StatusInput): ComputedStatus {
  const status: VirtualMachineInstanceStatus = structuredClone(vmi.status ?? {});
  const current = (status.phase ?? VmiPhase.Unset) as VmiPhase;
  const domain = input.domain;
  const decision = phaseDecision(vmi, input);

  let phaseChange: PhaseChange | undefined;
  if (decision.phase !== current) {
    phaseChange = { from: current, to: decision.phase };
    status.phase = decision.phase;
    status.phaseTransitionTimestamps = [
      ...(status.phaseTransitionTimestamps ?? []),
      { phase: decision.phase, phaseTransitionTimestamp: input.now },
    ];
  }
  if (!status.nodeName && status.phase !== VmiPhase.Pending) status.nodeName = input.nodeName;
  // The machine type the launcher chose (virt-handler's updateMachineType).
  if (domain?.spec.os?.machine) status.machine = { type: domain.spec.os.machine };

  let conditions = status.conditions ?? [];
  conditions = input.syncError
    ? setCondition(conditions, {
      type: ConditionType.Synchronized,
      status: "False",
      reason: SYNC_FAILED_REASON,
      message: input.syncError,
    }, input.now)
    : removeCondition(conditions, ConditionType.Synchronized);

  const pausedBy = domain?.status.status === LifeCycle.Paused && decision.pausedReason
    ? pausedConditionReason(decision.pausedReason)
    : undefined;
  conditions = pausedBy
    ? setCondition(conditions, {
      type: ConditionType.Paused,
      status: "True",
      reason: pausedBy,
      message: pausedBy === ConditionReason.PausedIOError
        ? "VMI was paused, low-level IO error detected"
        : "VMI was paused by user",
    }, input.now)
    : removeCondition(conditions, ConditionType.Paused);

  conditions = guestAgentConnected(domain)
    ? setCondition(conditions, { type: ConditionType.AgentConnected, status: "True" }, input.now)
    : removeCondition(conditions, ConditionType.AgentConnected);
  if (input.agentSupport?.supported) {
    conditions = removeCondition(conditions, ConditionType.UnsupportedAgent);
  } else if (
    input.agentSupport && !conditions.some((c) => c.type === ConditionType.UnsupportedAgent)
  ) {
    // As virt-handler: added once with its reason, not updated while it stands.
    conditions = [...conditions, {
      type: ConditionType.UnsupportedAgent,
      status: "True",
      reason: input.agentSupport.reason,
      lastProbeTime: input.now,
      lastTransitionTime: null,
    }];
  }

  const events: StatusEvent[] = [];
  const credential = domain?.spec.metadata.kubevirt.accessCredential;
  if (credential) {
    // As virt-handler: the launcher's verdict on the access credentials, with an Event
    // whenever it changes; without a verdict the condition is left as it is.
    const message = credential.message ?? "";
    const old = conditions.find((c) => c.type === ConditionType.AccessCredentialsSynchronized);
    const state = credential.succeeded ? "True" : "False";
    if (!old || old.status !== state || (old.message ?? "") !== message) {
      conditions = [
        ...removeCondition(conditions, ConditionType.AccessCredentialsSynchronized),
        {
          type: ConditionType.AccessCredentialsSynchronized,
          status: state,
          ...(message ? { message } : {}),
          lastProbeTime: null,
          lastTransitionTime: input.now,
        },
      ];
      events.push(
        credential.succeeded
          ? {
            type: "Normal",
            reason: EventReason.AccessCredentialsSyncSuccess,
            message: message
              ? `Access credentials sync successful: ${message}`
              : "Access credentials sync successful.",
          }
          : {
            type: "Warning",
            reason: EventReason.AccessCredentialsSyncFailed,
            message: `Access credentials sync failed: ${message}`,
          },
      );
    }
  }

  const migrationConditions = status.phase === VmiPhase.Running ||
    status.phase === VmiPhase.Scheduled;
  if (migrationConditions && !awaitsNodeFacts(vmi, input.migratable)) {
    const verdict = migratability({ ...vmi, status }, input.migratable);
    const blocker = verdict.blockers[0];
    const wasMigratable = conditions.find((c) => c.type === ConditionType.LiveMigratable);
    conditions = setCondition(
      conditions,
      blocker
        ? { type: ConditionType.LiveMigratable, status: "False", ...blocker }
        : { type: ConditionType.LiveMigratable, status: "True" },
      input.now,
    );
    // As virt-handler: a VMI to be migrated on eviction that cannot migrate gets a Warning
    // (KubeVirt repeats it each sync and its recorder folds the repeats; here it is said
    // when the verdict changes).
    const strategy = vmi.spec.evictionStrategy ?? input.clusterEvictionStrategy;
    if (
      blocker && strategy === "LiveMigrate" &&
      (wasMigratable?.status !== "False" || wasMigratable.message !== blocker.message)
    ) {
      events.push({
        type: "Warning",
        reason: "Migrated",
        message: `EvictionStrategy is set but vmi is not migratable; ${blocker.message ?? ""}`,
      });
    }
    conditions = setCondition(
      conditions,
      verdict.storageBlockers.length > 0
        ? {
          type: ConditionType.StorageLiveMigratable,
          status: "False",
          reason: ConditionReason.NotMigratable,
          message: joinBlockers(verdict.storageBlockers),
        }
        : { type: ConditionType.StorageLiveMigratable, status: "True" },
      input.now,
    );
    status.migrationMethod = verdict.method;
  }

  if (input.standIn) {
    const st = domain?.status.status;
    const running = status.phase === VmiPhase.Running &&
      (st === LifeCycle.Running || st === LifeCycle.Blocked || st === LifeCycle.PMSuspended);
    const readiness = input.standIn.readiness;
    conditions = !running
      ? setCondition(conditions, {
        type: ConditionType.Ready,
        status: "False",
        reason: ConditionReason.GuestNotRunning,
        message: "Guest VM is not reported as running",
      }, input.now)
      // A readiness probe that has not passed: as the kubelet's pod Ready condition says it.
      : readiness && !readiness.ready
      ? setCondition(conditions, {
        type: ConditionType.Ready,
        status: "False",
        reason: ConditionReason.ContainersNotReady,
        message: readiness.message,
      }, input.now)
      : setCondition(conditions, { type: ConditionType.Ready, status: "True" }, input.now);
  }
  const plugged = input.hotplugged;
  if (plugged?.cpu) status.currentCPUTopology = { ...plugged.cpu };
  if (plugged?.memoryGuest && status.memory) {
    status.memory = { ...status.memory, guestRequested: plugged.memoryGuest };
  }
  // As virt-controller marks a failed plug (its VM controller then asks for a restart).
  if (plugged?.memoryFailed && plugged.memoryFailed === vmi.spec.domain.memory?.guest) {
    conditions = setCondition(conditions, {
      type: "HotMemoryChange",
      status: "False",
      reason: "MemoryHotplugFailed",
      message: "memory hotplug failed, the VM configuration is not supported",
    }, input.now);
  }
  // As virt-handler: the guest's memory now is the domain's current memory.
  const currentMemory = domain?.spec.currentMemory;
  if (currentMemory && status.memory?.guestCurrent !== undefined) {
    const bytes = memoryBytes(currentMemory);
    if (bytes !== undefined && bytes !== parseQuantity(status.memory.guestCurrent)) {
      status.memory = { ...status.memory, guestCurrent: binaryQuantity(bytes) };
    }
  }
  if (conditions.length > 0 || status.conditions) status.conditions = conditions;

  let requeue = decision.requeue;
  if (domain) {
    const interfaces = interfacesFromDomain(domain, {
      podAddresses: input.podAddresses,
      previous: status.interfaces,
      podInterfaceName: input.standIn?.podInterfaceName,
      secondaryPodInterfaces: input.standIn
        ? new Map(
          (vmi.spec.networks ?? []).filter((n) => n.multus).map((
            n,
          ) => [n.name, hashedPodInterfaceName(n.name)]),
        )
        : undefined,
      ...(vmi.spec.networks
        ? { primary: vmi.spec.networks.find((n) => n.pod !== undefined && n.pod !== null)?.name }
        : {}),
      specNames: (vmi.spec.domain.devices.interfaces ?? []).map((i) => i.name),
      specMacs: new Map(
        (vmi.spec.domain.devices.interfaces ?? []).flatMap((i) =>
          i.macAddress ? [[i.name, i.macAddress] as const] : []
        ),
      ),
    });
    if (interfaces.length > 0) status.interfaces = interfaces;
    const volumes = volumeStatusFromDomain(vmi, domain, {
      hotplugMounted: input.hotplugMounted,
      standIn: input.standIn,
      now: input.now,
    });
    if (volumes.length > 0) status.volumeStatus = volumes;
    else delete status.volumeStatus;
    // A hotplugged volume not attached yet: its mount (or unmount) is looked for again soon.
    if (volumes.some((v) => v.hotplugVolume && !v.target)) requeue = true;
    if (domain.status.osInfo?.name) status.guestOSInfo = { ...domain.status.osInfo };
    // As KubeVirt's handler: "frozen" is shown, "thawed" clears it, unknown leaves it.
    const freeze = domain.status.fsFreezeStatus?.status;
    if (freeze === "thawed") delete status.fsFreezeStatus;
    else if (freeze) status.fsFreezeStatus = freeze;
    if (input.selinuxContext !== undefined) status.selinuxContext = input.selinuxContext;
  }
  return { status, phaseChange, requeue, events };
}

/** The Event a phase change deserves, as KubeVirt's handler records it. */
export function phaseChangeEvent(
  change: PhaseChange,
): { type: "Normal" | "Warning"; reason: string; message: string } | undefined {
  switch (change.to) {
    case VmiPhase.Running:
      return {
        type: "Normal",
        reason: EventReason.Started,
        message: "VirtualMachineInstance started.",
      };
    case VmiPhase.Succeeded:
      return {
        type: "Normal",
        reason: EventReason.Stopped,
        message: "The VirtualMachineInstance was shut down.",
      };
    case VmiPhase.Failed:
      return {
        type: "Warning",
        reason: EventReason.Stopped,
        message: "The VirtualMachineInstance crashed.",
      };
    default:
      return undefined;
  }
}

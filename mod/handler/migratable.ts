/**
 * Whether a VMI can be live-migrated, with the reasons KubeVirt's handler gives when it
 * cannot (`LiveMigratable`, `StorageLiveMigratable`, `status.migrationMethod`). The checks
 * and their order follow virt-handler's: the pod network's binding, a host-model CPU on a
 * node without one, host devices, confidential computing, SCSI reservations, a TSC
 * frequency the guest's timers need, Hyper-V passthrough, then the volumes. A VMI with a
 * local disk (containerDisk, emptyDisk, cloud-init, ...) stays migratable: its disks copy
 * along (`BlockMigration`).
 *
 * @module
 */

import { ConditionReason, type VirtualMachineInstance } from "../api/mod.ts";

/** The annotation that lets a VMI with bridge binding on the pod network migrate. */
export const ALLOW_POD_BRIDGE_MIGRATION_ANNOTATION =
  "kubevirt.io/allow-pod-bridge-network-live-migration";

/** One reason a VMI cannot be live-migrated. */
export interface MigrationBlocker {
  /** The condition's reason, KubeVirt's name for the blocker. */
  reason: string;
  /** What the user reads. */
  message: string;
}

/** What the node contributes to the decision. */
export interface MigratableContext {
  /**
   * The host-model CPU of this node as the labeller found it; empty when the node has none,
   * so a host-model VMI cannot migrate away from it. Undefined while the labeller has not
   * read it yet: {@linkcode migratability} then counts it as none, and
   * {@linkcode awaitsNodeFacts} tells the status not to say so yet.
   */
  hostCpuModel?: string;
  /** The cluster's network binding plugins that declare migration support, by name. */
  migratableBindings?: ReadonlySet<string>;
}

/** The outcome: every blocker that applies in KubeVirt's order, and the migration method. */
export interface Migratability {
  /** The blockers of a live migration, the first one being what `LiveMigratable` says. */
  blockers: MigrationBlocker[];
  /** The blockers of a storage live migration (the volumes do not count there). */
  storageBlockers: MigrationBlocker[];
  /** `BlockMigration` when some disk is not shared and would be copied. */
  method: "LiveMigration" | "BlockMigration";
}

/** Where the handler learns this node's host-model CPU (the node labeller). */
export interface HostCpuSource {
  /** The host-model CPU's name; empty when the node has none, undefined until it was read. */
  readonly hostCpuModel: string | undefined;
  /**
   * Calls `listener` whenever {@linkcode HostCpuSource.hostCpuModel} changes, its first
   * read included; returns what takes the listener off.
   */
  onHostCpuModel(listener: () => void): () => void;
}

/** Whether the VMI asks for the host-model CPU (KubeVirt's admission makes it the default). */
export function usesHostModel(vmi: VirtualMachineInstance): boolean {
  return vmi.spec.domain?.cpu?.model === "host-model";
}

/**
 * Whether the migratability of `vmi` hangs on a fact of the node not known yet: a
 * host-model VMI before the labeller read the host's CPU. Its migration conditions are
 * then left as they are, not written from a guess.
 */
export function awaitsNodeFacts(
  vmi: VirtualMachineInstance,
  context: MigratableContext | undefined,
): boolean {
  return usesHostModel(vmi) && context?.hostCpuModel === undefined;
}

function podNetworkInterface(vmi: VirtualMachineInstance) {
  const network = vmi.spec.networks?.find((n) => n.pod !== undefined);
  if (!network) return undefined;
  return vmi.spec.domain?.devices?.interfaces?.find((i) => i.name === network.name);
}

function interfaceBlocker(
  vmi: VirtualMachineInstance,
  context: MigratableContext,
): MigrationBlocker | undefined {
  const interfaces = vmi.spec.domain?.devices?.interfaces ?? [];
  if (interfaces.length === 0) return undefined;
  const pod = podNetworkInterface(vmi);
  // No interface on the pod network: nothing there to keep.
  if (!pod) return undefined;
  if (
    pod.bridge !== undefined &&
    vmi.metadata.annotations?.[ALLOW_POD_BRIDGE_MIGRATION_ANNOTATION] !== undefined
  ) {
    return undefined;
  }
  if (pod.masquerade !== undefined) return undefined;
  if (pod.binding && context.migratableBindings?.has(pod.binding.name)) return undefined;
  return {
    reason: ConditionReason.InterfaceNotMigratable,
    message: "cannot migrate VMI which does not use masquerade, bridge with " +
      `${ALLOW_POD_BRIDGE_MIGRATION_ANNOTATION} VM annotation or a migratable plugin to ` +
      "connect to the pod network",
  };
}

function launchSecurityBlocker(vmi: VirtualMachineInstance): MigrationBlocker | undefined {
  const security = vmi.spec.domain?.launchSecurity as
    | { sev?: unknown; snp?: unknown; tdx?: unknown }
    | undefined;
  if (!security) return undefined;
  if (security.sev !== undefined || security.snp !== undefined) {
    return { reason: ConditionReason.SEVNotMigratable, message: "VMI uses SEV" };
  }
  if (security.tdx !== undefined) {
    return { reason: ConditionReason.TDXNotMigratable, message: "VMI uses TDX" };
  }
  return undefined;
}

/** The checks both conditions share, in KubeVirt's order. */
function commonBlockers(
  vmi: VirtualMachineInstance,
  context: MigratableContext,
): MigrationBlocker[] {
  const out: MigrationBlocker[] = [];
  const iface = interfaceBlocker(vmi, context);
  if (iface) out.push(iface);
  if (usesHostModel(vmi) && !context.hostCpuModel) {
    out.push({
      reason: ConditionReason.CPUModeNotMigratable,
      message: `the node "${vmi.status?.nodeName ?? ""}" does not allow migration with host-model`,
    });
  }
  const devices = vmi.spec.domain?.devices;
  if ((devices?.hostDevices?.length ?? 0) > 0 || (devices?.gpus?.length ?? 0) > 0) {
    out.push({
      reason: ConditionReason.HostDeviceNotMigratable,
      message: "VMI uses a PCI host devices",
    });
  }
  const security = launchSecurityBlocker(vmi);
  if (security) out.push(security);
  if (devices?.disks?.some((d) => d.lun?.reservation === true)) {
    out.push({
      reason: ConditionReason.PRNotMigratable,
      message: "VMI uses SCSI persistent reservation",
    });
  }
  const hyperv = vmi.spec.domain?.features?.hyperv;
  const tscHinted = (vmi.status?.topologyHints?.tscFrequency ?? 0) > 0;
  // A guest that must boot with a TSC frequency cannot have started without one: only the
  // reenlightenment case is a migration matter.
  const invtscRequired =
    vmi.spec.domain?.cpu?.features?.some((f) =>
      f.name === "invtsc" && (f.policy === "require" || f.policy === "force")
    ) ?? false;
  // A feature given without `enabled` is on, as the converter builds it.
  const reenlightened = hyperv?.reenlightenment !== undefined &&
    hyperv.reenlightenment.enabled !== false;
  if (!invtscRequired && reenlightened && !tscHinted) {
    out.push({
      reason: ConditionReason.NoTSCFrequencyNotMigratable,
      message: "HyperV Reenlightenment VMIs cannot migrate when TSC Frequency is not exposed " +
        "on the cluster: guest timers might be inconsistent",
    });
  }
  const passthrough = vmi.spec.domain?.features?.hypervPassthrough;
  if (passthrough !== undefined && passthrough.enabled !== false) {
    out.push({
      reason: ConditionReason.HypervPassthroughNotMigratable,
      message: "VMI uses hyperv passthrough",
    });
  }
  return out;
}

/**
 * Whether every volume can be reached from the target, and whether some disk has to be
 * copied along: a claim must be ReadWriteMany (what virt-controller recorded in
 * `status.volumeStatus`), a hostDisk shared; a read-only CD-ROM and a virtiofs share need
 * nothing; any other volume is local to the node and makes the migration a block one.
 */
function volumes(
  vmi: VirtualMachineInstance,
): { blocker?: MigrationBlocker; block: boolean } {
  const statusByName = new Map((vmi.status?.volumeStatus ?? []).map((v) => [v.name, v]));
  const migrated = new Set((vmi.status?.migratedVolumes ?? []).map((v) => v.volumeName));
  let block = migrated.size > 0;
  const shares = new Set(
    (vmi.spec.domain?.devices?.filesystems ?? []).map((f) => (f as { name?: string }).name),
  );
  const notShared = (claim: string): MigrationBlocker => ({
    reason: ConditionReason.DisksNotMigratable,
    message: `cannot migrate VMI: PVC ${claim} is not shared, live migration requires that ` +
      "all PVCs must be shared (using ReadWriteMany access mode)",
  });
  for (const volume of vmi.spec.volumes ?? []) {
    const claimName = volume.persistentVolumeClaim?.claimName ?? volume.dataVolume?.name;
    const info = statusByName.get(volume.name)?.persistentVolumeClaimInfo;
    const shared = (info?.accessModes ?? []).includes("ReadWriteMany") ||
      migrated.has(volume.name);
    if (claimName !== undefined) {
      if (!info) {
        return {
          block: true,
          blocker: {
            reason: ConditionReason.DisksNotMigratable,
            message: `cannot migrate VMI: Unable to determine if PVC ${claimName} is shared, ` +
              "live migration requires that all PVCs must be shared (using ReadWriteMany " +
              "access mode)",
          },
        };
      }
      if (!shared) return { block: true, blocker: notShared(claimName) };
    } else if (volume.hostDisk) {
      // A claim the cluster turned into a hostDisk (a filesystem claim's disk.img).
      if (info) {
        if (!shared) return { block: true, blocker: notShared(info.claimName ?? volume.name) };
        continue;
      }
      if (volume.hostDisk.shared !== true) {
        return {
          block: true,
          blocker: {
            reason: ConditionReason.DisksNotMigratable,
            message: "cannot migrate VMI with non-shared HostDisk",
          },
        };
      }
    } else {
      if (shares.has(volume.name)) continue;
      const disk = vmi.spec.domain?.devices?.disks?.find((d) => d.name === volume.name);
      if (disk?.cdrom && disk.cdrom.readonly !== false) continue;
      block = true;
    }
  }
  return { block };
}

/** Every blocker of a live and of a storage migration of `vmi`, and its method. */
export function migratability(
  vmi: VirtualMachineInstance,
  context: MigratableContext = {},
): Migratability {
  const common = commonBlockers(vmi, context);
  const volume = volumes(vmi);
  return {
    blockers: volume.blocker ? [...common, volume.blocker] : common,
    storageBlockers: common,
    method: volume.block ? "BlockMigration" : "LiveMigration",
  };
}

/**
 * The storage condition's message for several blockers, as KubeVirt joins them:
 * `reason: message, reason: message`.
 */
export function joinBlockers(blockers: readonly MigrationBlocker[]): string {
  return blockers.map((b) => `${b.reason}: ${b.message}`).join(", ");
}

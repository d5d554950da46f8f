/**
 * Bridge interfaces plugged into a running VMI in KubeVirt mode, as KubeVirt v1.7.0's
 * virt-handler drives it (`FilterNetsForLiveUpdate`'s plug half). virt-controller copies an
 * interface added to a running VM's template into the VMI and, with no in-place Multus plug
 * (its dynamic networks controller), moves the VMI to a new launcher pod whose Multus
 * annotation has the network. There the VMI's status names the interface from the pod's
 * network status (`multus-status`) but not from the domain: the handler builds its binding in
 * the pod (a migration target's handler built it already) and syncs, and KubeVirt's launcher
 * attaches the NIC (`hotplugVirtioInterface`).
 *
 * @module
 */
import type { VirtualMachineInstance } from "../api/mod.ts";
import { INFO_SOURCE_MULTUS } from "./status.ts";

function tags(infoSource: string | undefined): string[] {
  return infoSource ? infoSource.split(", ") : [];
}

/**
 * The names of the VMI's interfaces to plug: not `absent`, with `multus-status` and without
 * `domain` in their status entry (the pod has the interface, the domain not yet). SR-IOV
 * interfaces are sriov_hotplug.ts's.
 */
export function interfacesToPlug(vmi: VirtualMachineInstance): string[] {
  const present = new Set(
    (vmi.spec.domain.devices.interfaces ?? [])
      .filter((i) => i.state !== "absent" && i.sriov == null)
      .map((i) => i.name),
  );
  const networks = new Set((vmi.spec.networks ?? []).map((n) => n.name));
  return (vmi.status?.interfaces ?? []).flatMap((s) => {
    const t = tags(s.infoSource);
    return s.name && present.has(s.name) && networks.has(s.name) &&
        t.includes(INFO_SOURCE_MULTUS) && !t.includes("domain")
      ? [s.name]
      : [];
  });
}

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
 * Unplug (`state: absent`): the handler's sync has KubeVirt's launcher detach the NIC in place
 * (`hotUnplugVirtioInterface`); once the status has the interface no longer from the domain,
 * the handler takes down the binding it built in the pod (virt-controller then moves the VMI
 * to a pod without the network, and KubeVirt drops the interface from the VMI and the VM).
 *
 * @module
 */
import type { VirtualMachineInstance } from "../api/mod.ts";
import { hashedPodInterfaceName, isLinkName } from "../network/mod.ts";
import { hasInfoSource, INFO_SOURCE_MULTUS } from "./status.ts";

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
    return s.name && present.has(s.name) && networks.has(s.name) &&
        hasInfoSource(s.infoSource, INFO_SOURCE_MULTUS) && !hasInfoSource(s.infoSource, "domain")
      ? [s.name]
      : [];
  });
}

/** An absent interface whose binding is to be taken down, with its pod interface's name. */
export interface InterfaceToUnplug {
  /** The interface's (and network's) name. */
  name: string;
  /** Its interface in the pod, as virt-controller reported it or KubeVirt names it. */
  podInterface: string;
}

/**
 * The VMI's `absent` interfaces on secondary networks whose status entry is no longer from the
 * domain (the launcher detached the NIC): their bindings are taken down.
 */
export function interfacesToUnplug(vmi: VirtualMachineInstance): InterfaceToUnplug[] {
  const absent = new Set(
    (vmi.spec.domain.devices.interfaces ?? []).filter((i) => i.state === "absent").map((i) =>
      i.name
    ),
  );
  return (vmi.spec.networks ?? []).flatMap((network) => {
    if (!absent.has(network.name) || network.multus == null) return [];
    const entry = (vmi.status?.interfaces ?? []).find((s) => s.name === network.name);
    if (!entry || hasInfoSource(entry.infoSource, "domain")) return [];
    const reported = entry.podInterfaceName;
    return [{
      name: network.name,
      podInterface: reported && isLinkName(reported)
        ? reported
        : hashedPodInterfaceName(network.name),
    }];
  });
}

/**
 * A VMI's networks as KubeVirt lays them out in its pod: which of its interfaces sits on
 * the pod network or on a secondary (Multus) network, with which binding (`bridge` or
 * `masquerade`; secondaries `bridge` only), and the names of everything the binding builds
 * in the pod's network namespace: the in-pod bridge `k6t-<iface>`, the tap the domain uses
 * (`tap0` for `eth0`, `tap<hash>` for `pod<hash>`), the pod interface renamed
 * `<iface>-nic` and the placeholder that keeps its name and addresses (bridge binding). A
 * secondary network's pod interface is named as KubeVirt names it: `pod` and the first 11
 * hex digits of the SHA-256 of the network's name, unless virt-controller reported another
 * (`status.interfaces[].podInterfaceName`, e.g. Multus's ordinal `net1`). Pure: the handler
 * (which builds the links) and the launcher (which serves DHCP and writes the domain's
 * `<interface>`) read the same plan.
 *
 * Every interface and network the node cannot serve is refused here with
 * {@linkcode NetworkSpecError} naming the field: virt-api refuses most bad specs already,
 * but not SR-IOV or binding plugins on the pod network, a Multus default network, or
 * masquerade CIDRs that leave no room for the guest.
 *
 * @module
 */

import { createHash } from "node:crypto";
import type { Interface, Network, VirtualMachineInstance } from "../api/mod.ts";
import { vmiKey } from "../api/mod.ts";

/** The pod network bindings virtnode builds. */
export type PodBinding = "bridge" | "masquerade";

/** A port masquerade forwards from the pod's address to the guest. */
export interface ForwardedPort {
  /** `tcp` or `udp`. */
  protocol: "tcp" | "udp";
  /** 1 to 65535. */
  port: number;
}

/** One interface on the pod network or a secondary network and the names its binding uses. */
export interface PodInterfacePlan {
  /** Its position in `spec.domain.devices.interfaces`. */
  index: number;
  /** The interface's (and its network's) name. */
  name: string;
  /** `pod`: the pod network; `multus`: a secondary network. */
  source: "pod" | "multus";
  /** A secondary network's NetworkAttachmentDefinition: `<name>` or `<namespace>/<name>`. */
  networkName?: string;
  /** How the guest reaches the pod network. */
  binding: PodBinding;
  /**
   * The pod's interface the binding uses: `eth0`, or `pod<hash>` for a secondary network
   * (or `status.interfaces[].podInterfaceName`).
   */
  podInterface: string;
  /** The in-pod bridge: `k6t-eth0`. */
  bridge: string;
  /** The tap the domain's `<interface type="ethernet">` opens: `tap0`. */
  tap: string;
  /** Bridge binding: the pod interface's new name once it is a port of the bridge: `eth0-nic`. */
  renamedPodInterface: string;
  /** The MAC address the spec asks for (lower case, colons), if any. */
  macAddress?: string;
  /** The libvirt NIC model: `virtio` becomes `virtio-non-transitional`. */
  model: string;
  /** `bootOrder` of the interface, if any. */
  bootOrder?: number;
  /** Masquerade: the ports forwarded to the guest; empty forwards every port. */
  ports: ForwardedPort[];
  /** Masquerade: the guest's IPv4 side (`vmNetworkCIDR`, default `10.0.2.0/24`). */
  vmCidr4: string;
  /** Masquerade: the guest's IPv6 side (`vmIPv6NetworkCIDR`, default `fd10:0:2::/120`). */
  vmCidr6: string;
}

/** KubeVirt's default guest side of a masquerade interface. */
export const DEFAULT_VM_CIDR4 = "10.0.2.0/24";
/** KubeVirt's default IPv6 guest side of a masquerade interface. */
export const DEFAULT_VM_CIDR6 = "fd10:0:2::/120";
/** The MAC of the in-pod bridge under masquerade; no guest may use it. */
export const MASQUERADE_BRIDGE_MAC = "02:00:00:00:00:00";

/** A VMI's network spec that the node cannot serve, with the field that says why. */
export class NetworkSpecError extends Error {
  /** `namespace/name` of the VMI. */
  readonly vmiKey: string;
  /** The JSON path of the field, e.g. `spec.domain.devices.interfaces[0].sriov`. */
  readonly path: string;
  /** What is wrong with it. */
  readonly detail: string;

  /** Creates `Invalid network of VMI "<key>": <path>: <detail>`. */
  constructor(key: string, path: string, detail: string) {
    super(`Invalid network of VMI "${key}": ${path}: ${detail}`);
    this.name = "NetworkSpecError";
    this.vmiKey = key;
    this.path = path;
    this.detail = detail;
  }
}

const SUPPORTED = "virtnode connects guests with the bridge binding (pod and secondary " +
  "networks) or masquerade (the pod network) only";
/** Why each binding virtnode does not build is refused. */
const UNSUPPORTED_BINDINGS: Record<string, string> = {
  passt: "the passt binding was discontinued in KubeVirt v1.3; " + SUPPORTED,
  passtBinding: "the passt binding needs its binding plugin; " + SUPPORTED,
  macvtap: "macvtap needs Multus and its device plugin; " + SUPPORTED,
  binding: "network binding plugins are not supported; " + SUPPORTED,
};
/** The states an interface may ask for (KubeVirt's; `up` and `down` are link states). */
const INTERFACE_STATES = ["absent", "up", "down"];
const BINDING_KEYS = [
  "bridge",
  "masquerade",
  "slirp",
  "sriov",
  ...Object.keys(UNSUPPORTED_BINDINGS),
];

/**
 * KubeVirt's name of a secondary network's interface in the pod: `pod` and the first 11 hex
 * digits of the SHA-256 of the network's name (within the kernel's 15 characters).
 */
export function hashedPodInterfaceName(networkName: string): string {
  return `pod${createHash("sha256").update(networkName).digest("hex").slice(0, 11)}`;
}

/** A link name the kernel takes and no path can be made of: not `.` or `..`, no `/`. */
const LINK_NAME = /^(?!\.\.?$)[A-Za-z0-9_.-]{1,15}$/;

/** Whether `name` is a link name the kernel takes and no path can be made of. */
export function isLinkName(name: string): boolean {
  return LINK_NAME.test(name);
}

/** `<pod interface>` without KubeVirt's `pod` prefix, as its generated names use it. */
function shortName(podInterface: string): string {
  return podInterface.startsWith("pod") ? podInterface.slice(3) : podInterface;
}

/** KubeVirt's in-pod bridge name for a pod interface (`k6t-eth0`). */
export function bridgeName(podInterface: string): string {
  return `k6t-${shortName(podInterface)}`;
}

/** KubeVirt's tap name for a pod interface: `tap0` for `eth0`. */
export function tapName(podInterface: string): string {
  return `tap${podInterface.slice(3)}`;
}

/** The domain's NIC model for a spec model (KubeVirt: virtio is non-transitional on x86). */
export function libvirtNicModel(model: string | undefined): string {
  return (model ?? "virtio") === "virtio" ? "virtio-non-transitional" : model!;
}

function parseCidr(cidr: string, family: 4 | 6): { prefix: number } | undefined {
  const [address, prefixText, extra] = cidr.split("/");
  if (extra !== undefined || prefixText === undefined || !/^\d+$/.test(prefixText)) return;
  const prefix = Number(prefixText);
  if (family === 4) {
    const parts = address.split(".");
    if (parts.length !== 4 || parts.some((p) => !/^\d+$/.test(p) || Number(p) > 255)) return;
    return prefix <= 32 ? { prefix } : undefined;
  }
  if (!/^[0-9a-fA-F:]+$/.test(address) || !address.includes(":")) return;
  return prefix <= 128 ? { prefix } : undefined;
}

function bindingOf(key: string, iface: Interface, path: string): string | undefined {
  const record = iface as unknown as Record<string, unknown>;
  const set = BINDING_KEYS.filter((b) => record[b] !== undefined && record[b] !== null);
  if (set.length > 1) {
    throw new NetworkSpecError(key, path, `has more than one binding (${set.join(", ")})`);
  }
  const binding = set[0];
  if (binding && UNSUPPORTED_BINDINGS[binding]) {
    throw new NetworkSpecError(key, `${path}.${binding}`, UNSUPPORTED_BINDINGS[binding]);
  }
  return binding;
}

function portsOf(key: string, iface: Interface, path: string): ForwardedPort[] {
  const ports = (iface.ports ?? []) as unknown[];
  return ports.map((raw, k) => {
    const at = `${path}.ports[${k}]`;
    const p = (raw ?? {}) as { protocol?: unknown; port?: unknown };
    const protocol = p.protocol === undefined || p.protocol === "" ? "TCP" : p.protocol;
    if (typeof protocol !== "string" || !["tcp", "udp"].includes(protocol.toLowerCase())) {
      throw new NetworkSpecError(
        key,
        `${at}.protocol`,
        `${JSON.stringify(protocol)} is not supported (TCP or UDP)`,
      );
    }
    if (typeof p.port !== "number" || !Number.isInteger(p.port) || p.port < 1 || p.port > 65535) {
      throw new NetworkSpecError(key, `${at}.port`, "must be a whole number from 1 to 65535");
    }
    return { protocol: protocol.toLowerCase() as "tcp" | "udp", port: p.port };
  });
}

/**
 * The interfaces of `vmi` on the pod network with their bindings and names. Interfaces
 * with `slirp` (QEMU's user networking, which needs no pod network), `sriov` (a VF KubeVirt's
 * launcher passes through) or `state: absent` (unplugged) are left out. Throws
 * {@linkcode NetworkSpecError} for a spec the node cannot serve.
 */
export function podNetworkPlan(vmi: VirtualMachineInstance): PodInterfacePlan[] {
  const key = vmiKey(vmi.metadata);
  const interfaces = vmi.spec.domain.devices.interfaces ?? [];
  const networks: Network[] = vmi.spec.networks ?? [];
  let podNetwork: string | undefined;
  networks.forEach((network, i) => {
    const path = `spec.networks[${i}]`;
    const multus = network.multus;
    if (multus !== undefined && multus !== null) {
      if (network.pod !== undefined && network.pod !== null) {
        throw new NetworkSpecError(key, path, "has two sources (pod and multus)");
      }
      if (multus.default === true) {
        throw new NetworkSpecError(
          key,
          `${path}.multus.default`,
          "a Multus default network in place of the pod network is not supported; " +
            "give the pod network (pod: {}) and this network as a secondary one",
        );
      }
      if (typeof multus.networkName !== "string" || multus.networkName === "") {
        throw new NetworkSpecError(
          key,
          `${path}.multus.networkName`,
          "names no NetworkAttachmentDefinition",
        );
      }
    } else if (network.pod === undefined || network.pod === null) {
      throw new NetworkSpecError(key, path, "needs a source (pod: {} or multus: {...})");
    } else if (podNetwork !== undefined) {
      throw new NetworkSpecError(
        key,
        `${path}.pod`,
        `more than one network is the pod network ("${podNetwork}" and "${network.name}")`,
      );
    } else {
      podNetwork = network.name;
    }
    if (networks.findIndex((n) => n.name === network.name) !== i) {
      throw new NetworkSpecError(key, `${path}.name`, `duplicate network name "${network.name}"`);
    }
    if (!interfaces.some((nic) => nic.name === network.name)) {
      throw new NetworkSpecError(key, `${path}.name`, `no interface named "${network.name}"`);
    }
  });
  const plans: PodInterfacePlan[] = [];
  interfaces.forEach((iface, index) => {
    const path = `spec.domain.devices.interfaces[${index}]`;
    if (interfaces.findIndex((n) => n.name === iface.name) !== index) {
      throw new NetworkSpecError(key, `${path}.name`, `duplicate interface name "${iface.name}"`);
    }
    const network = networks.find((n) => n.name === iface.name);
    if (!network) {
      throw new NetworkSpecError(key, `${path}.name`, `no network named "${iface.name}"`);
    }
    const binding = bindingOf(key, iface, path);
    if (binding === "slirp") return;
    const secondary = network.multus !== undefined && network.multus !== null;
    if (binding === "sriov") {
      // The SR-IOV device plugin gives the pod a virtual function and KubeVirt's launcher
      // passes it through (KubeVirt mode): nothing of the pod's network is built for it.
      if (!secondary) {
        throw new NetworkSpecError(
          key,
          `${path}.sriov`,
          "SR-IOV needs a virtual function from a secondary (Multus) network's device plugin, " +
            "not the pod network",
        );
      }
      return;
    }
    if (binding === undefined) {
      throw new NetworkSpecError(
        key,
        path,
        secondary
          ? "has no binding: give it bridge: {} on a secondary network"
          : "has no binding: give it bridge: {} or masquerade: {} on the pod network",
      );
    }
    const state = iface.state;
    if (state !== undefined && state !== "" && !INTERFACE_STATES.includes(state)) {
      throw new NetworkSpecError(
        key,
        `${path}.state`,
        `${JSON.stringify(state)} is not an interface state (${INTERFACE_STATES.join(", ")})`,
      );
    }
    if (state === "absent") {
      // Unplugged (or to be): nothing of it is built, as KubeVirt builds nothing for it.
      if (binding !== "bridge" || !secondary) {
        throw new NetworkSpecError(
          key,
          `${path}.state`,
          "only a bridge interface on a secondary (Multus) network can be absent, as in KubeVirt",
        );
      }
      return;
    }
    if (secondary && binding !== "bridge") {
      throw new NetworkSpecError(
        key,
        `${path}.${binding}`,
        `a secondary (Multus) network takes the bridge binding only, as in KubeVirt`,
      );
    }
    const ports = portsOf(key, iface, path);
    const mac = iface.macAddress?.replaceAll("-", ":").toLowerCase();
    if (binding === "masquerade" && mac === MASQUERADE_BRIDGE_MAC) {
      throw new NetworkSpecError(
        key,
        `${path}.macAddress`,
        `${MASQUERADE_BRIDGE_MAC} is the in-pod bridge's own address; choose another`,
      );
    }
    const podSpec = network.pod ?? {};
    const vmCidr4 = podSpec.vmNetworkCIDR || DEFAULT_VM_CIDR4;
    const vmCidr6 = podSpec.vmIPv6NetworkCIDR || DEFAULT_VM_CIDR6;
    const networkIndex = networks.indexOf(network);
    if (binding === "masquerade") {
      const v4 = parseCidr(vmCidr4, 4);
      if (!v4 || v4.prefix > 30) {
        throw new NetworkSpecError(
          key,
          `spec.networks[${networkIndex}].pod.vmNetworkCIDR`,
          `"${vmCidr4}" is not an IPv4 CIDR with room for a gateway and the guest (/30 or wider)`,
        );
      }
      const v6 = parseCidr(vmCidr6, 6);
      if (!v6 || v6.prefix > 126) {
        throw new NetworkSpecError(
          key,
          `spec.networks[${networkIndex}].pod.vmIPv6NetworkCIDR`,
          `"${vmCidr6}" is not an IPv6 CIDR with room for a gateway and the guest (/126 or wider)`,
        );
      }
    }
    const statusIndex = (vmi.status?.interfaces ?? []).findIndex((s) => s.name === iface.name);
    const reported = vmi.status?.interfaces?.[statusIndex]?.podInterfaceName;
    // The name goes into `ip` commands and file names: a link name of the kernel's, or refused.
    if (reported && !LINK_NAME.test(reported)) {
      throw new NetworkSpecError(
        key,
        `status.interfaces[${statusIndex}].podInterfaceName`,
        `${JSON.stringify(reported)} is not a network interface name (1 to 15 letters, ` +
          "digits, '-', '_' or '.')",
      );
    }
    const podInterface = reported || (secondary ? hashedPodInterfaceName(network.name) : "eth0");
    plans.push({
      index,
      name: iface.name,
      source: secondary ? "multus" : "pod",
      ...(secondary ? { networkName: network.multus!.networkName } : {}),
      binding: binding as PodBinding,
      podInterface,
      bridge: bridgeName(podInterface),
      tap: tapName(podInterface),
      renamedPodInterface: `${shortName(podInterface)}-nic`,
      macAddress: mac,
      model: libvirtNicModel(iface.model),
      bootOrder: iface.bootOrder,
      ports,
      vmCidr4,
      vmCidr6,
    });
  });
  return plans;
}

/** `Interface` of the spec for a plan, for callers that need more of it. */
export function specInterface(vmi: VirtualMachineInstance, plan: PodInterfacePlan): Interface {
  return (vmi.spec.domain.devices.interfaces ?? [])[plan.index];
}

/**
 * Pod-less mode: the name of a VMI's tap while it is in the host's network namespace,
 * before it joins the VM's pod namespace as `tap0`: `vn` and 12 hex digits of a hash
 * (FNV-1a, 64 bits) of the VMI's UID, within the kernel's 15 characters. A VMI has one
 * interface on the pod network at most, so its UID names the tap: the handler, the launcher
 * host and a cleanup that no longer knows the VMI's spec all find it. A secondary network's
 * tap is named by the UID and its pod interface ({@linkcode hostTapFor}).
 */
export function hostTapName(uid: string): string {
  let hash = 0xcbf29ce484222325n;
  for (const byte of new TextEncoder().encode(uid)) {
    hash = BigInt.asUintN(64, (hash ^ BigInt(byte)) * 0x100000001b3n);
  }
  return `vn${hash.toString(16).padStart(16, "0").slice(0, 12)}`;
}

/** Pod-less mode: the host's name of the tap of one of a VMI's interfaces (see {@linkcode hostTapName}). */
export function hostTapFor(uid: string, plan: PodInterfacePlan): string {
  return plan.source === "pod" ? hostTapName(uid) : hostTapName(`${uid}/${plan.podInterface}`);
}

/**
 * The KubeVirt CR's `permittedHostDevices` as virt-handler serves them.
 *
 * `pciHostDevices`: each
 * entry permits the PCI devices of one `vendor:device` ID under one resource name. The
 * devices of this host with that ID (`PCI_ID` in each device's `uevent` under
 * `/sys/bus/pci/devices`) that are bound to `vfio-pci` and have an IOMMU group become a
 * device plugin for the resource, one device per IOMMU group with its NUMA node. A container
 * allocated some gets `/dev/vfio/vfio` and each group's `/dev/vfio/<group>`, and the PCI
 * addresses in `PCI_RESOURCE_<RESOURCE>` (the name upper-cased, `/` and `.` as `_`), which
 * KubeVirt's launcher reads to build the domain's host devices.
 *
 * `mediatedDevices`: each entry permits the mediated devices of one type (its `mdevNameSelector`,
 * spaces as `_`, against each device's `mdev_type/name` under `/sys/bus/mdev/devices`, or the
 * type's folder name) under one resource name; one device per IOMMU group with its parent PCI
 * device's NUMA node. A container gets the group's VFIO nodes and the devices' UUIDs in
 * `MDEV_PCI_RESOURCE_<RESOURCE>`; a group whose `/dev/vfio/<group>` is gone fails the
 * allocation, as in KubeVirt. The mediated devices themselves are made from
 * `mediatedDevicesConfiguration` ({@linkcode HostDeviceConfiguration}, mdev_types.ts).
 *
 * `usb`: each entry permits a set of USB devices (one of each `vendor:product` selector, all
 * of them present) under one resource name; the host's plugged devices (`uevent` under
 * `/sys/bus/usb/devices`, controllers left out) are taken set by set, each set one device of the
 * plugin (its ID the resource and the set's first bus and device number), none in two sets. A
 * container gets the sets' device nodes (`mrw`), handed to
 * KubeVirt's non-root user 107 first (resolved beneath the device root, no symlink followed),
 * and their `bus:device` numbers in `USB_RESOURCE_<RESOURCE>`. A set's health follows its first
 * device's node.
 *
 * Entries with `externalResourceProvider: true` are left to another plugin, as in KubeVirt.
 *
 * @module
 */
import { basename, join } from "node:path";
import { chownBeneath } from "../../ffi/mod.ts";
import { getLogger } from "../log/mod.ts";
import type { PermanentDevice } from "./device_plugins.ts";
import {
  configureMdevTypes,
  desiredMdevTypes,
  externallyProvidedMdevTypes,
  type MdevTypesOptions,
  readText as read,
} from "./mdev_types.ts";

const log = getLogger("device-plugins", "pci");

/** Where the VFIO device nodes are. */
const VFIO_DIR = "/dev/vfio";
/** The VFIO container node every allocation gets. */
const VFIO_CONTAINER = "/dev/vfio/vfio";

/** One PCI device of this host that a permitted resource may hand out. */
export interface PciHostDevice {
  /** Its PCI address, e.g. `0000:65:00.0`. */
  address: string;
  /** Its IOMMU group, the plugin's device ID. */
  iommuGroup: string;
  /** Its NUMA node; -1 when the host does not say. */
  numaNode: number;
}

/**
 * The PCI selectors of a `permittedHostDevices` value: `vendor:device` (lower case) to
 * resource name, externally provided entries left out. Malformed entries are skipped.
 */
export function pciSelectors(permitted: Record<string, unknown> | undefined): Map<string, string> {
  return permittedSelectors(
    permitted,
    "pciHostDevices",
    "pciVendorSelector",
    (v) => v.toLowerCase(),
  );
}

/**
 * The entries of `permitted[list]` this handler serves, by their `field` (normalized) to
 * their resource name: externally provided and malformed entries left out.
 */
function permittedSelectors(
  permitted: Record<string, unknown> | undefined,
  list: string,
  field: string,
  normalize: (selector: string) => string,
): Map<string, string> {
  const out = new Map<string, string>();
  const entries = permitted?.[list];
  if (!Array.isArray(entries)) return out;
  for (const entry of entries) {
    const e = entry as Record<string, unknown>;
    const selector = e?.[field];
    if (typeof selector !== "string" || typeof e.resourceName !== "string") continue;
    if (e.externalResourceProvider === true) continue;
    out.set(normalize(selector), e.resourceName);
  }
  return out;
}

/** KubeVirt's variable name for a resource's devices: `<prefix>_<NAME>`, `/` and `.` as `_`. */
export function resourceEnvVar(prefix: string, resourceName: string): string {
  return `${prefix}_${resourceName.toUpperCase().replaceAll("/", "_").replaceAll(".", "_")}`;
}

function linkName(path: string): string | undefined {
  try {
    return basename(Deno.readLinkSync(path));
  } catch {
    return undefined;
  }
}

/**
 * This host's PCI devices the selectors permit, by resource name: those bound to `vfio-pci`
 * with an IOMMU group, in address order. `sysRoot` is where sysfs is (`/sys`).
 */
export function discoverPciHostDevices(
  selectors: ReadonlyMap<string, string>,
  sysRoot = "/sys",
): Map<string, PciHostDevice[]> {
  const found = new Map<string, PciHostDevice[]>();
  if (selectors.size === 0) return found;
  const dir = join(sysRoot, "bus/pci/devices");
  let addresses: string[];
  try {
    addresses = [...Deno.readDirSync(dir)].map((e) => e.name).sort();
  } catch (error) {
    log.warn("Cannot list the host's PCI devices in {dir}: {error}", { dir, error });
    return found;
  }
  for (const address of addresses) {
    const device = join(dir, address);
    const id = /^PCI_ID=(.*)$/m.exec(read(join(device, "uevent")) ?? "")?.[1]?.trim()
      .toLowerCase();
    const resource = id === undefined ? undefined : selectors.get(id);
    if (resource === undefined) continue;
    if (linkName(join(device, "driver")) !== "vfio-pci") continue;
    const iommuGroup = linkName(join(device, "iommu_group"));
    if (iommuGroup === undefined) continue;
    const numa = Number(read(join(device, "numa_node"))?.trim());
    const list = found.get(resource) ?? [];
    list.push({ address, iommuGroup, numaNode: Number.isInteger(numa) ? numa : -1 });
    found.set(resource, list);
  }
  return found;
}

/**
 * A plugin of VFIO devices: one device per IOMMU group; a container gets the groups' VFIO
 * nodes and, in `<envPrefix>_<RESOURCE>`, each group's `value` (KubeVirt's PCI and mediated
 * device plugins). `check` may refuse an allocation of the groups it is given.
 */
function vfioDevicePlugin(
  resourceName: string,
  devices: readonly { iommuGroup: string; numaNode: number; value: string }[],
  envPrefix: string,
  check?: (groups: string[]) => void,
): PermanentDevice {
  const byGroup = new Map(devices.map((d) => [d.iommuGroup, d.value]));
  return {
    name: resourceName.replaceAll("/", "-"),
    path: VFIO_CONTAINER,
    resourceName,
    preOpen: false,
    ids: devices.map((d) => ({ id: d.iommuGroup, numaNode: d.numaNode })),
    allocate: (ids, permissions) => {
      const known = ids.filter((id) => byGroup.has(id));
      check?.(known);
      return {
        envs: {
          [resourceEnvVar(envPrefix, resourceName)]: known.map((id) => byGroup.get(id)).join(","),
        },
        devices: known.flatMap((id) =>
          [VFIO_CONTAINER, `${VFIO_DIR}/${id}`].map((path) => ({
            container_path: path,
            host_path: path,
            permissions,
          }))
        ),
      };
    },
  };
}

/** The device plugin of one permitted PCI resource and its devices on this host. */
export function pciDevicePlugin(resourceName: string, devices: PciHostDevice[]): PermanentDevice {
  return vfioDevicePlugin(
    resourceName,
    devices.map((d) => ({ ...d, value: d.address })),
    "PCI_RESOURCE",
  );
}

/**
 * The mediated-device selectors of a `permittedHostDevices` value: type name (spaces as `_`)
 * to resource name, externally provided entries left out.
 */
export function mdevSelectors(permitted: Record<string, unknown> | undefined): Map<string, string> {
  return permittedSelectors(
    permitted,
    "mediatedDevices",
    "mdevNameSelector",
    (v) => v.replaceAll(" ", "_").trim(),
  );
}

/** One mediated device of this host that a permitted resource may hand out. */
export interface MediatedHostDevice {
  /** Its UUID. */
  uuid: string;
  /** Its IOMMU group, the plugin's device ID. */
  iommuGroup: string;
  /** Its parent PCI device's NUMA node; -1 when the host does not say. */
  numaNode: number;
}

/**
 * This host's mediated devices the selectors permit, by resource name (UUID order): each
 * symlink under `<sysRoot>/bus/mdev/devices` whose type name matches, with an IOMMU group.
 */
export function discoverMediatedHostDevices(
  selectors: ReadonlyMap<string, string>,
  sysRoot = "/sys",
): Map<string, MediatedHostDevice[]> {
  const found = new Map<string, MediatedHostDevice[]>();
  if (selectors.size === 0) return found;
  const dir = join(sysRoot, "bus/mdev/devices");
  let entries: Deno.DirEntry[];
  try {
    entries = [...Deno.readDirSync(dir)].sort((a, b) => a.name.localeCompare(b.name));
  } catch {
    return found; // no mdev bus on this host
  }
  for (const e of entries) {
    if (!e.isSymlink) continue;
    const device = join(dir, e.name);
    const typeName = (read(join(device, "mdev_type/name")) ?? linkName(join(device, "mdev_type")))
      ?.replaceAll(" ", "_").trim();
    const resource = typeName === undefined ? undefined : selectors.get(typeName);
    if (resource === undefined) continue;
    // The link is .../<parent PCI address>/<uuid>.
    let parent: string | undefined;
    try {
      parent = Deno.readLinkSync(device).split("/").at(-2);
    } catch {
      continue;
    }
    const iommuGroup = linkName(join(device, "iommu_group"));
    if (iommuGroup === undefined || parent === undefined) continue;
    const numa = Number(read(join(sysRoot, "bus/pci/devices", parent, "numa_node"))?.trim());
    const list = found.get(resource) ?? [];
    list.push({ uuid: e.name, iommuGroup, numaNode: Number.isInteger(numa) ? numa : -1 });
    found.set(resource, list);
  }
  return found;
}

/**
 * The device plugin of one permitted mediated-device resource. `deviceRoot` is where the
 * host's `/` is seen (a group whose VFIO node is gone fails the allocation).
 */
export function mdevDevicePlugin(
  resourceName: string,
  devices: MediatedHostDevice[],
  deviceRoot = "/",
): PermanentDevice {
  return vfioDevicePlugin(
    resourceName,
    devices.map((d) => ({ ...d, value: d.uuid })),
    "MDEV_PCI_RESOURCE",
    (groups) => {
      for (const id of groups) {
        try {
          Deno.statSync(join(deviceRoot, VFIO_DIR, id));
        } catch {
          throw new Error(`Failed to allocate resource ${resourceName}`);
        }
      }
      if (groups.length === 0) {
        throw new Error(`failed to allocate resource for resourceName: ${resourceName}`);
      }
    },
  );
}

/** A plugged USB device of this host. */
export interface UsbHostDevice {
  /** Its vendor ID. */
  vendor: number;
  /** Its product ID. */
  product: number;
  /** Its bus number. */
  bus: number;
  /** Its device number on the bus. */
  device: number;
  /** Its node, e.g. `/dev/bus/usb/001/004`. */
  path: string;
}

/** The host's plugged USB devices (their `uevent`), controllers left out, in sysfs order. */
export function discoverUsbHostDevices(sysRoot = "/sys"): UsbHostDevice[] {
  const dir = join(sysRoot, "bus/usb/devices");
  let names: string[];
  try {
    names = [...Deno.readDirSync(dir)].map((e) => e.name).sort();
  } catch {
    return [];
  }
  const found: UsbHostDevice[] = [];
  for (const name of names) {
    if (name.startsWith("usb")) continue;
    const device = join(dir, name);
    if (read(join(device, "idVendor")) === undefined) continue;
    const fields = new Map(
      (read(join(device, "uevent")) ?? "").split("\n").map((l) => l.split("=") as [string, string])
        .filter((kv) => kv.length === 2),
    );
    const [vendor, product] = (fields.get("PRODUCT") ?? "").split("/").map((h) => parseInt(h, 16));
    const bus = Number(fields.get("BUSNUM"));
    const number = Number(fields.get("DEVNUM"));
    const devName = fields.get("DEVNAME");
    if (
      !Number.isInteger(vendor) || !Number.isInteger(product) || !Number.isInteger(bus) ||
      !Number.isInteger(number) || !devName || devName.includes("..")
    ) continue;
    found.push({ vendor, product, bus, device: number, path: join("/dev", devName) });
  }
  return found;
}

/**
 * The permitted USB resources' device sets on this host, by resource name: for each entry,
 * one device per selector, as long as every selector finds one not taken yet.
 */
export function usbDeviceSets(
  permitted: Record<string, unknown> | undefined,
  devices: readonly UsbHostDevice[],
): Map<string, UsbHostDevice[][]> {
  const sets = new Map<string, UsbHostDevice[][]>();
  const entries = permitted?.usb;
  if (!Array.isArray(entries)) return sets;
  const free = [...devices];
  for (const entry of entries) {
    const e = entry as Record<string, unknown>;
    if (typeof e?.resourceName !== "string" || !Array.isArray(e.selectors)) continue;
    if (e.externalResourceProvider === true || e.selectors.length === 0) continue;
    const wanted = e.selectors.map((sel) => {
      const x = sel as Record<string, unknown>;
      return { vendor: parseInt(String(x?.vendor), 16), product: parseInt(String(x?.product), 16) };
    });
    if (wanted.some((w) => !Number.isInteger(w.vendor) || !Number.isInteger(w.product))) {
      log.warn("A USB selector of {resource} is not hexadecimal vendor and product", {
        resource: e.resourceName,
      });
      continue;
    }
    for (;;) {
      const set: UsbHostDevice[] = [];
      for (const w of wanted) {
        const i = free.findIndex((d) =>
          d.vendor === w.vendor && d.product === w.product && !set.includes(d)
        );
        if (i < 0) break;
        set.push(free[i]);
      }
      if (set.length < wanted.length) break;
      for (const d of set) free.splice(free.indexOf(d), 1);
      const list = sets.get(e.resourceName) ?? [];
      list.push(set);
      sets.set(e.resourceName, list);
    }
  }
  return sets;
}

/** KubeVirt's non-root user, who gets a USB device node before QEMU opens it. */
const NON_ROOT_UID = 107;

/**
 * The device plugin of one permitted USB resource: one device per set. `deviceRoot` is where
 * the host's `/` is seen; a set's nodes go to KubeVirt's non-root user on Allocate.
 */
export function usbDevicePlugin(
  resourceName: string,
  sets: UsbHostDevice[][],
  deviceRoot = "/",
): PermanentDevice {
  // Named after the set's first device (bus and device number), so the same plugged set
  // keeps its ID whenever the configuration is read again, and a re-plugged one gets a new one.
  const byId = new Map(sets.map((set) => [`${resourceName}-${set[0].bus}.${set[0].device}`, set]));
  return {
    name: resourceName.replaceAll("/", "-"),
    path: sets[0]?.[0]?.path ?? "/dev/bus/usb",
    resourceName,
    preOpen: false,
    ids: [...byId.keys()].map((id) => ({ id, numaNode: -1 })),
    allocate: (ids) => {
      const chosen = ids.flatMap((id) => byId.get(id) ?? []);
      for (const d of chosen) chownBeneath(deviceRoot, d.path.slice(1), NON_ROOT_UID, NON_ROOT_UID);
      return {
        envs: chosen.length > 0
          ? {
            [resourceEnvVar("USB_RESOURCE", resourceName)]: chosen.map((d) =>
              `${d.bus}:${d.device}`
            ).join(","),
          }
          : {},
        devices: chosen.map((d) => ({
          container_path: d.path,
          host_path: d.path,
          permissions: "mrw",
        })),
      };
    },
  };
}

/** The plugins of every permitted PCI, mediated-device and USB resource found on this host. */
export function hostDevicePlugins(
  permitted: Record<string, unknown> | undefined,
  options: { sysRoot?: string; deviceRoot?: string } = {},
): PermanentDevice[] {
  const sysRoot = options.sysRoot ?? "/sys";
  return [
    ...[...discoverPciHostDevices(pciSelectors(permitted), sysRoot)].map(([resource, list]) =>
      pciDevicePlugin(resource, list)
    ),
    ...[...discoverMediatedHostDevices(mdevSelectors(permitted), sysRoot)].map((
      [resource, list],
    ) => mdevDevicePlugin(resource, list, options.deviceRoot)),
    ...[...usbDeviceSets(permitted, discoverUsbHostDevices(sysRoot))].map(([resource, sets]) =>
      usbDevicePlugin(resource, sets, options.deviceRoot)
    ),
  ];
}

/** What {@linkcode HostDeviceConfiguration} serves to: the device plugin manager. */
export interface HostDeviceSink {
  /** Serves these permitted host devices besides the permanent ones. */
  setHostDevices(devices: readonly PermanentDevice[]): void;
}

/** The KubeVirt CR's host-device keys, as {@linkcode HostDeviceConfiguration} takes them. */
export interface HostDeviceKeys {
  /** `permittedHostDevices`. */
  permittedHostDevices: Record<string, unknown> | undefined;
  /** `mediatedDevicesConfiguration`. */
  mediatedDevicesConfiguration: Record<string, unknown> | undefined;
  /** False when the `DisableMDEVConfiguration` gate is on. */
  mdevHandling: boolean;
}

/**
 * The host-device side of the cluster configuration, as virt-handler's device controller
 * keeps it: at each configuration change and each heartbeat (which brings the node's labels),
 * the mediated devices are made to match `mediatedDevicesConfiguration` (mdev_types.ts), then
 * the plugins of the permitted devices found are served. Mediated devices wait for the first
 * labels: the node's types may depend on them.
 */
export class HostDeviceConfiguration {
  readonly #sink: HostDeviceSink;
  readonly #options: { sysRoot?: string; deviceRoot?: string; mdev?: MdevTypesOptions };
  #keys: HostDeviceKeys | undefined;
  #labels: Readonly<Record<string, string>> | undefined;

  /** Creates it; nothing is done until {@linkcode configure}. */
  constructor(
    sink: HostDeviceSink,
    options: { sysRoot?: string; deviceRoot?: string; mdev?: MdevTypesOptions } = {},
  ) {
    this.#sink = sink;
    this.#options = options;
  }

  /** A new configuration: applied at once. */
  configure(keys: HostDeviceKeys): void {
    this.#keys = keys;
    this.#refresh();
  }

  /** The node's labels, as a heartbeat returned them: applied at once. */
  nodeLabels(labels: Readonly<Record<string, string>>): void {
    this.#labels = labels;
    this.#refresh();
  }

  #refresh(): void {
    const keys = this.#keys;
    if (!keys) return;
    const sysRoot = this.#options.sysRoot ?? this.#options.mdev?.sysRoot;
    if (keys.mdevHandling && this.#labels) {
      configureMdevTypes(
        desiredMdevTypes(keys.mediatedDevicesConfiguration, this.#labels),
        externallyProvidedMdevTypes(keys.permittedHostDevices),
        { ...this.#options.mdev, ...(sysRoot ? { sysRoot } : {}) },
      );
    }
    this.#sink.setHostDevices(
      hostDevicePlugins(keys.permittedHostDevices, {
        ...(sysRoot ? { sysRoot } : {}),
        ...(this.#options.deviceRoot ? { deviceRoot: this.#options.deviceRoot } : {}),
      }),
    );
  }
}

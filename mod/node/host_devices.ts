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
 * allocation, as in KubeVirt. Creating mediated devices from `mediatedDevicesConfiguration` is
 * not done: the ones that exist are served.
 *
 * Entries with `externalResourceProvider: true` are left to another plugin, as in KubeVirt.
 * USB devices are not served.
 *
 * @module
 */
import { basename, join } from "node:path";
import { getLogger } from "../log/mod.ts";
import type { PermanentDevice } from "./device_plugins.ts";

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
  const out = new Map<string, string>();
  const entries = permitted?.pciHostDevices;
  if (!Array.isArray(entries)) return out;
  for (const entry of entries) {
    const e = entry as Record<string, unknown>;
    if (typeof e?.pciVendorSelector !== "string" || typeof e.resourceName !== "string") continue;
    if (e.externalResourceProvider === true) continue;
    out.set(e.pciVendorSelector.toLowerCase(), e.resourceName);
  }
  return out;
}

/** KubeVirt's variable name for a resource's devices: `<prefix>_<NAME>`, `/` and `.` as `_`. */
export function resourceEnvVar(prefix: string, resourceName: string): string {
  return `${prefix}_${resourceName.toUpperCase().replaceAll("/", "_").replaceAll(".", "_")}`;
}

/** The variable a container gets its devices' PCI addresses in (KubeVirt's name for it). */
export function pciResourceEnvVar(resourceName: string): string {
  return resourceEnvVar("PCI_RESOURCE", resourceName);
}

function read(path: string): string | undefined {
  try {
    return Deno.readTextFileSync(path);
  } catch {
    return undefined;
  }
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

/** The device plugin of one permitted PCI resource and its devices on this host. */
export function pciDevicePlugin(resourceName: string, devices: PciHostDevice[]): PermanentDevice {
  const byGroup = new Map(devices.map((d) => [d.iommuGroup, d.address]));
  return {
    name: resourceName.replaceAll("/", "-"),
    path: VFIO_CONTAINER,
    resourceName,
    preOpen: false,
    ids: devices.map((d) => ({ id: d.iommuGroup, numaNode: d.numaNode })),
    allocate: (ids, permissions) => {
      const known = ids.filter((id) => byGroup.has(id));
      return {
        envs: { [pciResourceEnvVar(resourceName)]: known.map((id) => byGroup.get(id)).join(",") },
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

/**
 * The mediated-device selectors of a `permittedHostDevices` value: type name (spaces as `_`)
 * to resource name, externally provided entries left out.
 */
export function mdevSelectors(permitted: Record<string, unknown> | undefined): Map<string, string> {
  const out = new Map<string, string>();
  const entries = permitted?.mediatedDevices;
  if (!Array.isArray(entries)) return out;
  for (const entry of entries) {
    const e = entry as Record<string, unknown>;
    if (typeof e?.mdevNameSelector !== "string" || typeof e.resourceName !== "string") continue;
    if (e.externalResourceProvider === true) continue;
    out.set(e.mdevNameSelector.replaceAll(" ", "_").trim(), e.resourceName);
  }
  return out;
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
  const byGroup = new Map(devices.map((d) => [d.iommuGroup, d.uuid]));
  return {
    name: resourceName.replaceAll("/", "-"),
    path: VFIO_CONTAINER,
    resourceName,
    preOpen: false,
    ids: devices.map((d) => ({ id: d.iommuGroup, numaNode: d.numaNode })),
    allocate: (ids, permissions) => {
      const known = ids.filter((id) => byGroup.has(id));
      for (const id of known) {
        try {
          Deno.statSync(join(deviceRoot, VFIO_DIR, id));
        } catch {
          throw new Error(`Failed to allocate resource ${resourceName}`);
        }
      }
      if (known.length === 0) {
        throw new Error(`failed to allocate resource for resourceName: ${resourceName}`);
      }
      return {
        envs: {
          [resourceEnvVar("MDEV_PCI_RESOURCE", resourceName)]: known.map((id) => byGroup.get(id))
            .join(","),
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

/** The plugins of every permitted PCI and mediated-device resource found on this host. */
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
  ];
}

/**
 * The KubeVirt CR's `permittedHostDevices.pciHostDevices` as virt-handler serves them: each
 * entry permits the PCI devices of one `vendor:device` ID under one resource name. The
 * devices of this host with that ID (`PCI_ID` in each device's `uevent` under
 * `/sys/bus/pci/devices`) that are bound to `vfio-pci` and have an IOMMU group become a
 * device plugin for the resource, one device per IOMMU group with its NUMA node. A container
 * allocated some gets `/dev/vfio/vfio` and each group's `/dev/vfio/<group>`, and the PCI
 * addresses in `PCI_RESOURCE_<RESOURCE>` (the name upper-cased, `/` and `.` as `_`), which
 * KubeVirt's launcher reads to build the domain's host devices.
 *
 * Entries with `externalResourceProvider: true` are left to another plugin, as in KubeVirt.
 * Mediated devices and USB devices are not served.
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

/** The variable a container gets its devices' PCI addresses in (KubeVirt's name for it). */
export function pciResourceEnvVar(resourceName: string): string {
  return `PCI_RESOURCE_${resourceName.toUpperCase().replaceAll("/", "_").replaceAll(".", "_")}`;
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

/** The plugins of every permitted PCI resource found on this host. */
export function pciDevicePlugins(
  permitted: Record<string, unknown> | undefined,
  sysRoot = "/sys",
): PermanentDevice[] {
  return [...discoverPciHostDevices(pciSelectors(permitted), sysRoot)].map(([resource, list]) =>
    pciDevicePlugin(resource, list)
  );
}

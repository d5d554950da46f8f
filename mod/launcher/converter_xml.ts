/**
 * The pure half of the converter: a validated VMI plus the files its volumes were
 * prepared into -> libvirt domain XML. No I/O happens here.
 *
 * @module
 */

import {
  DEFAULT_GRACE_PERIOD_SECONDS,
  type Disk,
  type DiskBus,
  DOWNWARD_METRICS_PORT,
  DOWNWARD_METRICS_VMI_SOCKET,
  type FeatureState,
  type Interface,
  quantityToInteger,
  SocketNames,
  type Timer,
  USB_CLIENT_PASSTHROUGH_SLOTS,
  usbRedirSocket,
  type VirtualMachineInstance,
  vmiKey as keyOf,
} from "../api/mod.ts";
import { domainNameOf, GUEST_AGENT_CHANNEL } from "../domain/mod.ts";
import {
  NetworkSpecError,
  type PodInterfacePlan,
  podNetworkPlan,
  type PreparedInterface,
} from "../network/mod.ts";
import { ConversionError, InvalidFieldError, UnsupportedFieldError } from "./converter_errors.ts";
import { el, renderXml } from "./_xml.ts";
import {
  checkCpuPlacement,
  type CpuPlacement,
  cpuPlacement,
  type HostNumaCell,
} from "./converter_cpu_tune.ts";
import type { XmlElement } from "./_xml.ts";

/** The file backing one volume, as the preparation step left it. */
export interface PreparedVolume {
  /** Absolute path of the image file. */
  path: string;
  /** Image format for QEMU's driver. */
  format: "qcow2" | "raw";
  /** The path is a block device node, not a file. */
  block?: boolean;
}

/** EFI firmware files, checked to exist by the preparation step. */
export interface PreparedEfi {
  /** Read-only firmware code (OVMF_CODE). */
  code: string;
  /** Variable store template (OVMF_VARS). */
  varsTemplate: string;
  /** Where libvirt keeps this VM's copy of the variable store. */
  nvram: string;
  /** Secure boot firmware. */
  secureBoot: boolean;
}

/** Inputs of {@linkcode generateDomainXml} besides the VMI. */
export interface DomainXmlOptions {
  /** `kvm` with /dev/kvm, `qemu` for software emulation. */
  domainType: "kvm" | "qemu";
  /** The VMI's private run directory (serial console and VNC sockets). */
  runDir: string;
  /** Prepared backing files, keyed by volume name. */
  volumes: Record<string, PreparedVolume>;
  /** EFI firmware, when the VMI asks for EFI. */
  efi?: PreparedEfi;
  /** What the launcher found of each pod-network interface, by interface name. */
  interfaces?: Record<string, PreparedInterface>;
  /** The cluster's settings the handler sent (`VirtualMachineOptions`); none: fields unset. */
  cluster?: DomainClusterOptions;
  /**
   * The host CPUs given to a VMI with `dedicatedCpuPlacement`: one per enabled vCPU, then
   * the emulator thread's with `isolateEmulatorThread`. Such a VMI is refused without them.
   */
  dedicatedCpus?: readonly number[];
  /** The host's NUMA nodes (the handler's `VirtualMachineOptions.topology`), for passthrough. */
  hostNumaCells?: readonly HostNumaCell[];
}

/** The cluster's settings a domain follows, from the handler's `VirtualMachineOptions`. */
export interface DomainClusterOptions {
  /** The SMBIOS system entries every domain gets. */
  smbios?: {
    manufacturer?: string;
    product?: string;
    version?: string;
    sku?: string;
    family?: string;
  };
  /** Seconds between balloon statistics; 0: none. */
  memBalloonStatsPeriod: number;
  /** The cluster leaves free page reporting on (KubeVirt's default). */
  freePageReporting: boolean;
}

/** The cluster settings of a `VirtualMachineOptions` (the handler's, as the wire has them). */
export function domainClusterOptions(
  options: Record<string, unknown> | null | undefined,
): DomainClusterOptions | undefined {
  if (!options) return undefined;
  const smbios = options.VirtualMachineSMBios as Record<string, unknown> | null | undefined;
  const cluster = options.clusterConfig as Record<string, unknown> | null | undefined;
  const text = (v: unknown) => typeof v === "string" ? v : undefined;
  const period = Number(options.MemBalloonStatsPeriod ?? 0);
  return {
    smbios: smbios
      ? {
        manufacturer: text(smbios.manufacturer),
        product: text(smbios.product),
        version: text(smbios.version),
        sku: text(smbios.sku),
        family: text(smbios.family),
      }
      : undefined,
    memBalloonStatsPeriod: Number.isInteger(period) && period >= 0 ? period : 0,
    freePageReporting: cluster?.FreePageReportingDisabled !== true,
  };
}

/**
 * Whether the domain's balloon reports free pages, as KubeVirt's launcher decides: the
 * cluster allows it and the VMI has a balloon, is no high-performance VMI (dedicated or
 * realtime CPUs, huge pages) and does not opt out by annotation.
 */
function freePageReporting(vmi: VirtualMachineInstance, cluster: DomainClusterOptions): boolean {
  const cpu = vmi.spec.domain.cpu as Record<string, unknown> | undefined;
  const memory = vmi.spec.domain.memory as Record<string, unknown> | undefined;
  return cluster.freePageReporting &&
    vmi.spec.domain.devices.autoattachMemBalloon !== false &&
    cpu?.dedicatedCpuPlacement !== true && cpu?.realtime === undefined &&
    memory?.hugepages === undefined &&
    vmi.metadata.annotations?.["kubevirt.io/free-page-reporting-disabled"] !== "true";
}

/** The libvirt domain name of a VMI: `<namespace>_<name>`, as KubeVirt names it. */
export function domainNameForVmi(vmi: VirtualMachineInstance): string {
  return domainNameOf(vmi.metadata.namespace ?? "default", vmi.metadata.name);
}

/** `namespace/name` of a VMI. */
export function vmiKey(vmi: VirtualMachineInstance): string {
  return keyOf({ namespace: vmi.metadata.namespace ?? "default", name: vmi.metadata.name });
}

const UUID_RE = /^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$/;
const TIMEZONE_RE = /^[a-zA-Z0-9_.+\-/]+$/;
const VENDOR_ID_RE = /^[^,]{0,12}$/;

/** Guest memory size in bytes: `memory.guest`, else requests, else limits. */
export function guestMemoryBytes(vmi: VirtualMachineInstance): number {
  const domain = vmi.spec.domain;
  const quantity = domain.memory?.guest ?? domain.resources?.requests?.memory ??
    domain.resources?.limits?.memory;
  if (quantity === undefined) {
    throw new InvalidFieldError(
      vmiKey(vmi),
      "spec.domain.memory.guest",
      "no memory size: set it or spec.domain.resources.requests.memory",
    );
  }
  const bytes = quantityToInteger(quantity);
  if (bytes < 1024 * 1024) {
    throw new InvalidFieldError(vmiKey(vmi), "spec.domain.memory.guest", "less than 1Mi");
  }
  return bytes;
}

/**
 * The memory CPU hot-plug's limit leaves room for: `memory.maxGuest` in bytes when it is
 * above the guest memory (virt-api sets it on every VMI of 1Gi or more under KubeVirt's
 * LiveUpdate rollout strategy), else undefined.
 */
export function maxGuestMemoryBytes(vmi: VirtualMachineInstance): number | undefined {
  const quantity = vmi.spec.domain.memory?.maxGuest;
  if (quantity === undefined) return undefined;
  const max = quantityToInteger(quantity);
  const guest = guestMemoryBytes(vmi);
  if (max < guest) {
    throw new InvalidFieldError(
      vmiKey(vmi),
      "spec.domain.memory.maxGuest",
      `${quantity} is less than the guest memory (${guest} bytes)`,
    );
  }
  return max > guest ? max : undefined;
}

/** virtio-mem's block size: KubeVirt's 2 MiB, 1 GiB under 1Gi huge pages. */
function memoryBlockBytes(vmi: VirtualMachineInstance): number {
  return vmi.spec.domain.memory?.hugepages?.pageSize === "1Gi" ? 1024 ** 3 : 2 * 1024 ** 2;
}

/**
 * The virtio-mem device memory hot-plug attaches, as KubeVirt's launcher builds it: on NUMA
 * node 0, `maxGuest` less the memory at boot in size, and the guest memory less the memory
 * at boot requested. `status.memory.guestAtBoot` is needed.
 */
export function virtioMemDevice(vmi: VirtualMachineInstance): {
  size: number;
  requested: number;
  block: number;
  xml: string;
} {
  const key = vmiKey(vmi);
  const atBoot = vmi.status?.memory?.guestAtBoot;
  if (atBoot === undefined) {
    throw new InvalidFieldError(key, "status.memory.guestAtBoot", "missing: the memory at boot");
  }
  const boot = quantityToInteger(atBoot);
  const maxGuest = vmi.spec.domain.memory?.maxGuest;
  const max = maxGuest === undefined ? undefined : quantityToInteger(maxGuest);
  if (max === undefined || max <= boot) {
    throw new InvalidFieldError(
      key,
      "spec.domain.memory.maxGuest",
      "not above the memory at boot: no memory can be plugged",
    );
  }
  if (guestMemoryBytes(vmi) > max) {
    throw new InvalidFieldError(
      key,
      "spec.domain.memory.guest",
      `more than maxGuest (${maxGuest})`,
    );
  }
  const block = memoryBlockBytes(vmi);
  const size = max - boot;
  const requested = guestMemoryBytes(vmi) - boot;
  if (requested < 0) {
    throw new InvalidFieldError(
      key,
      "spec.domain.memory.guest",
      `less than the memory at boot (${atBoot}): virtio-mem cannot take from it`,
    );
  }
  if (size % block !== 0 || requested % block !== 0) {
    throw new InvalidFieldError(
      key,
      "spec.domain.memory.guest",
      `the plugged memory (${requested} of ${size} bytes) is not in whole ${block}-byte blocks`,
    );
  }
  const xml = renderXml(el(
    "memory",
    { model: "virtio-mem" },
    el(
      "target",
      {},
      el("size", { unit: "b" }, String(size)),
      el("node", {}, "0"),
      el("block", { unit: "b" }, String(block)),
      el("requested", { unit: "b" }, String(requested)),
    ),
  ));
  return { size, requested, block, xml };
}

/**
 * The sockets CPU hot-plug may grow to: `cpu.maxSockets` (virt-api sets it on every VMI
 * under KubeVirt's LiveUpdate rollout strategy), at least the boot topology's sockets.
 */
export function maxCpuSockets(vmi: VirtualMachineInstance): number {
  const sockets = cpuTopology(vmi).sockets;
  const max = vmi.spec.domain.cpu?.maxSockets;
  if (max === undefined || max === 0) return sockets;
  if (max < sockets) {
    throw new InvalidFieldError(
      vmiKey(vmi),
      "spec.domain.cpu.maxSockets",
      `${max} is less than spec.domain.cpu.sockets (${sockets})`,
    );
  }
  return max;
}

/** The vCPU topology: from `cpu`, else sockets from the CPU limit or request. */
export function cpuTopology(
  vmi: VirtualMachineInstance,
): { sockets: number; cores: number; threads: number } {
  const cpu = vmi.spec.domain.cpu;
  const topology = {
    sockets: cpu?.sockets ?? 1,
    cores: cpu?.cores ?? 1,
    threads: cpu?.threads ?? 1,
  };
  if (!cpu?.sockets && !cpu?.cores && !cpu?.threads) {
    const resources = vmi.spec.domain.resources;
    const count = resources?.limits?.cpu ?? resources?.requests?.cpu;
    if (count !== undefined) topology.sockets = Math.max(1, quantityToInteger(count));
  }
  return topology;
}

function enabled(state: FeatureState | undefined, fallback: boolean): boolean {
  if (state === undefined) return fallback;
  return state.enabled ?? true;
}

function onOff(state: FeatureState | undefined): string {
  return enabled(state, true) ? "on" : "off";
}

function yesNo(value: boolean): string {
  return value ? "yes" : "no";
}

/** Device name for the n-th (0-based) disk with a prefix: vda, vdb, ..., vdz, vdaa. */
export function deviceName(prefix: string, index: number): string {
  let suffix = "";
  let n = index;
  do {
    suffix = String.fromCharCode(97 + (n % 26)) + suffix;
    n = Math.floor(n / 26) - 1;
  } while (n >= 0);
  return prefix + suffix;
}

function busPrefix(bus: DiskBus): string {
  return bus === "virtio" ? "vd" : "sd";
}

/** The device kind, bus and read-only flag a disk entry asks for, with KubeVirt's defaults. */
function diskShape(
  vmi: VirtualMachineInstance,
  disk: Disk,
  index: number,
): { device: "disk" | "cdrom"; bus: DiskBus; readonly: boolean } {
  const path = `spec.domain.devices.disks[${index}]`;
  const kinds = (["disk", "cdrom", "lun"] as const).filter((kind) => disk[kind] !== undefined);
  if (kinds.length > 1) {
    throw new InvalidFieldError(vmiKey(vmi), path, `sets ${kinds.join(" and ")}; set one`);
  }
  if (disk.cdrom) {
    const bus = disk.cdrom.bus ?? "sata";
    if (bus === "virtio") {
      throw new UnsupportedFieldError(
        vmiKey(vmi),
        `${path}.cdrom.bus`,
        `value "virtio" is not supported for a cdrom (use sata or scsi)`,
      );
    }
    return { device: "cdrom", bus, readonly: disk.cdrom.readonly ?? true };
  }
  return {
    device: "disk",
    bus: disk.disk?.bus ?? "virtio",
    readonly: disk.disk?.readonly ?? false,
  };
}

function checkDisks(vmi: VirtualMachineInstance): void {
  const key = vmiKey(vmi);
  const volumes = vmi.spec.volumes ?? [];
  const seen = new Set<string>();
  (vmi.spec.domain.devices.disks ?? []).forEach((disk, i) => {
    const path = `spec.domain.devices.disks[${i}]`;
    if (seen.has(disk.name)) {
      throw new InvalidFieldError(key, `${path}.name`, `duplicate disk name "${disk.name}"`);
    }
    seen.add(disk.name);
    if (!volumes.some((volume) => volume.name === disk.name)) {
      throw new InvalidFieldError(key, `${path}.name`, `no volume named "${disk.name}"`);
    }
    diskShape(vmi, disk, i);
  });
}

function buildDisks(vmi: VirtualMachineInstance, options: DomainXmlOptions): XmlElement[] {
  const key = vmiKey(vmi);
  const disks = vmi.spec.domain.devices.disks ?? [];
  const counters = new Map<string, number>();
  return disks.map((disk, i) => {
    const prepared = options.volumes[disk.name];
    if (!prepared) {
      throw new ConversionError(key, `volume "${disk.name}" was not prepared`);
    }
    const prefix = busPrefix(diskShape(vmi, disk, i).bus);
    const n = counters.get(prefix) ?? 0;
    counters.set(prefix, n + 1);
    return diskElement(vmi, i, prepared, deviceName(prefix, n));
  });
}

/** The `<disk>` of the VMI's `index`-th disk entry, backed by `prepared`, as `dev`. */
function diskElement(
  vmi: VirtualMachineInstance,
  index: number,
  prepared: PreparedVolume,
  dev: string,
): XmlElement {
  const disk = vmi.spec.domain.devices.disks![index];
  const shape = diskShape(vmi, disk, index);
  return el(
    "disk",
    { type: prepared.block ? "block" : "file", device: shape.device },
    el("driver", {
      name: "qemu",
      type: prepared.format,
      cache: disk.cache,
      error_policy: "stop",
    }),
    el("source", prepared.block ? { dev: prepared.path } : { file: prepared.path }),
    el("target", {
      dev,
      bus: shape.bus,
      tray: shape.device === "cdrom" ? "closed" : undefined,
    }),
    disk.bootOrder !== undefined && el("boot", { order: disk.bootOrder }),
    shape.readonly && el("readonly"),
    disk.serial !== undefined && el("serial", {}, disk.serial),
    el("alias", { name: `ua-${disk.name}` }),
  );
}

/**
 * The `<disk>` that attaches the VMI's disk `name` to its running domain: the first device
 * name of its bus that none of `taken` (the domain's disks now) holds. Throws when the
 * VMI has no such disk entry.
 */
export function hotplugDiskXml(
  vmi: VirtualMachineInstance,
  name: string,
  prepared: PreparedVolume,
  taken: ReadonlySet<string>,
): { xml: string; dev: string } {
  const index = (vmi.spec.domain.devices.disks ?? []).findIndex((d) => d.name === name);
  if (index < 0) {
    throw new InvalidFieldError(
      vmiKey(vmi),
      "spec.domain.devices.disks",
      `no disk named "${name}"`,
    );
  }
  const prefix = busPrefix(diskShape(vmi, vmi.spec.domain.devices.disks![index], index).bus);
  let n = 0;
  while (taken.has(deviceName(prefix, n))) n++;
  const dev = deviceName(prefix, n);
  return { xml: renderXml(diskElement(vmi, index, prepared, dev)), dev };
}

/** KubeVirt's rule: a SCSI controller for SCSI disks, and for disks hotplugged later. */
function needsScsiController(vmi: VirtualMachineInstance): boolean {
  const devices = vmi.spec.domain.devices;
  return !devices.disableHotplug ||
    (devices.disks ?? []).some((disk) => (disk.disk?.bus ?? disk.cdrom?.bus) === "scsi");
}

function buildInterfaces(
  vmi: VirtualMachineInstance,
  prepared?: Record<string, PreparedInterface>,
): XmlElement[] {
  const key = vmiKey(vmi);
  let plans: PodInterfacePlan[];
  try {
    plans = podNetworkPlan(vmi);
  } catch (error) {
    if (error instanceof NetworkSpecError) {
      throw new InvalidFieldError(key, error.path, error.detail, { cause: error });
    }
    throw error;
  }
  const interfaces = vmi.spec.domain.devices.interfaces ?? [];
  return interfaces.map((nic: Interface) => {
    const plan = plans.find((p) => p.name === nic.name);
    if (!plan) {
      // slirp: QEMU's user networking, no pod network involved.
      return el(
        "interface",
        { type: "user" },
        nic.macAddress !== undefined &&
          el("mac", { address: nic.macAddress.replaceAll("-", ":").toLowerCase() }),
        el("model", { type: nic.model ?? "virtio" }),
        nic.bootOrder !== undefined && el("boot", { order: nic.bootOrder }),
        el("alias", { name: `ua-${nic.name}` }),
      );
    }
    // Only the pure checks run without `prepared`; the domain itself needs the launcher's
    // view of the pod (its tap, MAC and MTU).
    const ready = prepared?.[plan.name];
    if (prepared && !ready) {
      throw new ConversionError(
        key,
        `the pod network of interface "${plan.name}" was not prepared`,
      );
    }
    return el(
      "interface",
      { type: "ethernet" },
      el("target", { dev: ready?.targetDev ?? plan.tap, managed: "no" }),
      el("model", { type: plan.model }),
      el("mac", { address: ready?.mac ?? plan.macAddress ?? "02:00:00:00:00:01" }),
      ready && el("mtu", { size: ready.mtu }),
      plan.bootOrder !== undefined
        ? el("boot", { order: plan.bootOrder })
        : el("rom", { enabled: "no" }),
      el("alias", { name: `ua-${nic.name}` }),
    );
  });
}

function buildCpu(vmi: VirtualMachineInstance, placement: CpuPlacement | undefined): XmlElement {
  const cpu = vmi.spec.domain.cpu;
  const topology = cpuTopology(vmi);
  // KubeVirt's default; libvirt also offers host-model to software-emulated guests.
  const model = cpu?.model ?? "host-model";
  const features = cpu?.features ?? [];
  let attrs: Record<string, string | undefined> = {};
  let modelElement: XmlElement | undefined;
  if (model === "host-model" || model === "host-passthrough") {
    attrs = { mode: model };
  } else {
    attrs = { mode: "custom", match: "exact" };
    modelElement = el("model", {}, model);
  }
  const sockets = maxCpuSockets(vmi);
  const vcpus = sockets * topology.cores * topology.threads;
  return el(
    "cpu",
    attrs,
    modelElement,
    el("topology", {
      sockets,
      dies: undefined,
      cores: topology.cores,
      threads: topology.threads,
    }),
    features.map((feature) =>
      el("feature", { policy: feature.policy ?? "require", name: feature.name })
    ),
    // NUMA passthrough's cells; else memory hot-plug's one node (libvirt 9 adds none itself).
    placement?.numa && el("numa", {}, placement.numa.cells),
    !placement?.numa && maxGuestMemoryBytes(vmi) !== undefined && el(
      "numa",
      {},
      el("cell", {
        id: 0,
        cpus: vcpus > 1 ? `0-${vcpus - 1}` : "0",
        memory: guestMemoryBytes(vmi),
        unit: "b",
      }),
    ),
  );
}

/**
 * `<vcpus>` for CPU hot-plug, as KubeVirt's launcher writes it: the boot topology's vCPUs
 * enabled, the rest of `maxSockets` disabled; vCPUs of the first socket cannot be
 * unplugged.
 */
function buildHotplugVcpus(vmi: VirtualMachineInstance): XmlElement | undefined {
  const topology = cpuTopology(vmi);
  const perSocket = topology.cores * topology.threads;
  const total = maxCpuSockets(vmi) * perSocket;
  const enabledCount = topology.sockets * perSocket;
  if (total === enabledCount) return undefined;
  const vcpus: XmlElement[] = [];
  for (let id = 0; id < total; id++) {
    vcpus.push(el("vcpu", {
      id,
      enabled: id < enabledCount ? "yes" : "no",
      hotpluggable: id >= perSocket ? "yes" : "no",
    }));
  }
  return el("vcpus", {}, vcpus);
}

/** The huge page size in KiB, when the VMI asks for one; 0 for huge pages of any size. */
function hugepageKib(vmi: VirtualMachineInstance): number | undefined {
  const hugepages = vmi.spec.domain.memory?.hugepages;
  if (!hugepages) return undefined;
  if (hugepages.pageSize === undefined) return 0;
  let kib: number;
  try {
    kib = quantityToInteger(hugepages.pageSize) / 1024;
  } catch (error) {
    throw new InvalidFieldError(
      vmiKey(vmi),
      "spec.domain.memory.hugepages.pageSize",
      `"${hugepages.pageSize}" is not a quantity`,
      { cause: error },
    );
  }
  if (!Number.isInteger(kib) || kib < 4) {
    throw new InvalidFieldError(
      vmiKey(vmi),
      "spec.domain.memory.hugepages.pageSize",
      `"${hugepages.pageSize}" is not a page size`,
    );
  }
  return kib;
}

function buildMemoryBacking(
  vmi: VirtualMachineInstance,
  placement: CpuPlacement | undefined,
): XmlElement | undefined {
  const kib = hugepageKib(vmi);
  const extra = placement?.memoryBacking ?? [];
  if (kib === undefined) return extra.length > 0 ? el("memoryBacking", {}, extra) : undefined;
  const pages = placement?.numa?.pages ??
    (kib === 0 ? [] : [el("page", { size: kib, unit: "KiB" })]);
  return el("memoryBacking", {}, el("hugepages", {}, pages), extra);
}

/**
 * The domain's parts for dedicated CPUs (converter_cpu_tune.ts), from the CPUs the launcher
 * was given; undefined for a VMI whose CPUs are not dedicated.
 */
function dedicatedPlacement(
  vmi: VirtualMachineInstance,
  options: Pick<DomainXmlOptions, "domainType" | "dedicatedCpus" | "hostNumaCells">,
): CpuPlacement | undefined {
  const cpu = vmi.spec.domain.cpu;
  if (cpu?.dedicatedCpuPlacement !== true) return undefined;
  if (options.dedicatedCpus === undefined) {
    throw new UnsupportedFieldError(
      vmiKey(vmi),
      "spec.domain.cpu.dedicatedCpuPlacement",
      "dedicated CPUs come from the node's CPU manager, and this launcher was given none",
    );
  }
  const topology = cpuTopology(vmi);
  const kib = hugepageKib(vmi);
  return cpuPlacement(
    {
      key: vmiKey(vmi),
      cpu,
      vcpus: topology.sockets * topology.cores * topology.threads,
      memoryBytes: guestMemoryBytes(vmi),
      hugepageBytes: kib ? kib * 1024 : undefined,
      architecture: vmi.spec.architecture,
      domainType: options.domainType,
    },
    options.dedicatedCpus,
    options.hostNumaCells ?? [],
  );
}

/**
 * A dedicated-CPU VMI's migratable domain `xml` pinned to the target's `cpus` over its NUMA
 * `cells`, as KubeVirt's source launcher rewrites it for the target it migrates to: the
 * `<cputune>` and `<numatune>` made for those CPUs replace the source's (the guest's own
 * NUMA cells stay as they are). Throws a converter error naming the field when `cpus` are
 * not as many as the VMI needs.
 */
export function pinnedForTarget(
  vmi: VirtualMachineInstance,
  xml: string,
  domainType: "kvm" | "qemu",
  cpus: readonly number[],
  cells: readonly HostNumaCell[],
): string {
  const placement = dedicatedPlacement(vmi, {
    domainType,
    dedicatedCpus: cpus,
    hostNumaCells: cells,
  });
  if (!placement) return xml;
  const swap = (text: string, name: string, replacement: XmlElement | undefined) => {
    const re = new RegExp(`<${name}\\b[^>]*>[\\s\\S]*?</${name}>|<${name}\\b[^>]*/>`);
    if (!re.test(text)) return text;
    return text.replace(re, replacement ? renderXml(replacement) : "");
  };
  return swap(swap(xml, "cputune", placement.cputune), "numatune", placement.numa?.numatune);
}

function firmwareUuid(vmi: VirtualMachineInstance): string | undefined {
  const uuid = vmi.spec.domain.firmware?.uuid;
  if (uuid !== undefined && !UUID_RE.test(uuid)) {
    throw new InvalidFieldError(
      vmiKey(vmi),
      "spec.domain.firmware.uuid",
      `"${uuid}" is not a UUID`,
    );
  }
  return uuid;
}

function buildSysinfo(
  vmi: VirtualMachineInstance,
  cluster: DomainClusterOptions | undefined,
): XmlElement | undefined {
  const firmware = vmi.spec.domain.firmware;
  const uuid = firmwareUuid(vmi);
  const smbios = cluster?.smbios;
  if (uuid === undefined && firmware?.serial === undefined && !smbios) return undefined;
  // KubeVirt's order: the firmware's entries, then the cluster's SMBIOS ones.
  const entry = (name: string, value: string | undefined) =>
    value !== undefined && el("entry", { name }, value);
  return el(
    "sysinfo",
    { type: "smbios" },
    el(
      "system",
      {},
      entry("uuid", uuid),
      entry("serial", firmware?.serial),
      ...(smbios
        ? [
          entry("manufacturer", smbios.manufacturer ?? ""),
          entry("family", smbios.family ?? ""),
          entry("product", smbios.product ?? ""),
          entry("sku", smbios.sku ?? ""),
          entry("version", smbios.version ?? ""),
        ]
        : []),
    ),
  );
}

/**
 * The memory balloon: KubeVirt's statistics period (10 s unless the cluster says) and, when
 * the cluster's settings came, free page reporting as KubeVirt's launcher decides it.
 */
function buildMemBalloon(
  vmi: VirtualMachineInstance,
  cluster: DomainClusterOptions | undefined,
): XmlElement {
  if (vmi.spec.domain.devices.autoattachMemBalloon === false) {
    return el("memballoon", { model: "none" });
  }
  const period = cluster ? cluster.memBalloonStatsPeriod : 10;
  return el(
    "memballoon",
    {
      model: "virtio",
      ...(cluster ? { freePageReporting: freePageReporting(vmi, cluster) ? "on" : "off" } : {}),
    },
    period > 0 && el("stats", { period }),
  );
}

/** Whether the VMI asks for EFI firmware. */
export function wantsEfi(vmi: VirtualMachineInstance): boolean {
  return vmi.spec.domain.firmware?.bootloader?.efi !== undefined;
}

/** Whether an EFI VMI asks for secure boot (KubeVirt's default: yes). */
export function wantsSecureBoot(vmi: VirtualMachineInstance): boolean {
  return wantsEfi(vmi) && (vmi.spec.domain.firmware?.bootloader?.efi?.secureBoot ?? true);
}

function buildOs(
  vmi: VirtualMachineInstance,
  options: DomainXmlOptions,
  withSysinfo: boolean,
): XmlElement {
  const bootloader = vmi.spec.domain.firmware?.bootloader;
  if (bootloader?.bios && bootloader.efi) {
    throw new InvalidFieldError(
      vmiKey(vmi),
      "spec.domain.firmware.bootloader",
      "sets bios and efi; set one",
    );
  }
  let efi: XmlElement[] = [];
  if (wantsEfi(vmi)) {
    if (!options.efi) {
      throw new ConversionError(vmiKey(vmi), "EFI firmware was not prepared");
    }
    efi = [
      el(
        "loader",
        { readonly: "yes", secure: yesNo(options.efi.secureBoot), type: "pflash" },
        options.efi.code,
      ),
      el("nvram", { template: options.efi.varsTemplate }, options.efi.nvram),
    ];
  }
  return el(
    "os",
    {},
    el(
      "type",
      { arch: "x86_64", machine: vmi.spec.domain.machine?.type ?? "q35" },
      "hvm",
    ),
    efi,
    bootloader?.bios?.useSerial !== undefined &&
      el("bios", { useserial: yesNo(bootloader.bios.useSerial) }),
    withSysinfo && el("smbios", { mode: "sysinfo" }),
  );
}

function buildFeatures(
  vmi: VirtualMachineInstance,
  placement: CpuPlacement | undefined,
): XmlElement {
  const features = vmi.spec.domain.features;
  const hyperv = features?.hyperv;
  let hypervElement: XmlElement | undefined;
  if (hyperv) {
    const state = (name: string, value: FeatureState | undefined) =>
      value !== undefined && el(name, { state: onOff(value) });
    const spinlocksOn = enabled(hyperv.spinlocks, false);
    const vendorId = hyperv.vendorid;
    if (vendorId?.vendorid !== undefined && !VENDOR_ID_RE.test(vendorId.vendorid)) {
      throw new InvalidFieldError(
        vmiKey(vmi),
        "spec.domain.features.hyperv.vendorid.vendorid",
        "at most 12 characters",
      );
    }
    hypervElement = el(
      "hyperv",
      { mode: "custom" },
      state("relaxed", hyperv.relaxed),
      state("vapic", hyperv.vapic),
      hyperv.spinlocks !== undefined &&
        el("spinlocks", {
          state: spinlocksOn ? "on" : "off",
          retries: spinlocksOn ? hyperv.spinlocks.spinlocks ?? 4096 : undefined,
        }),
      state("vpindex", hyperv.vpindex),
      state("runtime", hyperv.runtime),
      state("synic", hyperv.synic),
      state("reset", hyperv.reset),
      vendorId !== undefined &&
        el("vendor_id", {
          state: onOff(vendorId),
          value: enabled(vendorId, true) ? vendorId.vendorid ?? "" : undefined,
        }),
      state("frequencies", hyperv.frequencies),
      state("ipi", hyperv.ipi),
    );
  }
  return el(
    "features",
    {},
    // KubeVirt's API defaulting turns ACPI on unless the VMI turns it off.
    enabled(features?.acpi, true) && el("acpi"),
    enabled(features?.apic, false) && el("apic"),
    hypervElement,
    features?.smm !== undefined && el("smm", { state: onOff(features.smm) }),
    placement?.features,
  );
}

function buildClock(vmi: VirtualMachineInstance): XmlElement | undefined {
  const clock = vmi.spec.domain.clock;
  if (!clock) return undefined;
  const key = vmiKey(vmi);
  if (clock.utc && clock.timezone !== undefined) {
    throw new InvalidFieldError(key, "spec.domain.clock", "sets utc and timezone; set one");
  }
  let attrs: Record<string, string | number | undefined>;
  if (clock.timezone !== undefined) {
    if (!TIMEZONE_RE.test(clock.timezone)) {
      throw new InvalidFieldError(
        key,
        "spec.domain.clock.timezone",
        `"${clock.timezone}" is not a time zone name`,
      );
    }
    attrs = { offset: "timezone", timezone: clock.timezone };
  } else {
    attrs = { offset: "utc", adjustment: clock.utc?.offsetSeconds ?? "reset" };
  }
  const timers = clock.timer ?? {};
  const timer = (name: string, value: Timer | undefined) =>
    value !== undefined &&
    el("timer", {
      name,
      tickpolicy: value.tickPolicy,
      track: value.track,
      present: yesNo(value.present ?? true),
    });
  return el(
    "clock",
    attrs,
    timer("hpet", timers.hpet),
    timer("kvmclock", timers.kvm),
    timer("pit", timers.pit),
    timer("rtc", timers.rtc),
    timer("hypervclock", timers.hyperv),
  );
}

function buildConsoleAndGraphics(
  vmi: VirtualMachineInstance,
  options: DomainXmlOptions,
): XmlElement[] {
  const devices = vmi.spec.domain.devices;
  const result: XmlElement[] = [];
  if (devices.autoattachSerialConsole ?? true) {
    result.push(
      el(
        "serial",
        { type: "unix" },
        el("source", { mode: "bind", path: `${options.runDir}/${SocketNames.Serial0}` }),
        el("target", { port: 0 }),
      ),
      el("console", { type: "pty" }, el("target", { type: "serial", port: 0 })),
    );
  }
  if (devices.autoattachGraphicsDevice ?? true) {
    result.push(
      el(
        "graphics",
        { type: "vnc" },
        el("listen", { type: "socket", socket: `${options.runDir}/${SocketNames.Vnc}` }),
      ),
      el("video", {}, el("model", { type: "vga", vram: 16384, heads: 1 })),
    );
  }
  return result;
}

/**
 * `clientPassthrough`: a USB 3 controller and KubeVirt's four redirected USB ports, each
 * a socket QEMU listens on in the VMI's run directory, which the handler's `usbredir`
 * route bridges a client to.
 */
function buildUsbRedirection(
  vmi: VirtualMachineInstance,
  options: DomainXmlOptions,
): XmlElement[] {
  if (vmi.spec.domain.devices.clientPassthrough === undefined) return [];
  return [
    el("controller", { type: "usb", index: 0, model: "qemu-xhci" }),
    ...Array.from({ length: USB_CLIENT_PASSTHROUGH_SLOTS }, (_, slot) =>
      el(
        "redirdev",
        { type: "unix", bus: "usb" },
        el("source", { mode: "bind", path: `${options.runDir}/${usbRedirSocket(slot)}` }),
      )),
  ];
}

function buildMetadata(vmi: VirtualMachineInstance): XmlElement {
  const grace = vmi.spec.terminationGracePeriodSeconds ?? DEFAULT_GRACE_PERIOD_SECONDS;
  return el(
    "metadata",
    {},
    el(
      "kubevirt",
      { xmlns: "http://kubevirt.io" },
      el("uid", {}, vmi.metadata.uid ?? ""),
      el("graceperiod", {}, el("deletionGracePeriodSeconds", {}, String(grace))),
    ),
  );
}

function checkVolumes(vmi: VirtualMachineInstance): void {
  const key = vmiKey(vmi);
  const disks = vmi.spec.domain.devices.disks ?? [];
  const seen = new Set<string>();
  (vmi.spec.volumes ?? []).forEach((volume, i) => {
    const path = `spec.volumes[${i}]`;
    if (seen.has(volume.name)) {
      throw new InvalidFieldError(key, `${path}.name`, `duplicate volume name "${volume.name}"`);
    }
    seen.add(volume.name);
    const sources = Object.keys(volume).filter((field) => field !== "name");
    if (sources.length !== 1) {
      throw new InvalidFieldError(key, path, "needs exactly one volume source");
    }
    if (!disks.some((disk) => disk.name === volume.name)) {
      throw new InvalidFieldError(key, `${path}.name`, `no disk named "${volume.name}"`);
    }
  });
}

/**
 * Checks what the allow-list cannot: cross-references between disks, volumes,
 * interfaces and networks, and values libvirt would reject. Throws the converter's
 * typed errors; pure.
 */
export function checkVmiSemantics(
  vmi: VirtualMachineInstance,
  options: { domainType?: "kvm" | "qemu" } = {},
): void {
  const key = vmiKey(vmi);
  if (options.domainType === "qemu") {
    // What libvirt or QEMU refuse for software-emulated guests, refused here by name.
    if (vmi.spec.domain.cpu?.model === "host-passthrough") {
      throw new UnsupportedFieldError(
        key,
        "spec.domain.cpu.model",
        `value "host-passthrough" needs KVM; this node emulates guests in software`,
      );
    }
    if (vmi.spec.domain.features?.hyperv !== undefined) {
      throw new UnsupportedFieldError(
        key,
        "spec.domain.features.hyperv",
        "Hyper-V enlightenments need KVM; this node emulates guests in software",
      );
    }
  }
  if (wantsEfi(vmi) && !enabled(vmi.spec.domain.features?.acpi, true)) {
    throw new InvalidFieldError(key, "spec.domain.features.acpi", "EFI firmware needs ACPI");
  }
  checkCpuPlacement(key, vmi.spec.domain.cpu, hugepageKib(vmi) !== undefined);
  checkDisks(vmi);
  checkVolumes(vmi);
  buildInterfaces(vmi);
  guestMemoryBytes(vmi);
  maxGuestMemoryBytes(vmi);
  maxCpuSockets(vmi);
  firmwareUuid(vmi);
  if (wantsSecureBoot(vmi) && !enabled(vmi.spec.domain.features?.smm, false)) {
    throw new InvalidFieldError(
      vmiKey(vmi),
      "spec.domain.features.smm",
      "EFI secure boot needs SMM: enable it or set spec.domain.firmware.bootloader.efi.secureBoot to false",
    );
  }
}

/**
 * The libvirt domain XML for a validated VMI whose volumes were prepared. Pure: the same
 * inputs give the same text.
 */
export function generateDomainXml(vmi: VirtualMachineInstance, options: DomainXmlOptions): string {
  checkVmiSemantics(vmi, options);
  const devices = vmi.spec.domain.devices;
  const topology = cpuTopology(vmi);
  // libvirt 9 insists on a slot count beside the maximum; virtio-mem needs none.
  const maxGuest = maxGuestMemoryBytes(vmi);
  const sysinfo = buildSysinfo(vmi, options.cluster);
  const uuid = firmwareUuid(vmi);
  const placement = dedicatedPlacement(vmi, options);
  const domain = el(
    "domain",
    { type: options.domainType },
    el("name", {}, domainNameForVmi(vmi)),
    uuid !== undefined && el("uuid", {}, uuid),
    buildMetadata(vmi),
    maxGuest !== undefined && el("maxMemory", { slots: 1, unit: "b" }, String(maxGuest)),
    el("memory", { unit: "b" }, String(guestMemoryBytes(vmi))),
    buildMemoryBacking(vmi, placement),
    el(
      "vcpu",
      { placement: "static" },
      String(maxCpuSockets(vmi) * topology.cores * topology.threads),
    ),
    buildHotplugVcpus(vmi),
    placement?.cputune,
    placement?.numa?.numatune,
    sysinfo,
    buildOs(vmi, options, sysinfo !== undefined),
    buildFeatures(vmi, placement),
    buildCpu(vmi, placement),
    buildClock(vmi),
    el(
      "devices",
      {},
      buildDisks(vmi, options),
      needsScsiController(vmi) &&
        el("controller", { type: "scsi", index: 0, model: "virtio-scsi" }),
      buildInterfaces(vmi, options.interfaces ?? {}),
      // No source: libvirt picks the socket path, as with KubeVirt's launcher.
      el("channel", { type: "unix" }, el("target", { type: "virtio", name: GUEST_AGENT_CHANNEL })),
      // The downward metrics port: QEMU listens in the VMI's run directory, the handler
      // connects and answers the guest's requests.
      devices.downwardMetrics !== undefined &&
        el(
          "channel",
          { type: "unix" },
          el("source", { mode: "bind", path: `${options.runDir}/${DOWNWARD_METRICS_VMI_SOCKET}` }),
          el("target", { type: "virtio", name: DOWNWARD_METRICS_PORT }),
        ),
      buildConsoleAndGraphics(vmi, options),
      buildUsbRedirection(vmi, options),
      buildMemBalloon(vmi, options.cluster),
      devices.rng !== undefined &&
        el("rng", { model: "virtio" }, el("backend", { model: "random" }, "/dev/urandom")),
      devices.watchdog !== undefined &&
        el(
          "watchdog",
          { model: "i6300esb", action: devices.watchdog.i6300esb?.action },
          el("alias", { name: `ua-${devices.watchdog.name}` }),
        ),
    ),
  );
  return renderXml(domain);
}

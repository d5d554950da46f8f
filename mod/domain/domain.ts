/**
 * The Domain object a launcher reports to the handler (notify `domainJSON`, cmd
 * `DomainResponse.domain`), and its JSON codec.
 *
 * Inside virtnode a domain is {@linkcode Domain}: camelCase, only the parts the handler
 * reads. On the wire it is KubeVirt's Go `api.Domain` marshalled by `encoding/json`:
 * `{"kind","apiVersion","ObjectMeta":{...},"Spec":{...},"Status":{"Status","Reason",...}}`
 * with Go field names as keys (KubeVirt's domain types carry XML tags only). The codec
 * reads and writes that shape so virtnode and KubeVirt components understand each other.
 *
 * @module
 */

import type { GuestOsInfo } from "../api/mod.ts";
import { isDomainDown, LifeCycle, StateChangeReason } from "./status.ts";

/** `kind` of a domain object. */
export const DOMAIN_KIND = "Domain";
/** `apiVersion` KubeVirt's launcher puts on domain objects (not a Kubernetes group). */
export const DOMAIN_API_VERSION = "1.2.2";
/** Target name of the virtio channel QEMU's guest agent talks over. */
export const GUEST_AGENT_CHANNEL = "org.qemu.guest_agent.0";
/** libvirt's channel target state while a guest agent is listening on the channel. */
export const CHANNEL_CONNECTED = "connected";

/** One guest network interface the guest agent reports. */
export interface DomainInterfaceStatus {
  /** The interface's MAC address. */
  mac?: string;
  /** The interface's first IP address. */
  ip?: string;
  /** Every IP address of the interface. */
  ips?: string[];
  /** The interface's name in the guest, e.g. `eth0`. */
  interfaceName?: string;
}

/** A device alias; user-defined aliases are written `ua-<name>` in libvirt XML. */
export interface DomainAlias {
  /** The alias, without the `ua-` prefix when user-defined. */
  name: string;
  /** Whether the alias was given by the user (`ua-` in libvirt XML). */
  userDefined: boolean;
}

/** A network interface of the domain spec. */
export interface DomainInterface {
  /** The interface type, e.g. `ethernet` or `bridge`. */
  type: string;
  /** The interface's MAC address. */
  mac?: string;
  /** The device model, e.g. `virtio`. */
  model?: string;
  /** The device alias. */
  alias?: DomainAlias;
}

/** A host device of the domain spec (a PCI device passed through, an SR-IOV VF among them). */
export interface DomainHostDevice {
  /** The device type, e.g. `pci`. */
  type: string;
  /** The device alias (KubeVirt's launcher names an SR-IOV interface's `sriov-<name>`). */
  alias?: DomainAlias;
}

/** A disk of the domain spec. */
export interface DomainDisk {
  /** What the guest sees, e.g. `disk` or `cdrom`. */
  device: string;
  /** Where the data is, e.g. `file` or `block`. */
  type: string;
  /** The image file or block device on the host. */
  source: { file?: string; dev?: string };
  /** The bus and device name in the guest, e.g. `virtio` and `vda`. */
  target: { bus?: string; dev?: string };
  /** The device alias. */
  alias?: DomainAlias;
}

/** An amount of memory as libvirt writes it: `<memory unit='KiB'>2097152</memory>`. */
export interface DomainMemory {
  /** The amount, in `unit`. */
  value: number;
  /** libvirt's unit, e.g. `KiB` or `b`. */
  unit: string;
}

/** The target of a channel: what the guest sees. */
export interface DomainChannelTarget {
  /** The channel's name in the guest, e.g. `org.qemu.guest_agent.0`. */
  name?: string;
  /** The target type, e.g. `virtio`. */
  type: string;
  /** On a running domain: `connected` or `disconnected`, as libvirt reports it. */
  state?: string;
}

/** A channel device of the domain spec, e.g. the guest agent's. */
export interface DomainChannel {
  /** The host side, e.g. `unix`. */
  type: string;
  /** What the guest sees. */
  target?: DomainChannelTarget;
}

/** `<metadata><kubevirt>` of the domain spec. */
export interface DomainKubevirtMetadata {
  /** The VMI's UID. */
  uid: string;
  /** The grace period of the guest's shutdown, and whether it is being shut down. */
  gracePeriod?: {
    deletionGracePeriodSeconds: number;
    deletionTimestamp?: string;
    markedForGracefulShutdown?: boolean;
  };
  /** The state of the VMI's live migration, when one was started. */
  migration?: {
    uid?: string;
    startTimestamp?: string;
    endTimestamp?: string;
    failed?: boolean;
    failureReason?: string;
    abortStatus?: string;
    mode?: string;
  };
  /** Whether the launcher put the VMI's access credentials into the guest, and its message. */
  accessCredential?: { succeeded: boolean; message?: string };
  /** The last memory dump the launcher took: its file, when, and how it ended. */
  memoryDump?: {
    fileName?: string;
    startTimestamp?: string;
    endTimestamp?: string;
    completed?: boolean;
    failed?: boolean;
    failureReason?: string;
  };
}

/** The parts of the domain spec the handler reads. */
export interface DomainSpecSummary {
  /** `kvm` or `qemu`. */
  type?: string;
  /** libvirt domain name, `<namespace>_<name>`. */
  name: string;
  /** The libvirt domain UUID. */
  uuid?: string;
  /** KubeVirt's metadata in the domain. */
  metadata: { kubevirt: DomainKubevirtMetadata };
  /** Present when the domain has `<features>`; `acpi` tells whether ACPI is on. */
  features?: { acpi: boolean };
  /** `<os>`: the machine type, e.g. `pc-q35-rhel9.6.0`. */
  os?: { machine?: string };
  /** The guest's memory at boot. */
  memory?: DomainMemory;
  /** The guest's memory now (lower than `memory` while the balloon is inflated). */
  currentMemory?: DomainMemory;
  /** The network interfaces, disks and channels. */
  devices: {
    interfaces: DomainInterface[];
    disks: DomainDisk[];
    channels: DomainChannel[];
    hostDevices?: DomainHostDevice[];
  };
}

/** A domain's status: lifecycle, reason, and what the guest agent reported. */
export interface DomainStatus {
  /** The lifecycle state. */
  status: LifeCycle;
  /** Why the domain is in that state. */
  reason: StateChangeReason;
  /** The guest OS, as the guest agent reports it. */
  osInfo?: GuestOsInfo;
  /** The guest's network interfaces, as the guest agent reports them. */
  interfaces?: DomainInterfaceStatus[];
  /** Whether the guest's filesystems are frozen, e.g. `frozen`. */
  fsFreezeStatus?: { status: string };
}

/** A domain as the launcher reports it. */
export interface Domain {
  /** Always `Domain`. */
  kind: typeof DOMAIN_KIND;
  /** KubeVirt's domain API version ({@linkcode DOMAIN_API_VERSION}). */
  apiVersion: string;
  /** The VMI the domain belongs to. */
  metadata: {
    /** The VMI's name (not the libvirt domain name). */
    name: string;
    namespace: string;
    uid?: string;
    resourceVersion?: string;
    deletionTimestamp?: string;
  };
  /** The parts of the domain spec the handler reads. */
  spec: DomainSpecSummary;
  /** The domain's status. */
  status: DomainStatus;
}

/** Thrown when domain JSON is malformed. */
export class DomainJsonError extends Error {
  /** Creates the error with a detail message. */
  constructor(detail: string, options?: ErrorOptions) {
    super(`Cannot decode domain JSON: ${detail}`, options);
    this.name = "DomainJsonError";
  }
}

/** libvirt's domain name for a VMI: `<namespace>_<name>`, as KubeVirt names it. */
export function domainNameOf(namespace: string, name: string): string {
  return `${namespace}_${name}`;
}

/** A minimal domain for a VMI, with the given status. */
export function newDomain(
  ref: { namespace: string; name: string; uid?: string },
  state: { status: LifeCycle; reason: StateChangeReason },
): Domain {
  return {
    kind: DOMAIN_KIND,
    apiVersion: DOMAIN_API_VERSION,
    metadata: { name: ref.name, namespace: ref.namespace, uid: ref.uid },
    spec: {
      name: domainNameOf(ref.namespace, ref.name),
      metadata: { kubevirt: { uid: ref.uid ?? "" } },
      devices: { interfaces: [], disks: [], channels: [] },
    },
    status: { status: state.status, reason: state.reason },
  };
}

/** The domain as KubeVirt's wire JSON text. */
export function encodeDomainJson(domain: Domain): string {
  return JSON.stringify(domainToWire(domain));
}

/** A domain from KubeVirt's wire JSON text; throws {@linkcode DomainJsonError}. */
export function decodeDomainJson(text: string): Domain {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (error) {
    throw new DomainJsonError("not valid JSON", { cause: error });
  }
  return domainFromWire(raw);
}

/** A JSON object as KubeVirt's wire format carries it. */
export type Json = Record<string, unknown>;

function compact<T extends Json>(object: T): T {
  for (const key of Object.keys(object)) {
    if (object[key] === undefined) delete object[key];
  }
  return object;
}

function aliasToWire(alias: DomainAlias | undefined): Json | undefined {
  return alias ? { Name: alias.name, UserDefined: alias.userDefined } : undefined;
}

function memoryToWire(memory: DomainMemory | undefined): Json | undefined {
  return memory ? { Value: memory.value, Unit: memory.unit } : undefined;
}

/** The domain as a KubeVirt wire JSON value (before stringifying). */
export function domainToWire(domain: Domain): Json {
  const kv = domain.spec.metadata.kubevirt;
  const grace = kv.gracePeriod;
  const migration = kv.migration;
  return {
    kind: domain.kind,
    apiVersion: domain.apiVersion,
    ObjectMeta: compact({
      name: domain.metadata.name,
      namespace: domain.metadata.namespace,
      uid: domain.metadata.uid,
      resourceVersion: domain.metadata.resourceVersion,
      deletionTimestamp: domain.metadata.deletionTimestamp,
      creationTimestamp: null,
    }),
    Spec: compact({
      Type: domain.spec.type ?? "",
      Name: domain.spec.name,
      UUID: domain.spec.uuid ?? "",
      Metadata: {
        KubeVirt: compact({
          UID: kv.uid,
          GracePeriod: grace
            ? compact({
              DeletionGracePeriodSeconds: grace.deletionGracePeriodSeconds,
              DeletionTimestamp: grace.deletionTimestamp,
              MarkedForGracefulShutdown: grace.markedForGracefulShutdown,
            })
            : undefined,
          Migration: migration
            ? compact({
              UID: migration.uid ?? "",
              StartTimestamp: migration.startTimestamp,
              EndTimestamp: migration.endTimestamp,
              Failed: migration.failed ?? false,
              FailureReason: migration.failureReason ?? "",
              AbortStatus: migration.abortStatus ?? "",
              Mode: migration.mode ?? "",
            })
            : undefined,
          AccessCredential: kv.accessCredential
            ? compact({
              Succeeded: kv.accessCredential.succeeded || undefined,
              Message: kv.accessCredential.message || undefined,
            })
            : undefined,
          MemoryDump: kv.memoryDump
            ? compact({
              FileName: kv.memoryDump.fileName || undefined,
              StartTimestamp: kv.memoryDump.startTimestamp,
              EndTimestamp: kv.memoryDump.endTimestamp,
              Completed: kv.memoryDump.completed || undefined,
              Failed: kv.memoryDump.failed || undefined,
              FailureReason: kv.memoryDump.failureReason || undefined,
            })
            : undefined,
        }),
      },
      // Go's api.Memory and api.OS are values, not pointers: always present, zero when unset.
      Memory: memoryToWire(domain.spec.memory) ?? { Value: 0, Unit: "" },
      CurrentMemory: memoryToWire(domain.spec.currentMemory) ?? null,
      OS: { Type: { Machine: domain.spec.os?.machine ?? "" } },
      Features: domain.spec.features ? (domain.spec.features.acpi ? { ACPI: {} } : {}) : null,
      Devices: {
        Interfaces: domain.spec.devices.interfaces.map((nic) =>
          compact({
            Type: nic.type,
            MAC: nic.mac ? { MAC: nic.mac } : undefined,
            Model: nic.model ? { Type: nic.model } : undefined,
            Alias: aliasToWire(nic.alias),
          })
        ),
        Disks: domain.spec.devices.disks.map((disk) =>
          compact({
            Device: disk.device,
            Type: disk.type,
            Source: compact({ File: disk.source.file, Dev: disk.source.dev }),
            Target: compact({ Bus: disk.target.bus, Device: disk.target.dev }),
            Alias: aliasToWire(disk.alias),
          })
        ),
        HostDevices: domain.spec.devices.hostDevices?.map((device) =>
          compact({ Type: device.type, Alias: aliasToWire(device.alias) })
        ),
        Channels: domain.spec.devices.channels.map((channel) =>
          compact({
            Type: channel.type,
            Target: channel.target
              ? compact({
                Name: channel.target.name,
                Type: channel.target.type,
                State: channel.target.state,
              })
              : undefined,
          })
        ),
      },
    }),
    Status: {
      Status: domain.status.status,
      Reason: domain.status.reason,
      Interfaces:
        domain.status.interfaces?.map((nic) =>
          compact({ Mac: nic.mac, Ip: nic.ip, IPs: nic.ips, InterfaceName: nic.interfaceName })
        ) ?? null,
      OSInfo: {
        Name: domain.status.osInfo?.name ?? "",
        KernelRelease: domain.status.osInfo?.kernelRelease ?? "",
        Version: domain.status.osInfo?.version ?? "",
        PrettyName: domain.status.osInfo?.prettyName ?? "",
        VersionId: domain.status.osInfo?.versionId ?? "",
        KernelVersion: domain.status.osInfo?.kernelVersion ?? "",
        Machine: domain.status.osInfo?.machine ?? "",
        Id: domain.status.osInfo?.id ?? "",
      },
      FSFreezeStatus: { Status: domain.status.fsFreezeStatus?.status ?? "" },
    },
  };
}

function isObject(value: unknown): value is Json {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function object(value: unknown, path: string): Json {
  if (value === undefined || value === null) return {};
  if (!isObject(value)) throw new DomainJsonError(`"${path}" is not an object`);
  return value;
}

function optString(value: unknown, path: string): string | undefined {
  if (value === undefined || value === null || value === "") return undefined;
  if (typeof value !== "string") throw new DomainJsonError(`"${path}" is not a string`);
  return value;
}

function optCount(value: unknown, path: string): number | undefined {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value < 0) {
    throw new DomainJsonError(`"${path}" is not a non-negative integer`);
  }
  return value;
}

function array(value: unknown, path: string): unknown[] {
  if (value === undefined || value === null) return [];
  if (!Array.isArray(value)) throw new DomainJsonError(`"${path}" is not an array`);
  return value;
}

function aliasFromWire(value: unknown, path: string): DomainAlias | undefined {
  if (value === undefined || value === null) return undefined;
  const alias = object(value, path);
  const name = optString(alias.Name, `${path}.Name`);
  return name === undefined ? undefined : { name, userDefined: alias.UserDefined === true };
}

/** Go's zero `api.Memory` (no value, no unit) reads as absent. */
function memoryFromWire(value: unknown, path: string): DomainMemory | undefined {
  const memory = object(value, path);
  const amount = optCount(memory.Value, `${path}.Value`);
  const unit = optString(memory.Unit, `${path}.Unit`);
  if (!amount && unit === undefined) return undefined;
  return { value: amount ?? 0, unit: unit ?? "" };
}

function channelFromWire(value: unknown, path: string): DomainChannel {
  const channel = object(value, path);
  const target = channel.Target === undefined || channel.Target === null
    ? undefined
    : object(channel.Target, `${path}.Target`);
  return compact({
    type: optString(channel.Type, `${path}.Type`) ?? "",
    target: target
      ? compact({
        name: optString(target.Name, `${path}.Target.Name`),
        type: optString(target.Type, `${path}.Target.Type`) ?? "",
        state: optString(target.State, `${path}.Target.State`),
      })
      : undefined,
  });
}

const LIFE_CYCLES = new Set<string>(Object.values(LifeCycle));
const REASONS = new Set<string>(Object.values(StateChangeReason));

/** A domain from a KubeVirt wire JSON value; throws {@linkcode DomainJsonError}. */
export function domainFromWire(raw: unknown): Domain {
  if (!isObject(raw)) throw new DomainJsonError("not an object");
  const meta = object(raw.ObjectMeta, "ObjectMeta");
  const name = optString(meta.name, "ObjectMeta.name");
  const namespace = optString(meta.namespace, "ObjectMeta.namespace");
  if (!name || !namespace) {
    throw new DomainJsonError(`"ObjectMeta.name" and "ObjectMeta.namespace" are required`);
  }
  const spec = object(raw.Spec, "Spec");
  const kv = object(object(spec.Metadata, "Spec.Metadata").KubeVirt, "Spec.Metadata.KubeVirt");
  const status = object(raw.Status, "Status");
  const lifeCycle = optString(status.Status, "Status.Status") ?? LifeCycle.NoState;
  if (!LIFE_CYCLES.has(lifeCycle)) {
    throw new DomainJsonError(`"Status.Status" has unknown value "${lifeCycle}"`);
  }
  const reasonText = optString(status.Reason, "Status.Reason") ?? StateChangeReason.Unknown;
  const reason = REASONS.has(reasonText)
    ? reasonText as StateChangeReason
    : StateChangeReason.Unknown;

  const graceRaw = kv.GracePeriod;
  const grace = graceRaw === undefined || graceRaw === null
    ? undefined
    : object(graceRaw, "Spec.Metadata.KubeVirt.GracePeriod");
  const migrationRaw = kv.Migration;
  const migration = migrationRaw === undefined || migrationRaw === null
    ? undefined
    : object(migrationRaw, "Spec.Metadata.KubeVirt.Migration");
  const credentialRaw = kv.AccessCredential;
  const credential = credentialRaw === undefined || credentialRaw === null
    ? undefined
    : object(credentialRaw, "Spec.Metadata.KubeVirt.AccessCredential");
  const dumpRaw = kv.MemoryDump;
  const dump = dumpRaw === undefined || dumpRaw === null
    ? undefined
    : object(dumpRaw, "Spec.Metadata.KubeVirt.MemoryDump");
  const features = spec.Features === undefined || spec.Features === null
    ? undefined
    : object(spec.Features, "Spec.Features");
  const devices = object(spec.Devices, "Spec.Devices");
  const machine = optString(
    object(object(spec.OS, "Spec.OS").Type, "Spec.OS.Type").Machine,
    "Spec.OS.Type.Machine",
  );
  const osInfo = object(status.OSInfo, "Status.OSInfo");
  const freeze = optString(
    object(status.FSFreezeStatus, "Status.FSFreezeStatus").Status,
    "Status.FSFreezeStatus.Status",
  );

  const domain: Domain = {
    kind: DOMAIN_KIND,
    apiVersion: optString(raw.apiVersion, "apiVersion") ?? DOMAIN_API_VERSION,
    metadata: compact({
      name,
      namespace,
      uid: optString(meta.uid, "ObjectMeta.uid"),
      resourceVersion: optString(meta.resourceVersion, "ObjectMeta.resourceVersion"),
      deletionTimestamp: optString(meta.deletionTimestamp, "ObjectMeta.deletionTimestamp"),
    }),
    spec: compact({
      type: optString(spec.Type, "Spec.Type"),
      name: optString(spec.Name, "Spec.Name") ?? domainNameOf(namespace, name),
      uuid: optString(spec.UUID, "Spec.UUID"),
      metadata: {
        kubevirt: compact({
          uid: optString(kv.UID, "Spec.Metadata.KubeVirt.UID") ?? "",
          gracePeriod: grace
            ? compact({
              deletionGracePeriodSeconds: Number(grace.DeletionGracePeriodSeconds ?? 0),
              deletionTimestamp: optString(
                grace.DeletionTimestamp,
                "GracePeriod.DeletionTimestamp",
              ),
              markedForGracefulShutdown: typeof grace.MarkedForGracefulShutdown === "boolean"
                ? grace.MarkedForGracefulShutdown
                : undefined,
            })
            : undefined,
          migration: migration
            ? compact({
              uid: optString(migration.UID, "Migration.UID"),
              startTimestamp: optString(migration.StartTimestamp, "Migration.StartTimestamp"),
              endTimestamp: optString(migration.EndTimestamp, "Migration.EndTimestamp"),
              failed: migration.Failed === true,
              failureReason: optString(migration.FailureReason, "Migration.FailureReason"),
              abortStatus: optString(migration.AbortStatus, "Migration.AbortStatus"),
              mode: optString(migration.Mode, "Migration.Mode"),
            })
            : undefined,
          accessCredential: credential
            ? compact({
              succeeded: credential.Succeeded === true,
              message: optString(credential.Message, "AccessCredential.Message"),
            })
            : undefined,
          memoryDump: dump
            ? compact({
              fileName: optString(dump.FileName, "MemoryDump.FileName"),
              startTimestamp: optString(dump.StartTimestamp, "MemoryDump.StartTimestamp"),
              endTimestamp: optString(dump.EndTimestamp, "MemoryDump.EndTimestamp"),
              completed: dump.Completed === true,
              failed: dump.Failed === true,
              failureReason: optString(dump.FailureReason, "MemoryDump.FailureReason"),
            })
            : undefined,
        }),
      },
      features: features
        ? { acpi: features.ACPI !== undefined && features.ACPI !== null }
        : undefined,
      os: machine ? { machine } : undefined,
      memory: memoryFromWire(spec.Memory, "Spec.Memory"),
      currentMemory: memoryFromWire(spec.CurrentMemory, "Spec.CurrentMemory"),
      devices: {
        interfaces: array(devices.Interfaces, "Spec.Devices.Interfaces").map((value, i) => {
          const path = `Spec.Devices.Interfaces[${i}]`;
          const nic = object(value, path);
          return compact({
            type: optString(nic.Type, `${path}.Type`) ?? "",
            mac: optString(object(nic.MAC, `${path}.MAC`).MAC, `${path}.MAC.MAC`),
            model: optString(object(nic.Model, `${path}.Model`).Type, `${path}.Model.Type`),
            alias: aliasFromWire(nic.Alias, `${path}.Alias`),
          });
        }),
        disks: array(devices.Disks, "Spec.Devices.Disks").map((value, i) => {
          const path = `Spec.Devices.Disks[${i}]`;
          const disk = object(value, path);
          const source = object(disk.Source, `${path}.Source`);
          const target = object(disk.Target, `${path}.Target`);
          return compact({
            device: optString(disk.Device, `${path}.Device`) ?? "",
            type: optString(disk.Type, `${path}.Type`) ?? "",
            source: compact({
              file: optString(source.File, `${path}.Source.File`),
              dev: optString(source.Dev, `${path}.Source.Dev`),
            }),
            target: compact({
              bus: optString(target.Bus, `${path}.Target.Bus`),
              dev: optString(target.Device, `${path}.Target.Device`),
            }),
            alias: aliasFromWire(disk.Alias, `${path}.Alias`),
          });
        }),
        ...(devices.HostDevices === undefined || devices.HostDevices === null ? {} : {
          hostDevices: array(devices.HostDevices, "Spec.Devices.HostDevices").map((value, i) => {
            const path = `Spec.Devices.HostDevices[${i}]`;
            const device = object(value, path);
            return compact({
              type: optString(device.Type, `${path}.Type`) ?? "",
              alias: aliasFromWire(device.Alias, `${path}.Alias`),
            });
          }),
        }),
        channels: array(devices.Channels, "Spec.Devices.Channels").map((value, i) =>
          channelFromWire(value, `Spec.Devices.Channels[${i}]`)
        ),
      },
    }),
    status: compact({
      status: lifeCycle as LifeCycle,
      reason,
      osInfo: osInfoFromWire(osInfo),
      interfaces: status.Interfaces === undefined || status.Interfaces === null
        ? undefined
        : array(status.Interfaces, "Status.Interfaces").map((value, i) => {
          const path = `Status.Interfaces[${i}]`;
          const nic = object(value, path);
          return compact({
            mac: optString(nic.Mac, `${path}.Mac`),
            ip: optString(nic.Ip, `${path}.Ip`),
            ips: array(nic.IPs, `${path}.IPs`).map((ip) => String(ip)),
            interfaceName: optString(nic.InterfaceName, `${path}.InterfaceName`),
          });
        }),
      fsFreezeStatus: freeze ? { status: freeze } : undefined,
    }),
  };
  return domain;
}

function osInfoFromWire(info: Json): GuestOsInfo | undefined {
  const result = compact({
    name: optString(info.Name, "Status.OSInfo.Name"),
    kernelRelease: optString(info.KernelRelease, "Status.OSInfo.KernelRelease"),
    version: optString(info.Version, "Status.OSInfo.Version"),
    prettyName: optString(info.PrettyName, "Status.OSInfo.PrettyName"),
    versionId: optString(info.VersionId, "Status.OSInfo.VersionId"),
    kernelVersion: optString(info.KernelVersion, "Status.OSInfo.KernelVersion"),
    machine: optString(info.Machine, "Status.OSInfo.Machine"),
    id: optString(info.Id, "Status.OSInfo.Id"),
  });
  return Object.keys(result).length > 0 ? result : undefined;
}

/** Whether there is a domain and it is not down (any state but Shutoff or Crashed). */
export function isDomainAlive(domain: Domain | undefined): domain is Domain {
  return domain !== undefined && !isDomainDown(domain.status.status);
}

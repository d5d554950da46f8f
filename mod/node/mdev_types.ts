/**
 * Mediated devices made to order: the KubeVirt CR's `mediatedDevicesConfiguration` names the
 * mdev types this node should offer, and the handler creates and removes mediated devices in
 * sysfs to match, as virt-handler does (unless the `DisableMDEVConfiguration` gate is on).
 *
 * - **Which types.** `nodeMediatedDeviceTypes` entries whose `nodeSelector` the node's labels
 *   satisfy give their types (`mediatedDeviceTypes`, or the deprecated `mediatedDevicesTypes`);
 *   when none applies, or none lists a type, the top-level list does.
 * - **Removal first.** Every mediated device whose type (its `mdev_type/name`, spaces as `_`,
 *   or the type's folder name) is neither wanted nor the selector of an externally provided
 *   `permittedHostDevices.mediatedDevices` entry is removed (`1` into its `remove`).
 * - **Creation.** A parent device (under `/sys/class/mdev_bus`) that still has a mediated
 *   device is configured already and left alone. Each wanted type that an unconfigured parent
 *   supports takes such parents in turn, one parent per type per round (a card offers one type
 *   at a time), and on each it creates as many devices as `available_instances` says (a new
 *   UUID into the type's `create`). A parent whose creation fails is not tried again in that
 *   pass.
 *
 * Types are matched by name or by ID, as KubeVirt matches them. The paths written are the
 * ones sysfs lists; no name from the configuration becomes part of a path.
 *
 * @module
 */
import { basename, join } from "node:path";
import { getLogger } from "../log/mod.ts";
import { errorText } from "../../ffi/mod.ts";

const log = getLogger("device-plugins", "mdev");

/** The gate that turns the handling of mediated device types off, as in KubeVirt. */
export const DISABLE_MDEV_CONFIGURATION_GATE = "DisableMDEVConfiguration";

/** How {@linkcode configureMdevTypes} reaches sysfs. */
export interface MdevTypesOptions {
  /** Where sysfs is (`/sys`). */
  sysRoot?: string;
  /** Writes a sysfs attribute (`Deno.writeTextFileSync`). */
  write?: (path: string, value: string) => void;
  /** A new mediated device's UUID (`crypto.randomUUID`). */
  uuid?: () => string;
}

/** What one {@linkcode configureMdevTypes} pass did. */
export interface MdevTypesResult {
  /** UUIDs of the mediated devices removed. */
  removed: string[];
  /** Devices created, per type and parent. */
  created: { type: string; parent: string; uuids: string[] }[];
  /** What failed (logged too); the pass goes on past each. */
  errors: string[];
}

function strings(value: unknown): string[] {
  return Array.isArray(value) ? value.filter((v): v is string => typeof v === "string") : [];
}

function record(value: unknown): Record<string, unknown> | undefined {
  return typeof value === "object" && value !== null && !Array.isArray(value)
    ? value as Record<string, unknown>
    : undefined;
}

/** The types one configuration entry lists: the current spelling, else the deprecated one. */
function typesOf(entry: Record<string, unknown>): string[] {
  const current = strings(entry.mediatedDeviceTypes);
  return current.length > 0 ? current : strings(entry.mediatedDevicesTypes);
}

/**
 * The mdev types `mediatedDevicesConfiguration` wants on a node with `labels`, deduplicated in
 * the order the configuration gives them.
 */
export function desiredMdevTypes(
  configuration: Record<string, unknown> | undefined,
  labels: Readonly<Record<string, string>>,
): string[] {
  if (!configuration) return [];
  const perNode: string[] = [];
  for (
    const raw of Array.isArray(configuration.nodeMediatedDeviceTypes)
      ? configuration.nodeMediatedDeviceTypes
      : []
  ) {
    const entry = record(raw);
    if (!entry) continue;
    const selector = record(entry.nodeSelector) ?? {};
    if (Object.entries(selector).every(([key, value]) => labels[key] === value)) {
      perNode.push(...typesOf(entry));
    }
  }
  return [...new Set(perNode.length > 0 ? perNode : typesOf(configuration))];
}

/** The selectors (spaces as `_`) of `permittedHostDevices.mediatedDevices` another plugin provides. */
export function externallyProvidedMdevTypes(
  permitted: Record<string, unknown> | undefined,
): Set<string> {
  const out = new Set<string>();
  for (const raw of Array.isArray(permitted?.mediatedDevices) ? permitted.mediatedDevices : []) {
    const entry = record(raw);
    if (entry?.externalResourceProvider === true && typeof entry.mdevNameSelector === "string") {
      out.add(entry.mdevNameSelector.replaceAll(" ", "_").trim());
    }
  }
  return out;
}

/** A sysfs attribute's text; undefined when it cannot be read. */
export function readText(path: string): string | undefined {
  try {
    return Deno.readTextFileSync(path);
  } catch {
    return undefined;
  }
}

function sortedEntries(dir: string): Deno.DirEntry[] {
  try {
    return [...Deno.readDirSync(dir)].sort((a, b) => a.name.localeCompare(b.name));
  } catch {
    return [];
  }
}

/** A type's name as KubeVirt compares it: spaces as `_`, trimmed. */
function normalizedName(raw: string | undefined): string | undefined {
  return raw?.replaceAll(" ", "_").trim();
}

/** The existing mediated devices: UUID, type name and ID, parent. */
function existingMdevs(sysRoot: string) {
  const dir = join(sysRoot, "bus/mdev/devices");
  return sortedEntries(dir).map((e) => {
    const device = join(dir, e.name);
    let typeId: string | undefined;
    let parent: string | undefined;
    try {
      typeId = basename(Deno.readLinkSync(join(device, "mdev_type")));
    } catch { /* not readable: kept */ }
    try {
      // The link ends in .../<parent>/<uuid>.
      parent = Deno.readLinkSync(device).split("/").at(-2);
    } catch { /* not a link */ }
    return {
      uuid: e.name,
      path: device,
      typeName: normalizedName(readText(join(device, "mdev_type/name"))),
      typeId,
      parent,
    };
  });
}

/**
 * Makes this node's mediated devices match `desired` (see the module doc); the types in
 * `external` are never removed. Safe to call again: a configured parent is left alone.
 */
export function configureMdevTypes(
  desired: readonly string[],
  external: ReadonlySet<string>,
  options: MdevTypesOptions = {},
): MdevTypesResult {
  const sysRoot = options.sysRoot ?? "/sys";
  const write = options.write ??
    ((path: string, value: string) => Deno.writeTextFileSync(path, value));
  const uuid = options.uuid ?? (() => crypto.randomUUID());
  const result: MdevTypesResult = { removed: [], created: [], errors: [] };
  const fail = (message: string, error: unknown) => {
    const text = `${message}: ${errorText(error)}`;
    result.errors.push(text);
    log.error(text);
  };
  const wanted = new Set(desired);
  const keep = new Set([...desired, ...external]);

  const configuredParents = new Set<string>();
  for (const mdev of existingMdevs(sysRoot)) {
    const kept = (mdev.typeName !== undefined && keep.has(mdev.typeName)) ||
      mdev.typeId === undefined || keep.has(mdev.typeId);
    if (kept) {
      if (mdev.parent) configuredParents.add(mdev.parent);
      continue;
    }
    try {
      write(join(mdev.path, "remove"), "1");
      result.removed.push(mdev.uuid);
      log.info("Removed mediated device {uuid} of type {type}", {
        uuid: mdev.uuid,
        type: mdev.typeName ?? mdev.typeId,
      });
    } catch (error) {
      fail(`Cannot remove mediated device ${mdev.uuid}`, error);
      if (mdev.parent) configuredParents.add(mdev.parent);
    }
  }
  if (wanted.size === 0) return result;

  // Per wanted type ID, the unconfigured parents that offer it.
  const bus = join(sysRoot, "class/mdev_bus");
  const offers = new Map<string, string[]>();
  for (const parent of sortedEntries(bus)) {
    if (configuredParents.has(parent.name)) continue;
    const types = join(bus, parent.name, "mdev_supported_types");
    for (const type of sortedEntries(types)) {
      const name = normalizedName(readText(join(types, type.name, "name")));
      if (!wanted.has(type.name) && (name === undefined || !wanted.has(name))) continue;
      offers.set(type.name, [...(offers.get(type.name) ?? []), parent.name]);
    }
  }
  // Round robin over the types, one parent each per round: a parent takes one type only.
  const taken = new Set<string>();
  while (offers.size > 0) {
    for (const [type, parents] of [...offers]) {
      const parent = parents.find((p) => !taken.has(p));
      if (parent === undefined) {
        offers.delete(type);
        continue;
      }
      taken.add(parent);
      offers.set(type, parents.filter((p) => p !== parent));
      const dir = join(bus, parent, "mdev_supported_types", type);
      const instances = Number(readText(join(dir, "available_instances"))?.trim());
      if (!Number.isInteger(instances) || instances < 0) {
        fail(
          `Cannot create mediated devices of type ${type} on ${parent}`,
          "no available_instances",
        );
        continue;
      }
      const uuids: string[] = [];
      try {
        for (let i = 0; i < instances; i++) {
          const id = uuid();
          write(join(dir, "create"), id);
          uuids.push(id);
        }
      } catch (error) {
        fail(`Cannot create mediated devices of type ${type} on ${parent}`, error);
      }
      if (uuids.length > 0) {
        result.created.push({ type, parent, uuids });
        log.info("Created {count} mediated devices of type {type} on {parent}", {
          count: uuids.length,
          type,
          parent,
        });
      }
    }
  }
  return result;
}

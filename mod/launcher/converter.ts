/**
 * VMI -> libvirt domain XML. Three steps, usable separately:
 * {@linkcode validateVmi} (allow-list walk, pure), {@linkcode prepareVolumes} (creates
 * disk files, I/O) and {@linkcode generateDomainXml} (pure). Most callers want
 * {@linkcode convertVmiToDomainXml}, which runs all three.
 *
 * @module
 */

import { checkVmiSemantics, generateDomainXml } from "./converter_xml.ts";
import type { DomainClusterOptions, PreparedEfi, PreparedVolume } from "./converter_xml.ts";
import { prepareVolumes } from "./converter_volumes.ts";
import type { PrepareOptions } from "./converter_volumes.ts";
import { validateVmi } from "./converter_validate.ts";
import type { PreparedInterface } from "../network/mod.ts";
import type { HostNumaCell } from "./converter_cpu_tune.ts";

export {
  ConversionError,
  InvalidFieldError,
  UnsupportedFieldError,
  VolumePreparationError,
} from "./converter_errors.ts";
export { validateVmi, vmiKeyOf } from "./converter_validate.ts";
export {
  checkVmiSemantics,
  cpuTopology,
  deviceName,
  domainClusterOptions,
  domainNameForVmi,
  generateDomainXml,
  guestMemoryBytes,
  hotplugDiskXml,
  maxCpuSockets,
  pinnedForTarget,
  virtioMemDevice,
} from "./converter_xml.ts";
export type {
  DomainClusterOptions,
  DomainXmlOptions,
  PreparedEfi,
  PreparedVolume,
} from "./converter_xml.ts";
export {
  containerDiskFileName,
  DEFAULT_OVMF_DIR,
  prepareVolume,
  prepareVolumes,
} from "./converter_volumes.ts";
export type { PreparedVolumes, PrepareOptions } from "./converter_volumes.ts";

/** Options of {@linkcode convertVmiToDomainXml}. */
export interface ConvertOptions extends PrepareOptions {
  /** `kvm` when /dev/kvm is usable, `qemu` for software emulation. */
  domainType: "kvm" | "qemu";
  /** The VMI's private run directory, e.g. `/var/run/kubevirt-private/<uid>`. */
  runDir: string;
  /** What the launcher found of each pod-network interface (`prepareGuestNetwork`). */
  interfaces?: Record<string, PreparedInterface>;
  /** The cluster's settings the handler sent with the sync. */
  cluster?: DomainClusterOptions;
  /** The host CPUs a VMI with dedicated CPUs was given (see `DomainXmlOptions`). */
  dedicatedCpus?: readonly number[];
  /** The host's NUMA nodes, for NUMA passthrough. */
  hostNumaCells?: readonly HostNumaCell[];
}

/** The result of a conversion. */
export interface ConversionResult {
  /** The libvirt domain XML. */
  xml: string;
  /** Backing file of each volume, keyed by volume name. */
  volumes: Record<string, PreparedVolume>;
  /** EFI firmware files, when used. */
  efi?: PreparedEfi;
  /** Files this conversion created (to remove when the VMI goes away). */
  created: string[];
}

/**
 * Validates `vmi` (any JSON value), prepares its volumes and returns the domain XML.
 * Throws {@linkcode UnsupportedFieldError} for a field virtnode does not support,
 * {@linkcode InvalidFieldError} for a malformed or unsafe value, and
 * {@linkcode VolumePreparationError} when a disk file cannot be made. Nothing is
 * created on disk for a VMI that fails validation.
 */
export async function convertVmiToDomainXml(
  vmi: unknown,
  options: ConvertOptions,
): Promise<ConversionResult> {
  const valid = validateVmi(vmi);
  checkVmiSemantics(valid, options);
  const prepared = await prepareVolumes(valid, options);
  const xml = generateDomainXml(valid, {
    domainType: options.domainType,
    runDir: options.runDir,
    volumes: prepared.volumes,
    efi: prepared.efi,
    interfaces: options.interfaces,
    cluster: options.cluster,
    dedicatedCpus: options.dedicatedCpus,
    hostNumaCells: options.hostNumaCells,
  });
  return { xml, volumes: prepared.volumes, efi: prepared.efi, created: prepared.created };
}

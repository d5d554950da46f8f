/**
 * Pure readers of libvirt's capability documents, for the node labeller: host
 * capabilities (`virConnectGetCapabilities`), domain capabilities
 * (`virConnectGetDomainCapabilities`) and a baseline CPU
 * (`virConnectBaselineHypervisorCPU`). They take XML text and return plain data, so
 * golden tests run on fixtures without libvirt.
 *
 * @module
 */

import { child, children, parseXml, path, type XmlElement, XmlParseError } from "../xml/mod.ts";

/** A CPU model of the domain capabilities' `custom` mode. */
export interface CpuModelInfo {
  /** Model name, e.g. "Skylake-Server-IBRS". */
  name: string;
  /** libvirt's `usable` attribute: "yes", "no" or "unknown". */
  usable: string;
  /** The model's vendor as libvirt reports it, when it does. */
  vendor?: string;
}

/** The `host-model` CPU mode of the domain capabilities. */
export interface HostModelInfo {
  /** Model name, e.g. "EPYC-Rome". */
  name: string;
  /** CPU vendor, e.g. "Intel", "AMD"; empty when not reported. */
  vendor: string;
  /** The model's `fallback` attribute. */
  fallback: string;
  /** Features with `policy='require'`, in document order. */
  requiredFeatures: string[];
  /** Features with `policy='disable'`, in document order. */
  disabledFeatures: string[];
}

/** What the labeller reads from the domain capabilities. */
export interface DomainCapabilitiesInfo {
  /** `<arch>`, e.g. "x86_64". */
  arch: string;
  /** `<domain>`, e.g. "kvm" or "qemu". */
  domain: string;
  /** `<machine>`, the canonical machine type queried. */
  machine: string;
  /** The host-model CPU when that mode is supported and names a model. */
  hostModel?: HostModelInfo;
  /** Models of the `custom` mode, each with its usability. */
  customModels: CpuModelInfo[];
  /** `<features><sev supported='yes'>`. */
  sev: boolean;
  /** SEV-ES: SEV supported and `maxESGuests` above 0. */
  sevEs: boolean;
  /** SEV-SNP: SEV-ES and `launchSecurity` lists the `sev-snp` sectype. */
  sevSnp: boolean;
  /** `<features><tdx supported='yes'>`. */
  tdx: boolean;
  /** `<features><s390-pv supported='yes'>` (IBM Secure Execution). */
  secureExecution: boolean;
}

/** The host CPU's time stamp counter. */
export interface TscCounter {
  /** Frequency in Hz. */
  frequency: number;
  /** Whether the guest TSC frequency can be scaled (`scaling='yes'`). */
  scalable: boolean;
}

/** What the labeller reads from the host capabilities. */
export interface HostCapabilitiesInfo {
  /** Host CPU architecture, e.g. "x86_64". */
  arch: string;
  /** Host CPU vendor, when reported. */
  vendor?: string;
  /** The TSC counter, when libvirt reports `<counter name='tsc'>`. */
  tsc?: TscCounter;
  /** Machine type names of every guest architecture, without duplicates. */
  machines: string[];
  /** Those of {@linkcode HostCapabilitiesInfo.machines} QEMU calls deprecated (`deprecated='yes'`). */
  deprecatedMachines: string[];
}

/** A capability document could not be read. */
export class CapabilitiesError extends Error {
  /** Creates the error; `cause` is the parse failure when there is one. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "CapabilitiesError";
  }
}

function parseRoot(xml: string, expected: string, what: string): XmlElement {
  let root: XmlElement;
  try {
    root = parseXml(xml);
  } catch (error) {
    const detail = error instanceof XmlParseError ? error.message : String(error);
    throw new CapabilitiesError(`Cannot read ${what}: ${detail}`, { cause: error });
  }
  if (root.name !== expected) {
    throw new CapabilitiesError(
      `Cannot read ${what}: root element is "${root.name}", expected "${expected}"`,
    );
  }
  return root;
}

function supported(element: XmlElement | undefined): boolean {
  return element?.attrs.supported === "yes";
}

/** Reads the domain capabilities XML. */
export function parseDomainCapabilities(xml: string): DomainCapabilitiesInfo {
  const root = parseRoot(xml, "domainCapabilities", "domain capabilities");
  let hostModel: HostModelInfo | undefined;
  const customModels: CpuModelInfo[] = [];
  for (const mode of children(child(root, "cpu"), "mode")) {
    if (mode.attrs.name === "host-model" && supported(mode)) {
      const model = child(mode, "model");
      const name = model?.text.trim() ?? "";
      if (name !== "") {
        const features = children(mode, "feature");
        hostModel = {
          name,
          vendor: child(mode, "vendor")?.text.trim() ?? "",
          fallback: model?.attrs.fallback ?? "",
          requiredFeatures: features.filter((f) => f.attrs.policy === "require")
            .map((f) => f.attrs.name).filter(Boolean),
          disabledFeatures: features.filter((f) => f.attrs.policy === "disable")
            .map((f) => f.attrs.name).filter(Boolean),
        };
      }
    } else if (mode.attrs.name === "custom" && supported(mode)) {
      for (const model of children(mode, "model")) {
        const name = model.text.trim();
        if (name === "" || model.attrs.usable === undefined) continue;
        customModels.push({
          name,
          usable: model.attrs.usable,
          ...(model.attrs.vendor ? { vendor: model.attrs.vendor } : {}),
        });
      }
    }
  }
  const features = child(root, "features");
  const sevElement = child(features, "sev");
  const sev = supported(sevElement);
  const maxEsGuests = Number(child(sevElement, "maxESGuests")?.text.trim() ?? "0");
  const sevEs = sev && Number.isFinite(maxEsGuests) && maxEsGuests > 0;
  const launchSecurity = child(features, "launchSecurity");
  const secTypes = children(launchSecurity, "enum")
    .filter((e) => e.attrs.name === "sectype")
    .flatMap((e) => children(e, "value").map((v) => v.text.trim()));
  return {
    arch: child(root, "arch")?.text.trim() ?? "",
    domain: child(root, "domain")?.text.trim() ?? "",
    machine: child(root, "machine")?.text.trim() ?? "",
    hostModel,
    customModels,
    sev,
    sevEs,
    sevSnp: sevEs && supported(launchSecurity) && secTypes.includes("sev-snp"),
    tdx: supported(child(features, "tdx")),
    secureExecution: supported(child(features, "s390-pv")),
  };
}

/** Reads the host capabilities XML. */
export function parseHostCapabilities(xml: string): HostCapabilitiesInfo {
  const root = parseRoot(xml, "capabilities", "host capabilities");
  const cpu = path(root, "host", "cpu");
  let tsc: TscCounter | undefined;
  for (const counter of children(cpu, "counter")) {
    if (counter.attrs.name !== "tsc") continue;
    const frequency = Number(counter.attrs.frequency);
    if (Number.isSafeInteger(frequency) && frequency > 0) {
      tsc = { frequency, scalable: counter.attrs.scaling === "yes" };
    }
  }
  const machines = new Set<string>();
  const deprecatedMachines = new Set<string>();
  for (const guest of children(root, "guest")) {
    for (const machine of children(child(guest, "arch"), "machine")) {
      const name = machine.text.trim();
      if (name === "") continue;
      machines.add(name);
      if (machine.attrs.deprecated === "yes") deprecatedMachines.add(name);
    }
  }
  const vendor = child(cpu, "vendor")?.text.trim();
  return {
    arch: child(cpu, "arch")?.text.trim() ?? "",
    ...(vendor ? { vendor } : {}),
    ...(tsc ? { tsc } : {}),
    machines: [...machines],
    deprecatedMachines: [...deprecatedMachines],
  };
}

/**
 * Features a `<cpu>` document requires (`policy='require'`, or no policy as in host
 * capabilities): what `virConnectBaselineHypervisorCPU` with expanded features returns.
 */
export function parseCpuFeatures(xml: string): string[] {
  const root = parseRoot(xml, "cpu", "CPU definition");
  return children(root, "feature")
    .filter((f) => (f.attrs.policy ?? "require") === "require")
    .map((f) => f.attrs.name)
    .filter(Boolean);
}

function escapeAttr(value: string): string {
  return value.replaceAll("&", "&amp;").replaceAll("<", "&lt;").replaceAll(">", "&gt;")
    .replaceAll("'", "&apos;").replaceAll('"', "&quot;");
}

/**
 * The host-model CPU as a `<cpu>` definition for `virConnectBaselineHypervisorCPU`,
 * the way `virsh hypervisor-cpu-baseline` reads it out of domain capabilities.
 */
export function hostModelCpuXml(hostModel: HostModelInfo): string {
  const lines = [
    "<cpu mode='custom' match='exact'>",
    `  <model fallback='${escapeAttr(hostModel.fallback || "forbid")}'>${
      escapeAttr(hostModel.name)
    }</model>`,
  ];
  if (hostModel.vendor) lines.push(`  <vendor>${escapeAttr(hostModel.vendor)}</vendor>`);
  for (const name of hostModel.requiredFeatures) {
    lines.push(`  <feature policy='require' name='${escapeAttr(name)}'/>`);
  }
  for (const name of hostModel.disabledFeatures) {
    lines.push(`  <feature policy='disable' name='${escapeAttr(name)}'/>`);
  }
  lines.push("</cpu>");
  return lines.join("\n");
}

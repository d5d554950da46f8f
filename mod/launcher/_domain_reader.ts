/**
 * Reads the parts of a libvirt domain XML that the handler needs into a
 * {@linkcode Domain} of `mod/domain`. The input is XML that libvirt itself produced
 * (`virDomainGetXMLDesc`), so a small reader suffices: elements, attributes, text,
 * comments and the XML declaration; no DTDs. Private to `mod/launcher`.
 *
 * @module
 */

import {
  type Domain,
  type DomainChannel,
  type DomainDisk,
  type DomainInterface,
  type DomainMemory,
  type DomainState,
  newDomain,
} from "../domain/mod.ts";
import { parseXml as parseXmlDocument, type XmlElement, XmlParseError } from "../xml/mod.ts";

/** One parsed element (the shared XML reader's element). */
export type XmlNode = XmlElement;

/** The XML could not be read. */
export class DomainXmlReadError extends Error {
  /** Creates the error with a detail message. */
  constructor(detail: string, options?: ErrorOptions) {
    super(`Cannot read domain XML: ${detail}`, options);
    this.name = "DomainXmlReadError";
  }
}

/** Parses XML into its root element; throws {@linkcode DomainXmlReadError}. */
export function parseXml(xml: string): XmlNode {
  try {
    return parseXmlDocument(xml);
  } catch (error) {
    if (error instanceof XmlParseError) {
      throw new DomainXmlReadError(error.message, { cause: error });
    }
    throw error;
  }
}

function child(node: XmlNode | undefined, name: string): XmlNode | undefined {
  return node?.children.find((c) => c.name === name || c.name.endsWith(`:${name}`));
}

function children(node: XmlNode | undefined, name: string): XmlNode[] {
  return node?.children.filter((c) => c.name === name) ?? [];
}

function text(node: XmlNode | undefined): string | undefined {
  const value = node?.text.trim();
  return value === undefined || value === "" ? undefined : value;
}

function alias(node: XmlNode): { name: string; userDefined: boolean } | undefined {
  const name = child(node, "alias")?.attrs.name;
  if (!name) return undefined;
  return name.startsWith("ua-")
    ? { name: name.slice(3), userDefined: true }
    : { name, userDefined: false };
}

/** `<memory>` or `<currentMemory>`; libvirt's unit is KiB when none is written. */
function memory(node: XmlNode | undefined): DomainMemory | undefined {
  if (!node) return undefined;
  const amount = text(node) ?? "";
  if (!/^\d+$/.test(amount) || !Number.isSafeInteger(Number(amount))) {
    throw new DomainXmlReadError(`<${node.name}> has value "${amount}"`);
  }
  return { value: Number(amount), unit: node.attrs.unit ?? "KiB" };
}

function channel(node: XmlNode): DomainChannel {
  const target = child(node, "target");
  const result: DomainChannel = { type: node.attrs.type ?? "" };
  if (target) {
    result.target = { type: target.attrs.type ?? "" };
    if (target.attrs.name) result.target.name = target.attrs.name;
    if (target.attrs.state) result.target.state = target.attrs.state;
  }
  return result;
}

/** The VMI a launcher serves: namespace, name and UID. */
export interface VmiRef {
  /** The VMI's namespace. */
  namespace: string;
  /** The VMI's name. */
  name: string;
  /** The VMI's UID, when known. */
  uid?: string;
}

/**
 * The VMI UID in a domain XML's KubeVirt metadata; undefined when it has none (the domain
 * is no KubeVirt VMI's). Throws {@linkcode DomainXmlReadError} when the XML cannot be read.
 */
export function vmiUidOfDomainXml(xml: string): string | undefined {
  const kubevirt = child(child(parseXml(xml), "metadata"), "kubevirt");
  return text(child(kubevirt, "uid"));
}

/**
 * The domain as the handler sees it: spec parts read from `xml`, status from `state`.
 * Throws {@linkcode DomainXmlReadError} when the XML cannot be read.
 */
export function domainFromXml(ref: VmiRef, xml: string, state: DomainState): Domain {
  const root = parseXml(xml);
  if (root.name !== "domain") throw new DomainXmlReadError(`root element is "${root.name}"`);
  const domain = newDomain(ref, state);
  const spec = domain.spec;
  spec.type = root.attrs.type;
  spec.name = text(child(root, "name")) ?? spec.name;
  spec.uuid = text(child(root, "uuid"));
  const kubevirt = child(child(root, "metadata"), "kubevirt");
  const uid = text(child(kubevirt, "uid"));
  if (uid) {
    spec.metadata.kubevirt.uid = uid;
    domain.metadata.uid = uid;
  }
  const grace = child(kubevirt, "graceperiod");
  if (grace) {
    const seconds = Number(text(child(grace, "deletionGracePeriodSeconds")) ?? "0");
    spec.metadata.kubevirt.gracePeriod = {
      deletionGracePeriodSeconds: Number.isFinite(seconds) ? seconds : 0,
      deletionTimestamp: text(child(grace, "deletionTimestamp")),
      markedForGracefulShutdown: text(child(grace, "markedForGracefulShutdown")) === "true"
        ? true
        : undefined,
    };
  }
  const features = child(root, "features");
  if (features) spec.features = { acpi: child(features, "acpi") !== undefined };
  const machine = child(child(root, "os"), "type")?.attrs.machine;
  if (machine) spec.os = { machine };
  const bootMemory = memory(child(root, "memory"));
  if (bootMemory) spec.memory = bootMemory;
  const currentMemory = memory(child(root, "currentMemory"));
  if (currentMemory) spec.currentMemory = currentMemory;
  const devices = child(root, "devices");
  spec.devices.disks = children(devices, "disk").map((disk): DomainDisk => {
    const source = child(disk, "source");
    const target = child(disk, "target");
    return {
      device: disk.attrs.device ?? "disk",
      type: disk.attrs.type ?? "",
      source: { file: source?.attrs.file, dev: source?.attrs.dev },
      target: { bus: target?.attrs.bus, dev: target?.attrs.dev },
      alias: alias(disk),
    };
  });
  spec.devices.interfaces = children(devices, "interface").map((nic): DomainInterface => ({
    type: nic.attrs.type ?? "",
    mac: child(nic, "mac")?.attrs.address,
    model: child(nic, "model")?.attrs.type,
    alias: alias(nic),
  }));
  spec.devices.channels = children(devices, "channel").map(channel);
  return domain;
}

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
  type DomainDisk,
  type DomainInterface,
  type DomainState,
  newDomain,
} from "../domain/mod.ts";

/** One parsed element. */
export interface XmlNode {
  name: string;
  attrs: Record<string, string>;
  children: XmlNode[];
  text: string;
}

/** The XML could not be read. */
export class DomainXmlReadError extends Error {
  /** Creates the error with a detail message. */
  constructor(detail: string, options?: ErrorOptions) {
    super(`Cannot read domain XML: ${detail}`, options);
    this.name = "DomainXmlReadError";
  }
}

const ENTITIES: Record<string, string> = {
  lt: "<",
  gt: ">",
  amp: "&",
  quot: '"',
  apos: "'",
};

function decode(text: string): string {
  return text.replace(/&(#x[0-9a-fA-F]+|#[0-9]+|[a-z]+);/g, (whole, entity: string) => {
    if (entity.startsWith("#x")) return String.fromCodePoint(parseInt(entity.slice(2), 16));
    if (entity.startsWith("#")) return String.fromCodePoint(parseInt(entity.slice(1), 10));
    return ENTITIES[entity] ?? whole;
  });
}

const TAG = /<(\/?)([A-Za-z_][\w.:-]*)((?:\s+[\w.:-]+\s*=\s*(?:"[^"]*"|'[^']*'))*)\s*(\/?)>/y;
const ATTR = /([\w.:-]+)\s*=\s*(?:"([^"]*)"|'([^']*)')/g;

/** Parses XML into its root element; throws {@linkcode DomainXmlReadError}. */
export function parseXml(xml: string): XmlNode {
  const root: XmlNode = { name: "#document", attrs: {}, children: [], text: "" };
  const stack: XmlNode[] = [root];
  let i = 0;
  while (i < xml.length) {
    const lt = xml.indexOf("<", i);
    const top = stack[stack.length - 1];
    if (lt < 0) {
      top.text += decode(xml.slice(i));
      break;
    }
    if (lt > i) top.text += decode(xml.slice(i, lt));
    if (xml.startsWith("<!--", lt)) {
      const end = xml.indexOf("-->", lt);
      if (end < 0) throw new DomainXmlReadError("unterminated comment");
      i = end + 3;
      continue;
    }
    if (xml.startsWith("<?", lt)) {
      const end = xml.indexOf("?>", lt);
      if (end < 0) throw new DomainXmlReadError("unterminated processing instruction");
      i = end + 2;
      continue;
    }
    TAG.lastIndex = lt;
    const m = TAG.exec(xml);
    if (!m) throw new DomainXmlReadError(`malformed tag at offset ${lt}`);
    i = TAG.lastIndex;
    const [, closing, name, attrText, selfClosing] = m;
    if (closing) {
      const open = stack.pop();
      if (!open || open.name !== name || stack.length === 0) {
        throw new DomainXmlReadError(`unexpected closing tag "${name}"`);
      }
      continue;
    }
    const attrs: Record<string, string> = {};
    for (const a of attrText.matchAll(ATTR)) attrs[a[1]] = decode(a[2] ?? a[3] ?? "");
    const node: XmlNode = { name, attrs, children: [], text: "" };
    top.children.push(node);
    if (!selfClosing) stack.push(node);
  }
  if (stack.length !== 1) throw new DomainXmlReadError(`unclosed element "${stack.at(-1)?.name}"`);
  const first = root.children[0];
  if (!first) throw new DomainXmlReadError("no root element");
  return first;
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

/** The VMI a launcher serves: namespace, name and UID. */
export interface VmiRef {
  namespace: string;
  name: string;
  uid?: string;
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
  return domain;
}

/**
 * A small XML element tree and serializer for libvirt domain XML. Every attribute value
 * and text node is escaped here; callers never build XML by string concatenation.
 *
 * @module
 */

/** An XML element: name, attributes (undefined values are left out), children. */
export interface XmlElement {
  name: string;
  attrs: Record<string, string | number | undefined>;
  children: XmlNode[];
}

/** An element or a text node. */
export type XmlNode = XmlElement | string;

/** Builds an element; `undefined`/`false` children are skipped, arrays flattened. */
export function el(
  name: string,
  attrs: Record<string, string | number | undefined> = {},
  ...children: (XmlNode | XmlNode[] | undefined | false)[]
): XmlElement {
  const kept: XmlNode[] = [];
  for (const child of children) {
    if (child === undefined || child === false) continue;
    if (Array.isArray(child)) kept.push(...child);
    else kept.push(child);
  }
  return { name, attrs, children: kept };
}

const TEXT_ESCAPES: Record<string, string> = {
  "&": "&amp;",
  "<": "&lt;",
  ">": "&gt;",
  '"': "&quot;",
  "'": "&apos;",
};

// Characters XML 1.0 does not allow at all, even escaped.
// deno-lint-ignore no-control-regex
const INVALID_XML_CHARS = /[\u0000-\u0008\u000B\u000C\u000E-\u001F\uFFFE\uFFFF]/;

/** Thrown when a value cannot be represented in XML 1.0. */
export class XmlValueError extends Error {
  /** Creates the error for `value`. */
  constructor(value: string) {
    super(`Cannot write XML: value ${JSON.stringify(value)} has a control character`);
    this.name = "XmlValueError";
  }
}

/** Escapes text for use in element content or a quoted attribute. */
export function escapeXml(value: string): string {
  if (INVALID_XML_CHARS.test(value)) throw new XmlValueError(value);
  return value.replace(/[&<>"']/g, (ch) => TEXT_ESCAPES[ch]);
}

/** Serializes an element with two-space indentation and a trailing newline. */
export function renderXml(root: XmlElement): string {
  const lines: string[] = [];
  render(root, 0, lines);
  return lines.join("\n") + "\n";
}

function render(node: XmlElement, depth: number, lines: string[]): void {
  const pad = "  ".repeat(depth);
  let open = `<${node.name}`;
  for (const [key, value] of Object.entries(node.attrs)) {
    if (value === undefined) continue;
    open += ` ${key}='${escapeXml(String(value))}'`;
  }
  if (node.children.length === 0) {
    lines.push(`${pad}${open}/>`);
    return;
  }
  if (node.children.every((child) => typeof child === "string")) {
    const text = (node.children as string[]).map(escapeXml).join("");
    lines.push(`${pad}${open}>${text}</${node.name}>`);
    return;
  }
  lines.push(`${pad}${open}>`);
  for (const child of node.children) {
    if (typeof child === "string") lines.push(`${pad}  ${escapeXml(child)}`);
    else render(child, depth + 1, lines);
  }
  lines.push(`${pad}</${node.name}>`);
}

/**
 * The XML reader and its path helpers; the folder's face is `mod.ts`.
 *
 * @module
 */

/** An element of a parsed document. */
export interface XmlElement {
  /** Tag name. */
  name: string;
  /** Attributes, entity references decoded. */
  attrs: Record<string, string>;
  /** Child elements in document order. */
  children: XmlElement[];
  /** The element's own text (child elements' text excluded), decoded, untrimmed. */
  text: string;
}

/** The document is not well-formed in a way this reader notices. */
export class XmlParseError extends Error {
  /** Offset into the input where the problem was found. */
  readonly offset: number;
  /** Creates the error at `offset`. */
  constructor(detail: string, offset: number) {
    super(`Cannot parse XML at offset ${offset}: ${detail}`);
    this.name = "XmlParseError";
    this.offset = offset;
  }
}

const ENTITIES: Record<string, string> = {
  amp: "&",
  lt: "<",
  gt: ">",
  quot: '"',
  apos: "'",
};

function decode(raw: string, offset: number): string {
  return raw.replace(/&(#x[0-9a-fA-F]+|#[0-9]+|[a-zA-Z]+);/g, (_m, ref: string) => {
    if (ref.startsWith("#x")) return String.fromCodePoint(parseInt(ref.slice(2), 16));
    if (ref.startsWith("#")) return String.fromCodePoint(parseInt(ref.slice(1), 10));
    const value = ENTITIES[ref];
    if (value === undefined) throw new XmlParseError(`unknown entity "&${ref};"`, offset);
    return value;
  });
}

const NAME = /[A-Za-z_:][-A-Za-z0-9_.:]*/y;
const ATTR = /\s*([A-Za-z_:][-A-Za-z0-9_.:]*)\s*=\s*(?:"([^"]*)"|'([^']*)')/y;

/** Parses a document and returns its root element. */
export function parseXml(xml: string): XmlElement {
  const stack: XmlElement[] = [];
  let root: XmlElement | undefined;
  let i = 0;
  while (i < xml.length) {
    const lt = xml.indexOf("<", i);
    const textEnd = lt === -1 ? xml.length : lt;
    if (textEnd > i) {
      const text = xml.slice(i, textEnd);
      const top = stack[stack.length - 1];
      if (top) top.text += decode(text, i);
      else if (text.trim() !== "") throw new XmlParseError("text outside the root element", i);
    }
    if (lt === -1) break;
    i = lt;
    if (xml.startsWith("<!--", i)) {
      const end = xml.indexOf("-->", i + 4);
      if (end === -1) throw new XmlParseError("unterminated comment", i);
      i = end + 3;
    } else if (xml.startsWith("<![CDATA[", i)) {
      const end = xml.indexOf("]]>", i + 9);
      if (end === -1) throw new XmlParseError("unterminated CDATA section", i);
      const top = stack[stack.length - 1];
      if (top) top.text += xml.slice(i + 9, end);
      i = end + 3;
    } else if (xml.startsWith("<?", i)) {
      const end = xml.indexOf("?>", i + 2);
      if (end === -1) throw new XmlParseError("unterminated processing instruction", i);
      i = end + 2;
    } else if (xml.startsWith("<!", i)) {
      const end = xml.indexOf(">", i + 2);
      if (end === -1) throw new XmlParseError("unterminated declaration", i);
      i = end + 1;
    } else if (xml.startsWith("</", i)) {
      NAME.lastIndex = i + 2;
      const m = NAME.exec(xml);
      if (!m) throw new XmlParseError("bad closing tag", i);
      const end = xml.indexOf(">", NAME.lastIndex);
      if (end === -1) throw new XmlParseError("unterminated closing tag", i);
      const open = stack.pop();
      if (!open || open.name !== m[0]) {
        throw new XmlParseError(`closing tag "${m[0]}" does not match "${open?.name}"`, i);
      }
      i = end + 1;
    } else {
      NAME.lastIndex = i + 1;
      const m = NAME.exec(xml);
      if (!m) throw new XmlParseError("bad tag name", i);
      const element: XmlElement = { name: m[0], attrs: {}, children: [], text: "" };
      let j = NAME.lastIndex;
      for (;;) {
        ATTR.lastIndex = j;
        const a = ATTR.exec(xml);
        if (!a) break;
        element.attrs[a[1]] = decode(a[2] ?? a[3], j);
        j = ATTR.lastIndex;
      }
      while (j < xml.length && /\s/.test(xml[j])) j++;
      const selfClosing = xml.startsWith("/>", j);
      if (!selfClosing && xml[j] !== ">") throw new XmlParseError(`bad tag "${m[0]}"`, j);
      const parent = stack[stack.length - 1];
      if (parent) parent.children.push(element);
      else if (root) throw new XmlParseError("more than one root element", i);
      else root = element;
      if (!selfClosing) stack.push(element);
      i = j + (selfClosing ? 2 : 1);
    }
  }
  if (stack.length > 0) {
    throw new XmlParseError(`element "${stack[stack.length - 1].name}" is not closed`, xml.length);
  }
  if (!root) throw new XmlParseError("no root element", 0);
  return root;
}

/** The first child element named `name`. */
export function child(element: XmlElement | undefined, name: string): XmlElement | undefined {
  return element?.children.find((c) => c.name === name);
}

/** All child elements named `name`. */
export function children(element: XmlElement | undefined, name: string): XmlElement[] {
  return element?.children.filter((c) => c.name === name) ?? [];
}

/** Follows a path of child names, first match at each step. */
export function path(element: XmlElement | undefined, ...names: string[]): XmlElement | undefined {
  let current = element;
  for (const name of names) current = child(current, name);
  return current;
}

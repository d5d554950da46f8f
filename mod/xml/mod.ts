/**
 * A small, strict-enough XML reader for the documents libvirt hands back (capabilities,
 * domain capabilities, domain XML): elements, attributes and text; comments, processing
 * instructions and CDATA are handled; DTDs are not needed and not supported, and
 * namespace prefixes stay part of element names. Shared by the labeller and the launcher.
 *
 * @module
 */

export { child, children, parseXml, path, type XmlElement, XmlParseError } from "./xml.ts";

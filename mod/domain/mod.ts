/**
 * The domain status model shared by launcher and handler: KubeVirt's lifecycle and
 * reason names, libvirt state mapping, the Domain object and its wire JSON, and the
 * VMI phase a domain implies.
 *
 * @module
 */

export * from "./status.ts";
export * from "./domain.ts";
export * from "./phase.ts";
export * from "./cpu_list.ts";

/**
 * Live migration between two handlers: the TLS migration proxy.
 *
 * @module
 */
export * from "./proxy.ts";

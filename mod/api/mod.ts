/**
 * KubeVirt's `kubevirt.io/v1` API as virtnode uses it: VirtualMachineInstance types,
 * phases, conditions, label and annotation keys, default paths, and quantities.
 *
 * @module
 */

export * from "./types.ts";
export * from "./constants.ts";
export * from "./quantity.ts";
export * from "./keys.ts";
export * from "./time.ts";
export * from "./access_credentials.ts";

/**
 * Facts of this host that decide how guests run: whether KVM can run them.
 *
 * @module
 */

export { kvmUsable } from "./kvm.ts";

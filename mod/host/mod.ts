/**
 * Facts of this host that decide how guests run: whether KVM can run them, and SELinux.
 *
 * @module
 */

export { kvmUsable } from "./kvm.ts";
export { launcherSelinuxContext, selinuxEnabled } from "./selinux.ts";

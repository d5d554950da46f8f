/**
 * Facts of this host that decide how guests run: whether KVM can run them, and SELinux;
 * and access for QEMU's user by ACL entries.
 *
 * @module
 */

export { kvmUsable } from "./kvm.ts";
export { launcherSelinuxContext, selinuxEnabled } from "./selinux.ts";
export {
  type AclEntry,
  decodeAcl,
  encodeAcl,
  grantUserAccess,
  modeAllows,
  withUserAccess,
} from "./acl.ts";

/**
 * SELinux on the node, as KubeVirt's handler reports it in `status.selinuxContext`: the
 * label of the launcher's root where SELinux is enabled, `none` where it is not.
 * virt-controller gives a VMI's hotplug attachment pods that label's level, and makes
 * none while the field is empty.
 *
 * @module
 */
import { getXattr } from "../../ffi/mod.ts";

let enabled: boolean | undefined;

/** Whether SELinux is enabled on this node (its file system is mounted). */
export function selinuxEnabled(): boolean {
  if (enabled === undefined) {
    try {
      Deno.statSync("/sys/fs/selinux/enforce");
      enabled = true;
    } catch {
      enabled = false;
    }
  }
  return enabled;
}

/**
 * `status.selinuxContext` for a launcher whose root is `root` (`/proc/<pid>/root`): its
 * `security.selinux` label, or `none` without SELinux.
 */
export function launcherSelinuxContext(root: string | undefined): string | undefined {
  if (!selinuxEnabled()) return "none";
  if (root === undefined) return undefined;
  // The root directory itself, not the /proc magic link that names it.
  return getXattr(`${root}/.`, "security.selinux");
}

/**
 * Device ownership for non-root launchers. A launcher pod whose VMI runs as a non-root
 * user (`status.runtimeUser`, 107 by default in KubeVirt) gets its devices from the device
 * plugins with the host's owner and mode (`/dev/kvm` is often root's alone): QEMU, running
 * as that user, could not open them. Before the domain is defined the handler hands each
 * device the pod has to the runtime user, inside the pod's root, as KubeVirt's handler
 * does; the host's own device nodes are untouched.
 *
 * @module
 */
import { chownBeneath, ErrnoError } from "../../../ffi/mod.ts";

/** The device nodes a launcher's QEMU opens, relative to the launcher's root. */
export const LAUNCHER_DEVICES: readonly string[] = Object.freeze([
  "dev/kvm",
  "dev/net/tun",
  "dev/vhost-net",
]);

/**
 * Gives `user` the devices of {@linkcode LAUNCHER_DEVICES} present in `root` (a launcher's
 * `/proc/<pid>/root`), resolved beneath that root without following any symlink; returns
 * those it changed. A device the pod lacks is skipped, except `/dev/kvm` while the cluster
 * does not allow emulation (`options.emulation` false): then, as in virt-handler, the
 * launcher's set-up fails.
 */
export function claimLauncherDevices(
  root: string,
  user: number,
  options: { emulation: boolean } = { emulation: true },
): string[] {
  const claimed: string[] = [];
  for (const device of LAUNCHER_DEVICES) {
    try {
      chownBeneath(root, device, user, user);
      claimed.push(`/${device}`);
    } catch (error) {
      if (error instanceof ErrnoError && error.code === "ENOENT") {
        if (device === "dev/kvm" && !options.emulation) {
          throw new Error(
            "failed to set up file ownership for /dev/kvm: the launcher has no /dev/kvm and the KubeVirt CR does not allow emulation (developerConfiguration.useEmulation)",
            { cause: error },
          );
        }
        continue;
      }
      throw new Error(
        `Cannot give /${device} of the launcher to user ${user}: ${(error as Error).message}`,
        { cause: error },
      );
    }
  }
  return claimed;
}

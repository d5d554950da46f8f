/**
 * KubeVirt's `virtctl` and what it reaches a handler through (`virt-api`,
 * `kubevirt-install`), built from the same module version as KubeVirt's other programs
 * here (`build_virtctl.sh` beside this file; cached by content).
 *
 * @module
 */
import { runBuildScript } from "../cluster/cluster.ts";

/**
 * Runs `build_virtctl.sh` (a no-op when cached) and returns its directory: `virtctl`,
 * `virt-api` and `kubevirt-install`.
 */
export async function buildVirtctlKit(): Promise<string> {
  return await runBuildScript(
    new URL("./build_virtctl.sh", import.meta.url).pathname,
    "KubeVirt's virtctl and virt-api",
  );
}

/** Runs `build_virtctl.sh` (a no-op when cached) and returns the path of `virtctl`. */
export async function buildVirtctl(): Promise<string> {
  return `${await buildVirtctlKit()}/virtctl`;
}

/**
 * KubeVirt's `virtctl`, built from the same module version as the other KubeVirt peers
 * (`build_virtctl.sh` beside this file; cached by content).
 *
 * @module
 */
import { runBuildScript } from "../../../deploy/cluster/cluster.ts";

/** Runs `build_virtctl.sh` (a no-op when cached) and returns the path of `virtctl`. */
export async function buildVirtctl(): Promise<string> {
  const dir = await runBuildScript(
    new URL("./build_virtctl.sh", import.meta.url).pathname,
    "KubeVirt's virtctl",
  );
  return `${dir}/virtctl`;
}

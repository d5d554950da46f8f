/**
 * KubeVirt v1.7.0's own programs as the tests' peers (tests/harness/kubevirt/build_peers.sh,
 * cached by key): its launcher, handler, control plane and clients, beside local mode's
 * part (CRDs, admission, examples) from deploy/kubevirt/build.sh.
 *
 * @module
 */
import { runBuildScript } from "../../../deploy/cluster/cluster.ts";

const SCRIPT = new URL("./build_peers.sh", import.meta.url).pathname;

/**
 * Runs build_peers.sh (a no-op when its cache holds the result) and returns its directory:
 * `virt-launcher`, `virt-handler`, `virt-api`, `cmdclient-check`, `vhostmd-read` and the rest, with
 * `crds/`, `examples/` and `kubevirt-admission` beside them.
 */
export function buildKubevirtPeers(): Promise<string> {
  return runBuildScript(SCRIPT, "KubeVirt's test peers");
}

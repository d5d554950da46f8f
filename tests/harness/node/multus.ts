/**
 * Multus's thin plugin and the NetworkAttachmentDefinition CRD, built from the Go module
 * proxy by `build_multus.sh` (cached by key): the real test node chains its pod network
 * through the plugin, and a pod-less handler's cluster gets the CRD, as a cluster with Multus
 * has it.
 *
 * @module
 */
import { join } from "node:path";
import { kubectl } from "../../../deploy/cluster/cluster.ts";

const MULTUS_SCRIPT = new URL("./build_multus.sh", import.meta.url).pathname;

/**
 * Runs build_multus.sh (a no-op when cached) and returns its output directory: `multus`
 * and `networks-crd.yaml`.
 */
export async function buildMultus(): Promise<string> {
  const out = await new Deno.Command("bash", {
    args: [MULTUS_SCRIPT],
    stdin: "null",
    stdout: "piped",
    stderr: "inherit",
  }).output();
  if (!out.success) throw new Error(`Cannot build Multus: build_multus.sh exited ${out.code}`);
  return new TextDecoder().decode(out.stdout).trim().split("\n").at(-1)!;
}

/**
 * Applies the NetworkAttachmentDefinition CRD (once per cluster; applying it again changes
 * nothing) and waits until it is established, before anything names a network.
 */
export async function applyNetworkAttachmentCrd(kubeconfig: string): Promise<void> {
  await kubectl(kubeconfig, ["apply", "-f", join(await buildMultus(), "networks-crd.yaml")]);
  await kubectl(kubeconfig, [
    "wait",
    "--for=condition=Established",
    "--timeout=60s",
    "crd/network-attachment-definitions.k8s.cni.cncf.io",
  ]);
}

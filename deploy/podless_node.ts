/**
 * A pod-less node's identity, as `deploy/podless-node.yaml` describes it: KubeVirt's
 * `kubevirt-handler` ServiceAccount with the roles of `deploy/rbac.yaml` and
 * `deploy/podless-node.yaml`, and a token bound to the node's own Node object, which the
 * admission policy of `deploy/podless-node.yaml` keeps to that node's VMIs, migrations,
 * Node and Events. Local mode runs its handler with it; the tests make one per node.
 *
 * @module
 */
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { type Cluster, KUBEVIRT_NAMESPACE, serviceAccountKubeconfig } from "./cluster/cluster.ts";
import { detailOf, isApiStatus, loadKubeClient } from "../mod/kube/mod.ts";
import { sleep } from "../mod/lifecycle/mod.ts";

/** The ServiceAccount pod-less nodes run as (KubeVirt's handler's, which its admission trusts). */
export const HANDLER_SERVICE_ACCOUNT = "kubevirt-handler";
/** The admission policy (and its binding) of `deploy/podless-node.yaml`. */
export const PODLESS_NODE_POLICY = "virtnode-podless-node";
/** The manifests a pod-less node's identity needs, in the order they apply. */
export const PODLESS_MANIFESTS: readonly string[] = ["rbac.yaml", "podless-node.yaml"].map(
  (file) => path.join(path.dirname(fileURLToPath(import.meta.url)), file),
);
/** How long the apiserver gets to put a new policy in force. */
const POLICY_TIMEOUT_MS = 30_000;

/** The manifests or the token could not be made, or the policy did not take effect. */
export class PodlessIdentityError extends Error {
  /** Creates the error. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "PodlessIdentityError";
  }
}

/**
 * Writes `file`, a kubeconfig for the pod-less node `node` (its Node must exist): applies
 * {@linkcode PODLESS_MANIFESTS} with the cluster's admin kubeconfig (again is harmless),
 * requests a token of {@linkcode HANDLER_SERVICE_ACCOUNT} bound to the Node, and returns
 * once the apiserver enforces the policy for that token.
 */
export async function podlessNodeKubeconfig(
  cluster: Cluster,
  node: string,
  file: string,
): Promise<string> {
  // The ServiceAccount (and its namespace) first: the manifests bind roles to it.
  await serviceAccountKubeconfig(cluster, KUBEVIRT_NAMESPACE, HANDLER_SERVICE_ACCOUNT, file, {
    boundNode: node,
  });
  const args = ["--kubeconfig", cluster.kubeconfigPath, "apply"];
  for (const manifest of PODLESS_MANIFESTS) args.push("-f", manifest);
  const applied = await new Deno.Command(Deno.env.get("KUBECTL") ?? "kubectl", {
    args,
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).output();
  if (!applied.success) {
    throw new PodlessIdentityError(
      `Cannot apply the pod-less node's manifests: ${new TextDecoder().decode(applied.stderr)}`,
    );
  }
  await waitForPolicy(file, node);
  return file;
}

/**
 * Waits until the policy refuses the node's token an Event in another node's name (a
 * dry run, nothing is stored): a new policy is loaded by the apiserver a moment after it
 * is created, and a node must not start before its limits hold.
 */
async function waitForPolicy(kubeconfig: string, node: string): Promise<void> {
  const client = await loadKubeClient({ kubeconfigPath: kubeconfig });
  const deadline = Date.now() + POLICY_TIMEOUT_MS;
  let last = "the forged Event was accepted";
  try {
    while (Date.now() < deadline) {
      try {
        await client.request("POST", "/api/v1/namespaces/default/events?dryRun=All", {
          apiVersion: "v1",
          kind: "Event",
          metadata: { name: `virtnode-policy-probe.${crypto.randomUUID()}` },
          involvedObject: { apiVersion: "v1", kind: "Node", name: node },
          reason: "PolicyProbe",
          message: "a dry run that the pod-less node policy must refuse",
          type: "Normal",
          source: { component: "virt-handler", host: `not-${node}` },
        });
      } catch (error) {
        if (isApiStatus(error, 403) && error.apiMessage.includes(PODLESS_NODE_POLICY)) return;
        last = detailOf(error);
      }
      await sleep(250);
    }
  } finally {
    client.close();
  }
  throw new PodlessIdentityError(
    `Cannot put the policy "${PODLESS_NODE_POLICY}" in force for node "${node}" within ${
      POLICY_TIMEOUT_MS / 1000
    } s: ${last}`,
  );
}

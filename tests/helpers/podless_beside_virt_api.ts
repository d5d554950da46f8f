/**
 * A pod-less handler's identity beside KubeVirt's own virt-api (no virt-controller): the
 * handler runs as virt-controller's ServiceAccount, which KubeVirt's admission trusts to
 * place VMIs (as local mode and the other pod-less tests run it), holding the roles of
 * `deploy/rbac.yaml` and `deploy/podless-node.yaml`.
 *
 * @module
 */
import { join } from "node:path";
import {
  type Cluster,
  CONTROLLER_SERVICE_ACCOUNT,
  KUBEVIRT_NAMESPACE,
  serviceAccountKubeconfig,
} from "../../deploy/cluster/cluster.ts";
import { runText as run } from "./command.ts";

/**
 * Applies virtnode's roles, binds them to virt-controller's ServiceAccount (the bindings'
 * names start with `prefix`) and writes its kubeconfig into `dir`; returns the kubeconfig.
 */
export async function podlessHandlerKubeconfig(
  cluster: Cluster,
  dir: string,
  prefix: string,
): Promise<string> {
  const kubeconfig = await serviceAccountKubeconfig(
    cluster,
    KUBEVIRT_NAMESPACE,
    CONTROLLER_SERVICE_ACCOUNT,
    join(dir, "handler.kubeconfig"),
  );
  const kubectl = (...args: string[]) =>
    run("kubectl", "--kubeconfig", cluster.kubeconfigPath, ...args);
  await kubectl("apply", "-f", "deploy/rbac.yaml", "-f", "deploy/podless-node.yaml");
  for (const role of ["virtnode-handler", "virtnode-podless-handler"]) {
    await kubectl(
      "create",
      "clusterrolebinding",
      `${prefix}-${role}`,
      `--clusterrole=${role}`,
      `--serviceaccount=${KUBEVIRT_NAMESPACE}:${CONTROLLER_SERVICE_ACCOUNT}`,
    );
  }
  return kubeconfig;
}

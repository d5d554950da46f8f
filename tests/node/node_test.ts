/**
 * One real node (tests/harness/node/node.ts) joined to the test control plane: containerd,
 * runc and the CNI bridge from Debian, and a kubelet, kube-scheduler and
 * kube-controller-manager from the apiserver's own Kubernetes module. A DaemonSet of the
 * sandbox image built here shows the whole path: the controller manager creates the pod,
 * the scheduler places it, the kubelet runs it through containerd and the CNI gives it an
 * address; deleting the DaemonSet removes the pod, and stopping the node leaves nothing.
 */
import assert from "node:assert/strict";
import { useCluster } from "../../deploy/cluster/cluster.ts";
import { PAUSE_IMAGE, startNode } from "../harness/node/node.ts";
import { kubeClient, waitFor } from "../helpers/handler_process.ts";

interface Pod {
  metadata: { name: string; uid: string };
  spec: { nodeName?: string };
  status?: { phase?: string; podIP?: string };
}

function inCidr(ip: string, cidr: string): boolean {
  const [net, bits] = cidr.split("/");
  const n = (a: string) => a.split(".").reduce((v, o) => (v << 8) + Number(o), 0) >>> 0;
  const mask = bits === "0" ? 0 : (~0 << (32 - Number(bits))) >>> 0;
  return ((n(ip) & mask) >>> 0) === ((n(net) & mask) >>> 0);
}

Deno.test("node: a DaemonSet's pod runs through the kubelet, containerd and the CNI, and goes when deleted", async () => {
  // The pod is created, scheduled, run through containerd and given an address by the CNI.
  const cluster = await useCluster();
  const client = await kubeClient(cluster.kubeconfigPath);
  const node = await startNode(cluster);
  let ok = false;
  try {
    const name = `pause-${node.name}`;
    const labels = { app: name };
    await client.request("POST", "/apis/apps/v1/namespaces/default/daemonsets", {
      apiVersion: "apps/v1",
      kind: "DaemonSet",
      metadata: { name },
      spec: {
        selector: { matchLabels: labels },
        template: {
          metadata: { labels },
          spec: {
            nodeSelector: { "kubernetes.io/hostname": node.name },
            automountServiceAccountToken: false,
            terminationGracePeriodSeconds: 1,
            containers: [{ name: "pause", image: PAUSE_IMAGE, imagePullPolicy: "Never" }],
          },
        },
      },
    });
    const podsPath = `/api/v1/namespaces/default/pods?labelSelector=app%3D${name}`;
    const pod = await waitFor("the DaemonSet's pod to run with an address", async () => {
      const list = await client.request<{ items: Pod[] }>("GET", podsPath);
      const p = list.items[0];
      return p?.status?.phase === "Running" && p.status.podIP ? p : undefined;
    }, 90_000);
    assert.equal(pod.spec.nodeName, node.name, "placed on the node by the scheduler");
    assert.ok(inCidr(pod.status!.podIP!, node.podCidr), `${pod.status!.podIP} in ${node.podCidr}`);

    await client.request("DELETE", `/apis/apps/v1/namespaces/default/daemonsets/${name}`, {
      apiVersion: "v1",
      kind: "DeleteOptions",
      propagationPolicy: "Foreground",
    });
    await waitFor("the pod to be gone", async () => {
      const list = await client.request<{ items: Pod[] }>("GET", podsPath);
      return list.items.length === 0;
    }, 60_000);
    ok = true;
  } finally {
    if (!ok) {
      const pods = await client.request("GET", "/api/v1/namespaces/default/pods").catch(() => "");
      console.error(`pods: ${JSON.stringify(pods).slice(0, 3000)}\n${await node.complaints()}`);
    }
    await node.stop();
    await client.request("DELETE", `/api/v1/nodes/${node.name}`).catch(() => {});
    client.close();
    await cluster.stop();
  }
});

/**
 * The KubeVirt CR as the handler watches it: its resourceVersion follows every change (what
 * /healthz reports), and the node labeller follows its `obsoleteCPUModels`, as
 * virt-handler's does: a host model the CR marks obsolete gets the node the
 * `node-labeller.kubevirt.io/obsolete-host-model` label (which keeps VMIs off it), and an
 * empty map, the CR's way to mark none obsolete, takes it away again.
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { startCluster } from "../../deploy/cluster/cluster.ts";
import {
  type KubeObject,
  KubevirtCrWatch,
  loadKubeClient,
  obsoleteCpuModels,
} from "../../mod/kube/mod.ts";
import {
  type NodeLabelInfo,
  NodeLabeller,
  parseCpuFeatures,
  parseDomainCapabilities,
  parseHostCapabilities,
} from "../../mod/node/mod.ts";
import { waitFor } from "../helpers/handler_process.ts";

const FIXTURES = fileURLToPath(new URL("../fixtures/labeller/", import.meta.url));
const OBSOLETE_LABEL = "node-labeller.kubevirt.io/obsolete-host-model";

function fixtureInfo(host: string): NodeLabelInfo {
  const read = (suffix: string) => Deno.readTextFileSync(`${FIXTURES}${host}.${suffix}`);
  return {
    host: parseHostCapabilities(read("capabilities.xml")),
    domain: parseDomainCapabilities(read("domcapabilities.xml")),
    supportedFeatures: parseCpuFeatures(read("baseline.xml")),
  };
}

Deno.test("obsoleteCpuModels() reads the CR's map as virt-handler does: every key counts, an empty map is no map", () => {
  assert.equal(obsoleteCpuModels(undefined), undefined);
  assert.equal(obsoleteCpuModels({}), undefined);
  // virt-handler's JSON round trip drops an empty map (omitempty): KubeVirt's list applies.
  assert.equal(obsoleteCpuModels({ obsoleteCPUModels: {} }), undefined);
  // Its labeller tests a key's presence, not its value.
  assert.deepEqual(
    obsoleteCpuModels({ obsoleteCPUModels: { kvm64: true, qemu64: false, "486": true } }),
    ["486", "kvm64", "qemu64"],
  );
});

Deno.test("the labeller follows the KubeVirt CR's obsoleteCPUModels through the CR's watch", async () => {
  // A control plane of its own: the test changes its KubeVirt CR.
  const cluster = await startCluster({ admission: true });
  const client = await loadKubeClient({ kubeconfigPath: cluster.kubeconfigPath });
  const stop = new AbortController();
  const node = "obsolete-models";
  const running: Promise<void>[] = [];
  try {
    await client.request("POST", "/api/v1/nodes", {
      apiVersion: "v1",
      kind: "Node",
      metadata: { name: node },
    });
    const info = fixtureInfo("intel-skylake-server");
    const hostModel = info.domain.hostModel!.name;
    const labeller = new NodeLabeller(client, node, {
      source: () => Promise.resolve(info),
      intervalMs: 3_600_000,
    });
    const watch = new KubevirtCrWatch(client);
    watch.onChange(() => labeller.setObsoleteModels(obsoleteCpuModels(watch.configuration())));
    running.push(watch.run(stop.signal), labeller.run(stop.signal));
    const labels = async () =>
      (await client.request<KubeObject>("GET", `/api/v1/nodes/${node}`)).metadata?.labels ?? {};
    await waitFor(
      "the first labelling",
      async () => (await labels())[`host-model-cpu.node.kubevirt.io/${hostModel}`],
    );
    assert.equal(
      (await labels())[OBSOLETE_LABEL],
      undefined,
      "the host model is not obsolete by default",
    );

    const cr =
      (await client.request<{ items: KubeObject[] }>("GET", "/apis/kubevirt.io/v1/kubevirts"))
        .items[0];
    const path = `/apis/kubevirt.io/v1/namespaces/${cr.metadata!.namespace}/kubevirts/${
      cr.metadata!.name
    }`;
    const patch = (obsoleteCPUModels: Record<string, boolean>) =>
      client.request<KubeObject>(
        "PATCH",
        path,
        { spec: { configuration: { obsoleteCPUModels } } },
        { contentType: "application/merge-patch+json" },
      );
    const marked = await patch({ [hostModel]: true });
    await waitFor(
      "the watch to see the change",
      () => watch.resourceVersion() === marked.metadata?.resourceVersion,
    );
    await waitFor("the obsolete host-model label", async () => (await labels())[OBSOLETE_LABEL]);

    // A merge patch cannot empty a map: the whole configuration is written again, as
    // `kubectl edit` would leave it.
    const current = await client.request<{ spec: { configuration: Record<string, unknown> } }>(
      "GET",
      path,
    );
    await client.request("PATCH", path, [{
      op: "replace",
      path: "/spec/configuration",
      value: { ...current.spec.configuration, obsoleteCPUModels: {} },
    }], { contentType: "application/json-patch+json" });
    await waitFor(
      "the label gone again",
      async () => (await labels())[OBSOLETE_LABEL] === undefined,
    );
  } finally {
    stop.abort();
    await Promise.allSettled(running);
    client.close();
    await cluster.stop();
  }
});

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
import { type KubeObject, KubevirtCrWatch, loadKubeClient } from "../../mod/kube/mod.ts";
import { parseKubevirtConfiguration } from "../../mod/config/mod.ts";
import {
  type NodeLabelInfo,
  NodeLabeller,
  parseCpuFeatures,
  parseDomainCapabilities,
  parseHostCapabilities,
} from "../../mod/node/mod.ts";
import { waitFor, withHandler } from "../helpers/handler_process.ts";

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

Deno.test("obsoleteCPUModels is read as virt-handler reads it: every key counts, an empty map is no map", () => {
  const obsoleteCpuModels = (configuration: unknown) =>
    parseKubevirtConfiguration(configuration, { resourceVersion: "1", nodeName: "n" })
      .obsoleteCpuModels;
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
    watch.onChange(() => labeller.setObsoleteModels(watch.config().obsoleteCpuModels?.slice()));
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

Deno.test("a running handler follows the KubeVirt CR live: feature gate, verbosity, refused values", async () => {
  // The CPUManager gate turns the cpumanager label on; a verbosity of
  // 1 ends the debug lines the test's handler starts with; a value
  // KubeVirt refuses leaves the last good configuration in force.
  // The kubelet runs the static CPU manager policy: only KubeVirt's gate keeps the label off.
  const stateDir = await Deno.makeTempDir({ prefix: "virtnode-cpumanager-" });
  const stateFile = `${stateDir}/cpu_manager_state`;
  await Deno.writeTextFile(stateFile, JSON.stringify({ policyName: "static" }));
  try {
    await withHandler("cr-live", async ({ h, node, client }) => {
      type Cr = {
        metadata: { name: string; namespace: string; resourceVersion: string };
        spec: { configuration?: Record<string, unknown> };
      };
      const cr = (await client.request<{ items: Cr[] }>("GET", "/apis/kubevirt.io/v1/kubevirts"))
        .items[0];
      const path =
        `/apis/kubevirt.io/v1/namespaces/${cr.metadata.namespace}/kubevirts/${cr.metadata.name}`;
      const original = cr.spec.configuration ?? {};
      const configure = (configuration: Record<string, unknown>) =>
        client.request<Cr>("PATCH", path, [{
          op: "replace",
          path: "/spec/configuration",
          value: configuration,
        }], { contentType: "application/json-patch+json" });
      const healthzVersion = async () =>
        ((await (await fetch(`${h.health}/healthz`)).json()) as Record<string, string>)[
          "config-resource-version"
        ];
      const label = async () =>
        (await client.request<KubeObject>("GET", `/api/v1/nodes/${node}`)).metadata?.labels
          ?.cpumanager;
      const pid = h.child.pid;
      /** The debug lines logged after the handler took `version` into force. */
      const debugLinesAfter = (log: string, version: Cr) => {
        const mark = log.indexOf(
          `Updating cluster config from KubeVirt to resource version '${version.metadata.resourceVersion}'`,
        );
        if (mark < 0) return undefined;
        return log.slice(mark).split("\n").filter((l) => l.includes('"level":"debug"'));
      };
      try {
        await waitFor(
          "the CR's version in /healthz",
          async () => (await healthzVersion()) === cr.metadata.resourceVersion,
        );
        // A pod-less node's Node is its operator's to create (the handler's first beat found
        // none); no beat says cpumanager=true while the gate is off (Alpha, off by default).
        await client.request("POST", "/api/v1/nodes", {
          apiVersion: "v1",
          kind: "Node",
          metadata: { name: node },
        });
        assert.notEqual(await label(), "true");

        const dev = (original.developerConfiguration ?? {}) as Record<string, unknown>;
        const gates = (dev.featureGates ?? []) as string[];
        const on = await configure({
          ...original,
          developerConfiguration: {
            ...dev,
            featureGates: [...gates, "CPUManager"],
            logVerbosity: { virtHandler: 1 },
          },
        });
        await waitFor(
          "the new version in /healthz",
          async () => (await healthzVersion()) === on.metadata.resourceVersion,
        );
        // One beat at once, not at the next minute's.
        await waitFor("cpumanager=true", async () => (await label()) === "true", 10_000);
        // Its beat logs a debug line, which verbosity 1 no longer writes.
        await new Promise((r) => setTimeout(r, 1_000));
        assert.deepEqual(debugLinesAfter(await Deno.readTextFile(h.logFile), on), []);
        assert.equal(h.child.pid, pid);

        // KubeVirt refuses the whole version; the gate stays on and /healthz stays put.
        const bad = await configure({
          ...original,
          network: { defaultNetworkInterface: "vhostuser" },
        });
        await waitFor(
          "the refusal in the log",
          async () =>
            (await Deno.readTextFile(h.logFile)).includes(
              `Invalid cluster config using KubeVirt resource version '${bad.metadata.resourceVersion}', falling back to last good resource version '${on.metadata.resourceVersion}'`,
            ),
        );
        assert.equal(await healthzVersion(), on.metadata.resourceVersion);
        assert.equal(await label(), "true");

        // The gate off again: the label follows without a restart.
        const off = await configure(original);
        await waitFor(
          "the restored version in /healthz",
          async () => (await healthzVersion()) === off.metadata.resourceVersion,
        );
        await waitFor("cpumanager=false", async () => (await label()) === "false", 10_000);
        // No verbosity in the CR: the handler's own --log-level (debug) is back.
        await waitFor(
          "debug lines again",
          async () => (debugLinesAfter(await Deno.readTextFile(h.logFile), off)?.length ?? 0) > 0,
        );
        assert.equal(h.child.pid, pid);
      } finally {
        await configure(original).catch(() => {});
        await client.request("DELETE", `/api/v1/nodes/${node}`).catch(() => {});
      }
    }, { extraArgs: ["--cpu-manager-state", stateFile] });
  } finally {
    await Deno.remove(stateDir, { recursive: true });
  }
});

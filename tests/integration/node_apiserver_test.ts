/**
 * The heartbeat and the node labeller against a real kube-apiserver (deploy/cluster):
 * only an apiserver runs, so the tests create their Node objects themselves.
 */

import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { useCluster } from "../../deploy/cluster/cluster.ts";
import {
  EventRecorder,
  type KubeClient,
  type KubeList,
  type KubeObject,
  loadKubeClient,
  PatchConflictError,
  patchNodeMetadata,
} from "../../mod/kube/mod.ts";
import {
  Heartbeat,
  HeartbeatError,
  type NodeLabelInfo,
  NodeLabeller,
  NodeLabellerError,
  nodeServices,
  parseCpuFeatures,
  parseDomainCapabilities,
  parseHostCapabilities,
  readNodeHeartbeat,
} from "../../mod/node/mod.ts";
import { runStages } from "../../mod/lifecycle/mod.ts";
import { ensureLibvirtd } from "../helpers/libvirtd.ts";

const FIXTURES = fileURLToPath(new URL("../fixtures/labeller/", import.meta.url));

function fixtureInfo(host: string, edit: (domcaps: string) => string = (x) => x): NodeLabelInfo {
  const read = (suffix: string) => Deno.readTextFileSync(`${FIXTURES}${host}.${suffix}`);
  return {
    host: parseHostCapabilities(read("capabilities.xml")),
    domain: parseDomainCapabilities(edit(read("domcapabilities.xml"))),
    supportedFeatures: parseCpuFeatures(read("baseline.xml")),
  };
}

async function createNode(
  client: KubeClient,
  name: string,
  meta: { labels?: Record<string, string>; annotations?: Record<string, string> } = {},
): Promise<KubeObject> {
  return await client.request<KubeObject>("POST", "/api/v1/nodes", {
    apiVersion: "v1",
    kind: "Node",
    metadata: { name, ...meta },
  });
}

async function getNode(client: KubeClient, name: string): Promise<KubeObject> {
  return await client.request<KubeObject>("GET", `/api/v1/nodes/${name}`);
}

async function deleteNode(client: KubeClient, name: string): Promise<void> {
  await client.request("DELETE", `/api/v1/nodes/${name}`).catch(() => {});
}

const cluster = await useCluster();
const client = await loadKubeClient({ kubeconfigPath: cluster.kubeconfigPath });
const tmp = await Deno.makeTempDir({ prefix: "virtnode-node-" });

Deno.test("heartbeat and labeller against a real apiserver", async (t) => {
  try {
    await t.step("a beat writes schedulable, cpumanager and an RFC 3339 heartbeat", async () => {
      await createNode(client, "hb-1", { labels: { "team": "a" } });
      try {
        const state = `${tmp}/cpu_manager_state`;
        let ready = false;
        const seen: (Record<string, string> | undefined)[] = [];
        const heartbeat = new Heartbeat(client, "hb-1", {
          isReady: () => ready,
          cpuManagerStatePaths: [`${tmp}/missing`, state],
          // The node as the patch returned it: the labels mediated devices follow.
          onNode: (n) => seen.push(n.metadata?.labels),
        });
        const before = Date.now();
        const first = await heartbeat.beatOnce();
        let node = await getNode(client, "hb-1");
        assert.equal(node.metadata?.labels?.["kubevirt.io/schedulable"], "false");
        assert.equal(node.metadata?.labels?.["kubevirt.io/cpumanager"], "false");
        assert.equal(node.metadata?.labels?.["cpumanager"], "false");
        assert.equal(node.metadata?.labels?.["team"], "a");
        assert.equal(seen.length, 1);
        assert.deepEqual(seen[0], node.metadata?.labels);
        const stamp = node.metadata?.annotations?.["kubevirt.io/heartbeat"];
        assert.equal(stamp, first.heartbeat);
        assert.match(stamp!, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
        assert.ok(Math.abs(Date.parse(stamp!) - before) < 5_000);

        await Deno.writeTextFile(state, '{"policyName":"static","defaultCpuSet":"0-3"}');
        ready = true;
        await heartbeat.beatOnce();
        node = await getNode(client, "hb-1");
        assert.equal(node.metadata?.labels?.["kubevirt.io/schedulable"], "true");
        assert.equal(node.metadata?.labels?.["kubevirt.io/cpumanager"], "true");
        assert.equal(node.metadata?.labels?.["cpumanager"], "true");

        await Deno.writeTextFile(state, '{"policyName":"none"}');
        assert.equal((await heartbeat.beatOnce()).cpuManager, false);
        await Deno.writeTextFile(state, "not json");
        assert.equal((await heartbeat.beatOnce()).cpuManager, false);

        // A beat by hand leaves schedulable alone, whatever isReady says.
        ready = false;
        const manual = await heartbeat.beatOnce({ schedulable: "unchanged" });
        assert.equal(manual.schedulable, undefined);
        assert.notEqual(manual.heartbeat, undefined);

        const view = await readNodeHeartbeat(client, "hb-1");
        assert.equal(view.schedulable, "true");
        assert.equal(view.cpuManager, "false");
        assert.ok(view.ageSeconds !== undefined && view.ageSeconds < 5);
      } finally {
        await deleteNode(client, "hb-1");
      }
    });

    await t.step("start() says false first, true once ready, and stop() says false", async () => {
      await createNode(client, "hb-2");
      try {
        let ready = false;
        const heartbeat = new Heartbeat(client, "hb-2", {
          isReady: () => ready,
          readyPollMs: 20,
          readyWaitMs: 10_000,
          intervalMs: 60_000,
          cpuManagerStatePaths: [`${tmp}/missing`],
        });
        const stop = new AbortController();
        const running = heartbeat.run(stop.signal);
        const schedulable = async () =>
          (await getNode(client, "hb-2")).metadata?.labels?.["kubevirt.io/schedulable"];
        const deadline = Date.now() + 10_000;
        while (heartbeat.last === undefined && Date.now() < deadline) {
          await new Promise((r) => setTimeout(r, 10));
        }
        assert.equal(await schedulable(), "false");
        const readyAt = performance.now();
        ready = true;
        while ((await schedulable()) !== "true") {
          assert.ok(Date.now() < deadline, "schedulable never turned true");
          await new Promise((r) => setTimeout(r, 20));
        }
        console.log(
          `  device plugins ready to schedulable=true: ${
            (performance.now() - readyAt).toFixed(0)
          } ms`,
        );
        stop.abort();
        await running;
        assert.equal(await schedulable(), "false");
      } finally {
        await deleteNode(client, "hb-2");
      }
    });

    await t.step("a beat for a missing node fails with the apiserver's reason", async () => {
      const heartbeat = new Heartbeat(client, "hb-missing", {
        cpuManagerStatePaths: [`${tmp}/missing`],
      });
      await assert.rejects(heartbeat.beatOnce(), (error: Error) => {
        assert.ok(error instanceof HeartbeatError);
        assert.match(
          error.message,
          /^Cannot write the heartbeat of node "hb-missing": 404 NotFound: /,
        );
        return true;
      });
    });

    await t.step("the labeller writes its labels, removes stale ones, keeps others", async () => {
      await createNode(client, "lb-1", {
        labels: {
          "team": "a",
          "kubevirt.io/schedulable": "true",
          "cpu-model.node.kubevirt.io/Gone": "true",
          "kubevirt.io/sev": "true",
          "host-model-cpu.node.kubevirt.io/Old": "true",
        },
      });
      try {
        const labeller = new NodeLabeller(client, "lb-1", {
          source: () => Promise.resolve(fixtureInfo("intel-skylake-server")),
        });
        const result = await labeller.labelOnce();
        assert.equal(result.outcome, "patched");
        assert.equal(result.attempts, 1);
        assert.deepEqual(result.removed.sort(), [
          "cpu-model.node.kubevirt.io/Gone",
          "host-model-cpu.node.kubevirt.io/Old",
          "kubevirt.io/sev",
        ]);
        const labels = (await getNode(client, "lb-1")).metadata?.labels ?? {};
        assert.equal(labels["team"], "a");
        assert.equal(labels["kubevirt.io/schedulable"], "true");
        assert.equal(labels["cpu-model.node.kubevirt.io/Gone"], undefined);
        assert.equal(labels["kubevirt.io/sev"], undefined);
        assert.equal(labels["host-model-cpu.node.kubevirt.io/Skylake-Server-IBRS"], "true");
        assert.equal(labels["cpu-timer.node.kubevirt.io/tsc-frequency"], "2095078000");
        for (const [key, value] of Object.entries(result.labels)) {
          assert.equal(labels[key], value, key);
        }
        assert.equal((await labeller.labelOnce()).outcome, "unchanged");
      } finally {
        await deleteNode(client, "lb-1");
      }
    });

    await t.step("the labeller labels a node that has no labels at all", async () => {
      await createNode(client, "lb-2");
      try {
        const labeller = new NodeLabeller(client, "lb-2", {
          source: () => Promise.resolve(fixtureInfo("amd-epyc-rome")),
        });
        assert.equal((await labeller.labelOnce()).outcome, "patched");
        const labels = (await getNode(client, "lb-2")).metadata?.labels ?? {};
        assert.equal(labels["kubevirt.io/sev-es"], "true");
        assert.equal(labels["cpu-vendor.node.kubevirt.io/AMD"], "true");
      } finally {
        await deleteNode(client, "lb-2");
      }
    });

    await t.step("the skip annotation leaves the node alone", async () => {
      await createNode(client, "lb-3", {
        labels: { "cpu-model.node.kubevirt.io/Gone": "true" },
        annotations: { "node-labeller.kubevirt.io/skip-node": "" },
      });
      try {
        const labeller = new NodeLabeller(client, "lb-3", {
          source: () => Promise.resolve(fixtureInfo("intel-skylake-server")),
        });
        assert.equal((await labeller.labelOnce()).outcome, "skipped");
        const labels = (await getNode(client, "lb-3")).metadata?.labels ?? {};
        assert.deepEqual(labels, { "cpu-model.node.kubevirt.io/Gone": "true" });
        await patchNodeMetadata(client, "lb-3", {
          annotations: { "node-labeller.kubevirt.io/skip-node": null },
        });
        assert.equal((await labeller.labelOnce()).outcome, "patched");
      } finally {
        await deleteNode(client, "lb-3");
      }
    });

    await t.step("a concurrent label change fails the test op; the retry keeps it", async () => {
      await createNode(client, "lb-4", { labels: { "team": "a" } });
      try {
        let races = 0;
        let writes = 0;
        // Another writer changes the labels between our read and our patch, every time
        // until `races` runs out.
        const racing = (limit: number) =>
          ({
            request: async (method: string, path: string, body?: unknown, options?: object) => {
              if (method === "PATCH" && races < limit) {
                races++;
                writes++;
                await patchNodeMetadata(client, "lb-4", { labels: { [`other-${writes}`]: "x" } });
              }
              return await client.request(method, path, body, options);
            },
          }) as unknown as KubeClient;
        const labeller = new NodeLabeller(racing(1), "lb-4", {
          source: () => Promise.resolve(fixtureInfo("intel-skylake-server")),
        });
        const result = await labeller.labelOnce();
        assert.equal(result.outcome, "patched");
        assert.equal(result.attempts, 2);
        const labels = (await getNode(client, "lb-4")).metadata?.labels ?? {};
        assert.equal(labels["other-1"], "x", "the concurrent writer's label survived");
        assert.equal(labels["team"], "a");
        assert.equal(labels["host-model-cpu.node.kubevirt.io/Skylake-Server-IBRS"], "true");

        // A writer that always wins exhausts the attempts: the error says so.
        races = 0;
        const loser = new NodeLabeller(racing(100), "lb-4", {
          source: () => Promise.resolve(fixtureInfo("amd-epyc-rome")),
          maxAttempts: 3,
        });
        await assert.rejects(loser.labelOnce(), (error: Error) => {
          assert.ok(error instanceof NodeLabellerError);
          assert.ok(error.cause instanceof PatchConflictError);
          assert.match(error.message, /^Cannot label node "lb-4": /);
          return true;
        });
        assert.equal(races, 3);
        const after = (await getNode(client, "lb-4")).metadata?.labels ?? {};
        assert.equal(after["cpu-vendor.node.kubevirt.io/AMD"], undefined, "nothing half-written");
        assert.equal(after["other-4"], "x");
      } finally {
        await deleteNode(client, "lb-4");
      }
    });

    await t.step("an obsolete host model is labelled and reported as a Warning event", async () => {
      await createNode(client, "lb-5");
      const recorder = new EventRecorder(client, { host: "lb-5" });
      try {
        const labeller = new NodeLabeller(client, "lb-5", {
          source: () =>
            Promise.resolve(
              fixtureInfo(
                "intel-skylake-server",
                (x) =>
                  x.replace(
                    /<model fallback='forbid'>Skylake-Server-IBRS<\/model>/,
                    "<model>kvm64</model>",
                  ),
              ),
            ),
          recorder,
          // As the KubeVirt CR's obsoleteCPUModels names them: without a list virt-handler
          // marks no host model obsolete.
          obsoleteModels: ["kvm64"],
        });
        await labeller.labelOnce();
        const labels = (await getNode(client, "lb-5")).metadata?.labels ?? {};
        assert.equal(labels["node-labeller.kubevirt.io/obsolete-host-model"], "true");
        let events: KubeList<KubeObject & { reason?: string; type?: string; message?: string }> = {
          items: [],
        };
        const deadline = Date.now() + 10_000;
        while (events.items.length === 0 && Date.now() < deadline) {
          events = await client.request("GET", "/api/v1/namespaces/default/events", undefined, {
            query: { fieldSelector: "involvedObject.name=lb-5,reason=HostModelIsObsolete" },
          });
          if (events.items.length === 0) await new Promise((r) => setTimeout(r, 50));
        }
        assert.equal(events.items.length, 1);
        assert.equal(events.items[0].type, "Warning");
        assert.match(events.items[0].message ?? "", /kvm64 host-model cpu/);
      } finally {
        await deleteNode(client, "lb-5");
      }
    });

    await t.step("run() labels at once and trigger() runs again on demand", async () => {
      await createNode(client, "lb-6");
      try {
        let info = fixtureInfo("intel-skylake-server");
        let runs = 0;
        const labeller = new NodeLabeller(client, "lb-6", {
          source: () => {
            runs++;
            return Promise.resolve(info);
          },
          intervalMs: 60_000,
        });
        const stop = new AbortController();
        const running = labeller.run(stop.signal);
        const host = async () =>
          Object.keys((await getNode(client, "lb-6")).metadata?.labels ?? {})
            .find((k) => k.startsWith("host-model-cpu.node.kubevirt.io/"));
        const deadline = Date.now() + 10_000;
        while ((await host()) === undefined) {
          assert.ok(Date.now() < deadline);
          await new Promise((r) => setTimeout(r, 20));
        }
        assert.equal(await host(), "host-model-cpu.node.kubevirt.io/Skylake-Server-IBRS");
        info = fixtureInfo("amd-epyc-rome");
        await labeller.info(true);
        labeller.trigger();
        while ((await host()) !== "host-model-cpu.node.kubevirt.io/EPYC-Rome") {
          assert.ok(Date.now() < deadline);
          await new Promise((r) => setTimeout(r, 20));
        }
        stop.abort();
        await running;
        assert.equal(runs, 2);
      } finally {
        await deleteNode(client, "lb-6");
      }
    });
    await t.step(
      "nodeServices() label from libvirt and beat; stopping them says false",
      async () => {
        const uri = await ensureLibvirtd();
        await createNode(client, "svc-1");
        const pluginDir = `${tmp}/device-plugins`;
        try {
          const services = nodeServices(client, {
            nodeName: "svc-1",
            libvirtUri: uri,
            // No device to serve: no plugin runs, nothing to wait for (a plugin registers
            // whether its node exists or not, and no kubelet answers here).
            devicePlugins: { pluginDir, deviceRoot: `${tmp}/no-devices`, devices: [] },
            heartbeat: { cpuManagerStatePaths: [`${tmp}/missing`], readyPollMs: 20 },
            labeller: { virttype: "qemu" },
          });
          const stop = new AbortController();
          const running = runStages(services.stages, stop.signal);
          const labels = async () => (await getNode(client, "svc-1")).metadata?.labels ?? {};
          const deadline = Date.now() + 20_000;
          for (;;) {
            const now = await labels();
            if (
              now["kubevirt.io/schedulable"] === "true" &&
              Object.keys(now).some((k) => k.startsWith("host-model-cpu.node.kubevirt.io/"))
            ) break;
            assert.ok(Date.now() < deadline, `labels so far: ${JSON.stringify(now)}`);
            await new Promise((r) => setTimeout(r, 50));
          }
          assert.deepEqual(services.devicePlugins?.plugins, []);
          stop.abort();
          await running;
          assert.equal((await labels())["kubevirt.io/schedulable"], "false");
        } finally {
          await deleteNode(client, "svc-1");
        }
      },
    );
  } finally {
    client.close();
    await cluster.stop();
    await Deno.remove(tmp, { recursive: true });
  }
});

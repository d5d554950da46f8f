/**
 * mod/kube against a real kube-apiserver + etcd (deploy/cluster), with KubeVirt's own
 * CRDs applied by the cluster.
 */

import assert from "node:assert/strict";
import { type Cluster, startCluster } from "../../deploy/cluster/cluster.ts";
import { releaseVmi } from "../helpers/handler_process.ts";
import {
  EventRecorder,
  Informer,
  type KubeClient,
  KubeConnectionError,
  type KubeEvent,
  type KubeList,
  type KubeObject,
  loadKubeClient,
  objectKey,
  PatchConflictError,
  patchNodeJson,
  patchNodeMetadata,
  replaceMapWithTest,
  StatusWriter,
} from "../../mod/kube/mod.ts";

const GROUP_VERSION = "/apis/kubevirt.io/v1";
const ALL_VMIS = `${GROUP_VERSION}/virtualmachineinstances`;
const NODE_LABEL = "kubevirt.io/nodeName";
const REPO_ROOT = new URL("../../", import.meta.url).pathname;

interface VmiStatus {
  phase?: string;
  nodeName?: string;
  conditions?: { type: string; status: string; reason?: string }[];
  [field: string]: unknown;
}
type Vmi = KubeObject & { spec?: unknown; status?: VmiStatus };

function vmiPath(namespace: string, name?: string): string {
  const base = `${GROUP_VERSION}/namespaces/${namespace}/virtualmachineinstances`;
  return name ? `${base}/${name}` : base;
}

function newVmi(name: string, node: string, namespace = "default"): Vmi {
  return {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachineInstance",
    metadata: { name, namespace, labels: { [NODE_LABEL]: node } },
    spec: { domain: { cpu: { cores: 1 }, memory: { guest: "64Mi" }, devices: {} } },
  };
}

async function createVmi(client: KubeClient, name: string, node: string, namespace = "default") {
  return await client.request<Vmi>("POST", vmiPath(namespace), newVmi(name, node, namespace));
}

async function waitFor(what: string, cond: () => boolean, timeoutMs = 30_000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!cond()) {
    if (performance.now() > deadline) throw new Error(`Timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Records handler calls as "add ns/name", "update ns/name", "delete ns/name". */
function recordEvents(informer: Informer<Vmi>): string[] {
  const seen: string[] = [];
  informer.addHandlers({
    onAdd: (o) => seen.push(`add ${objectKey(o)}`),
    onUpdate: (_old, o) => seen.push(`update ${objectKey(o)}`),
    onDelete: (o) => seen.push(`delete ${objectKey(o)}`),
  });
  return seen;
}

async function kubectl(cluster: Cluster, ...args: string[]): Promise<string> {
  const out = await new Deno.Command("kubectl", {
    args: ["--kubeconfig", cluster.kubeconfigPath, ...args],
    stdin: "null",
  }).output();
  const dec = new TextDecoder();
  if (!out.success) throw new Error(`kubectl ${args.join(" ")} failed: ${dec.decode(out.stderr)}`);
  return dec.decode(out.stdout);
}

/**
 * Deletes a VMI and, playing virt-controller with no launcher pod left, takes virt-api's
 * finalizer off, so the VMI goes away.
 */
async function deleteVmi(client: KubeClient, namespace: string, name: string): Promise<void> {
  await client.request("DELETE", vmiPath(namespace, name));
  await releaseVmi(client, namespace, name);
}

/**
 * Runs `fn` with a fresh cluster of its own (these tests stop the apiserver and expect
 * a clean store, so they never share the suite's cluster), with KubeVirt's admission, and
 * a client that is virt-controller (KubeVirt's admission lets only KubeVirt's service
 * accounts place VMIs on nodes and write their status); always cleans up.
 */
async function withCluster(fn: (cluster: Cluster, client: KubeClient) => Promise<void>) {
  const cluster = await startCluster({ admission: true });
  let client: KubeClient | undefined;
  try {
    client = await loadKubeClient({ kubeconfigPath: cluster.handlerKubeconfigPath });
    await fn(cluster, client);
  } finally {
    client?.close();
    await cluster.stop();
  }
}

Deno.test("Informer sees add, update and delete of its node's VMIs and never another node's", async () => {
  await withCluster(async (_cluster, client) => {
    await client.request("POST", "/api/v1/namespaces", {
      apiVersion: "v1",
      kind: "Namespace",
      metadata: { name: "other-ns" },
    });
    await createVmi(client, "pre-a", "node-a");
    await createVmi(client, "pre-b", "node-b");
    const informer = new Informer<Vmi>(client, {
      path: ALL_VMIS,
      labelSelector: `${NODE_LABEL}=node-a`,
      pageSize: 2,
    });
    const seen = recordEvents(informer);
    const stop = new AbortController();
    const running = informer.run(stop.signal);
    try {
      await informer.waitForSync();
      assert.equal(informer.hasSynced(), true);
      assert.deepEqual(informer.keys(), ["default/pre-a"]);

      await createVmi(client, "vm-a", "node-a");
      await createVmi(client, "vm-b", "node-b");
      await createVmi(client, "vm-a2", "node-a", "other-ns");
      await waitFor(
        "vm-a and other-ns/vm-a2",
        () =>
          informer.get("default/vm-a") !== undefined &&
          informer.get("other-ns/vm-a2") !== undefined,
      );

      const current = informer.get("default/vm-a")!;
      await client.request("PUT", vmiPath("default", "vm-a"), {
        ...current,
        status: { phase: "Scheduled", nodeName: "node-a" },
      });
      await waitFor(
        "the status update",
        () => informer.get("default/vm-a")?.status?.phase === "Scheduled",
      );

      await deleteVmi(client, "default", "vm-a");
      await deleteVmi(client, "default", "vm-b");
      await waitFor("the delete", () => seen.includes("delete default/vm-a"));

      // Moving a VMI to another node makes it leave this node's view.
      await client.request("PATCH", vmiPath("default", "pre-a"), {
        metadata: { labels: { [NODE_LABEL]: "node-b" } },
      }, { contentType: "application/merge-patch+json" });
      await waitFor("pre-a leaving", () => informer.get("default/pre-a") === undefined);

      assert.deepEqual(seen, [
        "add default/pre-a",
        "add default/vm-a",
        "add other-ns/vm-a2",
        "update default/vm-a",
        // virt-api's finalizer: the delete marks the VMI first, then removes it.
        "update default/vm-a",
        "delete default/vm-a",
        "delete default/pre-a",
      ]);
      assert.ok(seen.every((e) => !e.includes("-b")), `saw another node's VMI: ${seen}`);
      assert.equal(informer.restarts, 0);
    } finally {
      stop.abort();
      await running;
    }
  });
});

Deno.test("Informer recovers when the apiserver stops and starts, and catches up on changes it missed", async () => {
  await withCluster(async (cluster, client) => {
    await createVmi(client, "keep", "node-a");
    await createVmi(client, "change", "node-a");
    await createVmi(client, "remove", "node-a");
    const errors: Error[] = [];
    // The informer watches as the admin: right after a restart the apiserver's RBAC caches
    // are not filled yet and answer a service account's watch with a 403 for a moment,
    // which is not what this test is about.
    const admin = await loadKubeClient({ kubeconfigPath: cluster.kubeconfigPath });
    const informer = new Informer<Vmi>(admin, {
      path: ALL_VMIS,
      labelSelector: `${NODE_LABEL}=node-a`,
      // Slow retries so the changes below land while the informer is disconnected.
      backoff: { initialMs: 1500, maxMs: 4000 },
      onError: (err) => errors.push(err),
    });
    const seen = recordEvents(informer);
    const stop = new AbortController();
    const running = informer.run(stop.signal);
    try {
      await informer.waitForSync();
      assert.equal(informer.list().length, 3);

      await cluster.stopApiserver();
      await waitFor("the informer to notice", () => informer.restarts > 0);
      assert.ok(informer.lastError instanceof Error);
      assert.match(informer.lastError.message, /^Cannot (watch|list) virtualmachineinstances: /);
      // A request while the apiserver is down fails clearly, naming the server.
      await assert.rejects(
        client.request("GET", ALL_VMIS, undefined, { timeoutMs: 3000 }),
        (err) => {
          assert.ok(err instanceof KubeConnectionError);
          assert.equal(err.server, cluster.server);
          assert.match(
            err.message,
            /^Cannot GET \/apis\/kubevirt.io\/v1\/virtualmachineinstances: /,
          );
          return true;
        },
      );

      await cluster.startApiserver();
      // These changes are made before the informer's next retry.
      await createVmi(client, "added-later", "node-a");
      const change = await client.request<Vmi>("GET", vmiPath("default", "change"));
      await client.request("PUT", vmiPath("default", "change"), {
        ...change,
        status: { phase: "Running" },
      });
      await deleteVmi(client, "default", "remove");
      await createVmi(client, "other-node", "node-b");

      await waitFor(
        "the informer to catch up",
        () =>
          informer.get("default/added-later") !== undefined &&
          informer.get("default/change")?.status?.phase === "Running" &&
          informer.get("default/remove") === undefined,
        60_000,
      );
      assert.deepEqual(informer.keys().sort(), [
        "default/added-later",
        "default/change",
        "default/keep",
      ]);
      assert.ok(seen.includes("add default/added-later"));
      assert.ok(seen.includes("update default/change"));
      assert.ok(seen.includes("delete default/remove"));
      assert.ok(!seen.some((e) => e.includes("other-node")));
      assert.ok(
        !seen.includes("update default/keep"),
        "an unchanged object is not reported as updated",
      );

      // And the watch works again afterwards.
      await createVmi(client, "after-recovery", "node-a");
      await waitFor(
        "a live event after recovery",
        () => informer.get("default/after-recovery") !== undefined,
      );
      // The restarted apiserver's watch cache starts after our resourceVersion: 410, relist.
      const messages = errors.map((e) => e.message).join("\n");
      assert.match(messages, /^Cannot watch virtualmachineinstances: 410 Expired: /m, messages);
      assert.equal(informer.lists, 2, "one initial list and one relist after the 410");
    } finally {
      stop.abort();
      await running;
      admin.close();
    }
  });
});

Deno.test("StatusWriter keeps another writer's change after a conflict, and skips an unchanged status", async () => {
  await withCluster(async (_cluster, client) => {
    const writer = new StatusWriter<VmiStatus, Vmi>(client, {
      groupVersionPath: GROUP_VERSION,
      plural: "virtualmachineinstances",
    });
    const created = await createVmi(client, "racy", "node-a");
    const setPhase = (s: VmiStatus) => {
      s.phase = "Scheduled";
      s.nodeName = "node-a";
    };
    const first = await writer.update(created, setPhase);
    assert.equal(first.written, true);
    assert.equal(first.requests, 1);
    const again = await writer.update(first.object, setPhase);
    assert.equal(again.written, false, "the same status twice makes one request");
    assert.equal(again.requests, 0);

    // Another writer adds a condition; our cached copy is now stale.
    const stale = first.object;
    const fresh = await client.request<Vmi>("GET", vmiPath("default", "racy"));
    await client.request("PUT", vmiPath("default", "racy"), {
      ...fresh,
      status: { ...fresh.status, conditions: [{ type: "LiveMigratable", status: "False" }] },
    });
    const ours = await writer.update(stale, (s) => {
      s.conditions = [...(s.conditions ?? []).filter((c) => c.type !== "Ready"), {
        type: "Ready",
        status: "True",
      }];
      s.phase = "Running";
    });
    assert.equal(ours.written, true);
    assert.equal(ours.requests, 3, "PUT (409), GET, PUT");
    const final = await client.request<Vmi>("GET", vmiPath("default", "racy"));
    assert.equal(final.status?.phase, "Running");
    assert.deepEqual(final.status?.conditions?.map((c) => `${c.type}=${c.status}`).sort(), [
      "LiveMigratable=False",
      "Ready=True",
    ]);

    // Status fields KubeVirt's schema names but virtnode does not write survive a write.
    await client.request("PUT", vmiPath("default", "racy"), {
      ...final,
      status: { ...final.status, selinuxContext: "none" },
    });
    const withOthers = await writer.update(final, (s) => {
      s.reason = "Written";
    });
    const read = await client.request<Vmi>("GET", vmiPath("default", "racy"));
    assert.equal(read.status?.selinuxContext, "none");
    assert.equal(read.status?.reason, "Written");
    assert.equal(withOthers.written, true);

    await deleteVmi(client, "default", "racy");
    await assert.rejects(writer.update(read, (s) => void (s.phase = "Failed")), /404 NotFound/);
  });
});

Deno.test("EventRecorder creates an Event and aggregates repeats into its count", async () => {
  await withCluster(async (_cluster, client) => {
    const vmi = await createVmi(client, "eventful", "node-a");
    const recorder = new EventRecorder(client, { host: "node-a" });
    const first = await recorder.record(
      vmi,
      "Normal",
      "Created",
      "VirtualMachineInstance defined.",
    );
    assert.equal(first.count, 1);
    const second = await recorder.record(
      vmi,
      "Normal",
      "Created",
      "VirtualMachineInstance defined.",
    );
    assert.equal(second.metadata?.name, first.metadata?.name, "the repeat patches the same Event");
    assert.equal(second.count, 2);
    // Repeats that come while the first is still being created (a slow apiserver, a
    // failing sync retried quickly) still make one Event.
    await Promise.all(
      [1, 2, 3].map(() => recorder.record(vmi, "Warning", "SyncFailed", "Cannot start domain")),
    );

    const list = await client.request<KubeList<KubeEvent>>(
      "GET",
      "/api/v1/namespaces/default/events",
      undefined,
      {
        query: { fieldSelector: "involvedObject.name=eventful" },
      },
    );
    const summary = list.items.map((e) => `${e.type} ${e.reason} x${e.count}`).sort();
    assert.deepEqual(summary, ["Normal Created x2", "Warning SyncFailed x3"]);
    const created = list.items.find((e) => e.reason === "Created")!;
    assert.equal(created.source.component, "virt-handler");
    assert.equal(created.source.host, "node-a");
    assert.equal(created.involvedObject.kind, "VirtualMachineInstance");
    assert.equal(created.involvedObject.uid, vmi.metadata?.uid);

    // A repeat after the aggregation window creates a new Event.
    let now = Date.now();
    const clocked = new EventRecorder(client, { host: "node-a", now: () => now });
    const a = await clocked.record(vmi, "Normal", "Later", "m");
    now += 11 * 60 * 1000;
    const b = await clocked.record(vmi, "Normal", "Later", "m");
    assert.notEqual(a.metadata?.name, b.metadata?.name);
  });
});

Deno.test("Node patches: strategic merge keeps others' labels; a failed JSON patch test is a PatchConflictError", async () => {
  await withCluster(async (_cluster, client) => {
    await client.request("POST", "/api/v1/nodes", {
      apiVersion: "v1",
      kind: "Node",
      metadata: { name: "node-a", labels: { "kubernetes.io/hostname": "node-a", "old": "x" } },
    });
    const patched = await patchNodeMetadata(client, "node-a", {
      labels: { "kubevirt.io/schedulable": "true", old: null },
      annotations: { "kubevirt.io/heartbeat": "2024-01-01T00:00:00Z" },
    });
    assert.deepEqual(patched.metadata?.labels, {
      "kubernetes.io/hostname": "node-a",
      "kubevirt.io/schedulable": "true",
    });
    assert.equal(patched.metadata?.annotations?.["kubevirt.io/heartbeat"], "2024-01-01T00:00:00Z");

    const observed = patched.metadata!.labels!;
    // Someone else changes the labels after we read them.
    await patchNodeMetadata(client, "node-a", { labels: { "someone.else/label": "1" } });
    const desired = { ...observed, "cpu-model.node.kubevirt.io/Haswell": "true" };
    await assert.rejects(
      patchNodeJson(client, "node-a", replaceMapWithTest("labels", observed, desired)),
      (err) => {
        assert.ok(err instanceof PatchConflictError, String(err));
        assert.ok(err.status === 422 || err.status === 409, `status ${err.status}`);
        assert.match(err.message, /^Cannot patch node "node-a": it changed since it was read: /);
        return true;
      },
    );
    // Re-read and retry: now the test holds.
    const node = await client.request<KubeObject>("GET", "/api/v1/nodes/node-a");
    const retried = await patchNodeJson(
      client,
      "node-a",
      replaceMapWithTest("labels", node.metadata!.labels!, {
        ...node.metadata!.labels!,
        "cpu-model.node.kubevirt.io/Haswell": "true",
      }),
    );
    assert.equal(retried.metadata?.labels?.["someone.else/label"], "1");
    assert.equal(retried.metadata?.labels?.["cpu-model.node.kubevirt.io/Haswell"], "true");
    await assert.rejects(
      patchNodeMetadata(client, "no-such-node", { labels: { a: "b" } }),
      /^Error: Cannot patch node "no-such-node": 404 NotFound: /,
    );
  });
});

Deno.test("kubectl applies deploy/examples and shows KubeVirt's printer columns for vmi and vmim", async () => {
  await withCluster(async (cluster, client) => {
    const applied = await kubectl(cluster, "apply", "-f", `${REPO_ROOT}deploy/examples/`);
    assert.match(applied, /virtualmachineinstance.kubevirt.io\/vmi-minimal created/);
    const table = await kubectl(cluster, "get", "vmi", "-n", "default");
    const header = table.split("\n")[0].trim().split(/\s+/);
    assert.deepEqual(header, ["NAME", "AGE", "PHASE", "IP", "NODENAME", "READY"]);
    assert.match(table, /vmi-cirros/);
    assert.match(table, /vmi-minimal/);

    const vmi = await client.request<Vmi>("GET", vmiPath("default", "vmi-minimal"));
    assert.equal(
      (vmi.spec as { nodeSelector?: Record<string, string> }).nodeSelector?.[
        "kubernetes.io/hostname"
      ],
      "virtnode-local",
    );
    await client.request("PUT", vmiPath("default", "vmi-minimal"), {
      ...vmi,
      status: {
        phase: "Running",
        nodeName: "virtnode-local",
        interfaces: [{ name: "default", ipAddress: "10.0.2.2" }],
        conditions: [
          { type: "Ready", status: "True" },
          { type: "LiveMigratable", status: "False" },
          { type: "Paused", status: "False" },
        ],
      },
    });
    const wide = await kubectl(cluster, "get", "vmis", "vmi-minimal", "-o", "wide");
    const [head, row] = wide.trim().split("\n").map((l) => l.trim().split(/\s+/));
    assert.deepEqual(head, [
      "NAME",
      "AGE",
      "PHASE",
      "IP",
      "NODENAME",
      "READY",
      "LIVE-MIGRATABLE",
      "PAUSED",
    ]);
    assert.deepEqual([row[0], ...row.slice(2)], [
      "vmi-minimal",
      "Running",
      "10.0.2.2",
      "virtnode-local",
      "True",
      "False",
      "False",
    ]);

    // KubeVirt's admission refuses to migrate a VMI whose LiveMigratable is False, which
    // is what virtnode reports while it cannot migrate: a drain starts no migration.
    await assert.rejects(
      client.request(
        "POST",
        `${GROUP_VERSION}/namespaces/default/virtualmachineinstancemigrations`,
        {
          apiVersion: "kubevirt.io/v1",
          kind: "VirtualMachineInstanceMigration",
          metadata: { name: "refused", namespace: "default" },
          spec: { vmiName: "vmi-minimal" },
        },
      ),
      /Cannot migrate VMI/,
    );
    const migratable = await client.request<Vmi>("GET", vmiPath("default", "vmi-minimal"));
    await client.request("PUT", vmiPath("default", "vmi-minimal"), {
      ...migratable,
      status: {
        ...migratable.status,
        conditions: migratable.status!.conditions!.map((c) =>
          c.type === "LiveMigratable" ? { ...c, status: "True" } : c
        ),
      },
    });

    // KubeVirt's schema rejects a status of the wrong shape.
    await assert.rejects(
      client.request("PUT", vmiPath("default", "vmi-minimal"), {
        ...(await client.request<Vmi>("GET", vmiPath("default", "vmi-minimal"))),
        status: { phase: 42 },
      }),
      /422 Invalid/,
    );

    await client.request(
      "POST",
      `${GROUP_VERSION}/namespaces/default/virtualmachineinstancemigrations`,
      {
        apiVersion: "kubevirt.io/v1",
        kind: "VirtualMachineInstanceMigration",
        metadata: { name: "mig1", namespace: "default" },
        spec: { vmiName: "vmi-minimal" },
      },
    );
    const vmim = await kubectl(cluster, "get", "vmim");
    const [mHead, mRow] = vmim.trim().split("\n").map((l) => l.trim().split(/\s+/));
    assert.deepEqual(mHead, ["NAME", "PHASE", "VMI"]);
    assert.deepEqual(mRow, ["mig1", "vmi-minimal"], "phase is empty until someone sets it");
    const all = await kubectl(cluster, "get", "all", "-n", "default", "-o", "name");
    assert.match(all, /virtualmachineinstance.kubevirt.io\/vmi-efi/);
  });
});

Deno.test("in-cluster credentials work; a kubeconfig with a wrong token or no CA fails clearly", async () => {
  await withCluster(async (cluster) => {
    const text = await Deno.readTextFile(cluster.kubeconfigPath);
    const badTokenPath = `${cluster.dir}/kubeconfig-bad-token`;
    await Deno.writeTextFile(badTokenPath, text.replace(cluster.token, "not-the-token"));
    const badToken = await loadKubeClient({ kubeconfigPath: badTokenPath });
    try {
      await assert.rejects(
        badToken.request("GET", ALL_VMIS),
        /^KubeApiError: Cannot GET .*: 401 Unauthorized/,
      );
    } finally {
      badToken.close();
    }
    // In-cluster: service account token and CA files, apiserver from the environment.
    const saDir = `${cluster.dir}/serviceaccount`;
    await Deno.mkdir(saDir);
    await Deno.writeTextFile(`${saDir}/token`, cluster.token);
    await Deno.copyFile(`${cluster.dir}/certs/apiserver.crt`, `${saDir}/ca.crt`);
    const env = ["KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"];
    const saved = env.map((k) => Deno.env.get(k));
    Deno.env.delete("KUBECONFIG");
    Deno.env.set("KUBERNETES_SERVICE_HOST", "127.0.0.1");
    Deno.env.set("KUBERNETES_SERVICE_PORT", new URL(cluster.server).port);
    try {
      const inCluster = await loadKubeClient({ serviceAccountDir: saDir });
      try {
        assert.equal(inCluster.source, "in-cluster");
        const list = await inCluster.request<KubeList>("GET", ALL_VMIS);
        assert.deepEqual(list.items, []);
      } finally {
        inCluster.close();
      }
    } finally {
      env.forEach((k, i) =>
        saved[i] === undefined ? Deno.env.delete(k) : Deno.env.set(k, saved[i]!)
      );
    }

    const noCaPath = `${cluster.dir}/kubeconfig-no-ca`;
    await Deno.writeTextFile(noCaPath, text.replace(/^\s*certificate-authority-data:.*$/m, ""));
    const noCa = await loadKubeClient({ kubeconfigPath: noCaPath });
    try {
      await assert.rejects(noCa.request("GET", ALL_VMIS), (err) => {
        assert.ok(err instanceof KubeConnectionError);
        assert.match(
          err.message,
          new RegExp(`cannot reach apiserver "${cluster.server}": .*certificate`, "i"),
        );
        return true;
      });
    } finally {
      noCa.close();
    }
  });
});

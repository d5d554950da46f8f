/**
 * H6: a pod-less node's credential reaches only its own node's objects. Each node gets the
 * identity local mode gives its handler (`deploy/podless_node.ts`: KubeVirt's
 * kubevirt-handler with a token bound to the node's Node object, under the admission
 * policy of `deploy/podless-node.yaml`), against the real apiserver with KubeVirt's CRDs and
 * admission. Node A's writes to node B's VMI, migration and Node are refused with the
 * policy's 403; its writes to its own go through; and the writes pod-less mode itself makes
 * (the scheduler's placement and the migration controller's hand-off, run here as the
 * handler runs them, then the target's take-over) pass, while a VMI can be moved only to a
 * node that takes it. The VM controller's writes pass for the VMs placed on the node only.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { useCluster } from "../../deploy/cluster/cluster.ts";
import { podlessNodeKubeconfig } from "../../deploy/podless_node.ts";
import {
  EventRecorder,
  isApiStatus,
  type KubeClient,
  type KubeObject,
} from "../../mod/kube/mod.ts";
import type {
  VirtualMachine,
  VirtualMachineInstance,
  VirtualMachineInstanceMigration,
} from "../../mod/api/mod.ts";
import { PodlessMigrations } from "../../mod/handler/testing.ts";
import { PodlessScheduler, vmiFromVm } from "../../mod/handler/testing.ts";
import {
  createVmi,
  getVmi,
  kubeClient,
  testVmi,
  vmiPath,
  waitFor,
} from "../helpers/handler_process.ts";

const NS = "default";
const NODE_LABEL = "kubevirt.io/nodeName";
const TARGET_LABEL = "kubevirt.io/migrationTargetNodeName";

function suffix(): string {
  return crypto.randomUUID().slice(0, 8);
}

function vmimPath(name = ""): string {
  return `/apis/kubevirt.io/v1/namespaces/${NS}/virtualmachineinstancemigrations${
    name ? "/" + name : ""
  }`;
}

/** Two nodes, each with its own pod-less credential, and the test's admin and controller. */
interface Nodes {
  admin: KubeClient;
  /** virt-controller's identity: places VMIs as KubeVirt's admission requires. */
  controller: KubeClient;
  a: { name: string; client: KubeClient };
  b: { name: string; client: KubeClient };
}

async function withTwoNodes(fn: (n: Nodes) => Promise<void>): Promise<void> {
  const cluster = await useCluster();
  const admin = await kubeClient(cluster.kubeconfigPath);
  const controller = await kubeClient(cluster.handlerKubeconfigPath);
  const dir = await Deno.makeTempDir({ prefix: "virtnode-node-identity-" });
  const id = suffix();
  const names = [`ident-a-${id}`, `ident-b-${id}`];
  const clients: KubeClient[] = [];
  try {
    for (const name of names) {
      await admin.request("POST", "/api/v1/nodes", {
        apiVersion: "v1",
        kind: "Node",
        metadata: { name },
      });
      const kubeconfig = await podlessNodeKubeconfig(cluster, name, join(dir, name));
      clients.push(await kubeClient(kubeconfig));
    }
    await fn({
      admin,
      controller,
      a: { name: names[0], client: clients[0] },
      b: { name: names[1], client: clients[1] },
    });
  } finally {
    for (const c of clients) c.close();
    for (const name of names) {
      await admin.request("DELETE", `/api/v1/nodes/${name}`).catch(() => {});
    }
    admin.close();
    controller.close();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    await cluster.stop();
  }
}

/** Reads the object at `path` with `reader`, changes it and PUTs it back as `writer`. */
async function update<T extends KubeObject>(
  reader: KubeClient,
  writer: KubeClient,
  path: string,
  mutate: (o: T) => void,
): Promise<T> {
  const object = await reader.request<T>("GET", path);
  mutate(object);
  return await writer.request<T>("PUT", path, object);
}

/** Asserts that `write` is refused with the admission policy's 403 matching `message`. */
async function refused(write: Promise<unknown>, message: RegExp): Promise<void> {
  await assert.rejects(write, (error: unknown) => {
    assert.ok(isApiStatus(error, 403), `a 403, not ${String(error)}`);
    assert.match(error.apiMessage, /virtnode-podless-node/);
    assert.match(error.apiMessage, message);
    return true;
  });
}

/** A VMI placed on `node` by virt-controller, made Running and migratable by that node. */
async function runningVmi(n: Nodes, node: { name: string; client: KubeClient }, name: string) {
  await createVmi(n.controller, testVmi(name, node.name, { placed: true }));
  return await update<VirtualMachineInstance>(n.admin, node.client, vmiPath(NS, name), (v) => {
    v.status = {
      ...v.status,
      phase: "Running",
      nodeName: node.name,
      conditions: [{ type: "LiveMigratable", status: "True" }],
    } as VirtualMachineInstance["status"];
  });
}

async function createVmim(admin: KubeClient, name: string, vmiName: string, target?: string) {
  return await admin.request<VirtualMachineInstanceMigration>("POST", vmimPath(), {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachineInstanceMigration",
    metadata: { name, namespace: NS },
    spec: {
      vmiName,
      ...(target ? { addedNodeSelector: { "kubernetes.io/hostname": target } } : {}),
    },
  });
}

Deno.test("a pod-less node's credential changes its own VMI, migration and Node, not another node's", async () => {
  await withTwoNodes(async (n) => {
    const { a, b } = n;
    const vmiA = `vm-a-${suffix()}`;
    const vmiB = `vm-b-${suffix()}`;
    await runningVmi(n, a, vmiA);
    await runningVmi(n, b, vmiB);

    // Node B's VMI: no status write, no annotation, no taking it over.
    const notItsVmi = new RegExp(`node "${a.name}" may update only the VMIs of its node`);
    await refused(
      update<VirtualMachineInstance>(n.admin, a.client, vmiPath(NS, vmiB), (v) => {
        v.status!.phase = "Failed";
      }),
      notItsVmi,
    );
    await refused(
      update<VirtualMachineInstance>(n.admin, a.client, vmiPath(NS, vmiB), (v) => {
        v.metadata.labels = { ...v.metadata.labels, [NODE_LABEL]: a.name };
      }),
      notItsVmi,
    );
    assert.equal((await getVmi(n.admin, NS, vmiB))!.status!.phase, "Running");

    // Node B's migration, once B drives it.
    const migB = `mig-b-${suffix()}`;
    await createVmim(n.admin, migB, vmiB);
    await update<VirtualMachineInstanceMigration>(
      n.admin,
      b.client,
      `${vmimPath(migB)}/status`,
      (m) => {
        m.status = { ...m.status, phase: "Pending", migrationState: { sourceNode: b.name } };
      },
    );
    const notItsMigration = new RegExp(`node "${a.name}" may write only the migrations it drives`);
    await refused(
      update<VirtualMachineInstanceMigration>(
        n.admin,
        a.client,
        `${vmimPath(migB)}/status`,
        (m) => {
          m.status!.phase = "Failed";
        },
      ),
      notItsMigration,
    );
    await refused(a.client.request("DELETE", vmimPath(migB)), notItsMigration);

    // Node B's Node.
    const patchLabels = (client: KubeClient, node: string) =>
      client.request("PATCH", `/api/v1/nodes/${node}`, {
        metadata: { labels: { "kubevirt.io/schedulable": "false" } },
      }, { contentType: "application/merge-patch+json" });
    await refused(
      patchLabels(a.client, b.name),
      new RegExp(`node "${a.name}" may update only its own Node`),
    );
    // What its roles allow is not enough: an Event in node B's name.
    await refused(
      a.client.request("POST", `/api/v1/namespaces/${NS}/events`, {
        metadata: { name: `forged.${suffix()}` },
        involvedObject: { apiVersion: "v1", kind: "Node", name: b.name },
        reason: "Forged",
        message: "node A speaking for node B",
        type: "Warning",
        source: { component: "virt-handler", host: b.name },
      }),
      new RegExp(`node "${a.name}" may record only its own Events`),
    );

    // Its own: the VMI, a migration of it, its Node.
    await update<VirtualMachineInstance>(n.admin, a.client, vmiPath(NS, vmiA), (v) => {
      v.metadata.annotations = { ...v.metadata.annotations, "test/touched": "yes" };
    });
    const migA = `mig-a-${suffix()}`;
    await createVmim(n.admin, migA, vmiA);
    await update<VirtualMachineInstanceMigration>(
      n.admin,
      a.client,
      `${vmimPath(migA)}/status`,
      (m) => {
        m.status = { ...m.status, phase: "Pending", migrationState: { sourceNode: a.name } };
      },
    );
    await patchLabels(a.client, a.name);
    assert.equal(
      (await getVmi(n.admin, NS, vmiA))!.metadata.annotations!["test/touched"],
      "yes",
    );
  });
});

Deno.test("pod-less mode's writes pass the node policy, and no node moves a VMI to itself", async () => {
  // The writes: placement, a migration's hand-off and its target's take-over.
  await withTwoNodes(async (n) => {
    const { a, b } = n;
    const stop = new AbortController();
    const running: Promise<void>[] = [];
    try {
      // A user's VMI that asks for node A: B may not place it, A's scheduler does.
      const name = `vm-${suffix()}`;
      await createVmi(n.admin, testVmi(name, a.name));
      await refused(
        update<VirtualMachineInstance>(n.admin, b.client, vmiPath(NS, name), (v) => {
          v.metadata.labels = { ...v.metadata.labels, [NODE_LABEL]: b.name };
        }),
        new RegExp(`node "${b.name}" may update only the VMIs of its node`),
      );
      const recorder = new EventRecorder(a.client, { host: a.name });
      const scheduler = new PodlessScheduler(a.client, a.name);
      const migrations = new PodlessMigrations({ nodeName: a.name, client: a.client, recorder });
      running.push(scheduler.run(stop.signal), migrations.run(stop.signal));
      await waitFor("node A's scheduler to place the VMI", async () => {
        const v = await getVmi(n.admin, NS, name);
        return v?.metadata.labels?.[NODE_LABEL] === a.name && v.status?.phase === "Scheduled";
      });

      // Running on A (its handler's status write); B takes VMIs.
      await update<VirtualMachineInstance>(n.admin, a.client, vmiPath(NS, name), (v) => {
        v.status = {
          ...v.status,
          phase: "Running",
          conditions: [{ type: "LiveMigratable", status: "True" }],
        } as VirtualMachineInstance["status"];
      });
      await b.client.request("PATCH", `/api/v1/nodes/${b.name}`, {
        metadata: { labels: { "kubevirt.io/schedulable": "true" } },
      }, { contentType: "application/merge-patch+json" });

      // A's migration controller drives the VMIM to the hand-off: the VMI names B.
      const mig = `mig-${suffix()}`;
      await createVmim(n.admin, mig, name, b.name);
      const handed = await waitFor("the hand-off to node B", async () => {
        const v = await getVmi(n.admin, NS, name);
        return v?.metadata.labels?.[TARGET_LABEL] === b.name ? v : undefined;
      });
      assert.equal(handed.status?.migrationState?.targetNode, b.name);
      const vmim = await n.admin.request<VirtualMachineInstanceMigration>("GET", vmimPath(mig));
      assert.equal(vmim.status?.migrationState?.sourceNode, a.name);

      // The target may not give the VMI to a third node, only take it itself.
      await refused(
        update<VirtualMachineInstance>(n.admin, b.client, vmiPath(NS, name), (v) => {
          v.metadata.labels = { ...v.metadata.labels, [TARGET_LABEL]: "elsewhere" };
        }),
        new RegExp(`node "${b.name}" may not change the spec of .* nor give it to another node`),
      );
      stop.abort();
      await Promise.all(running);
      // The target's take-over (mod/handler/migration_target.ts): the node label and
      // status.nodeName become B's, then the target label goes.
      await update<VirtualMachineInstance>(n.admin, b.client, vmiPath(NS, name), (v) => {
        v.metadata.labels = { ...v.metadata.labels, [NODE_LABEL]: b.name };
        v.status!.nodeName = b.name;
      });
      await update<VirtualMachineInstance>(n.admin, b.client, vmiPath(NS, name), (v) => {
        delete v.metadata.labels![TARGET_LABEL];
      });
      // The VMI is B's now: A can no longer write it.
      await refused(
        update<VirtualMachineInstance>(n.admin, a.client, vmiPath(NS, name), (v) => {
          v.status!.phase = "Failed";
        }),
        new RegExp(`node "${a.name}" may update only the VMIs of its node`),
      );
    } finally {
      stop.abort();
      await Promise.allSettled(running);
    }
  });
});

Deno.test("a pod-less node keeps the VMs placed on it: their VMIs and status, no other node's", async () => {
  // The VM controller's writes (mod/handler/podless/vms.ts) for a VM placed on node A pass
  // as A: its VMI created unplaced, the VM's finalizer and status, the VMI deleted. As B
  // each of them is refused, and so is A's VMI made placed, for B, or without a VM, and
  // a change of a VM's spec.
  await withTwoNodes(async (n) => {
    const name = `vm-${suffix()}`;
    const vmPath = `/apis/kubevirt.io/v1/namespaces/${NS}/virtualmachines/${name}`;
    const template = testVmi(name, n.a.name);
    const vm = await n.admin.request<VirtualMachine>(
      "POST",
      `/apis/kubevirt.io/v1/namespaces/${NS}/virtualmachines`,
      {
        apiVersion: "kubevirt.io/v1",
        kind: "VirtualMachine",
        metadata: { name, namespace: NS },
        spec: { runStrategy: "Halted", template: { spec: template.spec } },
      },
    );
    try {
      const made = await vmiFromVm(vm);
      const create = (client: KubeClient, vmi: VirtualMachineInstance) =>
        client.request("POST", vmiPath(NS), vmi);
      await refused(create(n.b.client, made), /may create only the VMI of a VM placed on it/);
      await refused(
        create(n.a.client, {
          ...made,
          spec: { ...made.spec, nodeSelector: { "kubernetes.io/hostname": n.b.name } },
        }),
        /may create only the VMI of a VM placed on it/,
      );
      await refused(
        create(n.a.client, {
          ...made,
          metadata: { ...made.metadata, labels: { [NODE_LABEL]: n.a.name } },
        }),
        /may create only the VMI of a VM placed on it, unplaced/,
      );
      await refused(
        create(n.a.client, { ...made, metadata: { ...made.metadata, ownerReferences: [] } }),
        /may create only the VMI of a VM placed on it/,
      );
      await create(n.a.client, made);

      // The VM's finalizer and status: A's, not B's; the spec stays A's to keep.
      const addFinalizer = (v: VirtualMachine) => {
        v.metadata.finalizers = ["kubevirt.io/virtualMachineControllerFinalize"];
      };
      await refused(
        update(n.admin, n.b.client, vmPath, addFinalizer),
        /may update only the VMs placed on it/,
      );
      await update(n.admin, n.a.client, vmPath, addFinalizer);
      const setStatus = (v: VirtualMachine) => {
        v.status = { printableStatus: "Starting" };
      };
      await refused(
        update(n.admin, n.b.client, `${vmPath}/status`, setStatus),
        /may update only the VMs placed on it/,
      );
      const written = await update<VirtualMachine>(
        n.admin,
        n.a.client,
        `${vmPath}/status`,
        setStatus,
      );
      assert.equal(written.status?.printableStatus, "Starting");
      await refused(
        update<VirtualMachine>(n.admin, n.a.client, vmPath, (v) => {
          v.spec.runStrategy = "Always";
        }),
        /and not their spec/,
      );
      await refused(
        update<VirtualMachine>(n.admin, n.a.client, vmPath, (v) => {
          v.spec.template.spec.nodeSelector = { "kubernetes.io/hostname": n.b.name };
        }),
        /may update only the VMs placed on it/,
      );

      // The unplaced VMI goes as A's stop, never as B's.
      await refused(
        n.b.client.request("DELETE", vmiPath(NS, name)),
        /may delete only the VMIs of its node/,
      );
      await n.a.client.request("DELETE", vmiPath(NS, name));
    } finally {
      const vmi = await getVmi(n.admin, NS, name);
      if (vmi) {
        await update(n.admin, n.admin, vmiPath(NS, name), (v: VirtualMachineInstance) => {
          v.metadata.finalizers = [];
        }).catch(() => {});
        await n.admin.request("DELETE", vmiPath(NS, name)).catch(() => {});
      }
      await update<VirtualMachine>(n.admin, n.admin, vmPath, (v) => {
        v.metadata.finalizers = [];
      }).catch(() => {});
      await n.admin.request("DELETE", vmPath).catch(() => {});
    }
  });
});

Deno.test("a pod-less node's memory dump writes: the request's volume, its own VMI, the claim's note", async () => {
  // virtctl memory-dump on a pod-less node (mod/handler/podless/vms.ts): the node adds the
  // memory dump volume of the claim its VM's status.memoryDumpRequest names to the VM's
  // template, and a memory dump volume named as its claim to its own running VMI; it
  // annotates the claim with kubevirt.io/memory-dump. Any other change of a spec, another
  // node's VM or VMI, and any other change of the claim are refused.
  await withTwoNodes(async (n) => {
    const name = `dump-${suffix()}`;
    const claim = `${name}-claim`;
    const vmPath = `/apis/kubevirt.io/v1/namespaces/${NS}/virtualmachines/${name}`;
    const pvcPath = `/api/v1/namespaces/${NS}/persistentvolumeclaims/${claim}`;
    const template = testVmi(name, n.a.name);
    await n.admin.request("POST", `/apis/kubevirt.io/v1/namespaces/${NS}/virtualmachines`, {
      apiVersion: "kubevirt.io/v1",
      kind: "VirtualMachine",
      metadata: { name, namespace: NS },
      spec: { runStrategy: "Halted", template: { spec: template.spec } },
    });
    await n.admin.request("POST", `/api/v1/namespaces/${NS}/persistentvolumeclaims`, {
      apiVersion: "v1",
      kind: "PersistentVolumeClaim",
      metadata: { name: claim, namespace: NS, annotations: { owner: "test" } },
      spec: { accessModes: ["ReadWriteOnce"], resources: { requests: { storage: "1Gi" } } },
    });
    const dumpVolume = (claimName: string, volumeName = claimName) => ({
      name: volumeName,
      memoryDump: { claimName, hotpluggable: true },
    });
    try {
      // virt-api's part: the request in the VM's status.
      await update<VirtualMachine>(n.admin, n.admin, `${vmPath}/status`, (v) => {
        v.status = { memoryDumpRequest: { claimName: claim, phase: "Associating" } };
      });
      const addToTemplate = (volume: ReturnType<typeof dumpVolume>) => (v: VirtualMachine) => {
        v.spec.template.spec.volumes = [...v.spec.template.spec.volumes ?? [], volume];
      };
      await refused(
        update(n.admin, n.b.client, vmPath, addToTemplate(dumpVolume(claim))),
        /may update only the VMs placed on it/,
      );
      await refused(
        update(n.admin, n.a.client, vmPath, addToTemplate(dumpVolume("another-claim"))),
        /and not their spec/,
      );
      await refused(
        update<VirtualMachine>(n.admin, n.a.client, vmPath, (v) => {
          addToTemplate(dumpVolume(claim))(v);
          v.spec.template.spec.domain.memory = { guest: "2Gi" };
        }),
        /and not their spec/,
      );
      await refused(
        update<VirtualMachine>(n.admin, n.a.client, vmPath, (v) => {
          v.spec.template.spec.volumes = [
            ...v.spec.template.spec.volumes ?? [],
            { name: claim, persistentVolumeClaim: { claimName: claim } },
          ];
        }),
        /and not their spec/,
      );
      const withDump = await update(n.admin, n.a.client, vmPath, addToTemplate(dumpVolume(claim)));
      assert.ok(
        withDump.spec.template.spec.volumes?.some((v) => v.memoryDump?.claimName === claim),
      );
      // ... and out again (the request's dissociation).
      await update<VirtualMachine>(n.admin, n.a.client, vmPath, (v) => {
        v.spec.template.spec.volumes = v.spec.template.spec.volumes?.filter((x) => !x.memoryDump);
      });

      // The VMI: A's own running one takes a memory dump volume named as its claim; B's
      // patch of it, another volume, or a misnamed dump volume is refused.
      const vmi = `${name}-vmi`;
      await runningVmi(n, n.a, vmi);
      const patchVolumes = (client: KubeClient, volumes: unknown[]) =>
        client.request("PATCH", vmiPath(NS, vmi), [
          { op: "add", path: "/spec/volumes", value: volumes },
        ], { contentType: "application/json-patch+json" });
      const before = (await getVmi(n.admin, NS, vmi))!.spec.volumes ?? [];
      await refused(
        patchVolumes(n.b.client, [...before, dumpVolume(claim)]),
        /may update only the VMIs of its node/,
      );
      await refused(
        patchVolumes(n.a.client, [...before, dumpVolume(claim, "not-the-claim")]),
        /may not change the spec/,
      );
      await refused(
        patchVolumes(n.a.client, [...before, { name: "x", emptyDisk: { capacity: "1Mi" } }]),
        /may not change the spec/,
      );
      await patchVolumes(n.a.client, [...before, dumpVolume(claim)]);
      const patched = await getVmi(n.admin, NS, vmi);
      assert.ok(patched?.spec.volumes?.some((v) => v.memoryDump?.claimName === claim));
      await patchVolumes(n.a.client, before);

      // The claim: its memory dump annotation only.
      const annotate = (client: KubeClient, annotations: Record<string, string>) =>
        client.request("PATCH", pvcPath, { metadata: { annotations } }, {
          contentType: "application/merge-patch+json",
        });
      await refused(annotate(n.a.client, { owner: "node" }), /kubevirt.io\/memory-dump/);
      await refused(
        n.a.client.request("PATCH", pvcPath, { metadata: { labels: { x: "y" } } }, {
          contentType: "application/merge-patch+json",
        }),
        /kubevirt.io\/memory-dump annotation of a claim/,
      );
      await annotate(n.a.client, { "kubevirt.io/memory-dump": "vm-dump.memory.dump" });
      const pvc = await n.admin.request<KubeObject>("GET", pvcPath);
      assert.equal(pvc.metadata?.annotations?.["kubevirt.io/memory-dump"], "vm-dump.memory.dump");
      assert.equal(pvc.metadata?.annotations?.owner, "test");
    } finally {
      for (const path of [vmiPath(NS, `${name}-vmi`), vmPath]) {
        await update<KubeObject>(n.admin, n.admin, path, (v) => {
          v.metadata!.finalizers = [];
        }).catch(() => {});
        await n.admin.request("DELETE", path).catch(() => {});
      }
      await n.admin.request("DELETE", pvcPath).catch(() => {});
    }
  });
});

Deno.test("a pod-less node's live CPU and memory change: its own VMI's sockets and guest memory only", async () => {
  // A VM's live update (mod/handler/podless/vms.ts) patches the running VMI's CPU sockets
  // and guest memory; the node may do that to a VMI of its own, and nothing else of the
  // domain: B may not, and A may not change the cores or the memory's maximum.
  await withTwoNodes(async (n) => {
    const name = `live-${suffix()}`;
    const vmi = testVmi(name, n.a.name, { placed: true });
    vmi.spec.domain.cpu = { sockets: 1, cores: 1, threads: 1, maxSockets: 2 };
    vmi.spec.domain.memory = { guest: "128Mi", maxGuest: "256Mi" };
    await createVmi(n.controller, vmi);
    try {
      await update<VirtualMachineInstance>(n.admin, n.a.client, vmiPath(NS, name), (v) => {
        v.status = { ...v.status, phase: "Running", nodeName: n.a.name };
      });
      const patch = (client: KubeClient, ops: unknown[]) =>
        client.request("PATCH", vmiPath(NS, name), ops, {
          contentType: "application/json-patch+json",
        });
      const sockets = [
        { op: "test", path: "/spec/domain/cpu/sockets", value: 1 },
        { op: "replace", path: "/spec/domain/cpu/sockets", value: 2 },
      ];
      await refused(patch(n.b.client, sockets), /may update only the VMIs of its node/);
      await refused(
        patch(n.a.client, [{ op: "replace", path: "/spec/domain/cpu/cores", value: 2 }]),
        /may not change the spec/,
      );
      await refused(
        patch(n.a.client, [{ op: "replace", path: "/spec/domain/memory/maxGuest", value: "1Gi" }]),
        /may not change the spec/,
      );
      await patch(n.a.client, sockets);
      await patch(n.a.client, [
        { op: "test", path: "/spec/domain/memory/guest", value: "128Mi" },
        { op: "replace", path: "/spec/domain/memory/guest", value: "192Mi" },
      ]);
      const after = await getVmi(n.admin, NS, name);
      assert.equal(after?.spec.domain.cpu?.sockets, 2);
      assert.equal(after?.spec.domain.memory?.guest, "192Mi");
    } finally {
      await update<KubeObject>(n.admin, n.admin, vmiPath(NS, name), (v) => {
        v.metadata!.finalizers = [];
      }).catch(() => {});
      await n.admin.request("DELETE", vmiPath(NS, name)).catch(() => {});
    }
  });
});

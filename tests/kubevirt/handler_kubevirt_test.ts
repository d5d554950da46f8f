/**
 * virtnode's handler against KubeVirt's own CRDs and admission (virt-api's webhooks,
 * built from kubevirt.io/kubevirt): a user creates a VMI the way KubeVirt users do, and
 * the handler — with the identity of one of KubeVirt's service accounts, as KubeVirt's
 * admission requires of whoever places VMIs and writes their status — runs it.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { type Cluster, KUBEVIRT_NAMESPACE, startCluster } from "../../deploy/cluster/cluster.ts";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { StatusDroppedError, StatusWriter } from "../../mod/kube/mod.ts";
import {
  createVmi,
  deleteVmi,
  getVmi,
  killLaunchers,
  kubeClient,
  startHandlerProcess,
  waitFor,
  waitForPhase,
} from "../helpers/handler_process.ts";

async function kubectl(cluster: Cluster, ...args: string[]): Promise<string> {
  const output = await new Deno.Command("kubectl", {
    args: ["--kubeconfig", cluster.kubeconfigPath, ...args],
    stdin: "null",
  }).output();
  const text = new TextDecoder().decode(output.stdout) + new TextDecoder().decode(output.stderr);
  if (!output.success) throw new Error(`kubectl ${args.join(" ")}: ${text}`);
  return text;
}

interface AuditEvent {
  verb: string;
  user: { username: string };
  objectRef?: { resource?: string; subresource?: string; name?: string; namespace?: string };
  responseStatus?: { code?: number };
}

async function auditEvents(cluster: Cluster): Promise<AuditEvent[]> {
  const text = await Deno.readTextFile(cluster.auditLogPath!);
  return text.split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l));
}

/** A VMI as a KubeVirt user writes it: placed with a node selector, no reserved labels. */
function userVmi(name: string, node: string): VirtualMachineInstance {
  return {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachineInstance",
    metadata: { name, namespace: "default" },
    spec: {
      terminationGracePeriodSeconds: 0,
      nodeSelector: { "kubernetes.io/hostname": node },
      domain: {
        memory: { guest: "64Mi" },
        devices: { autoattachPodInterface: false, autoattachGraphicsDevice: false },
      },
    },
  } as VirtualMachineInstance;
}

Deno.test("KubeVirt's admission refuses what a user may not do, and the VMI CRD is KubeVirt's", async () => {
  const cluster = await startCluster({ admission: true });
  try {
    const crd = JSON.parse(
      await kubectl(cluster, "get", "crd", "virtualmachineinstances.kubevirt.io", "-o", "json"),
    );
    for (const version of crd.spec.versions) {
      assert.equal(version.subresources, undefined, `${version.name} has no subresources`);
    }
    const labelled = join(cluster.dir, "labelled.json");
    const vmi = userVmi("labelled", "node-x");
    vmi.metadata.labels = { "kubevirt.io/nodeName": "node-x" };
    await Deno.writeTextFile(labelled, JSON.stringify(vmi));
    await assert.rejects(
      kubectl(cluster, "create", "--dry-run=server", "-f", labelled),
      /reserved kubevirt\.io\/ labels/,
    );
    const slirp = userVmi("slirp", "node-x");
    slirp.spec.domain.devices = { interfaces: [{ name: "default", slirp: {} }] } as never;
    slirp.spec.networks = [{ name: "default", pod: {} }];
    await Deno.writeTextFile(labelled, JSON.stringify(slirp));
    await assert.rejects(
      kubectl(cluster, "create", "--dry-run=server", "-f", labelled),
      /Slirp interface support has been discontinued/,
    );
    // What users create is defaulted the way virt-api defaults it.
    await Deno.writeTextFile(labelled, JSON.stringify(userVmi("plain", "node-x")));
    const defaulted = JSON.parse(
      await kubectl(cluster, "create", "--dry-run=server", "-o", "json", "-f", labelled),
    );
    assert.equal(defaulted.spec.domain.cpu.maxSockets > 0, true, "virt-api set maxSockets");
    assert.equal(defaulted.spec.domain.machine.type, "q35");

    // virt-api puts back the status a non-KubeVirt user writes; the writer says so.
    const admin = await kubeClient(cluster.kubeconfigPath);
    const controller = await kubeClient(cluster.handlerKubeconfigPath);
    try {
      const created = await createVmi(admin, userVmi("status-writes", "node-x"));
      const asUser = new StatusWriter<
        NonNullable<VirtualMachineInstance["status"]>,
        VirtualMachineInstance
      >(
        admin,
        { groupVersionPath: "/apis/kubevirt.io/v1", plural: "virtualmachineinstances" },
      );
      await assert.rejects(
        asUser.update(created, (s) => void (s.reason = "written by a user")),
        (error: unknown) =>
          error instanceof StatusDroppedError &&
          /KubeVirt's own service accounts/.test(error.message),
      );
      const asController = new StatusWriter<
        NonNullable<VirtualMachineInstance["status"]>,
        VirtualMachineInstance
      >(controller, {
        groupVersionPath: "/apis/kubevirt.io/v1",
        plural: "virtualmachineinstances",
      });
      const written = await asController.update(
        created,
        (s) => void (s.reason = "written by virt-controller"),
      );
      assert.equal(written.object.status?.reason, "written by virt-controller");
    } finally {
      admin.close();
      controller.close();
    }
  } finally {
    await cluster.stop();
  }
});

Deno.test("pod-less handler under KubeVirt's admission runs a user's VMI, never writing /status", async () => {
  // KubeVirt's CRD is installed too. The VMI is placed and runs,
  // and its status is written by updating the whole object.
  const cluster = await startCluster({ admission: true });
  const node = `kv-${crypto.randomUUID().slice(0, 8)}`;
  const admin = await kubeClient(cluster.kubeconfigPath);
  // The handler runs as virt-controller's service account: pod-less mode stands in for
  // virt-controller, and KubeVirt's admission lets only KubeVirt's own service accounts
  // place VMIs and write their status (the cluster made its kubeconfig).
  const kubeconfig = cluster.handlerKubeconfigPath;
  const h = await startHandlerProcess({
    kubeconfig,
    nodeName: node,
    libvirtUri: "test:///default",
    noWait: true,
  });
  let ok = false;
  try {
    await waitFor("the handler to be ready", async () => {
      const r = await fetch(`${h.health}/readyz`).catch(() => undefined);
      await r?.body?.cancel();
      return r?.status === 200;
    });
    await createVmi(admin, userVmi("placed", node));
    await createVmi(admin, userVmi("elsewhere", `${node}-other`));
    const running = await waitForPhase(admin, "default", "placed", "Running");
    assert.equal(running.metadata.labels?.["kubevirt.io/nodeName"], node);
    assert.equal(running.status?.nodeName, node);
    assert.ok((running.spec.domain.cpu?.maxSockets ?? 0) > 0, "virt-api's defaults were kept");
    const conditions = Object.fromEntries(
      (running.status?.conditions ?? []).map((c) => [c.type, c]),
    );
    // virt-api's host-model CPU on a node whose labeller found no host model (libvirt's
    // test driver): KubeVirt's reason.
    assert.equal(conditions.LiveMigratable?.status, "False");
    assert.equal(conditions.LiveMigratable?.reason, "CPUModeLiveMigratable");
    assert.equal(conditions.StorageLiveMigratable?.status, "False");
    const other = await getVmi(admin, "default", "elsewhere");
    assert.equal(other?.metadata.labels?.["kubevirt.io/nodeName"], undefined, "not ours");

    const events = await auditEvents(cluster);
    const vmiWrites = events.filter((e) =>
      e.objectRef?.resource === "virtualmachineinstances" &&
      ["update", "patch"].includes(e.verb) &&
      e.user.username === `system:serviceaccount:${KUBEVIRT_NAMESPACE}:kubevirt-controller`
    );
    assert.ok(vmiWrites.length >= 2, `the handler wrote the VMI (${vmiWrites.length} writes)`);
    assert.deepEqual(
      vmiWrites.filter((e) => e.objectRef?.subresource !== undefined),
      [],
      "no write went to a subresource",
    );
    assert.ok(vmiWrites.every((e) => e.verb === "update" && e.responseStatus?.code === 200));
    console.log(`  ${vmiWrites.length} whole-VMI updates by the handler, none to /status`);

    // virt-api put its finalizer on the VMI; pod-less mode takes it off when the VMI is
    // final and its domain gone, as virt-controller does, so the VMI goes away.
    assert.deepEqual(running.metadata.finalizers, ["kubevirt.io/foregroundDeleteVirtualMachine"]);
    await deleteVmi(admin, "default", "placed");
    await waitFor("the deleted VMI to be gone", async () => {
      return (await getVmi(admin, "default", "placed")) === undefined ? true : undefined;
    });
    ok = true;
  } finally {
    if (!ok) console.error(`handler log:\n${(await Deno.readTextFile(h.logFile)).slice(-6000)}`);
    await h.kill("SIGTERM");
    killLaunchers(h.stateDir);
    admin.close();
    await Deno.remove(h.dir, { recursive: true }).catch(() => {});
    await cluster.stop();
  }
});

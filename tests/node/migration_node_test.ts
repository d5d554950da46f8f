/**
 * Live migration on a cluster of two real nodes: two kubelets and containerds on this
 * machine, each node isolated in a mount namespace of its own (its own `/var/lib/kubelet`,
 * `/var/run/kubevirt`, `/var/lib/virtnode`: `startNode({ isolated: true })`), KubeVirt's
 * virt-api and virt-controller, KubeVirt's own virt-launcher image, and virtnode's DaemonSet
 * applied as shipped (only its image is this machine's). A VMIM is created as a user writes
 * one; virt-controller creates the target launcher pod on the other
 * node and hands the VMI to it; virtnode's handlers prepare the target, carry the migration
 * through their mutual-TLS proxy between the two handler pods, and hand the VMI over. The
 * test guest keeps its boot and answers HTTP on its new pod IP.
 */
import { buildKubevirtPeers } from "../harness/kubevirt/peers.ts";
import assert from "node:assert/strict";
import { join } from "node:path";
import { kubectl, startCluster } from "../../deploy/cluster/cluster.ts";
import { launcherImage, type Node, startNode, virtnodeImage } from "../harness/node/node.ts";
import { startKubevirt } from "../harness/node/kubevirt.ts";
import { cpuModelFor, offered, userVmi, virtnodeDaemonSet } from "../harness/node/daemonsets.ts";
import { ensureLibvirtd } from "../helpers/libvirtd.ts";
import { kubeClient, waitFor } from "../helpers/handler_process.ts";
import { nodeApi, type NodeObject, podReady, stepper } from "../helpers/node_api.ts";
import { httpGet, TEST_KERNEL_BOOT, testKernelOciArchive } from "../helpers/guest.ts";

const REPO = new URL("../../", import.meta.url).pathname;

async function guestBoot(ip: string): Promise<{ bootId: string; uptime: number } | undefined> {
  const bootId = (await httpGet(`http://${ip}/boot_id`))?.trim();
  const uptime = Number((await httpGet(`http://${ip}/cgi-bin/uptime`))?.trim());
  return bootId && Number.isFinite(uptime) ? { bootId, uptime } : undefined;
}

Deno.test("node: KubeVirt's virt-controller migrates a running guest between two kubelets' nodes", async () => {
  // The migration goes through virtnode's handlers and KubeVirt's launcher pods.
  const libvirtUri = await ensureLibvirtd();
  assert.equal(libvirtUri, "qemu:///system", "the DaemonSet's labeller reads the host's libvirtd");
  const cluster = await startCluster({ podNetwork: true });
  const kc = cluster.kubeconfigPath;
  const admin = await kubeClient(kc);
  const nodes: Node[] = [];
  let kubevirt: Awaited<ReturnType<typeof startKubevirt>> | undefined;
  let ok = false;
  const step = stepper();
  const { getVmi, pods } = nodeApi(admin);
  const ready = podReady;
  try {
    nodes.push(await startNode(cluster, { isolated: true }));
    nodes.push(await startNode(cluster, { isolated: true, clusterServices: false }));
    const launcher = await launcherImage();
    const handlerImage = await virtnodeImage();
    const kernel = await testKernelOciArchive();
    for (const node of nodes) {
      await node.importImage(launcher.archive);
      await node.importImage(handlerImage.archive);
      await node.importImage(kernel);
    }
    step("two nodes Ready, images imported into both");
    kubevirt = await startKubevirt(cluster, {
      kubevirtDir: await buildKubevirtPeers(),
      launcherImage: launcher.name,
    });
    await kubectl(kc, ["apply", "-f", join(REPO, "deploy/rbac.yaml")]);
    await kubectl(kc, ["apply", "-f", "-"], await virtnodeDaemonSet(handlerImage.name));
    await waitFor("a Ready handler pod on each node", async () => {
      const handlers = (await pods("kubevirt.io=virt-handler", "kubevirt")).filter(ready);
      return new Set(handlers.map((p) => p.spec.nodeName)).size === 2;
    }, 240_000);
    let labelled: NodeObject | undefined;
    for (const node of nodes) {
      labelled = await waitFor(`${node.name} schedulable with its devices`, async () => {
        const n = await admin.request<NodeObject>("GET", `/api/v1/nodes/${node.name}`);
        return n.metadata.labels["kubevirt.io/schedulable"] === "true" &&
            offered(n.status.allocatable["devices.kubevirt.io/tun"])
          ? n
          : undefined;
      }, 120_000);
    }
    step("virtnode's DaemonSet Ready on both nodes, both take VMIs");

    // The test guest booted from its kernel and initramfs (a kernel boot container): no
    // disk, so a live migration proper, not a block migration (KubeVirt 1.7's launcher asks
    // libvirt for `migrate_disks_detect_zeroes`, which Debian 12's libvirt 9.0 lacks).
    const vmi = userVmi("vm-mig", cpuModelFor(labelled!));
    const spec = {
      ...vmi,
      spec: {
        ...vmi.spec,
        domain: {
          ...vmi.spec.domain,
          memory: { guest: "128Mi" },
          devices: { interfaces: [{ name: "default", masquerade: {} }] },
          firmware: { kernelBoot: TEST_KERNEL_BOOT },
        },
        networks: [{ name: "default", pod: {} }],
      },
    };
    await kubectl(kc, ["apply", "-f", "-"], JSON.stringify(spec));
    const running = await waitFor("vm-mig Running with its pod IP", async () => {
      const v = await getVmi("vm-mig");
      return v?.status?.phase === "Running" && v.status.interfaces?.[0]?.ipAddress ? v : undefined;
    }, 240_000);
    const source = running.status!.nodeName!;
    const ip = running.status!.interfaces![0].ipAddress!;
    const before = await waitFor(`the guest's HTTP on ${ip}`, () => guestBoot(ip), 300_000, 1_000);
    const live = await waitFor(
      "vm-mig LiveMigratable",
      async () =>
        (await getVmi("vm-mig"))?.status?.conditions?.find((c) => c.type === "LiveMigratable"),
      60_000,
    );
    assert.equal(live.status, "True", JSON.stringify(live));
    step(`vm-mig Running on ${source}, its guest answering on ${ip}`);

    // A VirtualMachineInstanceMigration, as a user writes it (virtctl migrate names VMs, not
    // VMIs): KubeVirt's controller and virtnode's handlers do the rest.
    const started = performance.now();
    await kubectl(
      kc,
      ["create", "-f", "-"],
      JSON.stringify({
        apiVersion: "kubevirt.io/v1",
        kind: "VirtualMachineInstanceMigration",
        metadata: { name: "vm-mig-move", namespace: "default" },
        spec: { vmiName: "vm-mig" },
      }),
    );
    const vmim = await waitFor(
      "the migration to end",
      async () => {
        const list = await admin.request<{ items: { status?: { phase?: string } }[] }>(
          "GET",
          "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstancemigrations",
        );
        const m = list.items[0];
        return m?.status?.phase === "Succeeded" || m?.status?.phase === "Failed" ? m : undefined;
      },
      300_000,
      500,
    );
    assert.equal(vmim.status?.phase, "Succeeded", JSON.stringify(vmim.status));
    const moved = await waitFor(
      "vm-mig on the other node",
      async () => {
        const v = await getVmi("vm-mig");
        return v?.status?.nodeName !== source && v?.status?.migrationState?.completed &&
            v.status.interfaces?.[0]?.ipAddress && v.status.interfaces[0].ipAddress !== ip
          ? v
          : undefined;
      },
      60_000,
      500,
    );
    const target = moved.status!.nodeName!;
    assert.equal(moved.metadata.labels?.["kubevirt.io/nodeName"], target);
    const newIp = moved.status!.interfaces![0].ipAddress!;
    step(
      `migrated ${source} -> ${target} in ${
        ((performance.now() - started) / 1000).toFixed(1)
      } s (VMIM created to Succeeded); pod IP ${ip} -> ${newIp}`,
    );
    const after = await waitFor(
      `the guest's HTTP on ${newIp}`,
      () => guestBoot(newIp),
      60_000,
      500,
    );
    assert.equal(after.bootId, before.bootId, "the same boot: the guest moved");
    assert.ok(after.uptime > before.uptime);
    const launchers = await pods(`kubevirt.io/created-by=${running.metadata.uid}`);
    const onTarget = launchers.find((p) => p.spec.nodeName === target);
    assert.equal(onTarget?.status?.phase, "Running", "the target launcher pod runs the guest");
    await waitFor(
      "the source launcher pod to finish",
      async () => {
        const p = (await pods(`kubevirt.io/created-by=${running.metadata.uid}`))
          .find((p) => p.spec.nodeName === source);
        return !p || p.status?.phase === "Succeeded";
      },
      120_000,
      1_000,
    );
    step("the source's launcher pod done, the target's runs the guest");

    await kubectl(kc, ["delete", "vmi", "vm-mig", "--wait=true", "--timeout=120s"]);
    ok = true;
  } finally {
    if (!ok) {
      for (const node of nodes) console.log(await node.complaints());
      for (
        const args of [
          ["get", "vmim", "-o", "yaml"],
          ["get", "pods", "-A", "-o", "wide"],
          ["get", "events", "-A"],
          ["get", "vmi", "-o", "yaml"],
        ]
      ) {
        console.log(await kubectl(kc, args).catch((e) => String(e)));
      }
      const logs = await kubectl(kc, [
        "logs",
        "-n",
        "kubevirt",
        "-l",
        "kubevirt.io=virt-handler",
        "--tail=60",
        "--prefix",
      ]).catch((e) => String(e));
      console.log(logs);
      if (kubevirt) console.log(await kubevirt.complaints());
    }
    await kubevirt?.stop();
    for (const node of nodes.reverse()) await node.stop();
    await cluster.stop();
  }
});

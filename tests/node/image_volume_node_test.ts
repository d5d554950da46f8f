/**
 * KubeVirt's `ImageVolume` gate on a real node, end to end. With the gate on,
 * virt-controller gives a launcher pod each containerDisk as a Kubernetes image volume (the
 * kubelet and containerd 2 mount the image; no container-disk server, no socket), and the
 * handler must neither wait for a container-disk socket nor mount anything. The gate is
 * turned on in the KubeVirt CR while virtnode runs, as an operator does: virtnode follows the
 * change without a restart.
 *
 * The node runs containerd 2 built from the Go module proxy (Debian 12's 1.6 cannot mount an
 * image as a volume), with KubeVirt's own virt-api, virt-controller and launcher image, and
 * virtnode's DaemonSet as shipped.
 */
import { buildKubevirtPeers } from "../harness/kubevirt/peers.ts";
import assert from "node:assert/strict";
import { join } from "node:path";
import { kubectl, startCluster } from "../../deploy/cluster/cluster.ts";
import { launcherImage, startNode, virtnodeImage } from "../harness/node/node.ts";
import { startKubevirt } from "../harness/node/kubevirt.ts";
import {
  cpuModelFor,
  DAEMONSET_NAMES,
  virtnodeDaemonSet,
  virtnodeDirs,
} from "../harness/node/daemonsets.ts";
import { ensureLibvirtd } from "../helpers/libvirtd.ts";
import { kubeClient, waitFor } from "../helpers/handler_process.ts";
import { networkVmi, nodeApi, type NodeObject, podReady, stepper } from "../helpers/node_api.ts";
import { GUEST_IMAGE, httpGet, parseLease, testGuestOciArchive } from "../helpers/guest.ts";

const REPO = new URL("../../", import.meta.url).pathname;

interface PodVolume {
  name: string;
  image?: { reference?: string };
}

Deno.test("node: ImageVolume turned on in the CR while virtnode runs: the guest boots from an image volume", async () => {
  // KubeVirt's ImageVolume gate changes live; the containerDisk then arrives as an image volume.
  await ensureLibvirtd();
  const cluster = await startCluster({ podNetwork: true });
  const kc = cluster.kubeconfigPath;
  const admin = await kubeClient(kc);
  const node = await startNode(cluster, { containerd: "v2" });
  let kubevirt: Awaited<ReturnType<typeof startKubevirt>> | undefined;
  let ok = false;
  const step = stepper();
  const { getVmi, pods } = nodeApi(admin);
  const handlerPods = () => pods("kubevirt.io=virt-handler", "kubevirt");
  try {
    const launcher = await launcherImage();
    const handlerImage = await virtnodeImage();
    await node.importImage(launcher.archive);
    await node.importImage(handlerImage.archive);
    await node.importImage(await testGuestOciArchive());
    step("node Ready on containerd 2, images imported");
    kubevirt = await startKubevirt(cluster, {
      kubevirtDir: await buildKubevirtPeers(),
      launcherImage: launcher.name,
    });
    await kubectl(kc, ["apply", "-f", join(REPO, "deploy/rbac.yaml")]);
    await kubectl(
      kc,
      ["apply", "-f", "-"],
      await virtnodeDaemonSet(handlerImage.name, launcher.name, virtnodeDirs(node)),
    );
    const [handlerPod] = await waitFor("virtnode's pod Ready", async () => {
      const found = await handlerPods();
      return found[0] && podReady(found[0]) ? found : undefined;
    }, 180_000);
    const labelled = await waitFor("the node schedulable", async () => {
      const n = await admin.request<NodeObject>("GET", `/api/v1/nodes/${node.name}`);
      return n.metadata.labels["kubevirt.io/schedulable"] === "true" ? n : undefined;
    }, 120_000);
    step("virtnode's DaemonSet pod Ready, node schedulable");

    // The gate on, as an operator turns it on: virtnode applies the CR's new version live.
    const patched = JSON.parse(
      await kubectl(kc, [
        "patch",
        "kubevirt",
        "kubevirt",
        "-n",
        "kubevirt",
        "--type",
        "json",
        "-p",
        JSON.stringify([{
          op: "add",
          path: "/spec/configuration/developerConfiguration/featureGates/-",
          value: "ImageVolume",
        }]),
        "-o",
        "json",
      ]),
    );
    const version = patched.metadata.resourceVersion as string;
    await waitFor(`virtnode applying the KubeVirt CR at version ${version}`, async () => {
      const log = await kubectl(kc, ["logs", "-n", "kubevirt", handlerPod.metadata.name]);
      return log.includes(`resource version '${version}'`);
    }, 60_000);
    step(`ImageVolume on in the CR; virtnode applied version ${version} without a restart`);

    const created = performance.now();
    // The test guest's containerDisk, its interface on the pod network (masquerade).
    await kubectl(
      kc,
      ["apply", "-f", "-"],
      JSON.stringify(networkVmi("vm-image", cpuModelFor(labelled), "masquerade")),
    );
    const running = await waitFor("vm-image Running with its pod IP", async () => {
      const v = await getVmi("vm-image");
      return v?.status?.phase === "Running" && v.status.interfaces?.[0]?.ipAddress ? v : undefined;
    }, 240_000);
    step(`vm-image Running ${((performance.now() - created) / 1000).toFixed(1)} s after apply`);
    const [pod] = await pods(`kubevirt.io/created-by=${running.metadata.uid}`);
    const volumes = (pod.spec as unknown as { volumes?: PodVolume[] }).volumes ?? [];
    assert.equal(
      volumes.find((v) => v.name === "boot")?.image?.reference,
      GUEST_IMAGE,
      `virt-controller rendered the containerDisk as an image volume: ${JSON.stringify(volumes)}`,
    );
    const containers = (pod.spec as unknown as { containers: { name: string }[] }).containers;
    assert.ok(
      !containers.some((c) => c.name.startsWith("volume")),
      `no container-disk server container: ${containers.map((c) => c.name)}`,
    );
    const ip = running.status!.interfaces![0].ipAddress!;
    const text = await waitFor(
      `vm-image's guest answering HTTP on ${ip}`,
      () => httpGet(`http://${ip}/dhcp`),
      240_000,
      1_000,
    );
    assert.equal(parseLease(text).hostname, "vm-image");
    step(`vm-image booted from its image volume, HTTP answered on ${ip}`);
    const log = await kubectl(kc, ["logs", "-n", "kubevirt", handlerPod.metadata.name]);
    assert.doesNotMatch(log, /container-?disk.*(socket|not ready)/i, "no wait for a disk socket");

    await kubectl(kc, ["delete", "vmi", "vm-image", "--wait=true", "--timeout=120s"]);
    await waitFor("vm-image's pod gone", async () => {
      return (await pods(`kubevirt.io/created-by=${running.metadata.uid}`)).length === 0;
    }, 120_000);
    step("vm-image deleted, its pod gone");
    ok = true;
  } finally {
    if (!ok) {
      for (const p of await handlerPods().catch(() => [])) {
        const log = await kubectl(kc, ["logs", "-n", "kubevirt", p.metadata.name])
          .catch((e) => String(e));
        console.error(`--- ${p.metadata.name}:\n${log.split("\n").slice(-40).join("\n")}`);
      }
      if (kubevirt) console.error(await kubevirt.complaints());
      console.error(await node.complaints());
    }
    await kubectl(kc, [
      "delete",
      "daemonset",
      "-n",
      "kubevirt",
      DAEMONSET_NAMES.virtnode,
      "--wait=true",
    ]).catch(() => {});
    await kubevirt?.stop();
    await node.stop();
    admin.close();
    await cluster.stop();
  }
});

/**
 * Secondary networks in KubeVirt mode on a real node whose pod network is chained through
 * Multus's thin plugin: two VMIs on the pod network and two bridge NetworkAttachmentDefinitions
 * (Linux bridges of the node, no IPAM), created through KubeVirt's admission, with
 * virt-controller and KubeVirt's virt-launcher, and virtnode as the node's handler. Multus
 * plugs each network into the launcher pod under KubeVirt's hashed name, virtnode builds the
 * bridge binding there, and the guests take static addresses from cloud-init (no DHCP on
 * secondaries, as in KubeVirt). Each guest reaches the node and the other guest on both
 * networks; `status.interfaces` has KubeVirt's pod interface names, `multus-status` in
 * `infoSource` and the guest agent's addresses.
 *
 * KubeVirt's own virt-handler cannot be the yardstick here: its bridge binding keeps the pod
 * interface's place with a `dummy` link, which this kernel does not have (docs/testing.md).
 */
import { buildKubevirtPeers } from "../harness/kubevirt/peers.ts";
import assert from "node:assert/strict";
import { join } from "node:path";
import { kubectl, startCluster } from "../../deploy/cluster/cluster.ts";
import { buildVirtctl } from "../../deploy/kubevirt/virtctl.ts";
import { launcherImage, startNode, virtnodeImage } from "../harness/node/node.ts";
import { startKubevirt } from "../harness/node/kubevirt.ts";
import { cpuModelFor, virtnodeDaemonSet, virtnodeDirs } from "../harness/node/daemonsets.ts";
import { ensureLibvirtd } from "../helpers/libvirtd.ts";
import { kubeClient, waitFor } from "../helpers/handler_process.ts";
import { httpGet, testGuestOciArchive } from "../helpers/guest.ts";
import { consoleAnswers } from "../helpers/virtctl.ts";
import { networkVmi, nodeApi, type NodeObject, podReady, stepper } from "../helpers/node_api.ts";
import { hashedPodInterfaceName } from "../../mod/network/mod.ts";
import {
  echoedCaller,
  guestMac,
  networkAttachment,
  type NodeBridges,
  nodeBridges,
  secondaryNetworks,
  withSecondaryNetworks,
} from "../helpers/secondary_networks.ts";

const REPO = new URL("../../", import.meta.url).pathname;

Deno.test("node: pod network and two Multus bridge networks: the guest reaches the node and another VM on each", async () => {
  await ensureLibvirtd();
  const cluster = await startCluster({ podNetwork: true });
  const kc = cluster.kubeconfigPath;
  const admin = await kubeClient(kc);
  const node = await startNode(cluster, { multus: true });
  const nets = secondaryNetworks(crypto.randomUUID().slice(0, 6));
  let kubevirt: Awaited<ReturnType<typeof startKubevirt>> | undefined;
  let bridges: NodeBridges | undefined;
  let ok = false;
  const step = stepper();
  const { getVmi, pods } = nodeApi(admin);
  try {
    const launcher = await launcherImage();
    const handlerImage = await virtnodeImage();
    await node.importImage(launcher.archive);
    await node.importImage(handlerImage.archive);
    await node.importImage(await testGuestOciArchive());
    // The node's side of each network: a bridge with an address, and a web server on it.
    bridges = await nodeBridges(nets);
    const ports = bridges.ports;
    for (const n of nets) {
      await kubectl(kc, ["apply", "-f", "-"], JSON.stringify(networkAttachment(n, "default")));
    }
    step("node Ready with Multus, bridges and NetworkAttachmentDefinitions");
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
    await waitFor("virtnode's pod Ready", async () => {
      const found = await pods("kubevirt.io=virt-handler", "kubevirt");
      return found[0] && podReady(found[0]) ? found : undefined;
    }, 180_000);
    const labelled = await waitFor("the node schedulable", async () => {
      const n = await admin.request<NodeObject>("GET", `/api/v1/nodes/${node.name}`);
      return n.metadata.labels["kubevirt.io/schedulable"] === "true" ? n : undefined;
    }, 120_000);
    step("virt-api, virt-controller and virtnode up");

    const guests = [{ name: "vm-sec-a", host: 10 }, { name: "vm-sec-b", host: 11 }];
    for (const g of guests) {
      const base = networkVmi(g.name, cpuModelFor(labelled), "masquerade");
      const vmi = { ...base, spec: withSecondaryNetworks(base.spec, nets, g.host) };
      await kubectl(kc, ["apply", "-f", "-"], JSON.stringify(vmi));
    }
    for (const g of guests) {
      const running = await waitFor(`${g.name} Running`, async () => {
        const v = await getVmi(g.name);
        if (v?.status?.phase === "Failed") {
          throw new Error(`${g.name} failed: ${JSON.stringify(v.status)}`);
        }
        return v?.status?.phase === "Running" ? v : undefined;
      }, 240_000);
      // Multus attached each network under KubeVirt's name; virt-controller read it back.
      const [pod] = await pods(`kubevirt.io/created-by=${running.metadata.uid}`);
      const status = JSON.parse(
        pod.metadata.annotations?.["k8s.v1.cni.cncf.io/network-status"] ?? "[]",
      ) as { name: string; interface?: string }[];
      for (const n of nets) {
        assert.ok(
          status.some((s) =>
            s.name === `default/${n.name}` && s.interface === hashedPodInterfaceName(n.name)
          ),
          `${g.name}'s pod network-status: ${JSON.stringify(status)}`,
        );
      }
      step(`${g.name} Running; Multus attached ${nets.map((n) => n.name).join(", ")}`);
    }
    // The node reaches each guest on each network (the guest answers from its static address).
    for (const g of guests) {
      for (const n of nets) {
        const answer = await waitFor(
          `${g.name} answering HTTP on ${n.subnet}.${g.host}`,
          () => httpGet(`http://${n.subnet}.${g.host}/cgi-bin/echo`),
          240_000,
          1_000,
        );
        assert.match(answer, echoedCaller(n.subnet, 1));
      }
    }
    step("the node reaches both guests on both secondary networks");
    // Each guest reaches the node and the other guest on each network, from its console.
    const virtctl = await buildVirtctl();
    const [a, b] = guests;
    for (const n of nets) {
      await consoleAnswers({ virtctl, kubeconfig: kc, name: a.name }, {
        line: `wget -qO- http://${n.subnet}.1:${ports.get(n.name)}/`,
        answer: new RegExp(`node-${n.name}`),
      });
      await consoleAnswers({ virtctl, kubeconfig: kc, name: a.name }, {
        line: `wget -qO- http://${n.subnet}.${b.host}/cgi-bin/echo`,
        answer: echoedCaller(n.subnet, a.host),
      });
    }
    step(`${a.name} reaches the node and ${b.name} on both secondary networks`);
    // status.interfaces: KubeVirt's names, multus-status, the guest agent's addresses.
    const reported = await waitFor(
      "the secondary interfaces with the agent's addresses",
      async () => {
        const v = await getVmi(a.name);
        const ifaces = v?.status?.interfaces ?? [];
        return nets.every((n) =>
            ifaces.find((i) => i.name === n.name)?.ipAddresses?.includes(`${n.subnet}.${a.host}`)
          )
          ? ifaces
          : undefined;
      },
      120_000,
    );
    assert.equal(reported[0].name, "default", JSON.stringify(reported));
    for (const n of nets) {
      const entry = reported.find((i) => i.name === n.name)!;
      assert.equal(entry.podInterfaceName, hashedPodInterfaceName(n.name), JSON.stringify(entry));
      assert.deepEqual(
        entry.infoSource?.split(", ").sort(),
        ["domain", "guest-agent", "multus-status"],
        JSON.stringify(entry),
      );
      assert.equal(entry.mac, guestMac(n, a.host));
    }
    step("status.interfaces: pod<hash> names, multus-status, the guest agent's addresses");
    ok = true;
  } finally {
    if (!ok) {
      console.error(
        await kubectl(kc, ["get", "vmi,pods", "-A", "-o", "wide"]).catch((e) => String(e)),
      );
      console.error(
        await kubectl(kc, ["get", "events", "-A", "--sort-by=.lastTimestamp"]).catch((e) =>
          String(e)
        ),
      );
      if (kubevirt) console.error(await kubevirt.complaints());
      console.error(await node.complaints());
    }
    await kubectl(kc, ["delete", "vmi", "--all", "--wait=true", "--timeout=90s"]).catch(() => {});
    await kubectl(kc, ["delete", "daemonset", "-n", "kubevirt", "--all", "--wait=true"])
      .catch(() => {});
    await kubevirt?.stop();
    await node.stop();
    await bridges?.remove();
    admin.close();
    await cluster.stop();
  }
});

/**
 * `virtctl port-forward` to a guest on a pod-less node, through KubeVirt's own virt-api (no
 * virt-controller): virt-api dials the first interface address the VMI's status gives,
 * which on a pod-less node is the VM's pod address on the node's bridge, and the guest's
 * masquerade binding carries the connection to its HTTP server. A virt-api on another node
 * reaches that address only where the cluster routes the node's pod subnet; here it runs on
 * the node itself.
 *
 * In the soak tier, beside the others: it mostly waits for a guest's boot under software
 * emulation.
 */
import assert from "node:assert/strict";
import { startCluster } from "../../deploy/cluster/cluster.ts";
import { buildVirtctl } from "../../deploy/kubevirt/virtctl.ts";
import { buildKubevirtPeers } from "../harness/kubevirt/peers.ts";
import { startKubevirt } from "../harness/node/kubevirt.ts";
import { ensureLibvirtd } from "../helpers/libvirtd.ts";
import { guestVmi, installTestGuest } from "../helpers/guest.ts";
import {
  createVmi,
  deleteVmi,
  getVmi,
  killLaunchers,
  kubeClient,
  removeTestPodNetwork,
  startHandlerProcess,
  testPodNetwork,
  waitFor,
  waitForPhase,
} from "../helpers/handler_process.ts";
import { podlessHandlerKubeconfig } from "../helpers/podless_beside_virt_api.ts";
import { portForwardAnswers } from "../helpers/virtctl.ts";

/** A guest booting under software emulation takes its time on a busy 2-core machine. */
const BOOT_MS = 180_000;

Deno.test("virtctl port-forward reaches a pod-less guest's HTTP port through KubeVirt's virt-api", async () => {
  const uri = await ensureLibvirtd();
  const kubevirtDir = await buildKubevirtPeers();
  const virtctl = await buildVirtctl();
  const cluster = await startCluster({ podNetwork: true });
  const cleanups: (() => Promise<unknown>)[] = [() => cluster.stop()];
  let logFile: string | undefined;
  try {
    const kubevirt = await startKubevirt(cluster, {
      kubevirtDir,
      launcherImage: "unused.invalid/launcher:none",
      controller: false,
    });
    cleanups.unshift(() => kubevirt.stop());
    const kubeconfig = await podlessHandlerKubeconfig(cluster, kubevirt.dir, "port-forward");
    const client = await kubeClient(cluster.kubeconfigPath);
    cleanups.unshift(() => Promise.resolve(client.close()));
    const id = crypto.randomUUID().slice(0, 8);
    const node = `pf-node-${id}`;
    const name = `pf-${id}`;
    const dir = await Deno.makeTempDir({ prefix: "virtnode-pf-" });
    const network = testPodNetwork();
    await installTestGuest(`${dir}/state/images`);
    const h = await startHandlerProcess({
      kubeconfig,
      nodeName: node,
      libvirtUri: uri,
      dir,
      podNetwork: network,
    });
    logFile = h.logFile;
    cleanups.unshift(async () => {
      await deleteVmi(client, "default", name).catch(() => {});
      await waitFor("the VMI to be gone", async () => !(await getVmi(client, "default", name)))
        .catch((e) => console.error(e.message));
      await h.kill("SIGTERM");
      killLaunchers(h.stateDir);
      await removeTestPodNetwork(network);
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    });

    await createVmi(client, guestVmi(name, node, { binding: "masquerade" }));
    await waitForPhase(client, "default", name, "Running", BOOT_MS);
    const vmi = await waitFor("the VMI's pod address in its status", async () => {
      const v = await getVmi(client, "default", name);
      return v?.status?.interfaces?.[0]?.ipAddress ? v : undefined;
    });
    // The guest serves its DHCP lease over HTTP once it has booted.
    const answer = await waitFor(
      "the guest's HTTP answer through virtctl port-forward",
      () =>
        portForwardAnswers({ virtctl, kubeconfig: cluster.kubeconfigPath, name }, 80, "/dhcp")
          .catch(() => undefined),
      BOOT_MS,
      1_000,
    );
    assert.match(answer, /\S/, "the guest answered");
    console.log(`port-forward to ${vmi.status!.interfaces![0].ipAddress}:80 answered: ${answer}`);
  } catch (error) {
    if (logFile) {
      const log = await Deno.readTextFile(logFile).catch(() => "");
      console.error(`handler log:\n${log.slice(-6000)}`);
    }
    throw error;
  } finally {
    for (const cleanup of cleanups) await cleanup().catch((e) => console.error(e));
  }
});

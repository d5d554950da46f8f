/**
 * KubeVirt's own virt-launcher (v1.7.0, built by tests/harness/kubevirt/build_peers.sh) as a
 * launcher pod (tests/helpers/launcher_pod.ts), driven by virtnode's handler in KubeVirt
 * mode against KubeVirt's CRDs and admission. The test plays virt-controller: it places
 * the VMI, starts its pod and writes `Scheduled` with the pod in `activePods`.
 *
 * What it shows:
 * - the handler finds the pod's socket, negotiates the cmd version (CmdInfo) and sends
 *   `SyncVirtualMachine` with KubeVirt's VirtualMachineOptions; KubeVirt's launcher
 *   defines and starts a real QEMU guest in the pod's own libvirtd;
 * - the handler opens `domain-notify-pipe.sock` inside the pod and relays the launcher's
 *   events: Running, and a pause and an unpause sent to the launcher as virt-handler's
 *   REST routes send them (those routes come with a later issue; the handler learns of
 *   the pause only from the launcher's events), reach the VMI's status;
 * - deletion: the handler shuts the guest down through the launcher (ACPI, then kill
 *   after the grace period), KubeVirt's launcher ends, the VMI goes final, the pipe socket
 *   is removed, and the handler leaves virt-api's finalizer to virt-controller.
 */
import assert from "node:assert/strict";
import { useCluster } from "../../deploy/cluster/cluster.ts";
import {
  createVmi,
  deleteVmi,
  eventsFor,
  getVmi,
  kubeClient,
  releaseVmi,
  scheduleToPod,
  startHandlerProcess,
  testVmi,
  waitFor,
  waitForPhase,
} from "../helpers/handler_process.ts";
import { type LauncherPod, startLauncherPod } from "../helpers/launcher_pod.ts";
import { TestCmdClient } from "../helpers/cmd_client.ts";
import { openSocketBeneath } from "../../ffi/mod.ts";

function suffix(): string {
  return crypto.randomUUID().slice(0, 8);
}

/** virsh against the pod's own libvirtd, from inside the pod's mount namespace. */
async function podVirsh(pod: LauncherPod, args: string[]): Promise<string> {
  const out = await new Deno.Command("nsenter", {
    args: ["--target", String(pod.pid), "--mount", "--", "virsh", "-c", "qemu:///system", ...args],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  if (!out.success) throw new Error(`virsh ${args.join(" ")}: ${dec.decode(out.stderr).trim()}`);
  return dec.decode(out.stdout).trim();
}

function exists(path: string): boolean {
  try {
    Deno.lstatSync(path);
    return true;
  } catch {
    return false;
  }
}

Deno.test("kubevirt: KubeVirt's virt-launcher in a launcher pod runs a VMI under virtnode's handler", async () => {
  // The VMI goes Running, is paused, resumed, shut down and deleted.
  const cluster = await useCluster();
  const admin = await kubeClient(cluster.kubeconfigPath);
  const controller = await kubeClient(cluster.handlerKubeconfigPath);
  const dir = await Deno.makeTempDir({ prefix: "virtnode-kvpod-" });
  const podsDir = `${dir}/pods`;
  const node = `kvpod-${suffix()}`;
  const h = await startHandlerProcess({
    kubeconfig: cluster.handlerKubeconfigPath,
    nodeName: node,
    libvirtUri: "test:///default",
    kubeletPodsDir: podsDir,
  });
  let pod: LauncherPod | undefined;
  let ok = false;
  const t0 = performance.now();
  const step = (what: string) =>
    console.log(`${((performance.now() - t0) / 1000).toFixed(1).padStart(5)} s  ${what}`);
  try {
    const name = `vm-${suffix()}`;
    const vmi = await createVmi(controller, testVmi(name, node, { placed: true, grace: 1 }));
    const uid = vmi.metadata.uid!;
    pod = await startLauncherPod({
      podsDir,
      vmi: { name, namespace: "default", uid },
      gracePeriodSeconds: 1,
    });
    const volumes = `${pod.dir}/volumes/kubernetes.io~empty-dir`;
    await waitFor(
      "KubeVirt's launcher to listen",
      () => exists(`${volumes}/sockets/launcher-sock`),
    );

    // virt-controller's part: the pod runs, so the VMI is Scheduled on this node.
    await scheduleToPod(controller, "default", name, node, pod.uid);

    step("launcher pod listening; VMI Scheduled");
    const running = await waitForPhase(admin, "default", name, "Running", 120_000);
    step("Running");
    const domainName = `default_${name}`;
    assert.equal(await podVirsh(pod, ["domstate", domainName]), "running");
    // The pipe is in the pod's share directory, the handler's alone to use.
    const pipe = await Deno.lstat(`${volumes}/public/domain-notify-pipe.sock`);
    assert.ok(pipe.isSocket);
    assert.equal(pipe.mode! & 0o777, 0o600);
    assert.equal(pipe.uid, 0);
    assert.match(
      running.status!.machine?.type ?? "",
      /^pc-q35/,
      "machine type from KubeVirt's domain",
    );
    await waitFor("Created and Started events", async () => {
      const reasons = (await eventsFor(admin, "default", name)).map((e) => e.reason);
      return reasons.includes("Created") && reasons.includes("Started");
    });

    // Pause and unpause as virt-handler's REST routes send them to the launcher (those
    // routes are a later issue's): KubeVirt's own launcher pauses the guest and reports
    // it only through its events, which reach the handler through the notify pipe.
    const cmd = openSocketBeneath(pod.dir, "volumes/kubernetes.io~empty-dir/sockets/launcher-sock");
    const client = new TestCmdClient(cmd.path);
    try {
      const request = async () => ({
        vmi: {
          vmiJson: new TextEncoder().encode(JSON.stringify(await getVmi(admin, "default", name))),
        },
        options: {},
      });
      const paused = await client.call<{ success: boolean; message: string }>(
        "PauseVirtualMachine",
        await request(),
      );
      assert.ok(paused.success, paused.message);
      step("paused by the launcher");
      await waitFor("the Paused condition", async () => {
        const v = await getVmi(admin, "default", name);
        return v?.status?.conditions?.some((c) =>
          c.type === "Paused" && c.status === "True" && c.reason === "PausedByUser"
        );
      });
      // The handler's syncs meanwhile leave it paused (KubeVirt's launcher knows it paused it).
      await new Promise((r) => setTimeout(r, 1_000));
      assert.equal(await podVirsh(pod, ["domstate", domainName]), "paused");
      const resumed = await client.call<{ success: boolean; message: string }>(
        "UnpauseVirtualMachine",
        await request(),
      );
      assert.ok(resumed.success, resumed.message);
    } finally {
      client.close();
      cmd.release();
    }
    await waitFor("the Paused condition to go", async () => {
      const v = await getVmi(admin, "default", name);
      return v?.status?.phase === "Running" &&
        !v.status.conditions?.some((c) => c.type === "Paused");
    });
    assert.equal(await podVirsh(pod, ["domstate", domainName]), "running");
    step("unpaused: Paused condition gone");

    // Deleted: ACPI shutdown through KubeVirt's launcher, a kill after the grace period.
    await deleteVmi(admin, "default", name);
    const final = await waitFor("the VMI to be final", async () => {
      const v = await getVmi(admin, "default", name);
      return v?.status?.phase === "Succeeded" || v?.status?.phase === "Failed" ? v : undefined;
    }, 60_000);
    assert.ok(final.metadata.deletionTimestamp);
    step(`deleted: ${final.status!.phase}`);
    // KubeVirt's launcher ends once its domain is gone and its last event is sent.
    assert.ok(await pod.exited(30_000), "the launcher pod ended by itself");
    step("launcher pod ended");
    await waitFor(
      "the ghost record to be removed",
      () => !exists(`${h.stateDir}/ghost-records/${uid}`),
    );
    await waitFor(
      "the notify pipe to be removed",
      () => !exists(`${volumes}/public/domain-notify-pipe.sock`),
    );
    const reasons = (await eventsFor(admin, "default", name)).map((e) => e.reason);
    assert.ok(
      reasons.includes("Deleted") && reasons.includes("Stopped"),
      `Deleted and Stopped events: ${reasons.join(", ")}`,
    );
    // KubeVirt's launcher got the ACPI shutdown, then the kill at the end of the grace period.
    const launcherLog = await Deno.readTextFile(pod.logFile);
    assert.match(launcherLog, /Signaled graceful shutdown for /);
    assert.match(launcherLog, /Signaled vmi kill/);
    assert.deepEqual(
      (await getVmi(admin, "default", name))?.metadata.finalizers,
      ["kubevirt.io/foregroundDeleteVirtualMachine"],
      "KubeVirt mode leaves virt-api's finalizer to virt-controller",
    );
    // virt-controller's last steps: the pod goes, then the finalizer.
    await pod.stop();
    await releaseVmi(controller, "default", name);
    const log = await Deno.readTextFile(h.logFile);
    assert.match(log, /Notify pipe open in the launcher pod/);
    // The VMI's side of the handler (no kubelet, Node or real libvirt for the node
    // services here: their complaints are not this test's).
    const complaints = log.split("\n").filter((l) =>
      /"level":"(warn|error)"/.test(l) && /"logger":"handler\./.test(l)
    );
    assert.deepEqual(complaints, [], "no warning or error from the VMI controller");
    assert.ok(!reasons.includes("SyncFailed"), "no sync failed");
    ok = true;
  } finally {
    if (!ok) {
      console.error(`handler log:\n${(await Deno.readTextFile(h.logFile)).slice(-6000)}`);
      if (pod) {
        console.error(
          `launcher log:\n${(await Deno.readTextFile(pod.logFile).catch(() => "")).slice(-30000)}`,
        );
      }
    }
    await pod?.stop();
    await h.kill("SIGTERM");
    step("handler stopped");
    admin.close();
    controller.close();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    await Deno.remove(h.dir, { recursive: true }).catch(() => {});
    await cluster.stop();
  }
});

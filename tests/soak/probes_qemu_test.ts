/**
 * VMI probes on a pod-less node, with QEMU and the test guest's agent (QEMU's qemu-ga):
 * the handler plays the kubelet. An `exec` readiness probe keeps the VMI not Ready until
 * the command passes in the guest, and turns it back when it fails; KubeVirt's own
 * virt-probe, pointed at the VMI's launcher socket as a launcher pod's probe would be,
 * gets the same answers from virtnode's launcher (GuestPing, Exec and its exit code); a
 * `guestAgentPing` liveness probe fails once the agent stops, and the VMI fails with an
 * `Unhealthy` Event, as a launcher pod whose liveness probe failed ends.
 *
 * In the soak tier, beside the others: it mostly waits (the liveness probe's initial delay
 * outlasts the guest's boot under software emulation).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { useCluster } from "../../deploy/cluster/cluster.ts";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { kvmUsable } from "../../mod/host/mod.ts";
import { buildKubevirtPeers } from "../harness/kubevirt/peers.ts";
import { ensureLibvirtd } from "../helpers/libvirtd.ts";
import { guestVmi, installTestGuest } from "../helpers/guest.ts";
import {
  createVmi,
  deleteVmi,
  eventsFor,
  getVmi,
  killLaunchers,
  kubeClient,
  startHandlerProcess,
  waitFor,
  waitForPhase,
} from "../helpers/handler_process.ts";

/** A guest booting under software emulation takes its time on a busy 2-core machine. */
const BOOT_MS = 180_000;

function condition(vmi: VirtualMachineInstance | undefined, type: string) {
  return vmi?.status?.conditions?.find((c) => c.type === type);
}

/** Runs a shell command line in the guest through libvirt's agent channel; its exit code. */
async function inGuest(uri: string, domain: string, line: string): Promise<number> {
  const agent = async (request: object) => {
    const out = await new Deno.Command("virsh", {
      args: ["-c", uri, "qemu-agent-command", domain, JSON.stringify(request)],
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = new TextDecoder().decode(out.stdout);
    if (!out.success) throw new Error(`virsh: ${new TextDecoder().decode(out.stderr)}`);
    return JSON.parse(text).return;
  };
  const { pid } = await agent({
    execute: "guest-exec",
    arguments: { path: "/bin/sh", arg: ["-c", line] },
  });
  return await waitFor(
    `"${line}" to end in the guest`,
    async () => {
      const status = await agent({ execute: "guest-exec-status", arguments: { pid } });
      return status.exited ? { code: status.exitcode ?? -1 } : undefined;
    },
    30_000,
    200,
  ).then((r) => r.code);
}

/** Runs KubeVirt's virt-probe with `args`; its exit code and output. */
async function virtProbe(binary: string, args: string[]): Promise<{ code: number; out: string }> {
  const out = await new Deno.Command(binary, { args, stdout: "piped", stderr: "piped" }).output();
  const dec = new TextDecoder();
  return { code: out.code, out: dec.decode(out.stdout) + dec.decode(out.stderr) };
}

Deno.test("probes (pod-less): exec readiness moves Ready, virt-probe's calls, a failed liveness fails the VMI", async () => {
  const uri = await ensureLibvirtd();
  const cluster = await useCluster();
  const client = await kubeClient(cluster.kubeconfigPath);
  const peers = await buildKubevirtPeers();
  const id = crypto.randomUUID().slice(0, 8);
  const ns = `probe-${id}`;
  const node = `probe-node-${id}`;
  await client.request("POST", "/api/v1/namespaces", { metadata: { name: ns } });
  const dir = await Deno.makeTempDir({ prefix: "virtnode-probe-" });
  await installTestGuest(`${dir}/state/images`);
  const h = await startHandlerProcess({
    kubeconfig: cluster.handlerKubeconfigPath,
    nodeName: node,
    libvirtUri: uri,
    dir,
  });
  const domain = `${ns}_vm1`;
  try {
    const vmi = guestVmi("vm1", node, {
      namespace: ns,
      // No network: the probes here go through the launcher.
      binding: "none",
      spec: {
        readinessProbe: {
          exec: { command: ["/bin/cat", "/data/ready"] },
          periodSeconds: 2,
          failureThreshold: 1,
          timeoutSeconds: 3,
        },
        // Its first ping comes once the guest has surely booted and its agent answers.
        livenessProbe: {
          guestAgentPing: {},
          initialDelaySeconds: kvmUsable() ? 60 : 150,
          periodSeconds: 2,
          failureThreshold: 2,
        },
      },
    });
    await createVmi(client, vmi);
    await waitForPhase(client, ns, "vm1", "Running", BOOT_MS).catch(async (error) => {
      throw new Error(`${error}: ${JSON.stringify((await getVmi(client, ns, "vm1"))?.status)}`);
    });
    const notReady = condition(await getVmi(client, ns, "vm1"), "Ready");
    assert.equal(notReady?.status, "False", JSON.stringify(notReady));
    assert.equal(notReady?.reason, "ContainersNotReady");
    await waitFor(
      "the guest agent to connect",
      async () => condition(await getVmi(client, ns, "vm1"), "AgentConnected")?.status === "True",
      BOOT_MS,
      1_000,
    );
    // No file yet: the probe's command fails in the guest and says so.
    const failing = await waitFor(
      "the probe's failure in Ready",
      async () => {
        const ready = condition(await getVmi(client, ns, "vm1"), "Ready");
        return /Readiness probe failed: command "\/bin\/cat" exited with code 1/
            .test(ready?.message ?? "")
          ? ready
          : undefined;
      },
      30_000,
      500,
    );
    assert.equal(failing.status, "False");

    assert.equal(await inGuest(uri, domain, "echo yes > /data/ready"), 0);
    await waitFor(
      "Ready once the probe passes",
      async () => condition(await getVmi(client, ns, "vm1"), "Ready")?.status === "True",
      30_000,
      500,
    );

    // KubeVirt's own virt-probe, as a launcher pod runs it, against virtnode's launcher.
    const uid = (await getVmi(client, ns, "vm1"))!.metadata.uid!;
    const socket = join(dir, "run", "sockets", uid, "launcher-sock");
    const probe = join(peers, "virt-probe");
    const ping = await virtProbe(probe, [
      `--socket=${socket}`,
      `--domainName=${domain}`,
      "--timeoutSeconds=5",
      "--guestAgentPing",
    ]);
    assert.equal(ping.code, 0, ping.out);
    const cat = await virtProbe(probe, [
      `--socket=${socket}`,
      `--domainName=${domain}`,
      "--timeoutSeconds=5",
      "--command=/bin/cat",
      "--",
      "/data/ready",
    ]);
    assert.equal(cat.code, 0, cat.out);
    assert.match(cat.out, /^yes$/m, "the command's output comes back");
    const missing = await virtProbe(probe, [
      `--socket=${socket}`,
      `--domainName=${domain}`,
      "--timeoutSeconds=5",
      "--command=/bin/cat",
      "--",
      "/data/missing",
    ]);
    assert.equal(missing.code, 1, `its exit code is virt-probe's: ${missing.out}`);
    const other = await virtProbe(probe, [
      `--socket=${socket}`,
      `--domainName=${ns}_other`,
      "--guestAgentPing",
    ]);
    assert.notEqual(other.code, 0, "another domain's name is refused");

    assert.equal(await inGuest(uri, domain, "rm /data/ready"), 0);
    await waitFor(
      "not Ready once the probe fails again",
      async () => condition(await getVmi(client, ns, "vm1"), "Ready")?.status === "False",
      30_000,
      500,
    );

    // The agent stops: once the liveness probe's delay is over it fails twice, and the
    // VMI ends as its launcher pod would.
    await inGuest(uri, domain, "kill $(cat /run/qemu-ga.pid)").catch(() => {});
    const failed = await waitFor(
      "the VMI to fail on its liveness probe",
      async () => {
        const v = await getVmi(client, ns, "vm1");
        return v?.status?.phase === "Failed" ? v : undefined;
      },
      200_000,
      1_000,
    );
    assert.equal(failed.status?.phase, "Failed");
    const unhealthy = (await eventsFor(client, ns, "vm1")).find((e) => e.reason === "Unhealthy");
    assert.match(unhealthy?.message ?? "", /^Liveness probe failed: /, JSON.stringify(unhealthy));
    assert.equal(unhealthy?.type, "Warning");
  } catch (error) {
    // What the handler saw and said, for a failure here.
    const lines = (await Deno.readTextFile(h.logFile).catch(() => "")).split("\n")
      .filter((l) => /prober|Probe|probe|Sync|kill|Kill/i.test(l)).slice(-40);
    const events = (await eventsFor(client, ns, "vm1")).map((e) => `${e.reason}: ${e.message}`);
    console.log(`handler:\n${lines.join("\n")}\nevents:\n${events.join("\n")}`);
    console.log(`status: ${JSON.stringify((await getVmi(client, ns, "vm1"))?.status)}`);
    throw error;
  } finally {
    await deleteVmi(client, ns, "vm1").catch(() => {});
    await waitFor("vm1 to go", async () => !(await getVmi(client, ns, "vm1")), 60_000).catch(
      () => {},
    );
    await h.kill();
    killLaunchers(h.stateDir);
    await client.request("DELETE", `/api/v1/namespaces/${ns}`).catch(() => {});
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    client.close();
    await cluster.stop();
  }
});

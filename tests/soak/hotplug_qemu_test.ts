/**
 * CPU and memory hot-plug on a pod-less node, as a user makes it: a VirtualMachine running
 * the test guest with one socket of at most two and 1 GiB of at most 2 GiB (KubeVirt offers
 * memory hot-plug from 1Gi of guest memory) gets two sockets and 1152 MiB in its template (`kubectl patch vm`, KubeVirt's default LiveUpdate
 * rollout). The node's VM controller changes the VMI's spec, the handler has the launcher
 * plug a vCPU (SyncVirtualMachineCPUs) and 128 MiB (SyncVirtualMachineMemory, KubeVirt's
 * virtio-mem device) in place, and the guest brings both online (as a distribution's udev
 * rules do; read through its agent past virtnode). The VMI's status shows the topology, the
 * memory asked for and the memory the guest has; fewer sockets then need a restart (the VM's RestartRequired, as
 * KubeVirt v1.7.0 has it), and the guest keeps its two vCPUs.
 *
 * In the soak tier, beside the others: it mostly waits for a guest's boot under software
 * emulation.
 */
import assert from "node:assert/strict";
import { useCluster } from "../../deploy/cluster/cluster.ts";
import type { VirtualMachine } from "../../mod/api/mod.ts";
import { ensureLibvirtd, virsh } from "../helpers/libvirtd.ts";
import { guestVmi, inGuest, installTestGuest } from "../helpers/guest.ts";
import {
  getVmi,
  killLaunchers,
  kubeClient,
  startHandlerProcess,
  waitFor,
  waitForPhase,
} from "../helpers/handler_process.ts";

/** A guest booting under software emulation takes its time on a busy 2-core machine. */
const BOOT_MS = 180_000;

/** What the guest has: online vCPUs and MemTotal in KiB. */
async function hardware(domain: string): Promise<{ cpus: number; memoryKib: number }> {
  const out = await inGuest(
    domain,
    "grep -c ^processor /proc/cpuinfo; sed -n 's/^MemTotal: *\\([0-9]*\\) kB$/\\1/p' /proc/meminfo",
  );
  const [cpus, memory] = out.trim().split("\n").map(Number);
  return { cpus, memoryKib: memory };
}

Deno.test("hot-plug (pod-less): a VM's new socket and memory reach its running guest, fewer need a restart", async () => {
  const uri = await ensureLibvirtd();
  const cluster = await useCluster();
  const client = await kubeClient(cluster.kubeconfigPath);
  const id = crypto.randomUUID().slice(0, 8);
  const ns = `hotplug-${id}`;
  const node = `hotplug-node-${id}`;
  await client.request("POST", "/api/v1/namespaces", { metadata: { name: ns } });
  const dir = await Deno.makeTempDir({ prefix: "virtnode-hotplug-" });
  await installTestGuest(`${dir}/state/images`);
  const h = await startHandlerProcess({
    kubeconfig: cluster.handlerKubeconfigPath,
    nodeName: node,
    libvirtUri: uri,
    dir,
  });
  const vmPath = `/apis/kubevirt.io/v1/namespaces/${ns}/virtualmachines/vm1`;
  try {
    const template = guestVmi("vm1", node, { namespace: ns, binding: "none" });
    template.spec.domain.cpu = { ...template.spec.domain.cpu, sockets: 1, maxSockets: 2 };
    template.spec.domain.memory = { guest: "1Gi", maxGuest: "2Gi" };
    template.spec.architecture = "amd64"; // what virt-api gives a VM's template
    await client.request("POST", `/apis/kubevirt.io/v1/namespaces/${ns}/virtualmachines`, {
      apiVersion: "kubevirt.io/v1",
      kind: "VirtualMachine",
      metadata: { name: "vm1", namespace: ns },
      spec: { runStrategy: "Always", template: { spec: template.spec } },
    });
    await waitForPhase(client, ns, "vm1", "Running", BOOT_MS);
    const domain = `${ns}_vm1`;
    const before = await waitFor("the guest's agent", () => hardware(domain), BOOT_MS, 2_000);
    assert.equal(before.cpus, 1);

    const patchVm = (domainPatch: Record<string, unknown>) =>
      client.request("PATCH", vmPath, { spec: { template: { spec: { domain: domainPatch } } } }, {
        contentType: "application/merge-patch+json",
      });
    await patchVm({ cpu: { sockets: 2 }, memory: { guest: "1152Mi" } });
    // The driver plugs 64 blocks of 2 MiB; the guest's total grows by that (less the
    // kernel's page tables for the new memory, where it keeps them there).
    const grown = await waitFor(
      "the guest's second vCPU and 128 MiB more",
      async () => {
        const now = await hardware(domain);
        return now.cpus === 2 && now.memoryKib - before.memoryKib >= 120 * 1024 ? now : undefined;
      },
      120_000,
      2_000,
    );
    assert.ok(grown.memoryKib - before.memoryKib <= 128 * 1024, JSON.stringify({ before, grown }));
    const vmi = await waitFor("the VMI's status to show the change", async () => {
      const v = await getVmi(client, ns, "vm1");
      return v?.status?.currentCPUTopology?.sockets === 2 &&
          v.status.memory?.guestRequested === "1152Mi"
        ? v
        : undefined;
    });
    assert.equal(vmi.spec.domain.cpu?.sockets, 2);
    assert.equal(vmi.spec.domain.memory?.guest, "1152Mi");
    assert.equal(vmi.status?.memory?.guestAtBoot, "1Gi");
    assert.ok(!vmi.status?.conditions?.some((c) => c.type === "HotMemoryChange"));
    const device = /<memory model='virtio-mem'>[\s\S]*?<\/memory>/.exec(
      await virsh("dumpxml", domain),
    )?.[0] ?? "";
    assert.match(device, /<requested unit='KiB'>131072<\/requested>/);
    assert.match(device, /<current unit='KiB'>131072<\/current>/);
    // The guest's current memory follows the plugged blocks: libvirt's memory device size
    // event makes the launcher send the domain again, with its new current memory.
    const current = await waitFor("status.memory.guestCurrent to reach 1152Mi", async () => {
      const v = await getVmi(client, ns, "vm1");
      return v?.status?.memory?.guestCurrent === "1152Mi" ? v.status.memory : undefined;
    }, 60_000).catch(async (error) => {
      const v = await getVmi(client, ns, "vm1");
      throw new Error(`${error.message}; status.memory ${JSON.stringify(v?.status?.memory)}`);
    });
    console.log(
      `hot-plug: vCPUs 1 -> 2, MemTotal ${before.memoryKib} -> ${grown.memoryKib} KiB; ` +
        `guestCurrent ${current.guestCurrent}`,
    );

    // Fewer sockets cannot go live in KubeVirt v1.7.0: the VM says a restart is needed.
    await patchVm({ cpu: { sockets: 1 } });
    const restart = await waitFor("RestartRequired on the VM", async () => {
      const v = await client.request<VirtualMachine>("GET", vmPath);
      return v.status?.conditions?.find((c) => c.type === "RestartRequired");
    });
    assert.equal(restart.status, "True");
    assert.equal(restart.message, "Reduction of CPU socket count requires a restart");
    assert.equal((await getVmi(client, ns, "vm1"))?.spec.domain.cpu?.sockets, 2);
    assert.equal((await hardware(domain)).cpus, 2);
  } catch (error) {
    console.error((await Deno.readTextFile(h.logFile).catch(() => "")).slice(-8000));
    throw error;
  } finally {
    await client.request("DELETE", vmPath).catch(() => {});
    await waitFor("vm1 to go", async () => !(await getVmi(client, ns, "vm1")), 60_000)
      .catch((e) => console.error(e.message));
    await h.kill("SIGTERM");
    killLaunchers(h.stateDir);
    await client.request("DELETE", `/api/v1/namespaces/${ns}`).catch(() => {});
    client.close();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    await cluster.stop();
  }
});

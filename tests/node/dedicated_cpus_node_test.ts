/**
 * Dedicated CPUs in KubeVirt mode on a real node whose kubelet runs the static CPU manager:
 * virtnode's heartbeat reads the kubelet's CPU manager state and labels the node
 * `cpumanager=true` (KubeVirt's `CPUManager` gate on), virt-controller gives the launcher pod
 * of a `dedicatedCpuPlacement` VMI that node and whole CPUs, the kubelet gives its compute
 * container a CPU of its own, and KubeVirt's virt-launcher pins the vCPU to it: read back
 * from the kubelet's state and QEMU's threads in `/proc`.
 *
 * This machine has two CPUs and the kubelet keeps one: one CPU is left to give, enough for
 * one vCPU, not for an isolated emulator thread beside it (docs/testing.md).
 */
import { buildKubevirtPeers } from "../harness/kubevirt/peers.ts";
import assert from "node:assert/strict";
import { join } from "node:path";
import { kubectl, startCluster } from "../../deploy/cluster/cluster.ts";
import { launcherImage, startNode, virtnodeImage } from "../harness/node/node.ts";
import { startKubevirt } from "../harness/node/kubevirt.ts";
import {
  cpuModelFor,
  userVmi,
  virtnodeDaemonSet,
  virtnodeDirs,
} from "../harness/node/daemonsets.ts";
import { ensureLibvirtd } from "../helpers/libvirtd.ts";
import { kubeClient, waitFor } from "../helpers/handler_process.ts";
import { nodeApi, type NodeObject, podReady, stepper } from "../helpers/node_api.ts";
import { parseCpuList } from "../../mod/domain/mod.ts";

const REPO = new URL("../../", import.meta.url).pathname;

/** The kubelet's `cpu_manager_state`. */
interface CpuManagerState {
  policyName: string;
  defaultCpuSet: string;
  entries?: Record<string, Record<string, string>>;
}

/** The allowed CPUs of every thread of `pid`, by thread name. */
function threadCpus(pid: number): { comm: string; cpus: number[] }[] {
  const out: { comm: string; cpus: number[] }[] = [];
  for (const entry of Deno.readDirSync(`/proc/${pid}/task`)) {
    try {
      const dir = `/proc/${pid}/task/${entry.name}`;
      out.push({
        comm: Deno.readTextFileSync(`${dir}/comm`).trim(),
        cpus: parseCpuList(
          /^Cpus_allowed_list:\s*(\S+)/m.exec(Deno.readTextFileSync(`${dir}/status`))![1],
        ),
      });
    } catch {
      // Ended meanwhile.
    }
  }
  return out;
}

/** The PID of the QEMU whose `-name` is `guest=<domain>,…`. */
function qemuPid(domain: string): number | undefined {
  for (const entry of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    try {
      const args = Deno.readTextFileSync(`/proc/${entry.name}/cmdline`).split("\0");
      const at = args.indexOf("-name");
      if (at >= 0 && args[at + 1]?.startsWith(`guest=${domain},`)) return Number(entry.name);
    } catch {
      // Gone meanwhile.
    }
  }
  return undefined;
}

Deno.test("node: the static CPU manager gives a dedicatedCpuPlacement VMI's vCPU a CPU of its own", async () => {
  await ensureLibvirtd();
  const cluster = await startCluster({ podNetwork: true });
  const kc = cluster.kubeconfigPath;
  const admin = await kubeClient(kc);
  const node = await startNode(cluster, { cpuManager: "static" });
  let kubevirt: Awaited<ReturnType<typeof startKubevirt>> | undefined;
  let ok = false;
  const step = stepper();
  const { getVmi, pods } = nodeApi(admin);
  try {
    const launcher = await launcherImage();
    const handlerImage = await virtnodeImage();
    await node.importImage(launcher.archive);
    await node.importImage(handlerImage.archive);
    const statePath = join(node.kubeletDir, "cpu_manager_state");
    const before = JSON.parse(await Deno.readTextFile(statePath)) as CpuManagerState;
    assert.equal(before.policyName, "static");
    step(`node Ready, static CPU manager (${before.defaultCpuSet} shared)`);
    kubevirt = await startKubevirt(cluster, {
      kubevirtDir: await buildKubevirtPeers(),
      launcherImage: launcher.name,
      featureGates: ["CPUManager"],
    });
    await kubectl(kc, ["apply", "-f", join(REPO, "deploy/rbac.yaml")]);
    // The kubelet's root is below the node's folder here: virtnode is told where its state is
    // (through the host's root, which its hostPID pod reaches as /proc/1/root).
    const ds = JSON.parse(
      await virtnodeDaemonSet(handlerImage.name, launcher.name, virtnodeDirs(node)),
    );
    ds.spec.template.spec.containers[0].args.push(`--cpu-manager-state=/proc/1/root${statePath}`);
    await kubectl(kc, ["apply", "-f", "-"], JSON.stringify(ds));
    await waitFor("virtnode's pod Ready", async () => {
      const found = await pods("kubevirt.io=virt-handler", "kubevirt");
      return found[0] && podReady(found[0]) ? found : undefined;
    }, 180_000);
    const labelled = await waitFor("the node labelled cpumanager=true", async () => {
      const n = await admin.request<NodeObject>("GET", `/api/v1/nodes/${node.name}`);
      return n.metadata.labels["cpumanager"] === "true" &&
          n.metadata.labels["kubevirt.io/schedulable"] === "true"
        ? n
        : undefined;
    }, 120_000);
    step("virtnode's pod Ready, node labelled cpumanager=true");

    const vmi = userVmi("vm-dedicated", cpuModelFor(labelled));
    vmi.spec.domain.cpu = {
      ...vmi.spec.domain.cpu,
      dedicatedCpuPlacement: true,
    } as typeof vmi.spec.domain.cpu;
    await kubectl(kc, ["apply", "-f", "-"], JSON.stringify(vmi));
    const running = await waitFor("vm-dedicated Running", async () => {
      const v = await getVmi("vm-dedicated");
      if (v?.status?.phase === "Failed") {
        throw new Error(`vm-dedicated failed: ${JSON.stringify(v.status)}`);
      }
      return v?.status?.phase === "Running" ? v : undefined;
    }, 240_000);
    const [pod] = await pods(`kubevirt.io/created-by=${running.metadata.uid}`);
    step(`vm-dedicated Running in ${pod.metadata.name}`);

    // The kubelet gave the compute container a CPU the shared pool no longer has.
    const state = JSON.parse(await Deno.readTextFile(statePath)) as CpuManagerState;
    const given = parseCpuList(state.entries?.[pod.metadata.uid!]?.compute ?? "");
    assert.equal(given.length, 1, JSON.stringify(state));
    assert.ok(!parseCpuList(state.defaultCpuSet).includes(given[0]), JSON.stringify(state));
    // KubeVirt's launcher pinned the vCPU there; QEMU's threads are all in the container's set.
    const pid = await waitFor("vm-dedicated's QEMU", () => qemuPid("default_vm-dedicated"));
    const threads = threadCpus(pid);
    const report = threads.map((t) => `${t.comm}: ${t.cpus.join(",")}`).join("; ");
    const vcpus = threads.filter((t) => /^CPU \d+\/(KVM|TCG)$/.test(t.comm));
    assert.equal(vcpus.length, 1, report);
    assert.deepEqual(vcpus[0].cpus, given, report);
    for (const t of threads) assert.deepEqual(t.cpus, given, report);
    step(`vCPU pinned to CPU ${given[0]}, the kubelet's shared pool is ${state.defaultCpuSet}`);
    // virtnode's housekeeping found the QEMU in the launcher pod (nothing to move here: no
    // isolated emulator thread, no realtime, no KVM PIT thread under software emulation).
    const [handlerPod] = await pods("kubevirt.io=virt-handler", "kubevirt");
    const placedLine = await waitFor("virtnode placing vm-dedicated's QEMU threads", async () => {
      const log = await kubectl(kc, ["logs", "-n", "kubevirt", handlerPod.metadata.name]);
      return log.split("\n").find((l) =>
        l.includes("QEMU threads placed") && l.includes("vm-dedicated")
      );
    }, 60_000);
    // The node's PID namespace may not be the test's: QEMU's PIDs in each are in NSpid.
    const nsPids = /^NSpid:\s*(.*)$/m.exec(Deno.readTextFileSync(`/proc/${pid}/status`))![1]
      .trim().split(/\s+/).map(Number);
    const placedPid = Number(/"qemu":(\d+)/.exec(placedLine)?.[1]);
    assert.ok(nsPids.includes(placedPid), `${placedLine} names QEMU ${nsPids.join("/")}`);

    // An isolated emulator thread needs a second whole CPU, which this node does not have:
    // the launcher pod asks for two and cannot be placed (the evidence docs/testing.md cites).
    const isolated = userVmi("vm-isolated", cpuModelFor(labelled));
    isolated.spec.domain.cpu = {
      ...isolated.spec.domain.cpu,
      dedicatedCpuPlacement: true,
      isolateEmulatorThread: true,
    } as typeof isolated.spec.domain.cpu;
    await kubectl(kc, ["apply", "-f", "-"], JSON.stringify(isolated));
    const unplaced = await waitFor("vm-isolated's pod refused by the scheduler", async () => {
      const found = await admin.request<{ items: { reason?: string; message?: string }[] }>(
        "GET",
        "/api/v1/namespaces/default/events?fieldSelector=reason%3DFailedScheduling",
      );
      return found.items.find((e) => /Insufficient cpu/.test(e.message ?? ""))?.message;
    }, 120_000);
    const [isolatedPod] = await pods(
      "kubevirt.io/created-by=" +
        (await getVmi("vm-isolated"))!.metadata.uid,
    );
    const compute = (isolatedPod.spec as unknown as {
      containers: { name: string; resources: { limits?: Record<string, string> } }[];
    }).containers.find((c) => c.name === "compute");
    assert.equal(compute?.resources.limits?.cpu, "2", JSON.stringify(compute));
    assert.equal((await getVmi("vm-dedicated"))?.status?.phase, "Running");
    step(`vm-isolated's pod asks for 2 CPUs and stays Pending: ${unplaced}`);
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
    }
    await kubectl(kc, ["delete", "vmi", "--all", "--wait=true", "--timeout=60s"]).catch(() => {});
    await kubevirt?.stop();
    await node.stop();
    admin.close();
    await cluster.stop();
  }
});

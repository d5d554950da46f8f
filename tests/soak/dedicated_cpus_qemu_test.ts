/**
 * Dedicated CPUs on a pod-less node, read back from the kernel: a VMI with
 * `dedicatedCpuPlacement`, `isolateEmulatorThread`, `realtime` and NUMA passthrough on 2 MiB
 * huge pages (what KubeVirt's admission asks of a realtime VMI, with its `NUMA` gate on)
 * runs its vCPU threads each alone on a CPU of its own under `SCHED_FIFO` priority 1, and
 * every other QEMU thread on the one housekeeping CPU left, time-shared; read from
 * `/proc/<qemu>/task/*` (`Cpus_allowed_list`, and the policy and priority of `stat`). Its
 * memory comes from the huge pages of the host's NUMA node. A second dedicated VMI finds no
 * CPU free and says so in its `Synchronized` condition, without disturbing the first, and
 * gets the CPUs once the first is gone. A VM with a dedicated CPU then gets a second socket
 * in its template (LiveUpdate): the node plugs it in place, its new vCPU pinned to the CPU
 * left, the first vCPU where it was.
 *
 * The VMIs have no disk: SeaBIOS finds nothing to boot and waits, so a realtime vCPU under
 * software emulation costs the machine little while the test reads it. In the soak tier,
 * beside the others.
 */
import assert from "node:assert/strict";
import { useCluster } from "../../deploy/cluster/cluster.ts";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { parseCpuList } from "../../mod/domain/mod.ts";
import { ensureLibvirtd, virsh } from "../helpers/libvirtd.ts";
import type { KubeClient } from "../../mod/kube/mod.ts";
import {
  createVmi,
  deleteVmi,
  getVmi,
  type HandlerProcess,
  killLaunchers,
  kubeClient,
  startHandlerProcess,
  testVmi,
  waitFor,
  waitForPhase,
} from "../helpers/handler_process.ts";

const SCHED_OTHER = 0;
const SCHED_FIFO = 1;
const NR_HUGEPAGES = "/proc/sys/vm/nr_hugepages";
/** The VMI's guest memory in 2 MiB huge pages (64 MiB). */
const GUEST_PAGES = 32;

interface QemuThread {
  tid: number;
  comm: string;
  cpus: number[];
  policy: number;
  priority: number;
}

/** Every thread of a process: name, allowed CPUs, scheduling policy and realtime priority. */
function threadsOf(pid: number): QemuThread[] {
  const out: QemuThread[] = [];
  for (const entry of Deno.readDirSync(`/proc/${pid}/task`)) {
    const dir = `/proc/${pid}/task/${entry.name}`;
    try {
      const comm = Deno.readTextFileSync(`${dir}/comm`).trim();
      const status = Deno.readTextFileSync(`${dir}/status`);
      const stat = Deno.readTextFileSync(`${dir}/stat`);
      // Fields after the command's closing parenthesis start at field 3 (state).
      const fields = stat.slice(stat.lastIndexOf(")") + 2).trim().split(/\s+/);
      out.push({
        tid: Number(entry.name),
        comm,
        cpus: parseCpuList(/^Cpus_allowed_list:\s*(\S+)/m.exec(status)![1]),
        priority: Number(fields[40 - 3]),
        policy: Number(fields[41 - 3]),
      });
    } catch {
      // A thread that ended while it was read.
    }
  }
  return out;
}

/** The CPUs this test (and the handler and launcher host it starts) may run on. */
function ownCpus(): number[] {
  return parseCpuList(
    /^Cpus_allowed_list:\s*(\S+)/m.exec(Deno.readTextFileSync("/proc/self/status"))![1],
  );
}

Deno.test("dedicated CPUs (pod-less): vCPU threads pinned under SCHED_FIFO, QEMU's others on housekeeping CPU", async () => {
  const cpus = ownCpus();
  assert.ok(cpus.length >= 2, `the test needs 2 CPUs and runs on ${cpus.join(",")}`);
  const uri = await ensureLibvirtd();
  assert.match(
    await Deno.readTextFile("/proc/mounts"),
    /^\S+ \S+ hugetlbfs /m,
    "libvirtd runs without hugetlbfs mounted (it was started before virtnode's set-up mounted one): restart it",
  );
  const hugepagesBefore = (await Deno.readTextFile(NR_HUGEPAGES)).trim();
  await Deno.writeTextFile(NR_HUGEPAGES, String(Number(hugepagesBefore) + GUEST_PAGES));
  try {
    await onPodlessNode(uri, (node) => check(node, cpus));
  } finally {
    await Deno.writeTextFile(NR_HUGEPAGES, hugepagesBefore);
  }
});

/** A pod-less node of the test's own, on a control plane with KubeVirt's admission. */
interface TestNode {
  client: KubeClient;
  ns: string;
  node: string;
}

/**
 * Runs `fn` with a pod-less handler on a node of its own, the cluster's `NUMA` feature gate
 * on (KubeVirt's admission takes NUMA passthrough with it only); ends all it started.
 */
async function onPodlessNode(uri: string, fn: (node: TestNode) => Promise<void>): Promise<void> {
  const cluster = await useCluster();
  const client = await kubeClient(cluster.kubeconfigPath);
  const id = crypto.randomUUID().slice(0, 8);
  const ns = `dedicated-${id}`;
  const node = `dedicated-node-${id}`;
  const dir = await Deno.makeTempDir({ prefix: "virtnode-dcpu-" });
  let h: HandlerProcess | undefined;
  try {
    await client.request("POST", "/api/v1/namespaces", { metadata: { name: ns } });
    const crPath = "/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts/kubevirt";
    const cr = await client.request<{ spec: { configuration?: Record<string, unknown> } }>(
      "GET",
      crPath,
    );
    const configuration = cr.spec.configuration ?? {};
    const developer = (configuration.developerConfiguration ?? {}) as Record<string, unknown>;
    await client.request("PATCH", crPath, [{
      op: "add",
      path: "/spec/configuration",
      value: {
        ...configuration,
        developerConfiguration: {
          ...developer,
          featureGates: [...((developer.featureGates ?? []) as string[]), "NUMA"],
        },
      },
    }], { contentType: "application/json-patch+json" });
    h = await startHandlerProcess({
      kubeconfig: cluster.handlerKubeconfigPath,
      nodeName: node,
      libvirtUri: uri,
      dir,
    });
    await fn({ client, ns, node });
  } catch (error) {
    if (h) console.error((await Deno.readTextFile(h.logFile).catch(() => "")).slice(-8000));
    throw error;
  } finally {
    await client.request("DELETE", `/apis/kubevirt.io/v1/namespaces/${ns}/virtualmachines/plug`)
      .catch(() => {});
    for (const name of ["rt", "second"]) await deleteVmi(client, ns, name).catch(() => {});
    for (const name of ["rt", "second", "plug"]) {
      await waitFor(`${name} to go`, async () => !(await getVmi(client, ns, name)), 60_000)
        .catch((e) => console.error(e.message));
    }
    if (h) {
      await h.kill("SIGTERM");
      killLaunchers(h.stateDir);
    }
    await client.request("DELETE", `/api/v1/namespaces/${ns}`).catch(() => {});
    client.close();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    await cluster.stop();
  }
}

/** The test's checks on its node; `cpus` are the CPUs the node's launchers may use. */
async function check({ client, ns, node }: TestNode, cpus: number[]): Promise<void> {
  // Every CPU but one for the vCPUs, the last for the emulator thread.
  const vcpus = cpus.length - 1;
  const rt = testVmi("rt", node, { namespace: ns });
  rt.spec.domain.cpu = {
    ...rt.spec.domain.cpu,
    cores: vcpus,
    dedicatedCpuPlacement: true,
    isolateEmulatorThread: true,
    realtime: {},
    numa: { guestMappingPassthrough: {} },
  };
  rt.spec.domain.memory = { guest: `${GUEST_PAGES * 2}Mi`, hugepages: { pageSize: "2Mi" } };
  // The admission's check of realtime and NUMA passthrough is met (or this throws).
  await admitted(() => createVmi(client, rt));
  await waitForPhase(client, ns, "rt", "Running", 120_000).catch(async (error) => {
    throw new Error(
      `${error.message}; VMI: ${JSON.stringify((await getVmi(client, ns, "rt"))?.status)}`,
    );
  });
  const domain = `${ns}_rt`;
  const xml = await virsh("dumpxml", domain);
  const pid = Number((await Deno.readTextFile(`/run/libvirt/qemu/${domain}.pid`)).trim());
  const emulatorCpu = cpus[cpus.length - 1];
  // The VMI is Running once the domain runs; the threads are placed by the same sync.
  const isVcpu = (t: QemuThread) => /^CPU \d+\/(KVM|TCG)$/.test(t.comm);
  let threads = threadsOf(pid);
  await waitFor("QEMU's threads to be placed", () => {
    threads = threadsOf(pid);
    return threads.filter(isVcpu).length === vcpus &&
      threads.every((t) => isVcpu(t) || (t.cpus.length === 1 && t.cpus[0] === emulatorCpu));
  }, 30_000).catch(() => {/* the assertions below say what is wrong */});
  const vcpuThreads = threads.filter(isVcpu);
  const others = threads.filter((t) => !vcpuThreads.includes(t));
  const report = threads.map((t) =>
    `${t.tid} ${t.comm}: cpus ${t.cpus.join(",")} policy ${t.policy} priority ${t.priority}`
  ).join("\n");
  console.log(`QEMU ${pid}'s threads:\n${report}`);
  // Each vCPU alone on a CPU of the VMI's, none of them the emulator's, under FIFO 1.
  const vcpuCpus = vcpuThreads.map((t) => t.cpus);
  for (const t of vcpuThreads) {
    assert.equal(t.cpus.length, 1, report);
    assert.notEqual(t.cpus[0], emulatorCpu, report);
    assert.equal(t.policy, SCHED_FIFO, report);
    assert.equal(t.priority, 1, report);
  }
  assert.equal(new Set(vcpuCpus.flat()).size, vcpus, report);
  // QEMU's other threads: the housekeeping CPU only, time-shared.
  assert.ok(others.length > 0, report);
  for (const t of others) {
    assert.deepEqual(t.cpus, [emulatorCpu], report);
    assert.equal(t.policy, SCHED_OTHER, report);
  }
  // The domain as libvirt has it: the guest's NUMA node on the host's, from its huge pages.
  assert.match(xml, new RegExp(`<emulatorpin cpuset='${emulatorCpu}'/>`));
  assert.match(xml, /<vcpusched vcpus='[^']+' scheduler='fifo' priority='1'\/>/);
  assert.match(xml, /<memory mode='strict' nodeset='0'\/>/);
  assert.match(xml, /<page size='2048' unit='KiB' nodeset='0'\/>/);
  assert.match(xml, /<pmu state='off'\/>/);
  const free = Number(
    (await Deno.readTextFile("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")).trim(),
  );
  const total = Number((await Deno.readTextFile(NR_HUGEPAGES)).trim());
  assert.ok(total - free >= GUEST_PAGES, `huge pages in use: ${total - free} of ${total}`);

  // A second VMI with a dedicated CPU finds none free: it says so and the first runs on.
  const second = testVmi("second", node, { namespace: ns });
  second.spec.domain.cpu = { ...second.spec.domain.cpu, cores: 1, dedicatedCpuPlacement: true };
  await createVmi(client, second);
  const refused = await waitFor("the second VMI's Synchronized condition", async () => {
    const v = await getVmi(client, ns, "second");
    return v?.status?.conditions?.find((c) => c.type === "Synchronized" && c.status === "False");
  });
  assert.match(
    refused.message ?? "",
    new RegExp(
      `dedicated CPU placement needs 1 CPU of this node's own; 0 of its ${cpus.length} \\(${
        cpus.join(",")
      }\\) are not dedicated to other VMIs`,
    ),
  );
  assert.equal((await getVmi(client, ns, "rt"))?.status?.phase, "Running");
  assert.deepEqual(
    threadsOf(pid).filter((t) => vcpuThreads.some((v) => v.tid === t.tid)).map((t) => t.cpus),
    vcpuCpus,
  );

  // Once the first is gone, its CPUs are the second's.
  await deleteVmi(client, ns, "rt");
  await waitFor("rt to go", async () => !(await getVmi(client, ns, "rt")), 60_000);
  const running = await waitForPhase(client, ns, "second", "Running", 120_000);
  const pinned = /<vcpupin vcpu='0' cpuset='(\d+)'\/>/.exec(
    await virsh("dumpxml", `${ns}_second`),
  );
  assert.ok(pinned && cpus.includes(Number(pinned[1])), String(running.status?.phase));
  await deleteVmi(client, ns, "second");
  await waitFor("second to go", async () => !(await getVmi(client, ns, "second")), 60_000);
  await plugInPlace({ client, ns, node }, cpus);
}

/**
 * A VM with dedicated CPUs gets one more socket in its template (`kubectl patch vm`): the
 * node plugs it in place, the launcher first pins the new vCPU to a free CPU of its own, and
 * the first vCPU stays where it was.
 */
async function plugInPlace({ client, ns, node }: TestNode, cpus: number[]): Promise<void> {
  const template = testVmi("plug", node, { namespace: ns });
  template.spec.domain.cpu = {
    ...template.spec.domain.cpu,
    sockets: 1,
    maxSockets: 2,
    dedicatedCpuPlacement: true,
  };
  const vmPath = `/apis/kubevirt.io/v1/namespaces/${ns}/virtualmachines/plug`;
  await client.request("POST", `/apis/kubevirt.io/v1/namespaces/${ns}/virtualmachines`, {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachine",
    metadata: { name: "plug", namespace: ns },
    spec: { runStrategy: "Always", template: { spec: template.spec } },
  });
  await waitForPhase(client, ns, "plug", "Running", 120_000);
  const domain = `${ns}_plug`;
  const pinsOf = (xml: string) =>
    [...xml.matchAll(/<vcpupin vcpu='(\d+)' cpuset='(\d+)'\/>/g)].map((m) => [
      Number(m[1]),
      Number(m[2]),
    ]);
  const before = pinsOf(await virsh("dumpxml", domain));
  assert.equal(before.length, 1, JSON.stringify(before));
  await client.request("PATCH", vmPath, {
    spec: { template: { spec: { domain: { cpu: { sockets: 2 } } } } },
  }, { contentType: "application/merge-patch+json" });
  const vmi = await waitFor("the plugged socket in the VMI's status", async () => {
    const v = await getVmi(client, ns, "plug");
    return v?.status?.currentCPUTopology?.sockets === 2 ? v : undefined;
  }, 60_000);
  const xml = await virsh("dumpxml", domain);
  const after = pinsOf(xml);
  assert.deepEqual(after[0], before[0], xml);
  assert.equal(after.length, 2, xml);
  assert.notEqual(after[1][1], after[0][1], xml);
  assert.ok(cpus.includes(after[1][1]), xml);
  const pid = Number((await Deno.readTextFile(`/run/libvirt/qemu/${domain}.pid`)).trim());
  const vcpu1 = await waitFor(
    "the plugged vCPU's thread",
    () => threadsOf(pid).find((t) => /^CPU 1\/(KVM|TCG)$/.test(t.comm)),
    30_000,
  );
  assert.deepEqual(vcpu1.cpus, [after[1][1]]);
  console.log(
    `plugged in place: vCPU pins ${JSON.stringify(before)} -> ${JSON.stringify(after)}, ` +
      `sockets ${vmi.status?.currentCPUTopology?.sockets}`,
  );
  await client.request("DELETE", vmPath);
  await waitFor("plug to go", async () => !(await getVmi(client, ns, "plug")), 60_000);
}

/** Runs a create, showing the admission's refusal in full when it refuses. */
async function admitted(create: () => Promise<VirtualMachineInstance>): Promise<void> {
  try {
    await create();
  } catch (error) {
    throw new Error(`KubeVirt's admission refused the VMI: ${JSON.stringify(error)}`, {
      cause: error,
    });
  }
}

/**
 * Scenario 9: virtnode beside KubeVirt's own binaries, measured in the same run.
 *
 * - **The agents on a real node**: a pod-network control plane, a node (kubelet,
 *   containerd, kube-proxy) and KubeVirt's own virt-api and virt-controller (which make
 *   launcher pods with KubeVirt's own virt-launcher image). On that node, first KubeVirt's
 *   virt-handler DaemonSet (as virt-operator makes it), then — on a fresh control plane and
 *   node, so nothing of the first is left — virtnode's DaemonSet from `deploy/`. For each:
 *   the agent's RSS, PSS and CPU idle with 0 VMIs, the same `vmis` VMIs created at once
 *   (create → Running p50/p99, from the POST to the watch's Running), and again idle with
 *   them all Running.
 * - **Per VM, the launcher side**: every launcher pod's processes apart from QEMU
 *   (virt-launcher-monitor, virt-launcher, its libvirt daemon and virtlogd, found by the
 *   pod's PID namespace): PSS, RSS and the CPU they used from their start until measured.
 *   Beside it, `virtnode launcher` (KubeVirt mode's launcher, one process per VM) started
 *   for `launchers` VMs against the host's libvirtd, with the share of that libvirtd's CPU
 *   and memory the VMs added; the launcher host's figures come from scenario 8.
 *
 * @module
 */
import { buildKubevirtPeers } from "../harness/kubevirt/peers.ts";
import { join } from "node:path";
import { type Cluster, kubectl, startCluster } from "../../deploy/cluster/cluster.ts";
import {
  launcherImage,
  type Node,
  startNode,
  virtHandlerImage,
  virtnodeImage,
} from "../harness/node/node.ts";
import { type KubevirtControlPlane, startKubevirt } from "../harness/node/kubevirt.ts";
import {
  cpuModelFor,
  DAEMONSET_NAMES,
  type LabelledNode,
  offered,
  userVmi,
  virtHandlerDaemonSet,
  virtnodeDaemonSet,
  virtnodeDirs,
} from "../harness/node/daemonsets.ts";
import { ensureLibvirtd } from "../helpers/libvirtd.ts";
import { kubeClient, testVmi } from "../helpers/handler_process.ts";
import { startNotifyServer } from "../helpers/notify_server.ts";
import { TestCmdClient } from "../helpers/cmd_client.ts";
import { launcherSocketPath } from "../../mod/launcher/mod.ts";
import type { KubeClient } from "../../mod/kube/mod.ts";
import {
  clockTicksPerSecond,
  mapLimit,
  pollUntil,
  procMemory,
  sampleProcess,
  sleep,
  summarize,
  type Summary,
} from "./_util.ts";
import type { Row } from "./_report.ts";
import { kvmDevice } from "./_floors.ts";
import { hasPhase, isDeleted, VmiWatch } from "./_watch.ts";

const REPO = new URL("../../", import.meta.url).pathname;
const NAMESPACE = "default";

/** The two node agents compared. */
export type Agent = "virt-handler" | "virtnode";

/** What scenario 9 needs. */
export interface SideBySideOptions {
  /** VMIs created at once on the node, per agent. */
  vmis: number;
  /** `virtnode launcher` processes started at once for the per-VM launcher figures. */
  launchers: number;
  /** Seconds of each idle sample. */
  idleSeconds: number;
  /** Create requests in flight. */
  concurrency: number;
  /** Prefix of every name this scenario makes (QEMU domains included). */
  prefix: string;
  log(message: string): void;
  /** Called with a cleanup for what is running, cleared (undefined) once it ended. */
  onRunning(cleanup: (() => Promise<void>) | undefined): void;
}

/** Memory and CPU of one process over an idle sample. */
export interface Idle {
  rssMean: number;
  pssMean?: number;
  cpuPercent: number;
}

/** One launcher's processes apart from QEMU: bytes and CPU-seconds, by program. */
export interface LauncherCost {
  pss: number;
  rss: number;
  cpuS: number;
  programs: Record<string, { pss: number; rss: number; cpuS: number; count: number }>;
}

/** One agent's figures on the node. */
export interface AgentFigures {
  agent: Agent;
  idle0: Idle;
  idleN: Idle;
  createMs: number[];
  create: Summary;
  allRunningS: number;
  /** Every launcher pod's processes (KubeVirt's virt-launcher image in both runs). */
  pods: LauncherCost[];
}

/** `virtnode launcher` per VM (KubeVirt mode), with its share of the host's libvirtd. */
export interface VirtnodeLauncherFigures {
  n: number;
  /** Means over the launchers. */
  pss: number;
  rss: number;
  cpuS: number;
  startToRunningMs: Summary;
  libvirtdCpuSPerVm: number;
  libvirtdPssPerVm: number;
}

/** Everything scenario 9 measured. */
export interface SideBySide {
  agents: AgentFigures[];
  launcher?: VirtnodeLauncherFigures;
  domainType: string;
}

// ---------------------------------------------------------------------------
// /proc

function cmdline(pid: string | number): string[] {
  try {
    return Deno.readTextFileSync(`/proc/${pid}/cmdline`).split("\0").filter(Boolean);
  } catch {
    return [];
  }
}

function procPids(): string[] {
  return [...Deno.readDirSync("/proc")].filter((e) => /^\d+$/.test(e.name)).map((e) => e.name);
}

function pidNamespace(pid: string | number): string | undefined {
  try {
    return Deno.readLinkSync(`/proc/${pid}/ns/pid`);
  } catch {
    return undefined;
  }
}

/** utime + stime + cutime + cstime: the process's CPU and that of children it reaped. */
function cpuTicksWithChildren(pid: string | number): number {
  try {
    const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14]);
  } catch {
    return 0;
  }
}

function comm(pid: string | number): string {
  try {
    return Deno.readTextFileSync(`/proc/${pid}/comm`).trim();
  } catch {
    return "?";
  }
}

/** The agent's main process on this host (its container's). */
function agentPid(agent: Agent): number | undefined {
  const found = procPids().filter((pid) => {
    const args = cmdline(pid);
    if (agent === "virt-handler") return /(^|\/)virt-handler$/.test(args[0] ?? "");
    return args.includes("/opt/virtnode/main.ts") && args.includes("handler");
  });
  return found.length === 1 ? Number(found[0]) : undefined;
}

/**
 * The processes of the launcher pod of the VMI `uid` apart from QEMU: everything in the
 * PID namespace of its `virt-launcher-monitor`.
 */
function launcherPodCost(uid: string): LauncherCost | undefined {
  const all = procPids();
  const monitor = all.find((pid) => {
    const args = cmdline(pid);
    return /virt-launcher-monitor$/.test(args[0] ?? "") && args.includes(uid);
  });
  const ns = monitor && pidNamespace(monitor);
  if (!ns) return undefined;
  const hz = clockTicksPerSecond();
  const cost: LauncherCost = { pss: 0, rss: 0, cpuS: 0, programs: {} };
  for (const pid of all) {
    if (pidNamespace(pid) !== ns) continue;
    const name = comm(pid);
    if (/^qemu/.test(name)) continue;
    const m = procMemory(Number(pid));
    if (!m) continue;
    const cpuS = cpuTicksWithChildren(pid) / hz;
    const p = cost.programs[name] ??= { pss: 0, rss: 0, cpuS: 0, count: 0 };
    p.pss += m.pss ?? 0;
    p.rss += m.rss;
    p.cpuS += cpuS;
    p.count++;
    cost.pss += m.pss ?? 0;
    cost.rss += m.rss;
    cost.cpuS += cpuS;
  }
  return cost;
}

/** The host's own libvirtd (in this process's PID namespace). */
export function hostLibvirtdPid(): number | undefined {
  const ns = pidNamespace("self");
  const pid = procPids().find((p) => comm(p) === "libvirtd" && pidNamespace(p) === ns);
  return pid === undefined ? undefined : Number(pid);
}

// ---------------------------------------------------------------------------
// The node

interface NodeObject extends LabelledNode {
  metadata: { labels: Record<string, string>; annotations?: Record<string, string> };
  status: { allocatable: Record<string, string> };
}

interface PodList {
  items: {
    metadata: { name: string };
    status?: {
      conditions?: { type: string; status: string }[];
      containerStatuses?: { restartCount: number }[];
    };
  }[];
}

/** One agent's run on a fresh control plane and node. */
async function measureAgent(
  agent: Agent,
  o: SideBySideOptions,
  images: { launcher: string; launcherArchive: string; agent: string; agentArchive: string },
  kubevirtDir: string,
): Promise<AgentFigures> {
  let cluster: Cluster | undefined;
  let node: Node | undefined;
  let kubevirt: KubevirtControlPlane | undefined;
  let client: KubeClient | undefined;
  let watch: VmiWatch | undefined;
  // Called from the run's finally and, on a signal, from the bench's handler: once.
  let stopping: Promise<void> | undefined;
  const stop = () => stopping ??= stopAll();
  const stopAll = async () => {
    await watch?.stop().catch(() => {});
    if (cluster) {
      await kubectl(cluster.kubeconfigPath, [
        "delete",
        "daemonset",
        "-n",
        "kubevirt",
        DAEMONSET_NAMES[agent],
        "--wait=true",
        "--timeout=60s",
      ]).catch(() => {});
    }
    await kubevirt?.stop().catch(() => {});
    await node?.stop().catch(() => {});
    client?.close();
    await cluster?.stop().catch(() => {});
  };
  o.onRunning(stop);
  try {
    // The bench's signal handler calls `stop` (the node before its control plane).
    cluster = await startCluster({ podNetwork: true, stopOnSignals: false });
    const kc = cluster.kubeconfigPath;
    client = await kubeClient(kc);
    node = await startNode(cluster);
    await node.importImage(images.launcherArchive);
    await node.importImage(images.agentArchive);
    kubevirt = await startKubevirt(cluster, { kubevirtDir, launcherImage: images.launcher });
    if (agent === "virtnode") {
      await kubectl(kc, ["apply", "-f", join(REPO, "deploy/rbac.yaml")]);
      await kubectl(
        kc,
        ["apply", "-f", "-"],
        await virtnodeDaemonSet(images.agent, images.launcher, virtnodeDirs(node)),
      );
    } else {
      await kubectl(
        kc,
        ["apply", "-f", "-"],
        await virtHandlerDaemonSet(kubevirtDir, images.agent, images.launcher, node),
      );
    }
    const c = client;
    await pollUntil(`${agent}'s pod Ready`, async () => {
      const pods = await c.request<PodList>(
        "GET",
        `/api/v1/namespaces/kubevirt/pods?labelSelector=${
          encodeURIComponent("kubevirt.io=virt-handler")
        }`,
      );
      const p = pods.items[0];
      if (p?.status?.containerStatuses?.some((s) => s.restartCount > 0)) {
        throw new Error(`${agent}'s container restarted`);
      }
      return p?.status?.conditions?.some((x) => x.type === "Ready" && x.status === "True");
    }, { timeoutMs: 180_000, intervalMs: 500 });
    const nodeName = node.name;
    const labelled = await pollUntil("the node labelled and offering devices", async () => {
      const n = await c.request<NodeObject>("GET", `/api/v1/nodes/${nodeName}`);
      const a = n.status.allocatable;
      return n.metadata.labels["kubevirt.io/schedulable"] === "true" &&
          offered(a["devices.kubevirt.io/tun"]) &&
          (offered(a["devices.kubevirt.io/kvm"]) || !kvmDevice())
        ? n
        : undefined;
    }, { timeoutMs: 120_000, intervalMs: 500 });
    const cpuModel = cpuModelFor(labelled);
    const pid = await pollUntil(`${agent}'s process`, () => agentPid(agent), {
      timeoutMs: 30_000,
    });
    o.log(`${agent}: Ready (process ${pid}); settling, then ${o.idleSeconds} s idle`);
    await sleep(10_000);
    const idle0 = await sampleProcess(pid, o.idleSeconds);

    watch = await VmiWatch.start(client, NAMESPACE);
    const w = watch;
    const names = Array.from({ length: o.vmis }, (_, i) => `${o.prefix}-${agent}-${i}`);
    const running = names.map((name) =>
      w.waitFor(`VMI ${name} Running`, hasPhase(name, "Running"), 600_000)
    );
    const t0 = performance.now();
    const created = await mapLimit(names, o.concurrency, async (name) => {
      const t = performance.now();
      await c.request(
        "POST",
        `/apis/kubevirt.io/v1/namespaces/${NAMESPACE}/virtualmachineinstances`,
        userVmi(name, cpuModel, "10m"),
      );
      return t;
    });
    const ats = await Promise.all(running);
    const createMs = ats.map((at, i) => at - created[i]);
    const allRunningS = (Math.max(...ats) - t0) / 1000;
    o.log(`${agent}: ${o.vmis} VMIs Running after ${allRunningS.toFixed(1)} s`);
    await sleep(15_000);
    const pods = names.map((name) => {
      const uid = w.latest(name)?.metadata.uid;
      const cost = uid ? launcherPodCost(uid) : undefined;
      if (!cost) throw new Error(`Cannot find the launcher pod processes of ${name}`);
      return cost;
    });
    const idleN = await sampleProcess(pid, o.idleSeconds);

    const gone = names.map((name) => w.waitFor(`${name} deleted`, isDeleted(name), 300_000));
    await mapLimit(names, o.concurrency, (name) =>
      c.request(
        "DELETE",
        `/apis/kubevirt.io/v1/namespaces/${NAMESPACE}/virtualmachineinstances/${name}`,
      ));
    await Promise.all(gone);
    return {
      agent,
      idle0,
      idleN,
      createMs,
      create: summarize(createMs),
      allRunningS,
      pods,
    };
  } catch (error) {
    if (kubevirt) o.log(`${agent}: KubeVirt's complaints:\n${await kubevirt.complaints()}`);
    if (node) o.log(`${agent}: the node's complaints:\n${await node.complaints()}`);
    throw error;
  } finally {
    await stop();
    o.onRunning(undefined);
  }
}

// ---------------------------------------------------------------------------
// virtnode's launcher (KubeVirt mode) per VM

async function measureVirtnodeLaunchers(
  o: SideBySideOptions,
  uri: string,
  domainType: "kvm" | "qemu",
): Promise<VirtnodeLauncherFigures> {
  const libvirtd = hostLibvirtdPid();
  if (!libvirtd) throw new Error("Cannot find the host's libvirtd");
  const hz = clockTicksPerSecond();
  const notify = await startNotifyServer();
  const dir = await Deno.makeTempDir({ prefix: "vnb-launchers-" });
  const children: Deno.ChildProcess[] = [];
  const clients: TestCmdClient[] = [];
  let stopping: Promise<void> | undefined;
  const stop = () => stopping ??= stopAll();
  const stopAll = async () => {
    for (const c of clients.splice(0)) c.close();
    for (const child of children) {
      try {
        child.kill("SIGTERM");
      } catch { /* gone */ }
    }
    await Promise.all(children.splice(0).map((c) => c.status));
    await notify.close();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  };
  o.onRunning(stop);
  try {
    // Settle the daemon's figures before the launchers come.
    await sleep(2_000);
    const libvirtdCpu0 = cpuTicksWithChildren(libvirtd);
    const libvirtdPss0 = procMemory(libvirtd)?.pss ?? 0;
    const names = Array.from({ length: o.launchers }, (_, i) => `${o.prefix}-kl-${i}`);
    const startMs = await Promise.all(names.map(async (name, i) => {
      const uid = crypto.randomUUID();
      const socketDir = join(dir, name, "sockets");
      const t0 = performance.now();
      const child = new Deno.Command(Deno.execPath(), {
        args: [
          "run",
          "-A",
          "--v8-flags=--lite-mode",
          join(REPO, "main.ts"),
          "launcher",
          `--namespace=${NAMESPACE}`,
          `--name=${name}`,
          `--uid=${uid}`,
          `--socket-dir=${socketDir}`,
          `--libvirt-uri=${uri}`,
          `--notify-socket=${notify.socketPath}`,
          "--grace-period=1",
          `--run-dir=${join(dir, name, "run")}`,
          `--disk-dir=${join(dir, name, "disks")}`,
          `--image-dir=${join(dir, name, "images")}`,
          `--domain-type=${domainType}`,
        ],
        stdin: "null",
        stdout: "null",
        stderr: "null",
      }).spawn();
      children[i] = child;
      const socket = launcherSocketPath(socketDir);
      await pollUntil(`${name}'s cmd socket`, async () => {
        const info = await Deno.stat(socket).catch(() => undefined);
        return info?.isSocket;
      }, { timeoutMs: 60_000, intervalMs: 20 });
      const client = new TestCmdClient(socket, 120_000);
      clients.push(client);
      const vmi = testVmi(name, "none", { namespace: NAMESPACE });
      vmi.metadata.uid = uid;
      const res = await client.vmiCall("SyncVirtualMachine", vmi);
      if (!res.success) throw new Error(`${name}: SyncVirtualMachine failed: ${res.message}`);
      await notify.waitForDomainEvent(
        (e) => e.domain?.metadata.name === name && e.domain.status.status === "Running",
        120_000,
      );
      return performance.now() - t0;
    }));
    await sleep(10_000);
    const costs = children.map((child) => {
      const m = procMemory(child.pid);
      if (!m) throw new Error(`launcher ${child.pid} is gone`);
      return { pss: m.pss ?? 0, rss: m.rss, cpuS: cpuTicksWithChildren(child.pid) / hz };
    });
    const n = costs.length;
    const mean = (k: "pss" | "rss" | "cpuS") => costs.reduce((s, c) => s + c[k], 0) / n;
    return {
      n,
      pss: mean("pss"),
      rss: mean("rss"),
      cpuS: mean("cpuS"),
      startToRunningMs: summarize(startMs),
      libvirtdCpuSPerVm: (cpuTicksWithChildren(libvirtd) - libvirtdCpu0) / hz / n,
      libvirtdPssPerVm: ((procMemory(libvirtd)?.pss ?? 0) - libvirtdPss0) / n,
    };
  } finally {
    await stop();
    o.onRunning(undefined);
  }
}

/** Runs scenario 9: both agents on the node, then virtnode's per-VM launchers. */
export async function sideBySide(o: SideBySideOptions): Promise<SideBySide> {
  const uri = await ensureLibvirtd();
  if (uri !== "qemu:///system") {
    throw new Error(`The node's labellers read the host's qemu:///system; libvirtd gave ${uri}`);
  }
  o.log("building (or finding cached) KubeVirt's programs and the three images");
  const kubevirtDir = await buildKubevirtPeers();
  const launcher = await launcherImage();
  const agents: AgentFigures[] = [];
  for (const agent of ["virt-handler", "virtnode"] as const) {
    const image = agent === "virtnode" ? await virtnodeImage() : await virtHandlerImage();
    agents.push(
      await measureAgent(agent, o, {
        launcher: launcher.name,
        launcherArchive: launcher.archive,
        agent: image.name,
        agentArchive: image.archive,
      }, kubevirtDir),
    );
  }
  const domainType = kvmDevice() ? "kvm" : "qemu";
  o.log(`virtnode launcher × ${o.launchers} against the host's libvirtd (${domainType})`);
  const virtnodeLauncher = await measureVirtnodeLaunchers(o, uri, domainType);
  return { agents, launcher: virtnodeLauncher, domainType };
}

// ---------------------------------------------------------------------------
// Rows

/** What scenario 8 measured per QEMU VM of the pod-less launcher host (bytes, CPU-seconds). */
export interface PodlessPerVm {
  n: number;
  handlerCpuS: number;
  hostCpuS: number;
  libvirtdCpuS: number;
  /** Additional PSS of handler + launcher host per idle VM. */
  pss: number;
  libvirtdPss?: number;
}

const MB = 1e6;

function meanOf(costs: LauncherCost[], key: "pss" | "rss" | "cpuS"): number {
  return costs.reduce((s, c) => s + c[key], 0) / costs.length;
}

/** Mean PSS (MB) and CPU-seconds of each program across the pods, as text. */
function byProgram(costs: LauncherCost[]): string {
  const names = [...new Set(costs.flatMap((c) => Object.keys(c.programs)))].sort();
  return names.map((name) => {
    const ps = costs.map((c) => c.programs[name]).filter((p) => p !== undefined);
    const pss = ps.reduce((s, p) => s + p.pss, 0) / costs.length / MB;
    const cpu = ps.reduce((s, p) => s + p.cpuS, 0) / costs.length;
    return `${name} ${pss.toFixed(1)} MB, ${cpu.toFixed(2)} CPU-s`;
  }).join("; ");
}

/** The rows and notes of scenario 9 (`podless`: scenario 8's per-VM figures, when it ran). */
export function sideBySideRows(
  r: SideBySide,
  podless: PodlessPerVm | undefined,
): { rows: Row[]; notes: string[] } {
  const rows: Row[] = [];
  const notes: string[] = [];
  const kv = r.agents.find((a) => a.agent === "virt-handler");
  const vn = r.agents.find((a) => a.agent === "virtnode");
  const third = "≤ ⅓ of KubeVirt's";
  if (kv && vn) {
    const n = vn.createMs.length;
    const memRow = (metric: string, v: number, k: number): Row => ({
      scenario: 9,
      metric,
      value: v / MB,
      unit: "MB",
      kubevirt: k / MB,
      kubevirtLabel: "virt-handler",
      target: third,
      met: v <= k / 3,
    });
    rows.push(
      memRow(
        "node agent RSS, 0 VMIs (real node, DaemonSet pod)",
        vn.idle0.rssMean,
        kv.idle0.rssMean,
      ),
    );
    rows.push(
      memRow(`node agent RSS, ${n} idle VMIs (real node)`, vn.idleN.rssMean, kv.idleN.rssMean),
    );
    for (
      const [label, v, k] of [
        ["0 VMIs", vn.idle0, kv.idle0],
        [`${n} idle VMIs`, vn.idleN, kv.idleN],
      ] as const
    ) {
      rows.push({
        scenario: 9,
        metric: `node agent CPU, ${label} (real node)`,
        value: v.cpuPercent,
        unit: "% core",
        kubevirt: k.cpuPercent,
        kubevirtLabel: "virt-handler",
      });
    }
    for (const q of ["p50", "p99"] as const) {
      rows.push({
        scenario: 9,
        metric: `create → Running ${q}, ${n} VMIs at once (real node, launcher pods)`,
        value: vn.create[q],
        unit: "ms",
        kubevirt: kv.create[q],
        kubevirtLabel: "virt-handler",
        ...(q === "p50"
          ? { target: "faster than KubeVirt's", met: vn.create[q] < kv.create[q] }
          : {}),
      });
    }
    const pss = (a: AgentFigures) =>
      a.idleN.pssMean === undefined ? "?" : `${(a.idleN.pssMean / MB).toFixed(1)} MB`;
    notes.push(
      `real node, ${n} VMIs (KubeVirt's virt-launcher pods, created at once, ${r.domainType}): ` +
        `all Running after ${kv.allRunningS.toFixed(1)} s with virt-handler, ` +
        `${vn.allRunningS.toFixed(1)} s with virtnode; agent PSS with ${n} idle VMIs: ` +
        `virt-handler ${pss(kv)}, virtnode ${pss(vn)}`,
    );
  }
  const pods = kv?.pods ?? vn?.pods;
  if (pods?.length) {
    const podPss = meanOf(pods, "pss");
    const podCpu = meanOf(pods, "cpuS");
    notes.push(
      `a virt-launcher pod's processes apart from QEMU (mean of ${pods.length}, from its start ` +
        `until 15 s after all were Running): PSS ${(podPss / MB).toFixed(1)} MB, RSS ${
          (meanOf(pods, "rss") / MB).toFixed(1)
        } MB, ${podCpu.toFixed(2)} CPU-s; by program: ${byProgram(pods)}` +
        (vn?.pods.length && kv
          ? `; the same pods under virtnode: PSS ${(meanOf(vn.pods, "pss") / MB).toFixed(1)} MB, ${
            meanOf(vn.pods, "cpuS").toFixed(2)
          } CPU-s`
          : ""),
    );
    const l = r.launcher;
    if (l) {
      rows.push({
        scenario: 9,
        metric: "per VM, KubeVirt mode: launcher PSS (+ its share of the node's libvirtd)",
        value: (l.pss + l.libvirtdPssPerVm) / MB,
        unit: "MB",
        kubevirt: podPss / MB,
        kubevirtLabel: "virt-launcher pod",
        target: third,
        met: l.pss + l.libvirtdPssPerVm <= podPss / 3,
      });
      rows.push({
        scenario: 9,
        metric: "per VM, KubeVirt mode: launcher start CPU (+ its share of libvirtd)",
        value: l.cpuS + l.libvirtdCpuSPerVm,
        unit: "CPU-s",
        kubevirt: podCpu,
        kubevirtLabel: "virt-launcher pod",
      });
      notes.push(
        `virtnode launcher (KubeVirt mode), ${l.n} started at once against the host's libvirtd ` +
          `(${r.domainType}): each PSS ${(l.pss / MB).toFixed(1)} MB, RSS ${
            (l.rss / MB).toFixed(1)
          } MB, ${l.cpuS.toFixed(2)} CPU-s from its start until 10 s after Running (start → ` +
          `Running p50 ${l.startToRunningMs.p50.toFixed(0)} ms); libvirtd's share per VM ${
            (l.libvirtdPssPerVm / MB).toFixed(1)
          } MB PSS, ${l.libvirtdCpuSPerVm.toFixed(2)} CPU-s`,
      );
    }
    if (podless) {
      const mem = podless.pss + (podless.libvirtdPss ?? 0);
      const cpu = podless.hostCpuS + podless.libvirtdCpuS;
      rows.push({
        scenario: 9,
        metric:
          `per VM, pod-less: launcher host + handler PSS (+ libvirtd share), ${podless.n} QEMU VMs`,
        value: mem / MB,
        unit: "MB",
        kubevirt: podPss / MB,
        kubevirtLabel: "virt-launcher pod",
        target: third,
        met: mem <= podPss / 3,
      });
      rows.push({
        scenario: 9,
        metric:
          `per VM, pod-less: launcher host start CPU (+ libvirtd share), ${podless.n} QEMU VMs`,
        value: cpu,
        unit: "CPU-s",
        kubevirt: podCpu,
        kubevirtLabel: "virt-launcher pod",
      });
      notes.push(
        `pod-less per QEMU VM (scenario 8's burst): launcher host ${podless.hostCpuS.toFixed(3)} ` +
          `CPU-s, libvirtd ${podless.libvirtdCpuS.toFixed(3)} CPU-s, handler ${
            podless.handlerCpuS.toFixed(3)
          } CPU-s; additional PSS handler + host ${(podless.pss / MB).toFixed(2)} MB, libvirtd ${
            podless.libvirtdPss === undefined ? "?" : (podless.libvirtdPss / MB).toFixed(2)
          } MB`,
      );
    }
  }
  return { rows, notes };
}

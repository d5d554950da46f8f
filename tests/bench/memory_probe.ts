/**
 * Memory of the pod-less handler and its launchers against a real apiserver and
 * libvirt's test driver: the handler idle with no VMIs, then with `--vmis N` idle
 * Running VMIs, and each launcher. Figures are medians of several samples, in MB.
 *
 * `deno run -A tests/bench/memory_probe.ts --vmis 20 [--samples 5] [--settle 8]`
 * Extra V8 flags for every process: the `DENO_V8_FLAGS` environment variable.
 *
 * @module
 */
import { startCluster } from "../../deploy/cluster/cluster.ts";
import {
  createVmi,
  kubeClient,
  startHandlerProcess,
  testVmi,
  waitForPhase,
} from "../helpers/handler_process.ts";
import { procMemory } from "./import_probe.ts";

function arg(name: string, fallback: number): number {
  const i = Deno.args.indexOf(`--${name}`);
  return i >= 0 ? Number(Deno.args[i + 1]) : fallback;
}

const VMIS = arg("vmis", 20);
const SAMPLES = arg("samples", 5);
const SETTLE_S = arg("settle", 8);

type Mem = ReturnType<typeof procMemory>;

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

function medianMem(samples: Mem[]): Mem {
  const keys = Object.keys(samples[0]) as (keyof Mem)[];
  return Object.fromEntries(
    keys.map((k) => [k, Math.round(median(samples.map((s) => s[k])) * 10) / 10]),
  ) as Mem;
}

/** The largest mappings of a process by RSS (MB, anon and file), named by their file. */
function topMappings(pid: number, n = 10): Record<string, [number, number]> {
  const byName = new Map<string, [number, number]>();
  let name = "";
  for (const line of Deno.readTextFileSync(`/proc/${pid}/smaps`).split("\n")) {
    const head = /^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s*(.*)$/.exec(line);
    if (head) {
      name = head[1] || "[anon]";
      continue;
    }
    const m = /^(Rss|Anonymous):\s+(\d+) kB/.exec(line);
    if (!m) continue;
    const entry = byName.get(name) ?? [0, 0];
    entry[m[1] === "Rss" ? 0 : 1] += Number(m[2]) / 1024;
    byName.set(name, entry);
  }
  return Object.fromEntries(
    [...byName].sort((a, b) => b[1][0] - a[1][0]).slice(0, n)
      .map(([k, [rss, anon]]) => [k, [Math.round(rss * 10) / 10, Math.round(anon * 10) / 10]]),
  );
}

/** CPU seconds (user + system) a process used so far. */
function cpuSeconds(pid: number): number {
  const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(fields[11]) + Number(fields[12])) / 100; // utime, stime in clock ticks
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function sample(pids: number[]): Promise<Mem[]> {
  const per: Mem[][] = pids.map(() => []);
  for (let i = 0; i < SAMPLES; i++) {
    pids.forEach((pid, j) => per[j].push(procMemory(pid)));
    await sleep(1000);
  }
  return per.map(medianMem);
}

async function launcherPids(stateDir: string): Promise<number[]> {
  const pids: number[] = [];
  for await (const e of Deno.readDir(`${stateDir}/launchers`)) {
    if (!e.name.endsWith(".pid")) continue;
    const sh = Number((await Deno.readTextFile(`${stateDir}/launchers/${e.name}`)).trim());
    // The pid file names the sh that execs setsid, which execs the launcher: same pid,
    // unless setsid had to fork; then take its only child.
    const comm = Deno.readTextFileSync(`/proc/${sh}/comm`).trim();
    if (comm === "deno" || comm === "virtnode") pids.push(sh);
    else {
      const kids = Deno.readTextFileSync(`/proc/${sh}/task/${sh}/children`).trim().split(/\s+/);
      pids.push(Number(kids[0]));
    }
  }
  return pids;
}

const cluster = await startCluster();
const node = `mem-${crypto.randomUUID().slice(0, 6)}`;
const client = await kubeClient(cluster.kubeconfigPath);
const h = await startHandlerProcess({
  kubeconfig: cluster.handlerKubeconfigPath,
  nodeName: node,
  libvirtUri: "test:///default",
});
const result: Record<string, unknown> = { v8flags: Deno.env.get("DENO_V8_FLAGS") ?? "" };
try {
  await sleep(SETTLE_S * 1000);
  [result.handler0] = await sample([h.child.pid]);
  const cpuStart = cpuSeconds(h.child.pid);
  const t0 = Date.now();
  const names = Array.from({ length: VMIS }, (_, i) => `vm-${i}`);
  for (const name of names) await createVmi(client, testVmi(name, node));
  for (const name of names) await waitForPhase(client, "default", name, "Running", 120_000);
  result.secondsToRunning = (Date.now() - t0) / 1000;
  result.handlerCpuToRunning = Math.round((cpuSeconds(h.child.pid) - cpuStart) * 100) / 100;
  await sleep(SETTLE_S * 1000);
  const pids = await launcherPids(h.stateDir);
  const [handlerN, ...launchers] = await sample([h.child.pid, ...pids]);
  result[`handler${VMIS}`] = handlerN;
  if (Deno.args.includes("--smaps")) {
    result.handlerMappings = topMappings(h.child.pid);
    if (pids.length > 0) result.launcherMappings = topMappings(pids[0]);
  }
  if (launchers.length > 0) {
    const keys = Object.keys(launchers[0]) as (keyof Mem)[];
    result.launcherMedian = Object.fromEntries(
      keys.map((k) => [k, Math.round(median(launchers.map((l) => l[k])) * 10) / 10]),
    );
    result.launchers = launchers.length;
    result.launcherCpuMedian = median(pids.map(cpuSeconds));
  }
} finally {
  await h.kill("SIGTERM");
  for (const pid of await launcherPids(h.stateDir).catch(() => [])) {
    try {
      Deno.kill(pid, "SIGKILL");
    } catch { /* gone */ }
  }
  client.close();
  await Deno.remove(h.dir, { recursive: true }).catch(() => {});
  await cluster.stop();
}
console.log(JSON.stringify(result));

/**
 * virtnode's benchmark (`deno task bench`): numbers, not pass/fail. It starts a real
 * control plane, runs `virtnode handler --podless` with real launcher processes
 * (libvirt's test driver for scale, QEMU for one scenario) and prints each figure
 * beside its floor measured in the same run.
 *
 * Scenarios: 1 create -> Running latency; 2 a burst of VMIs on one node; 3 domain
 * event -> VMI status latency; 4 handler RSS/CPU with idle VMIs and launcher memory;
 * 5 handler restart and re-adoption; 6 handler start-up with no VMIs; 7 create ->
 * Running with QEMU guests; 8 a burst of QEMU guests and their idle cost; 9 beside
 * KubeVirt's own virt-handler and virt-launcher on a real node (tests/bench/_kubevirt_node.ts).
 *
 * Output: a markdown table on stdout and in `tests/bench/out/latest.md`, JSON in
 * `tests/bench/out/latest.json`. Run `deno task bench --help` for the flags.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { type Cluster, startCluster } from "../../deploy/cluster/cluster.ts";
import { createVmi, kubeClient, testVmi } from "../helpers/handler_process.ts";
import { ensureLibvirtd } from "../helpers/libvirtd.ts";
import { TestCmdClient } from "../helpers/cmd_client.ts";
import type { KubeClient } from "../../mod/kube/mod.ts";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { openLibvirt } from "../../ffi/mod.ts";
import {
  apiserverBurstFloor,
  apiserverFloors,
  denoFloor,
  type FloorContext,
  kvmDevice,
  libvirtFloor,
} from "./_floors.ts";
import {
  breakdown,
  eventBreakdown,
  type EventMarks,
  launcherReadyAt,
  type RunMarks,
} from "./_breakdown.ts";
import { type BenchHandler, killLaunchers, launcherPids, spawnHandler } from "./_handler.ts";
import { migrationBench } from "./_migration.ts";
import { agentBench } from "./_agents.ts";
import { pidAlive } from "../helpers/handler_process.ts";
import {
  type Environment,
  environment,
  kubevirtRatio,
  loadAverage,
  markdown,
  ratio,
  type Row,
} from "./_report.ts";
import {
  clockTicksPerSecond,
  machineBusyTicks,
  mapLimit,
  memAvailable,
  pidsOf,
  pollUntil,
  procCpuTicks,
  procMemory,
  sampleProcess,
  sleep,
  suffix,
  summarize,
  type Summary,
} from "./_util.ts";
import { hasPhase, isDeleted, pausedIs, vmiCollection, VmiWatch } from "./_watch.ts";
import {
  hostLibvirtdPid,
  type PodlessPerVm,
  sideBySide,
  sideBySideRows,
} from "./_kubevirt_node.ts";

const TEST_URI = "test:///default";
const NAMESPACE = "default";
const OUT_DIR = new URL("./out/", import.meta.url).pathname;
const MB = 1e6;

const USAGE = `Usage: deno task bench [flags]

  --quick                 small numbers for a smoke run (5 runs, burst 10, 5 s idle, ...);
                          scenarios 1-8 unless --only names 9 (its node takes minutes)
  --runs N                scenario 1: create -> Running runs (50)
  --burst N               scenarios 2-5: VMIs on the node (200)
  --concurrency N         create requests in flight during a burst (20)
  --event-samples N       scenario 3: pause/unpause samples (50)
  --idle-seconds N        scenario 4: seconds of each idle measurement (60)
  --startup-runs N        scenario 6: handler start-ups with no VMIs (3)
  --qemu-runs N           scenario 7: QEMU create -> Running runs (10)
  --qemu-burst N          scenario 8: QEMU VMIs created at once, then idle (20)
  --node-vmis N           scenario 9: VMIs created at once on the real node, per agent (50)
  --node-launchers N      scenario 9: virtnode launchers started at once for per-VM figures (10)
  --migration-runs N      scenario 10: migrations each way, through the proxy and straight (5)
  --agent-guests N        scenario 11: test guests with QEMU's guest agent, idle (10)
  --floor-samples N       samples of each floor (50)
  --only LIST             run only these scenarios, e.g. --only 1,3,6
  --handler-log-level L   --log-level of the handler and its launchers (info)
  --timeout-minutes N     stop and clean up after this long, whatever happens (50)
  --min-free-mib N        stop creating VMIs when MemAvailable falls below this (2048)
  --help                  this text
`;

/** The benchmark's settings. */
interface Options {
  runs: number;
  burst: number;
  concurrency: number;
  eventSamples: number;
  idleSeconds: number;
  startupRuns: number;
  qemuRuns: number;
  qemuBurst: number;
  nodeVmis: number;
  nodeLaunchers: number;
  migrationRuns: number;
  agentGuests: number;
  floorSamples: number;
  only: Set<number>;
  logLevel: string;
  timeoutMinutes: number;
  minFreeMiB: number;
  quick: boolean;
}

function parseOptions(args: string[]): Options {
  const { values } = parseArgs({
    args,
    options: {
      quick: { type: "boolean", default: false },
      runs: { type: "string" },
      burst: { type: "string" },
      concurrency: { type: "string" },
      "event-samples": { type: "string" },
      "idle-seconds": { type: "string" },
      "startup-runs": { type: "string" },
      "qemu-runs": { type: "string" },
      "qemu-burst": { type: "string" },
      "node-vmis": { type: "string" },
      "node-launchers": { type: "string" },
      "migration-runs": { type: "string" },
      "agent-guests": { type: "string" },
      "floor-samples": { type: "string" },
      only: { type: "string" },
      "handler-log-level": { type: "string", default: "info" },
      "timeout-minutes": { type: "string" },
      "min-free-mib": { type: "string" },
      help: { type: "boolean", default: false },
    },
    strict: true,
  });
  if (values.help) {
    console.log(USAGE);
    Deno.exit(0);
  }
  const q = values.quick;
  const int = (name: string, raw: string | undefined, dflt: number, min = 1): number => {
    if (raw === undefined) return dflt;
    const n = Number(raw);
    if (!Number.isInteger(n) || n < min) {
      console.error(`bench: --${name} must be a whole number of at least ${min}, not "${raw}"`);
      Deno.exit(2);
    }
    return n;
  };
  const only = new Set(
    (values.only ?? (q ? QUICK_SCENARIOS : ALL_SCENARIOS).join(",")).split(",")
      .map((s) => int("only", s.trim(), 0)),
  );
  return {
    runs: int("runs", values.runs, q ? 5 : 50),
    burst: int("burst", values.burst, q ? 10 : 200, 2),
    concurrency: int("concurrency", values.concurrency, 20),
    eventSamples: int("event-samples", values["event-samples"], q ? 10 : 50, 2),
    idleSeconds: int("idle-seconds", values["idle-seconds"], q ? 5 : 60),
    startupRuns: int("startup-runs", values["startup-runs"], q ? 2 : 3),
    qemuRuns: int("qemu-runs", values["qemu-runs"], q ? 2 : 10),
    qemuBurst: int("qemu-burst", values["qemu-burst"], q ? 3 : 20),
    nodeVmis: int("node-vmis", values["node-vmis"], q ? 3 : 50),
    nodeLaunchers: int("node-launchers", values["node-launchers"], q ? 2 : 10),
    migrationRuns: int("migration-runs", values["migration-runs"], q ? 1 : 5),
    agentGuests: int("agent-guests", values["agent-guests"], q ? 2 : 10),
    floorSamples: int("floor-samples", values["floor-samples"], q ? 10 : 50),
    only,
    logLevel: values["handler-log-level"]!,
    timeoutMinutes: int("timeout-minutes", values["timeout-minutes"], 50),
    minFreeMiB: int("min-free-mib", values["min-free-mib"], 2048, 0),
    quick: q!,
  };
}

// ---------------------------------------------------------------------------
// Everything the run has started, so that any way out cleans it up.

const live = {
  handlers: new Set<BenchHandler>(),
  stateDirs: new Set<string>(),
  dirs: new Set<string>(),
  /** Name fragment of every QEMU domain this run may have defined. */
  qemuFragment: "",
  qemuUsed: false,
  cluster: undefined as Cluster | undefined,
  /** Stops what scenario 9 has running (its own control plane and node, or launchers). */
  sideBySide: undefined as (() => Promise<void>) | undefined,
};

/** Synchronous last-resort cleanup (signals, the global timeout, unload). */
function cleanupNow(): void {
  for (const h of live.handlers) {
    try {
      Deno.kill(h.pid, "SIGKILL");
    } catch { /* gone */ }
  }
  live.handlers.clear();
  for (const dir of live.stateDirs) killLaunchers(dir);
  if (live.qemuUsed && live.qemuFragment) removeQemuDomainsSync(live.qemuFragment);
  for (const dir of live.dirs) {
    try {
      if (!Deno.env.get("KEEP_BENCH_DIRS")) Deno.removeSync(dir, { recursive: true });
    } catch { /* gone */ }
  }
  live.dirs.clear();
}

function virshSync(args: string[]): string {
  try {
    const out = new Deno.Command("virsh", {
      args: ["-c", "qemu:///system", ...args],
      stdout: "piped",
      stderr: "null",
    }).outputSync();
    return new TextDecoder().decode(out.stdout);
  } catch {
    return "";
  }
}

function removeQemuDomainsSync(fragment: string): void {
  const names = virshSync(["list", "--all", "--name"]).split("\n").map((s) => s.trim());
  for (const name of names.filter((n) => n.includes(fragment))) {
    virshSync(["destroy", name]);
    virshSync(["undefine", "--nvram", name]);
    virshSync(["undefine", name]);
  }
}

async function removeQemuDomains(fragment: string): Promise<number> {
  const conn = await openLibvirt("qemu:///system", { events: false });
  let removed = 0;
  try {
    for (const d of await conn.listAllDomains()) {
      if (!d.name.includes(fragment)) continue;
      try {
        const dom = await conn.lookupByName(d.name);
        if (d.stateName !== "Shutoff") await dom.destroy();
        await dom.undefine({ nvram: true }).catch(() => dom.undefine());
        removed++;
        log(`cleanup: removed leftover QEMU domain ${d.name} (${d.stateName})`);
      } catch { /* gone meanwhile */ }
    }
  } finally {
    await conn.close();
  }
  return removed;
}

async function stopHandler(h: BenchHandler, signal: Deno.Signal = "SIGTERM"): Promise<void> {
  await h.kill(signal, 15_000);
  live.handlers.delete(h);
}

// ---------------------------------------------------------------------------
// The run's shared context and small steps.

interface Ctx {
  opts: Options;
  client: KubeClient;
  watch: VmiWatch;
  kubeconfig: string;
  prefix: string;
  floorCtx: FloorContext;
  rows: Row[];
  notes: string[];
  json: Record<string, unknown>;
}

function startNewHandler(ctx: Ctx, nodeName: string, uri: string, dir?: string) {
  return spawnHandler({
    kubeconfig: ctx.kubeconfig,
    nodeName,
    libvirtUri: uri,
    dir,
    logLevel: ctx.opts.logLevel,
    readyTimeoutMs: 120_000,
  }).then((h) => {
    live.handlers.add(h);
    live.stateDirs.add(h.stateDir);
    live.dirs.add(h.dir);
    return h;
  });
}

/** Throws when the machine is short of memory: the benchmark shares it with others. */
function checkMemory(ctx: Ctx): void {
  const free = memAvailable();
  if (free < ctx.opts.minFreeMiB * 1024 * 1024) {
    throw new Error(
      `Cannot create more VMIs: MemAvailable ${
        (free / MB).toFixed(0)
      } MB is below --min-free-mib ${ctx.opts.minFreeMiB}`,
    );
  }
}

/** Creates a VMI and returns ms from the POST to the watch's first Running, and its UID. */
async function createRunning(
  ctx: Ctx,
  name: string,
  node: string,
  timeoutMs: number,
): Promise<{ ms: number; uid: string; createdAt: number; runningSeenAt: number }> {
  const running = ctx.watch.waitFor(`VMI ${name} Running`, hasPhase(name, "Running"), timeoutMs);
  const t0 = performance.now();
  let created: VirtualMachineInstance;
  try {
    created = await createVmi(ctx.client, testVmi(name, node, { namespace: NAMESPACE }));
  } catch (error) {
    running.catch(() => {});
    throw error;
  }
  const seen = await running;
  const epoch = (t: number) => performance.timeOrigin + t;
  return {
    ms: seen - t0,
    uid: created.metadata.uid!,
    createdAt: epoch(t0),
    runningSeenAt: epoch(seen),
  };
}

/** The create -> Running breakdown of runs as one report note. */
async function breakdownNote(what: string, h: BenchHandler, marks: RunMarks[]): Promise<string> {
  const b = breakdown(await Deno.readTextFile(h.logFile), marks);
  // Log lines carry whole milliseconds: a segment under 1 ms may come out slightly negative.
  const ms = (v: number) => Math.max(0, v).toFixed(0);
  const part = (label: string, s: Summary) => `${label} p50 ${ms(s.p50)} ms (p99 ${ms(s.p99)})`;
  return `${what} create → Running, where the time goes (from the handler's and the launcher host's logs, n=${b.toWatch.n}): ` +
    [
      part("create → handler asks the launcher host", b.toLauncherSpawn),
      part('→ the host\'s "Launcher ready" (cmd socket served)', b.launcherStart),
      part("→ handler writes Running", b.toRunningWritten),
      part("→ watch sees it", b.toWatch),
    ].join("; ");
}

/** Deletes a VMI; returns ms until its launcher process has exited. */
async function deleteAndReap(
  ctx: Ctx,
  h: BenchHandler,
  name: string,
  uid: string,
  timeoutMs: number,
): Promise<number> {
  const pid = pidOf(h, uid);
  const gone = ctx.watch.waitFor(`VMI ${name} deleted`, isDeleted(name), timeoutMs);
  const t0 = performance.now();
  await ctx.client.request("DELETE", `${vmiCollection(NAMESPACE)}/${name}`);
  await gone;
  if (pid !== undefined) {
    await pollUntil(`the launcher of ${name} to exit`, () => !pidAlive(pid), {
      timeoutMs,
      intervalMs: 10,
    });
  } else {
    // Served by the launcher host: done once the host has forgotten the VMI.
    const record = `${h.stateDir}/launcher-host/vms/${uid}.json`;
    await pollUntil(`the launcher host to let ${name} go`, () => {
      try {
        Deno.lstatSync(record);
        return false;
      } catch {
        return true;
      }
    }, { timeoutMs, intervalMs: 10 });
  }
  return performance.now() - t0;
}

function pidOf(h: BenchHandler, uid: string): number | undefined {
  try {
    const pid = Number(Deno.readTextFileSync(`${h.stateDir}/launchers/${uid}.pid`).trim());
    return Number.isInteger(pid) && pid > 1 ? pid : undefined;
  } catch {
    return undefined;
  }
}

/** Times a LIST of a node's VMIs (what a starting handler's informer does first). */
async function listMs(ctx: Ctx, node: string): Promise<number> {
  const samples: number[] = [];
  for (let i = 0; i < 5; i++) {
    const t = performance.now();
    await ctx.client.request("GET", "/apis/kubevirt.io/v1/virtualmachineinstances", undefined, {
      query: { labelSelector: `kubevirt.io/nodeName=${node}` },
    });
    samples.push(performance.now() - t);
  }
  return summarize(samples).p50;
}

function log(message: string): void {
  console.error(`bench ${new Date().toISOString().slice(11, 19)} ${message}`);
}

function fmtSummary(s: Summary): string {
  return `p50 ${s.p50.toFixed(1)} ms, p99 ${s.p99.toFixed(1)} ms (n=${s.n})`;
}

function newestLauncherLog(stateDir: string): string | undefined {
  try {
    const logs = [...Deno.readDirSync(`${stateDir}/launchers`)]
      .filter((e) => e.name.endsWith(".log"))
      .map((e) => `${stateDir}/launchers/${e.name}`)
      .map((p) => ({ p, t: Deno.statSync(p).mtime?.getTime() ?? 0 }))
      .sort((a, b) => b.t - a.t);
    return logs[0]?.p;
  } catch {
    return undefined;
  }
}

/** Runs one scenario; a failure is noted and the run goes on. */
async function scenario(ctx: Ctx, n: number, title: string, fn: () => Promise<void>) {
  if (!ctx.opts.only.has(n)) return;
  log(`scenario ${n}: ${title}`);
  const t = performance.now();
  try {
    await fn();
  } catch (error) {
    const msg = error instanceof Error ? error.message.split("\n")[0] : String(error);
    ctx.notes.push(`scenario ${n} (${title}) failed: ${msg}`);
    log(`scenario ${n} failed: ${error instanceof Error ? error.stack : error}`);
    for (const h of live.handlers) {
      const tail = (await Deno.readTextFile(h.logFile).catch(() => "")).slice(-3000);
      log(`log tail of the handler in ${h.dir}:\n${tail}`);
      const launcherLog = newestLauncherLog(h.stateDir);
      if (launcherLog) {
        const lt = (await Deno.readTextFile(launcherLog).catch(() => "")).slice(-3000);
        log(`log tail of launcher ${launcherLog}:\n${lt}`);
      }
    }
  }
  log(`scenario ${n} took ${((performance.now() - t) / 1000).toFixed(1)} s`);
}

// ---------------------------------------------------------------------------

/** The floors of one run, which every scenario's rows stand beside. */
interface Floors {
  a: Summary;
  b: Summary;
  c: Summary;
  suspend: Summary;
  open: Summary;
  denoStart: Summary;
  /** Create -> Running's floor: a + b + c. */
  createFloor: { p50: number; p99: number };
  /** A bare Deno's idle RSS. */
  denoRss: number;
  env: Environment;
}

/** What the scenarios of one run share: the context, the floors and the test-driver node. */
interface BenchRun extends Ctx {
  floors: Floors;
  createFloor: Floors["createFloor"];
  denoRss: number;
  env: Environment;
  /** The test-driver node of scenarios 1-6. */
  node: string;
  /** That node's handler; scenario 5 replaces it. */
  h?: BenchHandler;
  /** The VMIs of scenario 2's burst, the population of scenarios 3-5. */
  burstNames: string[];
  /** Scenario 4's samples, by VMI count (`host-<count>` for the launcher host). */
  idle: Record<string, Awaited<ReturnType<typeof sampleProcess>>>;
}

async function run(opts: Options, started: number): Promise<void> {
  const prefix = `vnb-${suffix()}`;
  live.qemuFragment = prefix;
  log(`starting the control plane (prefix ${prefix})`);
  // The run's own signal handler stops the control planes, after scenario 9's node.
  const cluster = await startCluster({ stopOnSignals: false });
  live.cluster = cluster;
  const client = await kubeClient(cluster.kubeconfigPath);
  const watch = await VmiWatch.start(client, NAMESPACE);
  const floorCtx: FloorContext = { client, watch, namespace: NAMESPACE, prefix, timeoutMs: 30_000 };
  const ctx: Ctx = {
    opts,
    client,
    watch,
    kubeconfig: cluster.kubeconfigPath,
    prefix,
    floorCtx,
    rows: [],
    notes: [],
    json: {},
  };
  let env: Environment | undefined;
  try {
    const floors = await measureFloors(ctx);
    env = floors.env;
    const idle: BenchRun["idle"] = {};
    ctx.json.idle = idle;
    const b: BenchRun = {
      ...ctx,
      floors,
      createFloor: floors.createFloor,
      denoRss: floors.denoRss,
      env,
      node: `${prefix}-node`,
      burstNames: Array.from({ length: opts.burst }, (_, i) => `${prefix}-b-${i}`),
      idle,
    };
    // The last start-up's handler stays as the node's handler.
    await startupScenario(b);
    if ([1, 2, 3, 4, 5].some((n) => opts.only.has(n))) {
      log(`starting the handler of node ${b.node}`);
      b.h = await startNewHandler(b, b.node, TEST_URI);
    }
    if (b.h && opts.only.has(4)) {
      await scenario(b, 4, "handler RSS/CPU with 0 idle VMIs", async () => {
        await sleep(5_000); // start-up work (labeller, heartbeat) settles first
        await idleRow(b, 0, "0 idle VMIs");
      });
    }
    if (b.h) await createToRunningScenario(b);
    const populated = b.h && [2, 3, 4, 5].some((n) => opts.only.has(n)) &&
      await burstScenario(b);
    if (b.h && populated) {
      // Trailing status writes settle, and the launcher host's extra libvirt call workers
      // (started while the burst's calls waited) retire after 30 s idle: idle is measured
      // after that (35 s for a burst of 200, less for a small one).
      await sleep(Math.min(35_000, 5_000 + opts.burst * 150));
      if (opts.only.has(4)) {
        await scenario(b, 4, `handler and launchers with ${opts.burst} idle VMIs`, async () => {
          await idleRow(b, opts.burst, `${opts.burst} idle VMIs`);
          // Per-VM memory is the row above: one launcher host serves every VMI.
        });
      }
      await domainEventScenario(b);
      await restartScenario(b);
      if (opts.only.has(4)) await halfIdleScenario(b);
    }
    if (b.h) await drainDriverNode(b);
    await qemuScenario(b);
    await migrationScenario(b);
    await agentScenario(b);
    await sideBySideScenario(b);
  } finally {
    if (env) {
      env.loadAtEnd = loadAverage();
      const durationS = (performance.now() - started) / 1000;
      await writeReport(env, ctx, durationS);
    }
    await watch.stop();
    client.close();
  }
}

/** The floors of the run, measured first on a quiet control plane. */
async function measureFloors(ctx: Ctx): Promise<Floors> {
  const { opts, prefix, floorCtx } = ctx;
  log("floors: apiserver create -> watch, status write -> watch, libvirt, bare Deno");
  const api = await apiserverFloors(floorCtx, opts.floorSamples);
  const lv = await libvirtFloor(TEST_URI, prefix, {
    n: opts.floorSamples,
    domainType: kvmDevice() ? "kvm" : "qemu",
  });
  const deno = await denoFloor(5);
  const env = environment(lv.version);
  const floors = {
    a: summarize(api.create),
    b: summarize(lv.defineStart),
    c: summarize(api.statusPatch),
    suspend: summarize(lv.suspend),
    open: summarize(lv.open),
    denoStart: summarize(deno.startMs),
  };
  ctx.json.floors = { ...floors, denoRss: deno.rss, denoPss: deno.pss };
  log(
    `floor (a) ${fmtSummary(floors.a)}; (b) ${fmtSummary(floors.b)}; (c) ${
      fmtSummary(floors.c)
    }; (d) RSS ${(deno.rss / MB).toFixed(1)} MB; (e) ${fmtSummary(floors.denoStart)}`,
  );
  const createFloor = {
    p50: floors.a.p50 + floors.b.p50 + floors.c.p50,
    p99: floors.a.p99 + floors.b.p99 + floors.c.p99,
  };
  ctx.notes.push(
    `floors (same run): (a) apiserver create → watch ADDED ${fmtSummary(floors.a)}; ` +
      `(b) libvirt define+start (test driver, in one process) ${fmtSummary(floors.b)}, ` +
      `connection open p50 ${floors.open.p50.toFixed(1)} ms; ` +
      `(c) status write → watch MODIFIED ${fmtSummary(floors.c)}; ` +
      `(d) bare Deno (same V8 flags) idle RSS ${(deno.rss / MB).toFixed(1)} MB, PSS ${
        deno.pss ? (deno.pss / MB).toFixed(1) : "?"
      } MB; (e) bare Deno start → exit ${fmtSummary(floors.denoStart)}`,
  );
  return { ...floors, createFloor, denoRss: deno.rss, env };
}

/** Scenario 6: start-up with no VMIs. */
async function startupScenario(ctx: BenchRun): Promise<void> {
  const { opts, prefix, floors } = ctx;
  await scenario(ctx, 6, "handler start-up with 0 VMIs", async () => {
    const toReady: number[] = [];
    const toLine: number[] = [];
    for (let i = 0; i < opts.startupRuns; i++) {
      const fresh = await startNewHandler(ctx, `${prefix}-startup-${i}`, TEST_URI);
      toReady.push(fresh.readyAt - fresh.spawnedAt);
      const line = await Promise.race([fresh.readyLine, sleep(10_000).then(() => undefined)]);
      if (line) toLine.push(line.at - fresh.spawnedAt);
      await stopHandler(fresh);
      killLaunchers(fresh.stateDir); // its launcher host outlives it by design
      await Deno.remove(fresh.dir, { recursive: true }).catch(() => {});
      live.dirs.delete(fresh.dir);
      live.stateDirs.delete(fresh.stateDir);
    }
    const empty = await listMs(ctx, `${prefix}-startup-0`);
    const s = summarize(toReady);
    ctx.json.startup = { toReadyMs: toReady, toReadyLineMs: toLine, listMs: empty };
    ctx.rows.push({
      scenario: 6,
      metric: `handler start-up, 0 VMIs: spawn → /readyz 200 (p50 of ${s.n})`,
      value: s.p50,
      unit: "ms",
      floor: floors.denoStart.p50 + empty,
      floorNote: "bare Deno start→exit + LIST",
    });
  });
}

/** Scenario 4's rows: the handler's (and launcher host's) memory and CPU with `count` idle VMIs. */
async function idleRow(ctx: BenchRun, count: number, label: string): Promise<void> {
  const { opts, idle } = ctx;
  const hostPids = ctx.h!.launcherPids();
  const [s, hs] = await Promise.all([
    sampleProcess(ctx.h!.pid, opts.idleSeconds),
    hostPids.length === 1 ? sampleProcess(hostPids[0], opts.idleSeconds) : undefined,
  ]);
  idle[String(count)] = s;
  if (hs) idle[`host-${count}`] = hs;
  ctx.rows.push({
    scenario: 4,
    metric: `handler RSS, ${label} (mean over ${opts.idleSeconds} s)`,
    value: s.rssMean / MB,
    unit: "MB",
    floor: ctx.denoRss / MB,
    floorNote: "bare Deno",
    ...(count === opts.burst
      ? {
        target: "≤ 100 MB",
        met: s.rssMean <= 100 * MB,
        publicFigure: "memory request 325Mi (341 MB); 270–315 MB highest seen",
      }
      : {}),
  });
  if (hs) {
    ctx.rows.push({
      scenario: 4,
      metric: `launcher host RSS, ${label}`,
      value: hs.rssMean / MB,
      unit: "MB",
      floor: ctx.denoRss / MB,
      floorNote: "bare Deno",
    });
    const cpu = s.cpuPercent + hs.cpuPercent;
    ctx.rows.push({
      scenario: 4,
      metric: `handler + launcher host CPU, ${label}`,
      value: cpu,
      unit: "% core",
      ...(count === opts.burst ? { target: "≤ 0.5 % core", met: cpu <= 0.5 } : {}),
    });
    const zero = idle["0"];
    const zeroHost = idle["host-0"];
    if (
      count > 0 && zero?.pssMean !== undefined && zeroHost?.pssMean !== undefined &&
      s.pssMean !== undefined && hs.pssMean !== undefined
    ) {
      const perVm = (s.pssMean + hs.pssMean - zero.pssMean - zeroHost.pssMean) / count;
      ctx.rows.push({
        scenario: 4,
        metric: `additional PSS (handler + launcher host) per idle VM, 0 → ${count} VMIs`,
        value: perVm / MB,
        unit: "MB",
        target: "≤ 2 MB",
        met: perVm <= 2 * MB,
      });
    }
  } else {
    ctx.rows.push({
      scenario: 4,
      metric: `handler CPU, ${label}`,
      value: s.cpuPercent,
      unit: "% core",
    });
  }
  log(
    `idle ${count}: RSS ${(s.rssMean / MB).toFixed(1)} MB, CPU ${s.cpuPercent.toFixed(2)} %${
      hs ? `; host RSS ${(hs.rssMean / MB).toFixed(1)} MB, CPU ${hs.cpuPercent.toFixed(2)} %` : ""
    }`,
  );
  ctx.notes.push(
    `handler with ${label}: RSS mean ${(s.rssMean / MB).toFixed(1)} MB, max ${
      (s.rssMax / MB).toFixed(1)
    } MB; PSS mean ${s.pssMean === undefined ? "?" : (s.pssMean / MB).toFixed(1)} MB${
      hs
        ? `; launcher host RSS mean ${(hs.rssMean / MB).toFixed(1)} MB, PSS ${
          hs.pssMean === undefined ? "?" : (hs.pssMean / MB).toFixed(1)
        } MB`
        : ""
    }`,
  );
}

/** Scenario 1: create -> Running, one at a time. */
async function createToRunningScenario(ctx: BenchRun): Promise<void> {
  const { opts, prefix, node, floors, createFloor } = ctx;
  const handler = ctx.h!;
  await scenario(ctx, 1, `create → Running × ${opts.runs}`, async () => {
    const lat: number[] = [];
    const reap: number[] = [];
    const marks: RunMarks[] = [];
    for (let i = 0; i <= opts.runs; i++) {
      const name = `${prefix}-one-${i}`;
      const r = await createRunning(ctx, name, node, 60_000);
      const ready = launcherReadyAt(handler.stateDir, r.uid);
      const d = await deleteAndReap(ctx, handler, name, r.uid, 60_000);
      // Run 0 warms the caches of the handler and the disk; it is not counted.
      if (i > 0) {
        lat.push(r.ms);
        reap.push(d);
        marks.push({ ...r, launcherReadyAt: ready });
      }
    }
    ctx.notes.push(await breakdownNote("test driver:", handler, marks));
    const s = summarize(lat);
    ctx.json.createToRunning = { samplesMs: lat, deleteToLauncherExitMs: reap, summary: s };
    log(`create → Running ${fmtSummary(s)}`);
    for (const q of ["p50", "p99"] as const) {
      ctx.rows.push({
        scenario: 1,
        metric: `create → Running, ${q} (test driver, ${s.n} runs)`,
        value: s[q],
        unit: "ms",
        floor: createFloor[q],
        floorNote: "a+b+c",
        ...(q === "p50" ? { target: "≤ 1.5× floor", met: s[q] <= 1.5 * createFloor[q] } : {}),
      });
    }
    // KubeVirt's phases need two writes of the VMI in order (Scheduled by the part of
    // virt-controller pod-less mode plays, then Running by the handler), where the floor
    // above has one: the least any implementation of that order can take.
    ctx.rows.push({
      scenario: 1,
      metric: `create → Running, p50, beside two writes in order (test driver, ${s.n} runs)`,
      value: s.p50,
      unit: "ms",
      floor: createFloor.p50 + floors.c.p50,
      floorNote: "a+b+2c: Scheduled, then Running written",
    });
    ctx.notes.push(
      `delete → launcher gone (test driver): ${fmtSummary(summarize(reap))}`,
    );
  });
}

/**
 * Scenario 2: a burst of VMIs, which are also the population of scenarios 3, 4 and 5
 * (brought up unmeasured where scenario 2 is not asked for). Whether they are all Running.
 */
async function burstScenario(ctx: BenchRun): Promise<boolean> {
  const { opts, floorCtx, prefix, node, burstNames } = ctx;
  let populated = false;
  await scenario(ctx, 2, `burst of ${opts.burst} VMIs`, async () => {
    log("burst floor: apiserver and libvirt doing the same amount of work");
    const apiBurst = await apiserverBurstFloor(floorCtx, opts.burst, opts.concurrency);
    const lvBurst = await libvirtFloor(TEST_URI, `${prefix}-bf`, {
      n: 1,
      burst: opts.burst,
      concurrency: opts.concurrency,
      domainType: kvmDevice() ? "kvm" : "qemu",
    });
    const floorMs = apiBurst.createAllMs + apiBurst.statusAllMs + lvBurst.burstMs;
    const timeoutMs = Math.max(120_000, opts.burst * 1_500);
    const waits = burstNames.map((n) =>
      ctx.watch.waitFor(`VMI ${n} Running`, hasPhase(n, "Running"), timeoutMs)
    );
    // Where the CPU goes during the burst: the handler, its launcher host, the
    // apiserver and etcd, and the whole machine (the bench itself included).
    const cpuParts: [string, number[]][] = [
      ["handler", [ctx.h!.pid]],
      ["launcher host", ctx.h!.launcherPids()],
      ["kube-apiserver", pidsOf("kube-apiserver", live.cluster!.dir)],
      ["etcd", pidsOf("etcd", live.cluster!.dir)],
    ];
    const ticksOf = (pids: number[]) => pids.reduce((t, p) => t + (procCpuTicks(p) ?? 0), 0);
    const cpu0 = cpuParts.map(([, pids]) => ticksOf(pids));
    const machine0 = machineBusyTicks();
    const t0 = performance.now();
    const created = await mapLimit(burstNames, opts.concurrency, async (n) => {
      checkMemory(ctx);
      const t = performance.now();
      await createVmi(ctx.client, testVmi(n, node, { namespace: NAMESPACE }));
      return t;
    });
    const settled = await Promise.allSettled(waits);
    const failed = settled.filter((s) => s.status === "rejected").length;
    if (failed) throw new Error(`${failed} of ${opts.burst} VMIs did not get Running in time`);
    const ats = settled.map((s) => (s as PromiseFulfilledResult<number>).value);
    const allMs = Math.max(...ats) - t0;
    const hz = clockTicksPerSecond();
    const cpuSeconds = cpuParts.map(([name, pids], i) =>
      [name, (ticksOf(pids) - cpu0[i]) / hz] as [string, number]
    );
    const machineSeconds = (machineBusyTicks() - machine0) / hz;
    ctx.json.burstCpu = { ...Object.fromEntries(cpuSeconds), machine: machineSeconds };
    const each = summarize(ats.map((at, i) => at - created[i]));
    populated = true;
    ctx.json.burst = {
      n: opts.burst,
      allRunningMs: allMs,
      perVmi: each,
      floor: { ...apiBurst, libvirtMs: lvBurst.burstMs, totalMs: floorMs },
    };
    log(
      `burst: all ${opts.burst} Running after ${(allMs / 1000).toFixed(1)} s (floor ${
        (floorMs / 1000).toFixed(2)
      } s)`,
    );
    ctx.rows.push({
      scenario: 2,
      metric: `burst of ${opts.burst}: create → all Running`,
      value: allMs / 1000,
      unit: "s",
      floor: floorMs / 1000,
      floorNote: "same burst through apiserver + libvirt",
    });
    ctx.rows.push({
      scenario: 2,
      metric: `burst of ${opts.burst}: VMIs per second`,
      value: opts.burst / (allMs / 1000),
      unit: "/s",
      floor: opts.burst / (floorMs / 1000),
      floorNote: "same",
      higherIsBetter: true,
      target: "≥ 50 /s",
      met: opts.burst / (allMs / 1000) >= 50,
    });
    ctx.notes.push(
      `burst of ${opts.burst}: CPU-seconds spent while it ran (${
        (allMs / 1000).toFixed(1)
      } s of wall time, ${navigator.hardwareConcurrency} CPUs): ${
        cpuSeconds.map(([n, v]) => `${n} ${v.toFixed(2)}`).join(", ")
      }, whole machine ${machineSeconds.toFixed(2)} (${
        (cpuSeconds[0][1] * 1000 / opts.burst).toFixed(1)
      } ms of handler and ${
        (cpuSeconds[1][1] * 1000 / opts.burst).toFixed(1)
      } ms of launcher host CPU per VMI)`,
    );
    ctx.notes.push(
      `burst of ${opts.burst}: the first VMI was Running after ${
        (each.min / 1000).toFixed(1)
      } s; each VMI's create → Running ${fmtSummary(each)}; floor parts: ` +
        `creates seen ${apiBurst.createAllMs.toFixed(0)} ms, status writes seen ${
          apiBurst.statusAllMs.toFixed(0)
        } ms, libvirt define+start ${lvBurst.burstMs.toFixed(0)} ms`,
    );
  });
  if (!populated && !opts.only.has(2)) {
    // Scenario 2 not asked for: still bring up the population, unmeasured.
    await mapLimit(burstNames, opts.concurrency, async (n) => {
      checkMemory(ctx);
      const w = ctx.watch.waitFor(`VMI ${n} Running`, hasPhase(n, "Running"), 300_000);
      await createVmi(ctx.client, testVmi(n, node, { namespace: NAMESPACE }));
      await w;
    });
    populated = true;
  }
  return populated;
}

/** Scenario 3: domain event -> VMI status. */
async function domainEventScenario(ctx: BenchRun): Promise<void> {
  const { opts, burstNames, floors } = ctx;
  const h = ctx.h;
  await scenario(ctx, 3, `domain event → VMI status × ${opts.eventSamples}`, async () => {
    const targets = burstNames.slice(0, Math.min(5, burstNames.length));
    const clients = new Map<string, TestCmdClient>();
    const samples: { kind: string; ms: number; rpcMs: number }[] = [];
    const marks: EventMarks[] = [];
    try {
      for (let i = 0; i < opts.eventSamples; i++) {
        const name = targets[Math.floor(i / 2) % targets.length];
        const vmi = ctx.watch.latest(name);
        if (!vmi) throw new Error(`Cannot find VMI ${name} on the watch`);
        const uid = vmi.metadata.uid!;
        let cmd = clients.get(uid);
        if (!cmd) {
          cmd = new TestCmdClient(`${h!.runDir}/sockets/${uid}/launcher-sock`, 10_000);
          clients.set(uid, cmd);
        }
        const pause = i % 2 === 0;
        const seen = ctx.watch.waitFor(
          `VMI ${name} ${pause ? "paused" : "unpaused"}`,
          pausedIs(name, pause),
          10_000,
        );
        const t0 = performance.now();
        const res = await cmd.vmiCall(
          pause ? "PauseVirtualMachine" : "UnpauseVirtualMachine",
          vmi,
        );
        const rpcMs = performance.now() - t0;
        if (!res.success) {
          seen.catch(() => {});
          throw new Error(`Cannot ${pause ? "pause" : "unpause"} ${name}: ${res.message}`);
        }
        const seenAt = await seen;
        samples.push({ kind: pause ? "pause" : "unpause", ms: seenAt - t0, rpcMs });
        marks.push({
          uid,
          status: pause ? "Paused" : "Running",
          sentAt: performance.timeOrigin + t0,
          seenAt: performance.timeOrigin + seenAt,
        });
      }
    } finally {
      for (const c of clients.values()) c.close();
    }
    const s = summarize(samples.map((x) => x.ms));
    const rpc = summarize(samples.map((x) => x.rpcMs));
    const eb = eventBreakdown(h!.stateDir, marks);
    ctx.json.domainEvent = { samples, summary: s, rpc, breakdown: eb };
    ctx.notes.push(
      `domain event → status is timed from sending Pause/Unpause to the launcher's cmd socket; ` +
        `that call alone took ${fmtSummary(rpc)}; from the launchers' logs (n=${eb.toWatch.n}): ` +
        `call sent → launcher logs the domain event p50 ${eb.toLauncherEvent.p50.toFixed(0)} ms ` +
        `(p99 ${eb.toLauncherEvent.p99.toFixed(0)}), → watch sees the VMI status p50 ${
          eb.toWatch.p50.toFixed(0)
        } ms (p99 ${eb.toWatch.p99.toFixed(0)})`,
    );
    log(`domain event → status ${fmtSummary(s)}`);
    for (const q of ["p50", "p99"] as const) {
      ctx.rows.push({
        scenario: 3,
        metric: `domain event → VMI status, ${q} (pause/unpause, ${s.n} samples)`,
        value: s[q],
        unit: "ms",
        floor: floors.c[q] + floors.suspend[q],
        floorNote: "c + libvirt suspend call",
        ...(q === "p99" ? { target: "≤ 50 ms", met: s.p99 <= 50 } : {}),
      });
    }
  });
}

/** Scenario 5: the handler killed and restarted with the population. */
async function restartScenario(ctx: BenchRun): Promise<void> {
  const { opts, node, floors } = ctx;
  const h = ctx.h;
  await scenario(ctx, 5, `handler restart with ${opts.burst} VMIs`, async () => {
    await sleep(2_000);
    const list = async () =>
      (await ctx.client.request<{ items: VirtualMachineInstance[] }>(
        "GET",
        vmiCollection(NAMESPACE),
        undefined,
        { query: { labelSelector: `kubevirt.io/nodeName=${node}` } },
      )).items;
    const before = new Map((await list()).map((v) => [v.metadata.name!, v]));
    const pidsBefore = new Set(h!.launcherPids());
    const floorList = await listMs(ctx, node);
    const old = h!;
    await stopHandler(old, "SIGKILL");
    await sleep(1_000);
    const nh = await startNewHandler(ctx, node, TEST_URI, old.dir);
    ctx.h = nh;
    const readyMs = nh.readyAt - nh.spawnedAt;
    const line = await Promise.race([nh.readyLine, sleep(60_000).then(() => undefined)]);
    await sleep(3_000);
    const after = await list();
    let changed = 0;
    for (const v of after) {
      const b = before.get(v.metadata.name!);
      if (!b || JSON.stringify(b.status) !== JSON.stringify(v.status)) changed++;
    }
    const pidsAfter = new Set(nh.launcherPids());
    const samePids = [...pidsBefore].filter((p) => pidsAfter.has(p)).length;
    ctx.json.restart = {
      n: before.size,
      toReadyMs: readyMs,
      toReadyLineMs: line ? line.at - nh.spawnedAt : undefined,
      readyLine: line,
      statusChanged: changed,
      launchersKept: samePids,
      launchersBefore: pidsBefore.size,
      floorListMs: floorList,
    };
    const floor = floors.denoStart.p50 + floorList;
    ctx.rows.push({
      scenario: 5,
      metric: `restart with ${before.size} VMIs: spawn → /readyz 200`,
      value: readyMs,
      unit: "ms",
      floor,
      floorNote: "bare Deno start→exit + LIST",
      target: "≤ 2000 ms",
      met: readyMs <= 2000,
    });
    ctx.rows.push({
      scenario: 5,
      metric: `restart with ${before.size} VMIs: spawn → "Handler ready" (adopted=${
        line?.adopted ?? "?"
      })`,
      value: line ? line.at - nh.spawnedAt : undefined,
      unit: "ms",
      floor,
      floorNote: "same",
      target: "≤ 2000 ms",
      met: line ? line.at - nh.spawnedAt <= 2000 && line.adopted === before.size : false,
    });
    ctx.rows.push({
      scenario: 5,
      metric: `restart: VMIs whose status changed (of ${before.size})`,
      value: changed,
      unit: "",
      target: "0",
      met: changed === 0,
      note: `the launcher host serving them is ${
        samePids === pidsBefore.size && samePids > 0 ? "the same process" : "another process"
      } after the restart`,
    });
    log(
      `restart: /readyz after ${readyMs.toFixed(0)} ms, ready line after ${
        line ? (line.at - nh.spawnedAt).toFixed(0) : "?"
      } ms (adopted ${line?.adopted}), ${changed} statuses changed`,
    );
  });
}

/** Scenario 4 at half: half of the population deleted, the handler left to sit. */
async function halfIdleScenario(ctx: BenchRun): Promise<void> {
  const { opts, burstNames } = ctx;
  if (opts.only.has(4)) {
    const half = Math.floor(opts.burst / 2);
    await scenario(ctx, 4, `handler with ${opts.burst - half} idle VMIs`, async () => {
      const handler = ctx.h!;
      const t0 = performance.now();
      await mapLimit(burstNames.slice(0, half), opts.concurrency, async (n) => {
        const uid = ctx.watch.latest(n)?.metadata.uid;
        if (uid) await deleteAndReap(ctx, handler, n, uid, 120_000);
      });
      ctx.notes.push(
        `deleting ${half} VMIs until their launchers exited took ${
          ((performance.now() - t0) / 1000).toFixed(1)
        } s`,
      );
      await sleep(5_000);
      await idleRow(
        ctx,
        opts.burst - half,
        `${opts.burst - half} idle VMIs (after ${half} of ${opts.burst} deleted)`,
      );
    });
  }
}

/** Takes the test-driver node down (its VMIs, handler and launchers) before the QEMU scenarios. */
async function drainDriverNode(ctx: BenchRun): Promise<void> {
  const { opts, node } = ctx;
  log("deleting the remaining VMIs of the test-driver node");
  const handler = ctx.h!;
  const rest = ctx.watch.all().filter((v) => v.metadata.labels?.["kubevirt.io/nodeName"] === node);
  await mapLimit(rest, opts.concurrency, async (v) => {
    await deleteAndReap(ctx, handler, v.metadata.name!, v.metadata.uid!, 120_000)
      .catch((error) => log(`cleanup: ${error}`));
  });
  await stopHandler(handler);
  killLaunchers(handler.stateDir);
}

/** Scenario 7 (and 8 inside it): QEMU guests. */
async function qemuScenario(ctx: BenchRun): Promise<void> {
  const { opts, prefix, floors } = ctx;
  await scenario(ctx, 7, `QEMU create → Running × ${opts.qemuRuns}`, async () => {
    const uri = await ensureLibvirtd();
    live.qemuUsed = true;
    const domainType = kvmDevice() ? "kvm" : "qemu";
    const qf = await libvirtFloor(uri, `${prefix}-q`, {
      n: Math.min(opts.qemuRuns, 5),
      domainType,
    });
    const conn = await openLibvirt(uri, { events: false });
    try {
      const hv = await conn.getHypervisorVersion();
      ctx.env.qemu = `${hv.major}.${hv.minor}.${hv.release}`;
    } finally {
      await conn.close();
    }
    const qnode = `${prefix}-qemu-node`;
    const hq = await startNewHandler(ctx, qnode, uri);
    try {
      const lat: number[] = [];
      const marks: RunMarks[] = [];
      for (let i = 0; i <= opts.qemuRuns; i++) {
        const name = `${prefix}-q-${i}`;
        const r = await createRunning(ctx, name, qnode, 120_000);
        const ready = launcherReadyAt(hq.stateDir, r.uid);
        if (i === 0) ctx.env.qemuDomainType = await domainTypeOf(uri, `${NAMESPACE}_${name}`);
        await deleteAndReap(ctx, hq, name, r.uid, 120_000);
        if (i > 0) {
          lat.push(r.ms);
          marks.push({ ...r, launcherReadyAt: ready });
        }
      }
      ctx.notes.push(await breakdownNote("QEMU:", hq, marks));
      const s = summarize(lat);
      const bq = summarize(qf.defineStart);
      ctx.json.qemu = { samplesMs: lat, summary: s, floor: qf };
      log(`QEMU create → Running ${fmtSummary(s)}; define+start ${fmtSummary(bq)}`);
      const fl = {
        p50: floors.a.p50 + bq.p50 + floors.c.p50,
        p99: floors.a.p99 + bq.p99 + floors.c.p99,
      };
      for (const q of ["p50", "p99"] as const) {
        ctx.rows.push({
          scenario: 7,
          metric: `QEMU create → Running, ${q} (${s.n} runs)`,
          value: s[q],
          unit: "ms",
          floor: fl[q],
          floorNote: `a+b(QEMU ${domainType})+c`,
          ...(q === "p50" ? { target: "≤ 1.5× floor", met: s[q] <= 1.5 * fl[q] } : {}),
        });
      }
      ctx.notes.push(`QEMU floor (b): define+start ${fmtSummary(bq)}, type ${domainType}`);
      if (opts.only.has(8)) await qemuBurst(ctx, hq, qnode, uri, domainType);
    } finally {
      await stopHandler(hq);
      killLaunchers(hq.stateDir);
      const removed = await removeQemuDomains(prefix);
      if (removed) log(`cleanup: removed ${removed} leftover QEMU domains`);
    }
  });
}

/** Scenario 10: a live migration through the proxy, beside the same one straight. */
async function migrationScenario(ctx: BenchRun): Promise<void> {
  const { opts } = ctx;
  await scenario(
    ctx,
    10,
    `live migration × ${opts.migrationRuns} through the proxy`,
    async () => {
      live.qemuUsed = true;
      const r = await migrationBench(opts.migrationRuns, log);
      ctx.json.migration = r.json;
      ctx.rows.push(...r.rows);
      ctx.notes.push(...r.notes);
    },
  );
}

/** Scenario 11: the guest agents' cost to the node (tests/bench/_agents.ts). */
async function agentScenario(ctx: BenchRun): Promise<void> {
  const { opts, prefix } = ctx;
  await scenario(ctx, 11, `guest agents: ${opts.agentGuests} test guests, idle`, async () => {
    live.qemuUsed = true;
    const uri = await ensureLibvirtd();
    let h: BenchHandler | undefined;
    try {
      const r = await agentBench({
        client: ctx.client,
        watch: ctx.watch,
        namespace: NAMESPACE,
        prefix,
        guests: opts.agentGuests,
        seconds: opts.idleSeconds,
        startHandler: async (node) => h = await startNewHandler(ctx, node, uri),
        log,
      });
      ctx.json.agents = r.json;
      ctx.rows.push(...r.rows);
      ctx.notes.push(...r.notes);
    } finally {
      if (h) {
        await stopHandler(h);
        killLaunchers(h.stateDir);
      }
      const removed = await removeQemuDomains(prefix);
      if (removed) log(`cleanup: removed ${removed} leftover QEMU domains`);
    }
  });
}

/** Scenario 9: beside KubeVirt's own binaries on a real node. */
async function sideBySideScenario(ctx: BenchRun): Promise<void> {
  const { opts, prefix } = ctx;
  await scenario(
    ctx,
    9,
    `beside KubeVirt's virt-handler and virt-launcher (${opts.nodeVmis} VMIs)`,
    async () => {
      live.qemuUsed = true;
      const r = await sideBySide({
        vmis: opts.nodeVmis,
        launchers: opts.nodeLaunchers,
        idleSeconds: opts.idleSeconds,
        concurrency: opts.concurrency,
        prefix,
        log,
        onRunning: (stop) => {
          live.sideBySide = stop;
        },
      });
      ctx.json.sideBySide = r;
      const { rows, notes } = sideBySideRows(r, ctx.json.qemuBurstPerVm as PodlessPerVm);
      ctx.rows.push(...rows);
      ctx.notes.push(...notes);
    },
  );
}

/**
 * Scenario 8: the burst and idle rows on QEMU: `qemuBurst` VMIs created at once on the QEMU
 * node, all Running (beside libvirt starting as many guests itself plus the apiserver's
 * share), then the handler's and launcher host's memory and CPU with them idle.
 */
async function qemuBurst(
  ctx: Ctx,
  hq: BenchHandler,
  qnode: string,
  uri: string,
  domainType: string,
): Promise<void> {
  const n = ctx.opts.qemuBurst;
  const names = Array.from({ length: n }, (_, i) => `${ctx.prefix}-qb-${i}`);
  const hostPid = hq.launcherPids()[0];
  const libvirtdPid = hostLibvirtdPid();
  const mem0 = procMemory(hq.pid);
  const host0 = hostPid === undefined ? undefined : procMemory(hostPid);
  const libvirtd0 = libvirtdPid === undefined ? undefined : procMemory(libvirtdPid);
  const lv = await libvirtFloor(uri, `${ctx.prefix}-qbf`, {
    n: 1,
    burst: n,
    concurrency: ctx.opts.concurrency,
    domainType,
  });
  const api = await apiserverBurstFloor(ctx.floorCtx, n, ctx.opts.concurrency);
  const floorMs = api.createAllMs + api.statusAllMs + lv.burstMs;
  const waits = names.map((name) =>
    ctx.watch.waitFor(`VMI ${name} Running`, hasPhase(name, "Running"), 300_000)
  );
  const ticks = () => [hq.pid, hostPid, libvirtdPid].map((p) => p && procCpuTicks(p) || 0);
  const ticks0 = ticks();
  const t0 = performance.now();
  const created = await mapLimit(names, ctx.opts.concurrency, async (name) => {
    const t = performance.now();
    await createVmi(ctx.client, testVmi(name, qnode, { namespace: NAMESPACE }));
    return t;
  });
  const ats = await Promise.all(waits);
  const allMs = Math.max(...ats) - t0;
  const hz = clockTicksPerSecond();
  const [handlerCpuS, hostCpuS, libvirtdCpuS] = ticks().map((t, i) => (t - ticks0[i]) / hz / n);
  const each = summarize(ats.map((at, i) => at - created[i]));
  ctx.rows.push({
    scenario: 8,
    metric: `QEMU burst of ${n}: VMIs per second`,
    value: n / (allMs / 1000),
    unit: "/s",
    floor: n / (floorMs / 1000),
    floorNote: `same burst through apiserver + libvirt (QEMU ${domainType})`,
    higherIsBetter: true,
  });
  ctx.rows.push({
    scenario: 8,
    metric: `QEMU burst of ${n}: create → Running p50`,
    value: each.p50,
    unit: "ms",
  });
  await sleep(Math.min(35_000, 5_000 + n * 150));
  const [s, hs] = await Promise.all([
    sampleProcess(hq.pid, ctx.opts.idleSeconds),
    hostPid === undefined ? undefined : sampleProcess(hostPid, ctx.opts.idleSeconds),
  ]);
  ctx.rows.push({
    scenario: 8,
    metric: `handler RSS, ${n} idle QEMU VMIs`,
    value: s.rssMean / MB,
    unit: "MB",
    target: "≤ 100 MB",
    met: s.rssMean <= 100 * MB,
  });
  if (hs) {
    const cpu = s.cpuPercent + hs.cpuPercent;
    ctx.rows.push({
      scenario: 8,
      metric: `handler + launcher host CPU, ${n} idle QEMU VMIs`,
      value: cpu,
      unit: "% core",
    });
    if (
      mem0?.pss !== undefined && host0?.pss !== undefined && s.pssMean !== undefined &&
      hs.pssMean !== undefined
    ) {
      const perVm = (s.pssMean + hs.pssMean - mem0.pss - host0.pss) / n;
      const libvirtdNow = libvirtdPid === undefined ? undefined : procMemory(libvirtdPid);
      ctx.json.qemuBurstPerVm = {
        n,
        handlerCpuS,
        hostCpuS,
        libvirtdCpuS,
        pss: perVm,
        libvirtdPss: libvirtdNow?.pss !== undefined && libvirtd0?.pss !== undefined
          ? (libvirtdNow.pss - libvirtd0.pss) / n
          : undefined,
      };
      ctx.rows.push({
        scenario: 8,
        metric: `additional PSS (handler + launcher host) per idle QEMU VM, 0 → ${n}`,
        value: perVm / MB,
        unit: "MB",
        target: "≤ 2 MB",
        met: perVm <= 2 * MB,
      });
    }
  }
  ctx.notes.push(
    `QEMU burst of ${n}: all Running after ${(allMs / 1000).toFixed(1)} s (floor ${
      (floorMs / 1000).toFixed(2)
    } s: libvirt starting ${n} guests ${(lv.burstMs / 1000).toFixed(2)} s); each ${
      fmtSummary(each)
    }`,
  );
  await mapLimit(names, ctx.opts.concurrency, async (name) => {
    const uid = ctx.watch.all().find((v) => v.metadata.name === name)?.metadata.uid;
    if (!uid) return log(`cleanup: no UID seen for ${name}`);
    await deleteAndReap(ctx, hq, name, uid, 120_000).catch((e) => log(`cleanup: ${name}: ${e}`));
  });
}

async function domainTypeOf(uri: string, name: string): Promise<string | undefined> {
  const conn = await openLibvirt(uri, { events: false });
  try {
    const xml = await (await conn.lookupByName(name)).getXMLDesc();
    return /<domain type=['"](\w+)['"]/.exec(xml)?.[1];
  } catch {
    return undefined;
  } finally {
    await conn.close();
  }
}

async function writeReport(env: Environment, ctx: Ctx, durationS: number): Promise<void> {
  const o = ctx.opts;
  const options = [
    o.quick ? "--quick" : "",
    `runs ${o.runs}`,
    `burst ${o.burst} (concurrency ${o.concurrency})`,
    `event samples ${o.eventSamples}`,
    `idle ${o.idleSeconds} s`,
    `start-ups ${o.startupRuns}`,
    `QEMU runs ${o.qemuRuns}`,
    `QEMU burst ${o.qemuBurst}`,
    `node VMIs ${o.nodeVmis}`,
    `node launchers ${o.nodeLaunchers}`,
    `floor samples ${o.floorSamples}`,
    `scenarios ${[...o.only].sort().join(",")}`,
    `handler log level ${o.logLevel}`,
  ].filter(Boolean).join(", ");
  const notes = [
    "ratio = virtnode ÷ floor (floor ÷ virtnode for rates): how many times the floor; p99 of fewer than 100 samples is the maximum.",
    "a bare Deno process's PSS depends on how many other Deno processes share its pages at that moment (the floor is taken while other engineers' processes may run).",
    ...ctx.notes,
  ];
  const md = markdown(env, ctx.rows, {
    title: "virtnode benchmark",
    durationS,
    options,
    notes,
  });
  console.log(md);
  await Deno.mkdir(OUT_DIR, { recursive: true });
  await Deno.writeTextFile(`${OUT_DIR}latest.md`, md);
  const json = {
    environment: env,
    options: { ...o, only: [...o.only] },
    durationS,
    rows: ctx.rows.map((r) => ({ ...r, ratio: ratio(r), kubevirtRatio: kubevirtRatio(r) })),
    notes: ctx.notes,
    details: ctx.json,
  };
  await Deno.writeTextFile(`${OUT_DIR}latest.json`, JSON.stringify(json, null, 2) + "\n");
  log(`wrote ${OUT_DIR}latest.md and latest.json`);
  // A full run (defaults, every scenario) is docs/bench.md's table; a partial one is not.
  if (!o.quick && o.only.size === ALL_SCENARIOS.length) {
    await updateBenchDoc(md.replace(/^# virtnode benchmark\n+/, ""));
  }
}

/** Every scenario's number. */
const ALL_SCENARIOS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11];
/** What `--quick` runs unless told: scenario 9 starts two control planes and nodes. */
const QUICK_SCENARIOS = ALL_SCENARIOS.filter((n) => n !== 9);
const BENCH_DOC = new URL("../../docs/bench.md", import.meta.url).pathname;
const TABLE_START = "<!-- bench:table:start -->";
const TABLE_END = "<!-- bench:table:end -->";

/** Puts a full run's report between docs/bench.md's table markers (formatted as deno fmt does). */
async function updateBenchDoc(report: string): Promise<void> {
  const text = await Deno.readTextFile(BENCH_DOC);
  const a = text.indexOf(TABLE_START);
  const b = text.indexOf(TABLE_END);
  if (a < 0 || b < a) {
    log(`docs/bench.md has no ${TABLE_START} ... ${TABLE_END}: left as it is`);
    return;
  }
  const body =
    `${TABLE_START}\n\nLatest full run, written by \`deno task bench\`:\n\n${report.trim()}\n\n`;
  await Deno.writeTextFile(BENCH_DOC, text.slice(0, a) + body + text.slice(b));
  await new Deno.Command(Deno.execPath(), { args: ["fmt", "-q", BENCH_DOC] }).output();
  log("updated docs/bench.md's table");
}

async function cleanup(): Promise<void> {
  await live.sideBySide?.().catch((error) => log(`cleanup: ${error}`));
  for (const h of [...live.handlers]) await stopHandler(h, "SIGKILL").catch(() => {});
  for (const dir of live.stateDirs) killLaunchers(dir);
  if (live.qemuUsed) {
    await removeQemuDomains(live.qemuFragment).catch(() =>
      removeQemuDomainsSync(live.qemuFragment)
    );
  }
  // A SIGKILLed launcher host stays in /proc until its reaper (init) collects it: give it
  // a moment before calling it a leftover.
  let leftovers: number[] = [];
  for (let i = 0; i < 20; i++) {
    await sleep(100);
    leftovers = [...live.stateDirs].flatMap((d) => launcherPids(d));
    if (leftovers.length === 0) break;
  }
  if (leftovers.length) log(`warning: launchers still alive after SIGKILL: ${leftovers.join(" ")}`);
  live.stateDirs.clear();
  if (!Deno.env.get("KEEP_BENCH_DIRS")) {
    for (const dir of live.dirs) await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
  live.dirs.clear();
  await live.cluster?.stop().catch((error) => log(`cleanup: ${error}`));
  live.cluster = undefined;
}

if (import.meta.main) {
  const opts = parseOptions(Deno.args);
  const started = performance.now();
  const onSignal = () => {
    log("interrupted: cleaning up");
    cleanupNow();
    (async () => {
      await live.sideBySide?.().catch(() => {});
      await live.cluster?.stop().catch(() => {});
    })().finally(() => Deno.exit(130));
  };
  Deno.addSignalListener("SIGINT", onSignal);
  Deno.addSignalListener("SIGTERM", onSignal);
  globalThis.addEventListener("unload", cleanupNow);
  const overall = setTimeout(() => {
    log(`the run took longer than ${opts.timeoutMinutes} min: stopping`);
    cleanupNow();
    Promise.all([live.sideBySide?.().catch(() => {}), live.cluster?.stop()])
      .finally(() => Deno.exit(1));
  }, opts.timeoutMinutes * 60_000);
  Deno.unrefTimer(overall);
  let code = 0;
  try {
    await run(opts, started);
  } catch (error) {
    log(`failed: ${error instanceof Error ? error.stack : error}`);
    code = 1;
  } finally {
    await cleanup();
    clearTimeout(overall);
  }
  log(`done in ${((performance.now() - started) / 1000).toFixed(0)} s`);
  Deno.exit(code);
}

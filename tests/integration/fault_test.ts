/**
 * Fault tests: the handler and its launchers (real processes, libvirt's test driver)
 * under a handler SIGKILL in the middle of a burst, an apiserver outage, corrupt
 * ghost records, and a launcher fed 1000 mutated VMI specs. Each test prints the
 * numbers it measured (times to recover, counts).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { type Cluster, startCluster, useCluster } from "../../deploy/cluster/cluster.ts";
import {
  createVmi,
  deleteVmi,
  getVmi,
  type HandlerProcess,
  hostedUids,
  hostLogOf,
  hostPid,
  killLaunchers,
  kubeClient,
  launcherStarts,
  startHandlerProcess,
  testVmi,
  waitFor,
  waitForPhase,
} from "../helpers/handler_process.ts";
import { TestCmdClient } from "../helpers/cmd_client.ts";
import { startNotifyServer } from "../helpers/notify_server.ts";
import { decodeDomainJson } from "../../mod/domain/mod.ts";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import type { KubeClient } from "../../mod/kube/mod.ts";
import { launcherSocketPath, runLauncher } from "../../mod/launcher/mod.ts";
import type { LauncherOptions } from "../../mod/launcher/mod.ts";

const TEST_URI = "test:///default";
const grpcTest = { sanitizeOps: false, sanitizeResources: false };

function suffix(): string {
  return crypto.randomUUID().slice(0, 8);
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** The launcher host processes of a handler's directory (by their `--dir` below it). */
function hostProcesses(h: HandlerProcess): number[] {
  const pids: number[] = [];
  for (const e of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(e.name)) continue;
    try {
      const args = Deno.readTextFileSync(`/proc/${e.name}/cmdline`).split("\0");
      if (args.includes("launcher-host") && args.some((a) => a.startsWith(`${h.dir}/`))) {
        pids.push(Number(e.name));
      }
    } catch { /* exited meanwhile */ }
  }
  return pids;
}

/** How many times the launcher host's log says a UID's launcher became ready. */
async function hostStarts(h: HandlerProcess): Promise<Map<string, number>> {
  const starts = new Map<string, number>();
  // Every host of the directory writes to the one log (its name comes from the directory).
  const text = await Deno.readTextFile(hostLogOf(h.stateDir));
  for (const line of text.split("\n")) {
    if (!line.includes('"msg":"Launcher ready"')) continue;
    const uid = /"uid":"([^"]+)"/.exec(line)?.[1];
    if (uid) starts.set(uid, (starts.get(uid) ?? 0) + 1);
  }
  return starts;
}

/** Lines of the handler's log that tell of a launcher crash (SIGSEGV 139 / SIGABRT 134). */
async function crashEvidence(logFile: string): Promise<string[]> {
  const text = await Deno.readTextFile(logFile).catch(() => "");
  return text.split("\n").filter((l) =>
    /Launcher exited with code/.test(l) && /"code":(134|139)|"signal":"SIG(SEGV|ABRT)"/.test(l)
  );
}

async function listVmis(client: KubeClient, ns: string): Promise<VirtualMachineInstance[]> {
  const list = await client.request<{ items: VirtualMachineInstance[] }>(
    "GET",
    `/apis/kubevirt.io/v1/namespaces/${ns}/virtualmachineinstances`,
  );
  return list.items;
}

async function healthStatus(h: HandlerProcess, path: string): Promise<number> {
  try {
    const r = await fetch(`${h.health}${path}`, { signal: AbortSignal.timeout(2_000) });
    await r.body?.cancel();
    return r.status;
  } catch {
    return 0;
  }
}

/**
 * Asserts one launcher host process (the one its PID file names, started once), every UID
 * served by it, and at most one start of each UID's launcher in the host's log.
 */
async function assertOneLauncherPerUid(h: HandlerProcess, uids: string[]): Promise<void> {
  const hosts = hostProcesses(h);
  assert.deepEqual(hosts, [hostPid(h.stateDir)], "one launcher host, the one its PID file names");
  assert.equal((await launcherStarts(h.logFile)).size, 1, "the host was started once");
  const served = new Set(hostedUids(h.stateDir));
  const starts = await hostStarts(h);
  for (const uid of uids) {
    assert.ok(served.has(uid), `the host serves ${uid}`);
    assert.equal(starts.get(uid), 1, `${uid}'s launcher started ${starts.get(uid)} times`);
  }
}

/** Every launcher's GetDomain shows its domain running. */
async function assertDomainsRunning(h: HandlerProcess, uids: string[]): Promise<void> {
  for (const uid of uids) {
    const c = new TestCmdClient(`${h.runDir}/sockets/${uid}/launcher-sock`, 10_000);
    try {
      const res = await c.getDomain();
      assert.equal(res.response?.success, true, res.response?.message ?? "");
      assert.notEqual(res.domain, "", `the launcher of ${uid} has a domain`);
      assert.equal(decodeDomainJson(res.domain).status.status, "Running", `domain of ${uid}`);
    } finally {
      c.close();
    }
  }
}

interface Env {
  cluster: Cluster;
  client: KubeClient;
  ns: string;
  node: string;
}

/** A namespace and node name of its own on a cluster; everything is cleaned up after `fn`. */
async function withEnv(
  prefix: string,
  cluster: Cluster,
  fn: (env: Env, track: (h: HandlerProcess) => void) => Promise<void>,
): Promise<void> {
  const client = await kubeClient(cluster.kubeconfigPath);
  const id = suffix();
  const ns = `${prefix}-${id}`;
  await client.request("POST", "/api/v1/namespaces", { metadata: { name: ns } });
  const handlers: HandlerProcess[] = [];
  let ok = false;
  try {
    await fn({ cluster, client, ns, node: `${prefix}-node-${id}` }, (h) => handlers.push(h));
    ok = true;
  } finally {
    const last = handlers.at(-1);
    if (!ok && last) {
      console.error(`handler log:\n${(await Deno.readTextFile(last.logFile)).slice(-8000)}`);
    }
    const uids: string[] = [];
    const vmis = await listVmis(client, ns).catch(() => []);
    for (const v of vmis) {
      uids.push(v.metadata.uid!);
      await deleteVmi(client, ns, v.metadata.name!).catch(() => {});
    }
    // Let a live handler stop the launchers; then kill the host.
    if (last && last.child && vmis.length > 0) {
      await waitFor(
        "launchers to end",
        () => {
          const served = new Set(hostedUids(last.stateDir));
          return uids.every((u) => !served.has(u));
        },
        60_000,
        250,
      ).catch(() => {});
    }
    for (const h of handlers) await h.kill("SIGTERM");
    if (last) killLaunchers(last.stateDir);
    await client.request("DELETE", `/api/v1/namespaces/${ns}`).catch(() => {});
    client.close();
    if (last && !Deno.env.get("KEEP_HANDLER_DIR")) {
      await Deno.remove(last.dir, { recursive: true }).catch(() => {});
    }
  }
}

Deno.test(
  "fault: handler SIGKILLed mid 50-VMI burst: every VMI Running, one launcher each in one host",
  grpcTest,
  async () => {
    // The handler is restarted after the kill and must not give any VMI a second launcher.
    const COUNT = 50;
    const cluster = await useCluster();
    try {
      await withEnv("burst", cluster, async ({ client, ns, node }, track) => {
        const h = await startHandlerProcess({
          kubeconfig: cluster.handlerKubeconfigPath,
          nodeName: node,
          libvirtUri: TEST_URI,
        });
        track(h);
        const names = Array.from({ length: COUNT }, (_, i) => `vm-${i}`);
        const t0 = performance.now();
        // Created quickly, 10 requests at a time, in the background.
        const creating = (async () => {
          for (let i = 0; i < COUNT; i += 10) {
            await Promise.all(
              names.slice(i, i + 10).map((n) =>
                createVmi(client, testVmi(n, node, { namespace: ns }))
              ),
            );
          }
        })();
        let runningAtKill = 0;
        await waitFor(
          "half of the VMIs to be Running",
          async () => {
            const vmis = await listVmis(client, ns);
            runningAtKill = vmis.filter((v) => v.status?.phase === "Running").length;
            return runningAtKill >= COUNT / 2;
          },
          180_000,
          50,
        );
        const killStatus = await h.kill("SIGKILL");
        const killedAt = performance.now();
        assert.equal(killStatus.signal, "SIGKILL");
        await creating;
        const vmisAtKill = await listVmis(client, ns);
        const uids = vmisAtKill.map((v) => v.metadata.uid!);
        assert.equal(uids.length, COUNT);
        const launchersAtKill = hostedUids(h.stateDir).filter((u) => uids.includes(u)).length;

        const restarted = await startHandlerProcess({
          kubeconfig: cluster.handlerKubeconfigPath,
          nodeName: node,
          libvirtUri: TEST_URI,
          dir: h.dir,
        });
        track(restarted);
        const readyAt = performance.now();
        await waitFor(
          "every VMI to be Running",
          async () => {
            const vmis = await listVmis(client, ns);
            return vmis.length === COUNT && vmis.every((v) => v.status?.phase === "Running");
          },
          240_000,
          250,
        );
        const allRunningAt = performance.now();
        // Deliberate: a window for trailing syncs to start a duplicate launcher if they would
        // (nothing announces "no more syncs"); the count below must still be one per UID.
        await sleep(2_000);
        await assertOneLauncherPerUid(restarted, uids);
        await assertDomainsRunning(restarted, uids);
        const vmis = await listVmis(client, ns);
        for (const v of vmis) {
          assert.equal(v.status?.phase, "Running", `${v.metadata.name} still Running`);
          assert.ok(
            !v.status?.phaseTransitionTimestamps?.some((p) => p.phase === "Failed"),
            `${v.metadata.name} never Failed`,
          );
        }
        const crashes = await crashEvidence(restarted.logFile);
        if (crashes.length > 0) console.error(`launcher crash evidence:\n${crashes.join("\n")}`);
        console.log(
          `50-VMI burst: ${runningAtKill} Running and ${launchersAtKill} launchers when the ` +
            `handler was SIGKILLed at ${Math.round(killedAt - t0)} ms; restarted handler ready ` +
            `after ${Math.round(readyAt - killedAt)} ms; all ${COUNT} Running ${
              Math.round(allRunningAt - readyAt)
            } ms after ready (${Math.round(allRunningAt - t0)} ms after the first create); ` +
            `${COUNT} launchers in one host, one per UID`,
        );
      });
    } finally {
      await cluster.stop();
    }
  },
);

Deno.test(
  "fault: through a 30 s apiserver outage the handler stays up, catches up and duplicates nothing",
  grpcTest,
  async () => {
    // The apiserver stops while VMIs are being worked on.
    const OUTAGE_MS = 30_000;
    const cluster = await startCluster();
    try {
      await withEnv("outage", cluster, async ({ client, ns, node }, track) => {
        const h = await startHandlerProcess({
          kubeconfig: cluster.handlerKubeconfigPath,
          nodeName: node,
          libvirtUri: TEST_URI,
        });
        track(h);
        const steady = ["vm-a", "vm-b", "vm-c", "vm-d"];
        for (const n of steady) await createVmi(client, testVmi(n, node, { namespace: ns }));
        for (const n of steady) await waitForPhase(client, ns, n, "Running");
        const paused = (await getVmi(client, ns, "vm-a"))!;
        const deletedUid = (await getVmi(client, ns, "vm-d"))!.metadata.uid!;
        // Activity right before the stop: two creates and a delete, not waited for.
        const late = ["vm-late-1", "vm-late-2"];
        for (const n of late) await createVmi(client, testVmi(n, node, { namespace: ns }));
        await deleteVmi(client, ns, "vm-d");
        // Deliberate: the apiserver stops while this work is in flight, not before the
        // handler has seen it nor after it has finished.
        await sleep(300);
        const latePhases: string[] = [];
        for (const n of late) {
          latePhases.push((await getVmi(client, ns, n))?.status?.phase ?? "none");
        }

        const stopAt = performance.now();
        await cluster.stopApiserver();
        const health: number[] = [];
        const ready: number[] = [];
        let exited = false;
        h.child.status.then(() => exited = true);
        // During the outage the domain changes: vm-a is paused through its launcher.
        const socket = `${h.runDir}/sockets/${paused.metadata.uid}/launcher-sock`;
        const cmd = new TestCmdClient(socket, 10_000);
        try {
          // Deliberate: the pause lands well inside the outage, so the handler can only
          // learn of it after the apiserver is back.
          await sleep(2_000);
          const res = await cmd.vmiCall("PauseVirtualMachine", paused);
          assert.deepEqual(res, { success: true, message: "" }, "pause during the outage");
        } finally {
          cmd.close();
        }
        while (performance.now() - stopAt < OUTAGE_MS) {
          health.push(await healthStatus(h, "/healthz"));
          ready.push(await healthStatus(h, "/readyz"));
          await sleep(500); // the sampling interval of a fixed-length outage
        }
        assert.ok(!exited, "the handler process stays up during the outage");
        assert.ok(health.every((s) => s === 200), `healthz 200 throughout: ${health.join(",")}`);

        await cluster.startApiserver();
        const backAt = performance.now();
        const pausedCond = await waitFor(
          "the Paused condition after the outage",
          async () => {
            const v = await getVmi(client, ns, "vm-a");
            return v?.status?.conditions?.find((c) => c.type === "Paused" && c.status === "True");
          },
          120_000,
          250,
        );
        const pausedSeenMs = Math.round(performance.now() - backAt);
        assert.equal(pausedCond.reason, "PausedByUser");
        for (const n of late) await waitForPhase(client, ns, n, "Running", 120_000);
        const lateRunningMs = Math.round(performance.now() - backAt);
        await waitFor(
          "the deleted VMI's launcher to be gone",
          () => {
            return !hostedUids(h.stateDir).includes(deletedUid);
          },
          60_000,
          250,
        );
        await waitFor(
          "the deleted VMI to be gone from the apiserver",
          async () => !(await getVmi(client, ns, "vm-d")),
          60_000,
        );
        const uids = (await listVmis(client, ns)).map((v) => v.metadata.uid!);
        assert.equal(uids.length, 5);
        // Deliberate: a window for trailing syncs to start a duplicate launcher if they would.
        await sleep(1_000);
        await assertOneLauncherPerUid(h, uids);
        for (const n of ["vm-b", "vm-c", ...late]) {
          const v = await getVmi(client, ns, n);
          assert.equal(v?.status?.phase, "Running", `${n} Running`);
        }
        assert.equal(await healthStatus(h, "/healthz"), 200);
        assert.equal(await healthStatus(h, "/readyz"), 200);
        const crashes = await crashEvidence(h.logFile);
        if (crashes.length > 0) console.error(`launcher crash evidence:\n${crashes.join("\n")}`);
        console.log(
          `apiserver outage ${Math.round(backAt - stopAt)} ms (incl. restart): healthz 200 in ` +
            `${health.length}/${health.length} probes, readyz 200 in ${
              ready.filter((s) => s === 200).length
            }/${ready.length}; after it was back: Paused condition in ${pausedSeenMs} ms, ` +
            `VMIs created just before the outage (${latePhases.join("/")} at the stop) Running ` +
            `in ${lateRunningMs} ms`,
        );
      });
    } finally {
      await cluster.stop();
    }
  },
);

Deno.test(
  "fault: corrupt and foreign ghost-record files are reported and set aside at start-up",
  grpcTest,
  async () => {
    // One corrupt and one foreign file sit in the ghost-record directory when the handler starts.
    const cluster = await useCluster();
    try {
      await withEnv("ghosts", cluster, async ({ client, ns, node }, track) => {
        const dir = await Deno.makeTempDir({ prefix: "virtnode-handler-" });
        const ghostDir = `${dir}/state/ghost-records`;
        await Deno.mkdir(ghostDir, { recursive: true, mode: 0o700 });
        const corrupt = "0f6c1d2e-0000-4000-8000-00000000c0de";
        await Deno.writeTextFile(`${ghostDir}/${corrupt}`, '{"name":"vm-x","namespace":"def');
        const foreign = "notes.txt";
        await Deno.writeFile(`${ghostDir}/${foreign}`, new Uint8Array([0x7f, 0x45, 0x4c, 0x46, 0]));
        const t0 = performance.now();
        const h = await startHandlerProcess({
          kubeconfig: cluster.handlerKubeconfigPath,
          nodeName: node,
          libvirtUri: TEST_URI,
          dir,
        });
        track(h);
        const readyMs = Math.round(performance.now() - t0);
        assert.equal(await healthStatus(h, "/readyz"), 200);
        const errors = (await Deno.readTextFile(h.logFile)).split("\n")
          .filter((l) => l.startsWith("{"))
          .map((l) => JSON.parse(l) as Record<string, unknown>)
          .filter((r) => r.level === "error" && /ghost record/i.test(String(r.msg)));
        for (
          const [file, reason] of [[corrupt, /unreadable|JSON/i], [foreign, /unreadable|JSON/i]]
        ) {
          const line = errors.find((r) => String(r.file).endsWith(`/${file as string}`));
          assert.ok(line, `an error line names ${file}: ${JSON.stringify(errors)}`);
          assert.match(String(line.reason), reason as RegExp);
          assert.match(String(line.msg), new RegExp(file as string));
        }
        const remaining = [...Deno.readDirSync(ghostDir)].map((e) => e.name).sort();
        assert.deepEqual(remaining, [".set-aside"], "only the set-aside folder is left");
        const setAside = [...Deno.readDirSync(`${ghostDir}/.set-aside`)].map((e) => e.name);
        assert.equal(setAside.length, 2);
        assert.ok(setAside.some((n) => n.startsWith(`${corrupt}.`)), setAside.join(","));
        assert.ok(setAside.some((n) => n.startsWith(`${foreign}.`)), setAside.join(","));
        assert.equal(
          await Deno.readTextFile(
            `${ghostDir}/.set-aside/${setAside.find((n) => n.startsWith(corrupt))}`,
          ),
          '{"name":"vm-x","namespace":"def',
          "the content is kept for inspection",
        );

        const t1 = performance.now();
        await createVmi(client, testVmi("vm-new", node, { namespace: ns }));
        await waitForPhase(client, ns, "vm-new", "Running");
        const runningMs = Math.round(performance.now() - t1);
        assert.equal(await healthStatus(h, "/healthz"), 200);
        console.log(
          `ghost records: 2 bad files set aside; handler ready in ${readyMs} ms; ` +
            `a new VMI Running in ${runningMs} ms`,
        );
      });
    } finally {
      await cluster.stop();
    }
  },
);

/** mulberry32: a small seeded PRNG, so a failing case can be replayed. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };

function pathsOf(value: Json, at: (string | number)[] = []): (string | number)[][] {
  const out: (string | number)[][] = [at];
  if (Array.isArray(value)) value.forEach((v, i) => out.push(...pathsOf(v, [...at, i])));
  else if (value !== null && typeof value === "object") {
    for (const [k, v] of Object.entries(value)) out.push(...pathsOf(v, [...at, k]));
  }
  return out;
}

function parentOf(root: Json, path: (string | number)[]): Json | undefined {
  let cur: Json = root;
  for (const p of path.slice(0, -1)) {
    if (cur === null || typeof cur !== "object") return undefined;
    cur = (cur as Record<string, Json>)[p as string];
  }
  return cur;
}

/** Applies one random mutation to `vmi` in place; returns its name for the tally. */
function mutate(vmi: Json, rand: () => number, hostDiskRoot: string): string {
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)];
  const longString = (n: number) => "x".repeat(n);
  const weird: readonly Json[] = [
    "",
    " ",
    "\u0000",
    "\u0007\u001b[31m",
    "\u202eevil",
    "💣🧨",
    "é\u0301",
    "\ud800",
    "a\nb",
    "../../etc/passwd",
    "${HOME}",
    "<domain>",
    "'; DROP TABLE vmis; --",
    longString(100_000),
  ];
  const numbers: readonly Json[] = [
    -1,
    -0,
    0,
    1e308,
    -1e308,
    2 ** 53 + 1,
    Number.MAX_SAFE_INTEGER,
    0.5,
    4294967296,
    -2147483649,
  ];
  const escapes = [
    `${hostDiskRoot}/../vn-fuzz-escape.img`,
    "../vn-fuzz-escape.img",
    "/tmp/vn-fuzz-escape.img",
    `${hostDiskRoot}/a/../../vn-fuzz-escape.img`,
    "/etc/vn-fuzz-escape.img",
    "disk\u0000.img",
    `${hostDiskRoot}/${longString(5_000)}`,
  ];
  // Mostly the spec: a wrong name or namespace is rejected before anything else.
  const all = pathsOf(vmi).filter((p) => p.length > 0);
  const spec = all.filter((p) => p[0] === "spec");
  if (all.length === 0) return "noop";
  const path = rand() < 0.95 && spec.length > 0 ? pick(spec) : pick(all);
  const parent = parentOf(vmi, path);
  if (parent === undefined || parent === null || typeof parent !== "object") return "noop";
  const key = path.at(-1)!;
  const slot = parent as Record<string | number, Json>;
  const op = pick(
    [
      "delete",
      "null",
      "wrongType",
      "number",
      "string",
      "unknownField",
      "arrayForObject",
      "objectForArray",
      "duplicate",
      "hostDiskPath",
      "quantity",
    ] as const,
  );
  switch (op) {
    case "delete":
      if (Array.isArray(parent)) parent.splice(key as number, 1);
      else delete slot[key];
      return op;
    case "null":
      slot[key] = null;
      return op;
    case "wrongType":
      slot[key] = pick([true, 42, "str", [], {}, [1, "a"], { a: { b: [] } }] as Json[]);
      return op;
    case "number":
      slot[key] = pick(numbers);
      return op;
    case "string":
      slot[key] = pick(weird);
      return op;
    case "unknownField": {
      const target = slot[key];
      if (target !== null && typeof target === "object" && !Array.isArray(target)) {
        // defineProperty: a plain assignment to `__proto__` would not make a field.
        Object.defineProperty(target, pick(["__proto__", "constructor", "zzUnknown", "💣"]), {
          value: pick(weird),
          enumerable: true,
          writable: true,
          configurable: true,
        });
      } else slot[`${key}Unknown`] = 1;
      return op;
    }
    case "arrayForObject":
      slot[key] = [slot[key]];
      return op;
    case "objectForArray":
      slot[key] = Array.isArray(slot[key]) ? { ...(slot[key] as Json[]) } : { value: slot[key] };
      return op;
    case "duplicate": {
      const arrays = all.filter((p) => {
        const target = p.reduce<Json | undefined>(
          (cur, k) =>
            cur !== null && typeof cur === "object"
              ? (cur as Record<string, Json>)[k as string]
              : undefined,
          vmi,
        );
        return Array.isArray(target) && target.length > 0;
      });
      if (arrays.length === 0) return "noop";
      const arr = pick(arrays).reduce<Json>(
        (cur, k) => (cur as Record<string, Json>)[k as string],
        vmi,
      );
      (arr as Json[]).push(structuredClone((arr as Json[])[0]));
      return op;
    }
    case "hostDiskPath": {
      const volumes = (vmi as { spec?: { volumes?: Json } | null }).spec?.volumes;
      const hd = Array.isArray(volumes)
        ? volumes.find((v) => v !== null && typeof v === "object" && "hostDisk" in v)
        : undefined;
      if (!hd) return "noop";
      const hostDisk = (hd as Record<string, Json>).hostDisk;
      if (hostDisk === null || typeof hostDisk !== "object" || Array.isArray(hostDisk)) {
        return "noop";
      }
      hostDisk.path = pick(escapes);
      return op;
    }
    case "quantity":
      slot[key] = pick(["9999999Ei", "-1Gi", "1e400", "0", "1.5.5Mi", "64Mb", "NaN", "Infinity"]);
      return op;
  }
}

Deno.test(
  "fault: 1000 randomly mutated VMI specs through SyncVirtualMachine: always an answer, launcher alive",
  grpcTest,
  async () => {
    const SEED = Number(Deno.env.get("FUZZ_SEED") ?? 8);
    const CALLS = 1000;
    const TRACE = Deno.env.get("FUZZ_TRACE") === "1";
    const dir = await Deno.makeTempDir({ prefix: "vn-fuzz-" });
    const notify = await startNotifyServer();
    const name = "vm-fuzz";
    const options: LauncherOptions = {
      namespace: "default",
      name,
      uid: `uid-${name}`,
      socketDir: join(dir, "sockets"),
      libvirtUri: TEST_URI,
      notifySocket: notify.socketPath,
      gracePeriodSeconds: 0,
      runDir: join(dir, "run"),
      diskDir: join(dir, "disks"),
      imageDir: join(dir, "images"),
      hostDiskRoot: join(dir, "hostdisks"),
      domainType: "qemu",
    };
    await Deno.mkdir(options.hostDiskRoot!, { recursive: true });
    const abort = new AbortController();
    let ready!: () => void;
    const isReady = new Promise<void>((resolve) => ready = resolve);
    const exit = runLauncher(options, {
      signal: abort.signal,
      handleSignals: false,
      onReady: () => ready(),
      notifyTimeouts: { intervalMs: 100, sendTimeoutMs: 1_000, totalTimeoutMs: 2_000 },
    });
    let exitedWith: number | undefined;
    exit.then((code) => exitedWith = code);
    await Promise.race([isReady, exit.then((code) => assert.fail(`launcher exited ${code}`))]);
    const client = new TestCmdClient(launcherSocketPath(options.socketDir), 10_000);
    const base = {
      apiVersion: "kubevirt.io/v1",
      kind: "VirtualMachineInstance",
      metadata: { name, namespace: "default", uid: options.uid },
      spec: {
        terminationGracePeriodSeconds: 0,
        domain: {
          cpu: { cores: 1, sockets: 1, threads: 1 },
          memory: { guest: "64Mi" },
          resources: { requests: { memory: "64Mi", cpu: "100m" } },
          firmware: { uuid: "5d307ca9-b3ef-428c-8861-06e72d69f223" },
          features: { acpi: {} },
          devices: {
            disks: [
              { name: "data", disk: { bus: "virtio" } },
              { name: "scratch", disk: { bus: "sata" } },
            ],
            interfaces: [{ name: "default", slirp: {} }],
          },
        },
        networks: [{ name: "default", pod: {} }],
        volumes: [
          {
            name: "data",
            hostDisk: {
              // The namespace's folder of the root: the only one its VMIs may name.
              path: `${options.hostDiskRoot}/default/data.img`,
              type: "DiskOrCreate",
              capacity: "1Mi",
            },
          },
          { name: "scratch", emptyDisk: { capacity: "1Mi" } },
        ],
      },
    } as unknown as Json;
    const rand = prng(SEED);
    let successes = 0;
    const failureWords = new Map<string, number>();
    const detailWords = new Map<string, number>();
    const ops = new Map<string, number>();
    let slowest = 0;
    const t0 = performance.now();
    try {
      // The base itself must be valid, or the test measures nothing.
      const first = await client.vmiCall("SyncVirtualMachine", base);
      assert.deepEqual(first, { success: true, message: "" }, "the unmutated VMI syncs");
      await client.vmiCall("KillVirtualMachine", base);
      await client.vmiCall("DeleteVirtualMachine", base);
      for (let i = 0; i < CALLS; i++) {
        const vmi = structuredClone(base);
        const applied: string[] = [];
        const n = 1 + Math.floor(rand() * 3);
        for (let j = 0; j < n; j++) applied.push(mutate(vmi, rand, options.hostDiskRoot!));
        for (const op of applied) ops.set(op, (ops.get(op) ?? 0) + 1);
        // A few requests are not even JSON.
        const body = rand() < 0.02
          ? JSON.stringify(vmi).slice(0, Math.floor(rand() * 200))
          : JSON.stringify(vmi);
        if (TRACE) console.error(`call ${i}: ${applied.join("+")} ${body.slice(0, 300)}`);
        const started = performance.now();
        let res;
        try {
          res = await client.vmiCall("SyncVirtualMachine", body);
        } catch (error) {
          assert.fail(
            `call ${i} (seed ${SEED}, ${applied.join("+")}) got a transport error: ${error}`,
          );
        }
        const ms = performance.now() - started;
        slowest = Math.max(slowest, ms);
        assert.ok(ms < 10_000, `call ${i} answered within 10 s (${ms} ms)`);
        assert.equal(typeof res.success, "boolean");
        if (res.success) {
          successes++;
          // Bounded: the domain goes before the next call.
          const kill = await client.vmiCall("KillVirtualMachine", base);
          assert.equal(kill.success, true, kill.message);
          const del = await client.vmiCall("DeleteVirtualMachine", base);
          assert.equal(del.success, true, del.message);
        } else {
          assert.ok(
            res.message.trim().length > 0,
            `call ${i} (${applied.join("+")}): empty message`,
          );
          const word = res.message.split(/\s+/)[0];
          failureWords.set(word, (failureWords.get(word) ?? 0) + 1);
          const d = /^Cannot \w+(?: \w+)? VMI "[^"]*": (.*)$/s.exec(res.message)?.[1] ??
            res.message;
          const dw = d.split(/[\s:]+/)[0].slice(0, 40);
          detailWords.set(dw, (detailWords.get(dw) ?? 0) + 1);
        }
        assert.equal(exitedWith, undefined, `the launcher is still running after call ${i}`);
      }
      assert.deepEqual(await client.call("Ping"), { success: true, message: "" });
      const after = await client.getDomain();
      assert.equal(after.response?.success, true);
      assert.equal(after.domain, "", "no domain left behind");
      // Nothing escaped the host disk root.
      for (
        const p of [
          `${dir}/vn-fuzz-escape.img`,
          "/tmp/vn-fuzz-escape.img",
          "/etc/vn-fuzz-escape.img",
        ]
      ) {
        await assert.rejects(Deno.lstat(p), Deno.errors.NotFound, `${p} was not created`);
      }
      const sorted = (m: Map<string, number>) =>
        [...m].sort((a, b) => b[1] - a[1]).map(([k, v]) => `${JSON.stringify(k)}:${v}`).join(" ");
      console.log(
        `fuzz seed ${SEED}: ${CALLS} calls in ${Math.round(performance.now() - t0)} ms ` +
          `(slowest ${Math.round(slowest)} ms): ${successes} success, ${CALLS - successes} failure`,
      );
      console.log(`  failure first words: ${sorted(failureWords)}`);
      console.log(`  failure detail first words: ${sorted(detailWords)}`);
      console.log(`  mutations: ${sorted(ops)}`);
    } finally {
      abort.abort();
      const code = await exit;
      client.close();
      await notify.close();
      await Deno.remove(dir, { recursive: true }).catch(() => {});
      assert.equal(code, 0, "the launcher stops cleanly");
    }
  },
);

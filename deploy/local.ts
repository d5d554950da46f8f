/**
 * Local mode (`deno task start`): the whole agent on one machine, for trying
 * virtnode and for demos. It starts a real control plane (kube-apiserver and
 * etcd built by deploy/cluster/build.sh), a libvirtd with QEMU (or, when that
 * cannot run, libvirt's test driver, said loudly), and `virtnode handler
 * --podless` for a node named after this host; then applies the VMIs in
 * deploy/examples/ for that node and shows each VMI's phase live. Ctrl-C deletes
 * the example VMIs, waits for their launchers to stop, stops everything, and leaves the
 * host's libvirt as it found it (qemu.conf, and whether libvirtd runs).
 *
 * Flags: `--until-running` exits (cleanly) once every example VMI is Running, for
 * tests; `--test-driver` uses libvirt's test driver even where QEMU could run.
 *
 * @module
 */
import { startCluster } from "./cluster/cluster.ts";
import { type PreparedLibvirtd, prepareLibvirtd } from "./libvirtd.ts";
import { podlessNodeKubeconfig } from "./podless_node.ts";
import { type KubeClient, loadKubeClient } from "../mod/kube/mod.ts";
import { sleep } from "../mod/lifecycle/mod.ts";
import type { VirtualMachineInstance } from "../mod/api/mod.ts";
import { V8_FLAGS } from "../mod/config/mod.ts";
import {
  checkSecurityDriver,
  formatReport,
  hostProbes,
  securityModels,
} from "../mod/preflight/mod.ts";

const root = new URL("..", import.meta.url).pathname;
const args = new Set(Deno.args);
const untilRunning = args.has("--until-running");
const isTerminal = Deno.stdout.isTerminal();
/** `--until-running` gives up after this long. */
const UNTIL_RUNNING_TIMEOUT_MS = 5 * 60_000;
const nodeName = Deno.hostname().toLowerCase().replace(/[^a-z0-9.-]/g, "-");

function say(line: string) {
  console.log(`[local] ${line}`);
}

/** libvirtd with QEMU, as this host allows; libvirt's test driver when it cannot run. */
async function pickLibvirt(): Promise<{ uri: string; prepared?: PreparedLibvirtd }> {
  if (args.has("--test-driver")) return { uri: "test:///default" };
  try {
    const prepared = await prepareLibvirtd();
    if (prepared.changedQemuConf) {
      say("libvirt: added virtnode's lines to qemu.conf (undone at exit)");
    }
    if (prepared.startedDaemons) say("libvirt: started libvirtd (stopped at exit)");
    return { uri: prepared.uri, prepared };
  } catch (error) {
    const bar = "!".repeat(78);
    console.log(`${bar}\n!!! Cannot start libvirtd with QEMU: ${(error as Error).message}`);
    console.log(`!!! Falling back to libvirt's TEST DRIVER: no real guests will run.\n${bar}`);
    return { uri: "test:///default" };
  }
}

/**
 * Local mode's libvirtd runs QEMU without a security driver (deploy/libvirtd.ts), which a
 * node that runs others' guests must not: said loudly, in `virtnode check --local`'s words.
 */
async function warnSecurityDriver(uri: string): Promise<void> {
  let models: string[];
  try {
    models = securityModels(await hostProbes.capabilities(uri));
  } catch (error) {
    say(`cannot read libvirt's capabilities: ${(error as Error).message}`);
    return;
  }
  const result = checkSecurityDriver(uri, models, { local: true });
  if (result.verdict === "PASS") return;
  console.log(formatReport([result]));
  say(
    "WARNING: no security driver confines QEMU here: every guest runs unconfined as one " +
      "user; local mode is for guests you trust (virtnode check fails such a host)",
  );
}

async function kubectl(kubeconfig: string, ...argv: string[]): Promise<string> {
  const out = await new Deno.Command("kubectl", {
    args: ["--kubeconfig", kubeconfig, ...argv],
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
  if (!out.success) throw new Error(`kubectl ${argv.join(" ")} failed: ${text.trim()}`);
  return text;
}

/** The example manifests with their node label set to this host's node. */
async function examples(): Promise<{ file: string; yaml: string; name: string }[]> {
  const dir = `${root}deploy/examples`;
  const out = [];
  for (const e of [...Deno.readDirSync(dir)].sort((a, b) => a.name.localeCompare(b.name))) {
    if (!e.name.endsWith(".yaml")) continue;
    const text = await Deno.readTextFile(`${dir}/${e.name}`);
    const name = /^ {2}name: (\S+)/m.exec(text)?.[1] ?? e.name;
    out.push({
      file: e.name,
      name,
      yaml: text.replace(/kubernetes\.io\/hostname: \S+/, `kubernetes.io/hostname: ${nodeName}`),
    });
  }
  return out;
}

/** The handler process, its log pumped into a file. */
interface HandlerChild {
  process: Deno.ChildProcess;
  /** Resolves when its output has been written out. */
  pumped: Promise<unknown>;
  logFile: Deno.FsFile;
}

/** Starts `virtnode handler --podless` for this host's node, its output in `<dir>/handler.log`. */
async function startHandler(dir: string, kubeconfig: string, uri: string): Promise<HandlerChild> {
  const handlerLog = `${dir}/handler.log`;
  const logFile = await Deno.open(handlerLog, { create: true, write: true, append: true });
  // Its own session: a terminal's Ctrl-C reaches local mode only, which deletes the VMIs
  // through this handler before it stops it. setpriv has the kernel stop it should local
  // mode die without doing so.
  const process = new Deno.Command("setsid", {
    args: [
      "setpriv",
      "--pdeathsig",
      "SIGTERM",
      "--",
      Deno.execPath(),
      "run",
      "-A",
      `--v8-flags=${V8_FLAGS}`,
      `${root}main.ts`,
      "--node-name",
      nodeName,
      "--kubeconfig",
      kubeconfig,
      "--libvirt-uri",
      uri,
      "--state-dir",
      `${dir}/state`,
      "--run-dir",
      `${dir}/run`,
      "--log-format",
      "json",
      "handler",
      "--podless",
      "--health-address",
      "127.0.0.1:0",
    ],
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const pump = async (s: ReadableStream<Uint8Array>) => {
    for await (const chunk of s) await logFile.write(chunk);
  };
  const pumped = Promise.all([pump(process.stdout), pump(process.stderr)]);
  say(`handler started (pid ${process.pid}); its log: ${handlerLog}`);
  return { process, pumped, logFile };
}

/** The node bridge of the handler's pod network (`--pod-network-bridge`'s default). */
const POD_BRIDGE = "virtnode0";

function linkExists(name: string): boolean {
  try {
    Deno.statSync(`/sys/class/net/${name}`);
    return true;
  } catch {
    return false;
  }
}

/** Resolves at the first SIGINT or SIGTERM. */
function stopRequested(): Promise<void> {
  return new Promise<void>((resolve) => {
    const onSignal = () => {
      say("Ctrl-C: stopping");
      resolve();
    };
    Deno.addSignalListener("SIGINT", onSignal);
    Deno.addSignalListener("SIGTERM", onSignal);
  });
}

/** One screen of the VMIs' phases and the node's labels. */
async function statusTable(client: KubeClient, path: string): Promise<{
  table: string;
  vmis: VirtualMachineInstance[];
}> {
  const list = await client.request<{ items: VirtualMachineInstance[] }>("GET", path);
  const rows = list.items.map((v) => {
    const ready = v.status?.conditions?.find((c) => c.type === "Ready");
    const sync = v.status?.conditions?.find((c) => c.type === "Synchronized");
    return `${v.metadata.name.padEnd(16)} ${(v.status?.phase ?? "Pending").padEnd(10)} ` +
      `${(v.status?.nodeName ?? "").padEnd(20)} ready=${ready?.status ?? "-"}` +
      (v.status?.interfaces?.[0]?.ipAddress ? `  ip=${v.status.interfaces[0].ipAddress}` : "") +
      (sync?.status === "False" ? `  sync error: ${sync.message}` : "");
  });
  const node = await client.request<{ metadata: { labels?: Record<string, string> } }>(
    "GET",
    `/api/v1/nodes/${nodeName}`,
  );
  const labels = node.metadata.labels ?? {};
  const cpuLabels = Object.keys(labels).filter((k) => k.includes(".node.kubevirt.io/")).length;
  rows.push(
    `node ${nodeName}: kubevirt.io/schedulable=${labels["kubevirt.io/schedulable"] ?? "-"}, ` +
      `${cpuLabels} labels from libvirt's capabilities`,
  );
  return { table: rows.join("\n"), vmis: list.items };
}

/**
 * Shows the VMIs until a stop is requested; with `--until-running`, until every example
 * VMI runs (0) or one fails (1).
 */
async function watch(
  client: KubeClient,
  uri: string,
  kubeconfig: string,
  expected: number,
  stopped: Promise<void>,
): Promise<number> {
  const path = "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances";
  let stopping = false;
  stopped.then(() => (stopping = true));
  let last = "";
  const deadline = Date.now() + UNTIL_RUNNING_TIMEOUT_MS;
  while (!stopping) {
    if (untilRunning && Date.now() > deadline) {
      say(`the example VMIs were not all Running after ${UNTIL_RUNNING_TIMEOUT_MS / 1000} s`);
      return 1;
    }
    try {
      const { table, vmis } = await statusTable(client, path);
      if (table !== last) {
        if (isTerminal) {
          console.log(
            "\x1b[2J\x1b[H" + `virtnode local mode — node ${nodeName}, ` +
              `libvirt ${uri}  (Ctrl-C stops everything)\nkubeconfig: ${kubeconfig}\n`,
          );
        }
        console.log(`${"NAME".padEnd(16)} ${"PHASE".padEnd(10)} ${"NODE".padEnd(20)} READY`);
        console.log(table + "\n");
        last = table;
      }
      if (
        untilRunning && vmis.length === expected &&
        vmis.every((v) => v.status?.phase === "Running")
      ) {
        say("every example VMI is Running");
        return 0;
      }
      if (untilRunning && vmis.some((v) => v.status?.phase === "Failed")) {
        say("an example VMI failed");
        return 1;
      }
    } catch (error) {
      say(`cannot list VMIs yet: ${(error as Error).message}`);
    }
    await Promise.race([stopped, sleep(1000)]);
  }
  return 0;
}

/** Deletes the example VMIs and waits (up to a minute) for the handler to clean them up. */
async function deleteExamples(dir: string, kubeconfig: string, names: string[]): Promise<void> {
  say("deleting the example VMIs (graceful shutdown of their guests)");
  for (const name of names) {
    await kubectl(kubeconfig, "delete", "vmi", name, "--ignore-not-found", "--wait=false")
      .catch((e) => say(e.message));
  }
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    let left = 0;
    try {
      left = [...Deno.readDirSync(`${dir}/state/ghost-records`)].filter((e) => e.isFile).length;
    } catch { /* none yet */ }
    if (left === 0) break;
    await sleep(250);
  }
}

/**
 * Ends the launcher host the handler started (it outlives the handler by design, so that
 * a handler restart never stops a VM); it serves nothing once the examples are deleted.
 */
async function stopLauncherHost(stateDir: string): Promise<void> {
  let entries: Deno.DirEntry[];
  try {
    entries = [...Deno.readDirSync(`${stateDir}/launchers`)];
  } catch {
    return;
  }
  for (const e of entries) {
    if (!e.name.startsWith("host-") || !e.name.endsWith(".pid")) continue;
    const pid = Number(Deno.readTextFileSync(`${stateDir}/launchers/${e.name}`).trim());
    let cmdline = "";
    try {
      cmdline = Deno.readTextFileSync(`/proc/${pid}/cmdline`);
    } catch {
      continue; // gone already
    }
    if (!cmdline.includes("\0launcher-host\0")) continue;
    say(`stopping the launcher host (pid ${pid})`);
    Deno.kill(pid, "SIGTERM");
    for (let i = 0; i < 100; i++) {
      try {
        Deno.statSync(`/proc/${pid}`);
      } catch {
        return;
      }
      await sleep(100);
    }
    Deno.kill(pid, "SIGKILL");
  }
}

/** The example VMIs' domains (`default_<name>`) that libvirt still has. */
async function leftoverDomains(uri: string, names: string[]): Promise<string[]> {
  if (uri.startsWith("test:")) return []; // the launcher host held the test driver's state
  const out = await new Deno.Command("virsh", {
    args: ["-c", uri, "list", "--all", "--name"],
    stdin: "null",
    stdout: "piped",
    stderr: "null",
  }).output();
  const domains = new Set(new TextDecoder().decode(out.stdout).split("\n").map((l) => l.trim()));
  return names.map((n) => `default_${n}`).filter((d) => domains.has(d));
}

async function main(): Promise<number> {
  say(`node name: ${nodeName}`);
  say("starting the control plane (kube-apiserver + etcd; built and cached on first use)");
  // Local mode owns Ctrl-C: it deletes its VMIs through the cluster before stopping it.
  // With KubeVirt's CRDs and admission: the examples go through virt-api's webhooks, and
  // the handler, which places them as virt-controller would, holds one of KubeVirt's
  // service accounts (its handler's, bound to this node).
  const cluster = await startCluster({ stopOnSignals: false, admission: true });
  const kubeconfig = cluster.kubeconfigPath;
  say(`kubeconfig: ${kubeconfig}`);
  say(`  try: KUBECONFIG=${kubeconfig} kubectl get vmi -w`);
  // No kubelet runs here: register the Node as one would, for the heartbeat and labels.
  const nodeJson = JSON.stringify({ apiVersion: "v1", kind: "Node", metadata: { name: nodeName } });
  const nodeFile = `${cluster.dir}/node.json`;
  await Deno.writeTextFile(nodeFile, nodeJson);
  await kubectl(kubeconfig, "apply", "-f", nodeFile);
  const { uri, prepared } = await pickLibvirt();
  say(`libvirt: ${uri}`);
  await warnSecurityDriver(uri);
  const dir = await Deno.makeTempDir({ prefix: "virtnode-local-" });
  // The handler's own identity: kubevirt-handler with a token bound to this Node, kept to
  // this node's objects by deploy/podless-node.yaml's admission policy.
  const handlerKubeconfig = await podlessNodeKubeconfig(
    cluster,
    nodeName,
    `${cluster.dir}/node.kubeconfig`,
  );
  say(`handler identity: kubevirt/kubevirt-handler bound to Node ${nodeName}`);
  // The handler's pod network's node bridge (its default); one this run made goes at exit.
  const bridgeWasThere = linkExists(POD_BRIDGE);
  const handler = await startHandler(dir, handlerKubeconfig, uri);
  const stopped = stopRequested();

  const manifests = await examples();
  for (const m of manifests) {
    const tmp = `${dir}/${m.file}`;
    await Deno.writeTextFile(tmp, m.yaml);
    say((await kubectl(kubeconfig, "apply", "-f", tmp)).trim());
  }
  const client = await loadKubeClient({ kubeconfigPath: kubeconfig });
  const code = await watch(client, uri, kubeconfig, manifests.length, stopped);

  await deleteExamples(dir, kubeconfig, manifests.map((m) => m.name));
  say("stopping the handler");
  try {
    handler.process.kill("SIGTERM");
  } catch { /* gone */ }
  const status = await handler.process.status;
  await handler.pumped;
  handler.logFile.close();
  client.close();
  say(`handler exited with code ${status.code}`);
  await stopLauncherHost(`${dir}/state`);
  if (!bridgeWasThere && linkExists(POD_BRIDGE)) {
    await new Deno.Command("ip", { args: ["link", "delete", POD_BRIDGE] }).output();
    say(`removed the pod network's bridge ${POD_BRIDGE}`);
  }
  say("stopping the control plane");
  await cluster.stop();
  const left = await leftoverDomains(uri, manifests.map((m) => m.name));
  if (left.length > 0) say(`domains left behind in libvirt: ${left.join(", ")}`);
  if (prepared) {
    await prepared.restore();
    say("libvirt: the host's configuration is as it was");
  }
  await Deno.remove(dir, { recursive: true }).catch(() => {});
  say("done");
  return code || (status.code === 0 && left.length === 0 ? 0 : 1);
}

Deno.exit(await main());

/**
 * Local mode (`deno task start`): the whole agent on one machine, for trying
 * virtnode and for demos. It starts a real control plane (kube-apiserver and
 * etcd built by deploy/cluster/build.sh), a libvirtd with QEMU (or, when that
 * cannot run, libvirt's test driver, said loudly), and `virtnode handler
 * --podless` for a node named after this host; then applies the VMIs in
 * deploy/examples/ for that node and shows each VMI's phase live. Ctrl-C deletes
 * the example VMIs, waits for their launchers to stop, and stops everything.
 *
 * Flags: `--until-running` exits (cleanly) once every example VMI is Running, for
 * tests; `--test-driver` uses libvirt's test driver even where QEMU could run.
 *
 * @module
 */
import { startCluster } from "./cluster/cluster.ts";
import { ensureLibvirtd } from "./libvirtd.ts";
import { loadKubeClient } from "../mod/kube/mod.ts";
import type { VirtualMachineInstance } from "../mod/api/mod.ts";
import { V8_FLAGS } from "../mod/config/mod.ts";

const root = new URL("..", import.meta.url).pathname;
const args = new Set(Deno.args);
const untilRunning = args.has("--until-running");
const isTerminal = Deno.stdout.isTerminal();
const nodeName = Deno.hostname().toLowerCase().replace(/[^a-z0-9.-]/g, "-");

function say(line: string) {
  console.log(`[local] ${line}`);
}

async function pickLibvirt(): Promise<string> {
  if (args.has("--test-driver")) return "test:///default";
  try {
    return await ensureLibvirtd();
  } catch (error) {
    const bar = "!".repeat(78);
    console.log(`${bar}\n!!! Cannot start libvirtd with QEMU: ${(error as Error).message}`);
    console.log(`!!! Falling back to libvirt's TEST DRIVER: no real guests will run.\n${bar}`);
    return "test:///default";
  }
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
      yaml: text.replace(/kubevirt\.io\/nodeName: \S+/, `kubevirt.io/nodeName: ${nodeName}`),
    });
  }
  return out;
}

async function main(): Promise<number> {
  say(`node name: ${nodeName}`);
  say("starting the control plane (kube-apiserver + etcd; built and cached on first use)");
  const cluster = await startCluster();
  say(`kubeconfig: ${cluster.kubeconfigPath}`);
  say(`  try: KUBECONFIG=${cluster.kubeconfigPath} kubectl get vmi -w`);
  // No kubelet runs here: register the Node as one would, for the heartbeat and labels.
  const nodeJson = JSON.stringify({ apiVersion: "v1", kind: "Node", metadata: { name: nodeName } });
  const nodeFile = `${cluster.dir}/node.json`;
  await Deno.writeTextFile(nodeFile, nodeJson);
  await kubectl(cluster.kubeconfigPath, "apply", "-f", nodeFile);
  const uri = await pickLibvirt();
  say(`libvirt: ${uri}`);
  const dir = await Deno.makeTempDir({ prefix: "virtnode-local-" });
  const handlerLog = `${dir}/handler.log`;
  const log = await Deno.open(handlerLog, { create: true, write: true, append: true });
  const handler = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      `--v8-flags=${V8_FLAGS}`,
      `${root}main.ts`,
      "--node-name",
      nodeName,
      "--kubeconfig",
      cluster.kubeconfigPath,
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
    for await (const chunk of s) await log.write(chunk);
  };
  const pumps = Promise.all([pump(handler.stdout), pump(handler.stderr)]);
  say(`handler started (pid ${handler.pid}); its log: ${handlerLog}`);

  let stopping = false;
  const stopped = new Promise<void>((resolve) => {
    const onSignal = () => {
      if (!stopping) say("Ctrl-C: stopping");
      stopping = true;
      resolve();
    };
    Deno.addSignalListener("SIGINT", onSignal);
    Deno.addSignalListener("SIGTERM", onSignal);
  });

  const manifests = await examples();
  for (const m of manifests) {
    const tmp = `${dir}/${m.file}`;
    await Deno.writeTextFile(tmp, m.yaml);
    say((await kubectl(cluster.kubeconfigPath, "apply", "-f", tmp)).trim());
  }

  const client = await loadKubeClient({ kubeconfigPath: cluster.kubeconfigPath });
  const path = "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances";
  let last = "";
  let code = 0;
  while (!stopping) {
    let rows: string[] = [];
    try {
      const list = await client.request<{ items: VirtualMachineInstance[] }>("GET", path);
      rows = list.items.map((v) => {
        const ready = v.status?.conditions?.find((c) => c.type === "Ready");
        const sync = v.status?.conditions?.find((c) => c.type === "Synchronized");
        return `${v.metadata.name.padEnd(16)} ${(v.status?.phase ?? "Pending").padEnd(10)} ` +
          `${(v.status?.nodeName ?? "").padEnd(20)} ready=${ready?.status ?? "-"}` +
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
      const table = rows.join("\n");
      if (table !== last) {
        if (isTerminal) {
          console.log(
            "\x1b[2J\x1b[H" + `virtnode local mode — node ${nodeName}, ` +
              `libvirt ${uri}  (Ctrl-C stops everything)\nkubeconfig: ${cluster.kubeconfigPath}\n`,
          );
        }
        console.log(`${"NAME".padEnd(16)} ${"PHASE".padEnd(10)} ${"NODE".padEnd(20)} READY`);
        console.log(table + "\n");
        last = table;
      }
      if (
        untilRunning && list.items.length === manifests.length &&
        list.items.every((v) => v.status?.phase === "Running")
      ) {
        say("every example VMI is Running");
        break;
      }
      if (untilRunning && list.items.some((v) => v.status?.phase === "Failed")) {
        say("an example VMI failed");
        code = 1;
        break;
      }
    } catch (error) {
      say(`cannot list VMIs yet: ${(error as Error).message}`);
    }
    await Promise.race([stopped, new Promise((r) => setTimeout(r, 1000))]);
  }

  say("deleting the example VMIs (graceful shutdown of their guests)");
  for (const m of manifests) {
    await kubectl(
      cluster.kubeconfigPath,
      "delete",
      "vmi",
      m.name,
      "--ignore-not-found",
      "--wait=false",
    )
      .catch((e) => say(e.message));
  }
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    let left = 0;
    try {
      left = [...Deno.readDirSync(`${dir}/state/ghost-records`)].filter((e) => e.isFile).length;
    } catch { /* none yet */ }
    if (left === 0) break;
    await new Promise((r) => setTimeout(r, 250));
  }
  say("stopping the handler");
  try {
    handler.kill("SIGTERM");
  } catch { /* gone */ }
  const status = await handler.status;
  await pumps;
  log.close();
  client.close();
  say(`handler exited with code ${status.code}`);
  say("stopping the control plane");
  await cluster.stop();
  await Deno.remove(dir, { recursive: true }).catch(() => {});
  say("done");
  return code || (status.code === 0 ? 0 : 1);
}

Deno.exit(await main());

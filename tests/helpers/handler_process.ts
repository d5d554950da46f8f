/**
 * Runs `virtnode handler --podless` as a real process for tests, with its own
 * node name, state and run directories, and helpers to drive VMIs through the
 * real apiserver.
 *
 * @module
 */
import { useCluster } from "../../deploy/cluster/cluster.ts";
import { freePorts } from "../../deploy/cluster/processes.ts";
import { loadKubeClient } from "../../mod/kube/mod.ts";
import type { KubeClient } from "../../mod/kube/mod.ts";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { V8_FLAGS } from "../../mod/config/mod.ts";
import { GUEST_CPU_FEATURES } from "../harness/guest_cpu.ts";

const MAIN = new URL("../../main.ts", import.meta.url).pathname;

/** Options of {@linkcode startHandlerProcess}. */
export interface HandlerProcessOptions {
  kubeconfig: string;
  nodeName: string;
  libvirtUri: string;
  /** Reuse directories (a restart); fresh temporary ones otherwise. */
  dir?: string;
  /** KubeVirt mode (launcher pods) with this kubelet pods directory; pod-less otherwise. */
  kubeletPodsDir?: string;
  /** KubeVirt mode: the kubelet's device plugins directory; one of the handler's own unless told. */
  devicePluginsDir?: string;
  /** Do not wait for /readyz (for tests of a handler that cannot get ready yet). */
  noWait?: boolean;
  /** Pod-less mode: the VMs' pod network (see {@linkcode testPodNetwork}). */
  podNetwork?: TestPodNetwork;
  /** Pod-less mode: the only directory host disks (and hotplugged claims) may use. */
  hostDiskRoot?: string;
  /** More `handler` options, appended as they are. */
  extraArgs?: string[];
  /** The health endpoints speak TLS (`--health-tls`) with a certificate of this CA. */
  healthCa?: string;
  /**
   * Runs the handler inside a test "node" (see `tests/helpers/migration.ts`): the command
   * that enters its namespaces goes before the handler's own.
   */
  enter?: string[];
  /** The address of `/healthz`, `/readyz` and `/metrics` (a node's own); 127.0.0.1 unless told. */
  healthHost?: string;
  /** `/metrics` answers every client there (`--metrics-address`), not loopback ones only. */
  openMetrics?: boolean;
  /** The run directory; `<dir>/run` unless told. */
  runDir?: string;
  /** Flags of `deno run` itself (e.g. `--inspect=127.0.0.1:9229`), before the script. */
  denoFlags?: string[];
}

/** A pod-less pod network for one test handler: its own node bridge and /24. */
export interface TestPodNetwork {
  /** The node bridge. */
  bridge: string;
  /** The pods' range (an IPv6 one may follow after a comma). */
  cidr: string;
}

/**
 * A pod network no other test handler uses: a bridge named after a random ID and a random
 * /24 of 10.200.0.0 to 10.239.255.0 (clear of the node tier's 10.244.0.0/16 and the
 * default 10.245.0.0/16). Remove its bridge with {@linkcode removeTestPodNetwork}.
 */
export function testPodNetwork(options: { ipv6?: boolean } = {}): TestPodNetwork {
  const bytes = crypto.getRandomValues(new Uint8Array(3));
  const id = [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
  const v4 = `10.${200 + (bytes[0] % 40)}.${bytes[1]}.0/24`;
  const v6 = `fd00:${id.slice(0, 4)}:${id.slice(4)}::/64`;
  return { bridge: `vntb${id}`, cidr: options.ipv6 ? `${v4},${v6}` : v4 };
}

/** Deletes a test pod network's node bridge (the CNI bridge plugin leaves it). */
export async function removeTestPodNetwork(network: TestPodNetwork): Promise<void> {
  await new Deno.Command("ip", {
    args: ["link", "delete", "dev", network.bridge],
    stdout: "null",
    stderr: "null",
  }).output();
}

/** A handler running as a child process. */
export interface HandlerProcess {
  dir: string;
  stateDir: string;
  runDir: string;
  health: string;
  child: Deno.ChildProcess;
  logFile: string;
  /** Sends a signal and waits for the process to exit. */
  kill(signal?: Deno.Signal): Promise<Deno.CommandStatus>;
}

/** A TCP port nothing listens on, outside the kernel's ephemeral range (`freePorts`). */
export function freePort(): number {
  return freePorts(1)[0];
}

/** Polls `fn` until it returns a truthy value or the time is up. */
export async function waitFor<T>(
  what: string,
  fn: () => Promise<T | undefined | false | null> | T | undefined | false | null,
  timeoutMs = 30_000,
  intervalMs = 100,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v as T;
    } catch (error) {
      last = error;
    }
    if (Date.now() > deadline) {
      throw new Error(`Timed out after ${timeoutMs} ms waiting for ${what}`, { cause: last });
    }
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

/** What {@linkcode handlerArgs} builds a command line from. */
export interface HandlerArgsOptions {
  kubeconfig: string;
  nodeName: string;
  libvirtUri: string;
  /** State and run directories go below it. */
  dir: string;
  /** Port of /healthz and /readyz on 127.0.0.1. */
  port: number;
  logLevel: string;
  /** KubeVirt mode with this kubelet pods directory; pod-less otherwise. */
  kubeletPodsDir?: string;
  /** KubeVirt mode: the kubelet's device plugins directory (`<dir>/device-plugins` unless told). */
  devicePluginsDir?: string;
  /** Pod-less mode: the VMs' pod network. */
  podNetwork?: TestPodNetwork;
  /** Pod-less mode: `--host-disk-root`. */
  hostDiskRoot?: string;
  /** More `handler` options, appended as they are. */
  extraArgs?: string[];
  /** Address of /healthz and /readyz; 127.0.0.1 unless told. */
  healthHost?: string;
  /** `/metrics` answers every client there (`--metrics-address`), not loopback ones only. */
  openMetrics?: boolean;
  /** The run directory; `<dir>/run` unless told. */
  runDir?: string;
  /** Flags of `deno run` itself, before the script. */
  denoFlags?: string[];
}

/**
 * The `deno run` arguments of a handler for tests and benchmarks: the V8 flags every
 * virtnode process runs with, JSON logs, directories below `dir`.
 */
export function handlerArgs(o: HandlerArgsOptions): string[] {
  return [
    "run",
    "-A",
    `--v8-flags=${V8_FLAGS}`,
    ...(o.denoFlags ?? []),
    MAIN,
    "--node-name",
    o.nodeName,
    "--kubeconfig",
    o.kubeconfig,
    "--libvirt-uri",
    o.libvirtUri,
    "--state-dir",
    `${o.dir}/state`,
    "--run-dir",
    o.runDir ?? `${o.dir}/run`,
    "--log-format",
    "json",
    "--log-level",
    o.logLevel,
    "handler",
    ...(o.kubeletPodsDir
      ? [
        "--kubelet-pods-dir",
        o.kubeletPodsDir,
        "--device-plugins-dir",
        o.devicePluginsDir ?? `${o.dir}/device-plugins`,
      ]
      : [
        "--podless",
        ...(o.podNetwork
          ? ["--pod-network-bridge", o.podNetwork.bridge, "--pod-network-cidr", o.podNetwork.cidr]
          : []),
        ...(o.hostDiskRoot ? ["--host-disk-root", o.hostDiskRoot] : []),
      ]),
    "--health-address",
    `${o.healthHost ?? "127.0.0.1"}:${o.port}`,
    ...(o.openMetrics ? ["--metrics-address", `${o.healthHost ?? "127.0.0.1"}:${o.port}`] : []),
    ...(o.extraArgs ?? []),
  ];
}

/** Starts the handler and waits until `/readyz` answers 200. */
export async function startHandlerProcess(opts: HandlerProcessOptions): Promise<HandlerProcess> {
  const dir = opts.dir ?? await Deno.makeTempDir({ prefix: "virtnode-handler-" });
  const stateDir = `${dir}/state`;
  const runDir = opts.runDir ?? `${dir}/run`;
  const port = freePort();
  const logFile = `${dir}/handler.log`;
  const log = await Deno.open(logFile, { append: true, create: true, write: true });
  const args = handlerArgs({ ...opts, dir, port, logLevel: "debug" });
  const child = new Deno.Command(opts.enter?.[0] ?? Deno.execPath(), {
    args: opts.enter ? [...opts.enter.slice(1), Deno.execPath(), ...args] : args,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  // Copy output to the log file so a failing test can show it.
  const pump = async (stream: ReadableStream<Uint8Array>) => {
    for await (const chunk of stream) await Deno.writeFile(logFile, chunk, { append: true });
  };
  pump(child.stdout);
  pump(child.stderr);
  log.close();
  const health = `${opts.healthCa ? "https" : "http"}://${opts.healthHost ?? "127.0.0.1"}:${port}`;
  const httpClient = opts.healthCa
    ? Deno.createHttpClient({ caCerts: [opts.healthCa] })
    : undefined;
  let exited = false;
  child.status.then(() => (exited = true));
  if (!opts.noWait) {
    await waitFor("the handler to be ready", async () => {
      if (exited) {
        throw new Error(`handler exited early; log:\n${await Deno.readTextFile(logFile)}`);
      }
      const r = await fetch(`${health}/readyz`, { client: httpClient }).catch(() => undefined);
      await r?.body?.cancel();
      return r?.status === 200;
    }, 60_000);
  }
  httpClient?.close();
  return {
    dir,
    stateDir,
    runDir,
    health,
    child,
    logFile,
    async kill(signal: Deno.Signal = "SIGTERM") {
      try {
        child.kill(signal);
      } catch { /* already gone */ }
      return await child.status;
    },
  };
}

/** A Kubernetes client for the test cluster. */
export function kubeClient(kubeconfig: string): Promise<KubeClient> {
  return loadKubeClient({ kubeconfigPath: kubeconfig });
}

/**
 * A small VMI for this node that KubeVirt's admission and the converter accept (no disks,
 * no network). It asks for the node with `spec.nodeSelector`, as a KubeVirt user does;
 * a pod-less handler places it. `placed` puts the `kubevirt.io/nodeName` label on it
 * as virt-controller would (only KubeVirt's service accounts may create it so).
 */
export function testVmi(
  name: string,
  nodeName: string,
  options: {
    namespace?: string;
    grace?: number;
    extra?: Record<string, unknown>;
    placed?: boolean;
  } = {},
): VirtualMachineInstance {
  return {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachineInstance",
    metadata: {
      name,
      namespace: options.namespace ?? "default",
      ...(options.placed ? { labels: { "kubevirt.io/nodeName": nodeName } } : {}),
    },
    spec: {
      terminationGracePeriodSeconds: options.grace ?? 0,
      nodeSelector: { "kubernetes.io/hostname": nodeName },
      domain: {
        cpu: { cores: 1, features: GUEST_CPU_FEATURES },
        memory: { guest: "64Mi" },
        devices: {
          autoattachPodInterface: false,
          ...(options.extra ?? {}),
        },
      },
    },
  } as VirtualMachineInstance;
}

/** The path of a VMI (or of the collection when `name` is empty). */
export function vmiPath(namespace: string, name = ""): string {
  return `/apis/kubevirt.io/v1/namespaces/${namespace}/virtualmachineinstances${
    name ? "/" + name : ""
  }`;
}

/** Creates a VMI. */
export async function createVmi(
  client: KubeClient,
  vmi: VirtualMachineInstance,
): Promise<VirtualMachineInstance> {
  return await client.request<VirtualMachineInstance>(
    "POST",
    vmiPath(vmi.metadata.namespace!),
    vmi,
  );
}

/** Reads a VMI, or undefined when it does not exist. */
export async function getVmi(
  client: KubeClient,
  namespace: string,
  name: string,
): Promise<VirtualMachineInstance | undefined> {
  try {
    return await client.request<VirtualMachineInstance>("GET", vmiPath(namespace, name));
  } catch (error) {
    if ((error as { status?: number }).status === 404) return undefined;
    throw error;
  }
}

/** Waits until a VMI has `phase`, and returns it. */
export function waitForPhase(
  client: KubeClient,
  namespace: string,
  name: string,
  phase: string,
  timeoutMs = 60_000,
): Promise<VirtualMachineInstance> {
  return waitFor(`VMI ${namespace}/${name} to be ${phase}`, async () => {
    const vmi = await getVmi(client, namespace, name);
    return vmi?.status?.phase === phase ? vmi : undefined;
  }, timeoutMs);
}

/** Deletes a VMI (no error when it is gone already). */
export async function deleteVmi(client: KubeClient, namespace: string, name: string) {
  try {
    await client.request("DELETE", vmiPath(namespace, name));
  } catch (error) {
    if ((error as { status?: number }).status !== 404) throw error;
  }
}

/** Events about one object, as `reason: message` strings. */
export async function eventsFor(
  client: KubeClient,
  namespace: string,
  name: string,
): Promise<{ type: string; reason: string; message: string; count: number }[]> {
  const list = await client.request<{ items: Record<string, unknown>[] }>(
    "GET",
    `/api/v1/namespaces/${namespace}/events`,
    undefined,
    { query: { fieldSelector: `involvedObject.name=${name}` } },
  );
  return list.items.map((e) => ({
    type: e.type as string,
    reason: e.reason as string,
    message: e.message as string,
    count: e.count as number,
  }));
}

/** Whether a process with this PID is alive. */
export function pidAlive(pid: number): boolean {
  try {
    Deno.statSync(`/proc/${pid}`);
    return true;
  } catch {
    return false;
  }
}

/** The live launcher PIDs named by `<stateDir>/launchers/*.pid`. */
export function launcherPids(stateDir: string): number[] {
  const pids: number[] = [];
  let entries: Deno.DirEntry[];
  try {
    entries = [...Deno.readDirSync(`${stateDir}/launchers`)];
  } catch {
    return pids;
  }
  for (const e of entries) {
    if (!e.name.endsWith(".pid")) continue;
    try {
      const pid = Number(Deno.readTextFileSync(`${stateDir}/launchers/${e.name}`).trim());
      if (Number.isInteger(pid) && pid > 1 && pidAlive(pid)) pids.push(pid);
    } catch {
      // Removed meanwhile.
    }
  }
  return pids;
}

/** The PID of a pod-less handler's launcher host (`<stateDir>/launchers/host-*.pid`), if alive. */
export function hostPid(stateDir: string): number | undefined {
  let entries: Deno.DirEntry[];
  try {
    entries = [...Deno.readDirSync(`${stateDir}/launchers`)];
  } catch {
    return undefined;
  }
  for (const e of entries) {
    if (!e.name.startsWith("host-") || !e.name.endsWith(".pid")) continue;
    const pid = Number(Deno.readTextFileSync(`${stateDir}/launchers/${e.name}`).trim());
    if (Number.isInteger(pid) && pid > 1 && pidAlive(pid)) return pid;
  }
  return undefined;
}

/** The log file of a pod-less handler's launcher host (`<stateDir>/launchers/host-*.log`). */
export function hostLogOf(stateDir: string): string {
  for (const e of Deno.readDirSync(`${stateDir}/launchers`)) {
    if (e.name.startsWith("host-") && e.name.endsWith(".log")) {
      return `${stateDir}/launchers/${e.name}`;
    }
  }
  throw new Error(`no launcher host log in ${stateDir}/launchers`);
}

/** The UIDs a pod-less handler's launcher host serves (its `vms/<uid>.json` records). */
export function hostedUids(stateDir: string): string[] {
  try {
    return [...Deno.readDirSync(`${stateDir}/launcher-host/vms`)]
      .filter((e) => e.name.endsWith(".json"))
      .map((e) => e.name.slice(0, -5));
  } catch {
    return [];
  }
}

/** Every running `virtnode launcher` process on this host, by the `--uid` it carries. */
export function launchersByUid(): Map<string, number[]> {
  const byUid = new Map<string, number[]>();
  for (const e of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(e.name)) continue;
    let args: string[];
    try {
      args = Deno.readTextFileSync(`/proc/${e.name}/cmdline`).split("\0");
    } catch {
      continue; // exited meanwhile
    }
    const i = args.indexOf("--uid");
    if (i < 0 || !args.includes("launcher")) continue;
    const uid = args[i + 1];
    byUid.set(uid, [...(byUid.get(uid) ?? []), Number(e.name)]);
  }
  return byUid;
}

/**
 * The PIDs of the running launcher processes of one VMI UID: a second launcher for the
 * same VMI shows here even when it overwrote the first one's PID file.
 */
export function launcherProcesses(uid: string): number[] {
  return launchersByUid().get(uid) ?? [];
}

/**
 * How many times a handler log (JSON lines, every handler that used the file) says
 * "Started launcher", per VMI UID.
 */
export async function launcherStarts(logFile: string): Promise<Map<string, number>> {
  const starts = new Map<string, number>();
  for (const line of (await Deno.readTextFile(logFile)).split("\n")) {
    if (!line.includes("Started launcher")) continue;
    let entry: { msg?: string; uid?: string };
    try {
      entry = JSON.parse(line);
    } catch {
      continue; // a line cut by a SIGKILL
    }
    if (entry.msg?.startsWith("Started launcher") && entry.uid) {
      starts.set(entry.uid, (starts.get(entry.uid) ?? 0) + 1);
    }
  }
  return starts;
}

/**
 * SIGKILLs every live launcher of a handler's state directory (test cleanup); returns
 * how many. Besides the PIDs of `<stateDir>/launchers/*.pid` it kills every launcher
 * process whose command line names the handler's directory, so a launcher whose PID file
 * was overwritten or never written does not outlive the test.
 */
export function killLaunchers(stateDir: string): number {
  const dir = stateDir.replace(/\/state\/?$/, "");
  const pids = new Set(launcherPids(stateDir));
  for (const e of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(e.name)) continue;
    try {
      const args = Deno.readTextFileSync(`/proc/${e.name}/cmdline`).split("\0");
      const role = args.includes("launcher") || args.includes("launcher-host");
      if (role && args.some((a) => a.startsWith(`${dir}/`))) {
        pids.add(Number(e.name));
      }
    } catch {
      // Exited meanwhile.
    }
  }
  for (const pid of pids) {
    try {
      // A recycled PID is not ours: a launcher carries "launcher" on its command line.
      const cmdline = Deno.readTextFileSync(`/proc/${pid}/cmdline`);
      if (cmdline.includes("launcher")) Deno.kill(pid, "SIGKILL");
    } catch {
      // Gone meanwhile.
    }
  }
  return pids.size;
}

/** What {@linkcode withHandler} hands its test. */
export interface HandlerTestContext {
  /** The running pod-less handler. */
  h: HandlerProcess;
  /** Its node's name (unique per call). */
  node: string;
  /** A client of the test cluster. */
  client: KubeClient;
  /** The test cluster's kubeconfig. */
  kubeconfig: string;
}

/**
 * Runs `fn` with a pod-less handler on libvirt's test driver for a node named
 * `<name>-<random>`; afterwards stops the handler, kills its launchers and removes its
 * directories (kept with KEEP_HANDLER_DIR=1). A failing test shows the handler's log.
 */
export async function withHandler(
  name: string,
  fn: (ctx: HandlerTestContext) => Promise<void>,
  options: { libvirtUri?: string; extraArgs?: string[] } = {},
): Promise<void> {
  const cluster = await useCluster();
  const node = `${name}-${crypto.randomUUID().slice(0, 8)}`;
  const client = await kubeClient(cluster.kubeconfigPath);
  const h = await startHandlerProcess({
    kubeconfig: cluster.handlerKubeconfigPath,
    nodeName: node,
    libvirtUri: options.libvirtUri ?? "test:///default",
    extraArgs: options.extraArgs,
  });
  let ok = false;
  try {
    await fn({ h, node, client, kubeconfig: cluster.handlerKubeconfigPath });
    ok = true;
  } finally {
    if (!ok) console.error(`handler log:\n${(await Deno.readTextFile(h.logFile)).slice(-6000)}`);
    await h.kill("SIGTERM");
    killLaunchers(h.stateDir);
    client.close();
    if (!Deno.env.get("KEEP_HANDLER_DIR")) {
      await Deno.remove(h.dir, { recursive: true }).catch(() => {});
    }
    await cluster.stop();
  }
}

/**
 * Takes virt-api's finalizer off a deleted VMI, as virt-controller does once no launcher
 * pod is left (no-op when the VMI is gone or has none); `client` must be one of KubeVirt's
 * service accounts.
 */
export async function releaseVmi(client: KubeClient, namespace: string, name: string) {
  const vmi = await getVmi(client, namespace, name);
  if (!vmi?.metadata.finalizers?.length) return;
  await client.request("PUT", vmiPath(namespace, name), {
    ...vmi,
    metadata: { ...vmi.metadata, finalizers: [] },
  });
}

/**
 * What virt-controller writes once a VMI's launcher pod runs: `Scheduled` on `node`, the pod
 * in `activePods`, the runtime user of a root VMI. `client` must be one of KubeVirt's
 * service accounts.
 */
export async function scheduleToPod(
  client: KubeClient,
  namespace: string,
  name: string,
  node: string,
  podUid: string,
): Promise<void> {
  const current = (await getVmi(client, namespace, name))!;
  await client.request("PUT", vmiPath(namespace, name), {
    ...current,
    status: {
      ...current.status,
      phase: "Scheduled",
      nodeName: node,
      activePods: { [podUid]: node },
      runtimeUser: 0,
    },
  });
}

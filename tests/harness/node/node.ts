/**
 * One real Kubernetes node for a test control plane (deploy/cluster/cluster.ts): Debian's
 * containerd, runc and CNI plugins (bridge, host-local, loopback), and a kubelet,
 * kube-scheduler and kube-controller-manager built from the apiserver's own
 * `k8s.io/kubernetes` module (tests/harness/node/build.sh). Every file lives in one temporary
 * directory (containerd's root and state, the kubelet's root, the CNI configuration and
 * address store, logs), and {@linkcode Node.stop} ends every process it started, removes
 * the pods' containers and network (with the sandboxes' network namespaces in /run/netns
 * and their CNI results in /var/lib/cni/results, which live outside it), and the directory;
 * the last node of a process to stop also removes the kubelets' iptables chains and
 * /var/log/containers when the host had none before.
 *
 * No registry is reachable here: the pods' sandbox image (`virtnode.local/pause:1`,
 * tests/harness/node/cmd/pause) and every other image are OCI archives built on this machine
 * (deploy/image/oci.ts) and imported with {@linkcode Node.importImage}.
 *
 * Settings this machine needs, and why:
 * - `failCgroupV1: false`: the hierarchy is cgroup v1 (hybrid), which kubelet refuses
 *   from v1.35 on unless told.
 * - `cgroupDriver: cgroupfs` (no systemd runs here) and `cgroupsPerQOS: false` with no
 *   node allocatable enforcement: the kubelet does not build its own QoS hierarchy.
 * - image garbage collection off: an image removed here cannot be pulled again.
 * - `failSwapOn: false`, and eviction thresholds near zero: a shared test machine's disk
 *   and memory levels are not this node's to judge.
 * - containerd's `restrict_oom_score_adj`: this machine's root lacks CAP_SYS_RESOURCE, so
 *   runc cannot give the pod sandbox the OOM score (-998) the kubelet asks for.
 *
 * @module
 */
import { buildKubevirtPeers } from "../kubevirt/peers.ts";
import { join } from "node:path";
import type { Cluster } from "../../../deploy/cluster/cluster.ts";
import { applyNetworkAttachmentCrd, buildMultus } from "./multus.ts";
import { buildImageArchive } from "../../../deploy/image/oci.ts";
import { cachedImage, ContentHash } from "../../../deploy/image/image.ts";
import {
  ClusterError,
  freePorts,
  logTail,
  type Managed,
  spawnManaged,
  terminate,
  waitUntil,
} from "../../../deploy/cluster/processes.ts";
import { removeIfPresent } from "../../../mod/lifecycle/mod.ts";

const BUILD_SCRIPT = new URL("./build.sh", import.meta.url).pathname;

/**
 * Removes what a stopping node leaves behind; one path that cannot be removed (busy, still
 * mounted) is reported and the teardown goes on with the rest.
 */
async function removeLeftover(path: string, options?: Deno.RemoveOptions): Promise<void> {
  await removeIfPresent(path, options).catch((error) =>
    console.warn(`cannot remove ${path}: ${error}`)
  );
}

/** The pods' sandbox image. */
export const PAUSE_IMAGE = "virtnode.local/pause:1";
const CNI_BIN_DIR = "/usr/lib/cni";
const DEVICE_PLUGINS_DIR = "/var/lib/kubelet/device-plugins";
const CONTAINERD_SHIM_SOCKETS = "/run/containerd/s";
/** Where the CNI library caches each attachment's result (its default; containerd names none). */
const CNI_RESULTS = "/var/lib/cni/results";
const READY_TIMEOUT_MS = 90_000;
/** The cluster's DNS domain, Kubernetes' default. */
export const CLUSTER_DOMAIN = "cluster.local";

/** A running node. */
export interface Node {
  /** The Node object's name. */
  readonly name: string;
  /** The directory of every file the node keeps. */
  readonly dir: string;
  /** containerd's socket. */
  readonly containerdSocket: string;
  /** The kubelet's root directory (its `pods/`). */
  readonly kubeletDir: string;
  /**
   * Where the kubelet listens for device plugins: always the host's
   * `/var/lib/kubelet/device-plugins` (a constant of the device plugin API, not below the
   * kubelet's root directory), so one test node runs at a time.
   */
  readonly devicePluginsDir: string;
  /** The pods' address range. */
  readonly podCidr: string;
  /**
   * Imports an OCI image archive into containerd's Kubernetes namespace, also under each of
   * `names` (the same image under the names a manifest expects).
   */
  importImage(archive: string, names?: string[]): Promise<void>;
  /** The last lines of each process's log with warnings and errors, for a failing test. */
  complaints(): Promise<string>;
  /** Ends every process the node started and removes its files. */
  stop(): Promise<void>;
}

/** Options of {@linkcode startNode}. */
export interface StartNodeOptions {
  /** The Node's name; `node-<random>` unless told. */
  name?: string;
  /**
   * A node of its own on this host, beside others: its kubelet and containerd run in a
   * mount namespace of the node's where `/var/lib/kubelet` (the kubelet's root, with the
   * device-plugin directory the API fixes there), `/var/run/kubevirt`, `/var/lib/virtnode` and
   * containerd's shim folder are the node's own folders. A node agent's DaemonSet then
   * applies as shipped (its hostPaths at their real places), and two nodes share no host
   * path. Default false: the kubelet's root below the node's folder, the host's
   * device-plugin directory (one such node at a time).
   */
  isolated?: boolean;
  /**
   * Run the cluster's own services with this node (kube-scheduler,
   * kube-controller-manager, kube-proxy); default true. A second node of a cluster leaves
   * them to the first.
   */
  clusterServices?: boolean;
  /**
   * The cluster DNS Service's address (tests/harness/node/cluster_dns.ts): the kubelet gives its
   * pods that nameserver and the `cluster.local` search domains, as a kubelet of a cluster
   * with CoreDNS does. Unset: pods get the host's /etc/resolv.conf as it is.
   */
  clusterDns?: string;
  /**
   * Which containerd runs the pods: Debian 12's 1.6 (default), or containerd 2 built from
   * the Go module proxy (tests/harness/node/build_containerd.sh), which gives pods images as
   * volumes (Kubernetes' ImageVolume; KubeVirt's ImageVolume gate needs it).
   */
  containerd?: "debian" | "v2";
  /**
   * The kubelet's CPU manager: `static` gives Guaranteed pods' containers with whole CPUs
   * CPUs of their own (what KubeVirt's `dedicatedCpuPlacement` needs). The kubelet keeps
   * 100m for itself (`kubeReserved`), which the static policy rounds up to one whole CPU
   * kept out of the exclusive pool; the rest is allocatable. `none` (the kubelet's default)
   * unless told.
   */
  cpuManager?: "none" | "static";
  /**
   * Chain the pod network through Multus's thin plugin (tests/harness/node/build_multus.sh),
   * as a cluster with Multus does: the pod network stays each pod's default network, and a
   * pod's `k8s.v1.cni.cncf.io/networks` annotation adds the NetworkAttachmentDefinitions it
   * names (the CRD is applied as the node starts). Default false.
   */
  multus?: boolean;
}

/** Builds containerd 2 (cached by key) and gives the directory of its programs. */
export async function buildContainerdV2(): Promise<string> {
  const out = await new Deno.Command("bash", {
    args: [new URL("./build_containerd.sh", import.meta.url).pathname],
    stdout: "piped",
    stderr: "inherit",
  }).output();
  if (!out.success) throw new Error("tests/harness/node/build_containerd.sh failed");
  return new TextDecoder().decode(out.stdout).trim();
}

/** The host paths an isolated node has of its own, and its folder each is bound from. */
const ISOLATED_PATHS = {
  "/var/lib/kubelet": "kubelet",
  "/var/run/kubevirt": "kubevirt-run",
  "/var/lib/virtnode": "virtnode-state",
  // virt-handler's own, for the yardstick on isolated nodes.
  "/var/run/kubevirt-private": "kubevirt-private",
  "/var/run/kubevirt-libvirt-runtimes": "kubevirt-libvirt-runtimes",
  "/var/lib/kubevirt-node-labeller": "kubevirt-node-labeller",
  "/run/containerd/s": "containerd-shims",
} as const;

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

async function run(
  cmd: string,
  args: string[],
  options: { cwd?: string; env?: Record<string, string> } = {},
): Promise<string> {
  const out = await new Deno.Command(cmd, { args, stdout: "piped", stderr: "piped", ...options })
    .output();
  const dec = new TextDecoder();
  if (!out.success) {
    throw new Error(`Cannot run ${cmd} ${args.join(" ")}: ${dec.decode(out.stderr).trim()}`);
  }
  return dec.decode(out.stdout);
}

/** The topmost directory of `path` that does not exist yet, if any. */
async function firstMissing(path: string): Promise<string | undefined> {
  let missing: string | undefined;
  for (let p = path; p !== "/"; p = p.slice(0, p.lastIndexOf("/")) || "/") {
    try {
      await Deno.stat(p);
      break;
    } catch {
      missing = p;
    }
  }
  return missing;
}

/**
 * What every kubelet leaves on the host, not below its root: its chains in the host's
 * iptables and ip6tables (`KUBE-FIREWALL` and its jumps, the `KUBE-KUBELET-CANARY` and
 * `KUBE-IPTABLES-HINT` chains) and its `/var/log/containers` folder. The test nodes of this
 * process share them; the last to stop removes what the first found missing.
 */
interface KubeletHostState {
  nodes: number;
  /** Whether any `KUBE-` chain was there before (another kubelet's or kube-proxy's). */
  hadChains: boolean;
  /** The topmost missing folder of `/var/log/containers`, made by the kubelet. */
  logDir?: string;
}
let kubeletHost: Promise<KubeletHostState> | undefined;

const IPTABLES = [["iptables-save", "iptables"], ["ip6tables-save", "ip6tables"]] as const;

async function probeKubeletHost(): Promise<KubeletHostState> {
  let hadChains = false;
  for (const [save] of IPTABLES) {
    if (/^:KUBE-/m.test(await run(save, []).catch(() => ""))) hadChains = true;
  }
  return { nodes: 0, hadChains, logDir: await firstMissing("/var/log/containers") };
}

/** Removes the `KUBE-` chains of the host's tables and the rules that jump to them. */
async function removeKubeChains(): Promise<void> {
  for (const [save, cmd] of IPTABLES) {
    let table = "";
    const chains: [string, string][] = [];
    const jumps: [string, string][] = [];
    for (const line of (await run(save, []).catch(() => "")).split("\n")) {
      if (line.startsWith("*")) table = line.slice(1);
      const chain = line.match(/^:(KUBE-\S+)/)?.[1];
      if (chain) chains.push([table, chain]);
      const rule = line.match(/^-A (\S+) (.*-j KUBE-\S+.*)$/);
      if (rule && !rule[1].startsWith("KUBE-")) jumps.push([table, line.slice(3)]);
    }
    for (const [t, rule] of jumps) {
      await run(cmd, ["-t", t, "-D", ...splitRule(rule)]).catch(() => {});
    }
    for (const [t, chain] of chains) await run(cmd, ["-t", t, "-F", chain]).catch(() => {});
    for (const [t, chain] of chains) await run(cmd, ["-t", t, "-X", chain]).catch(() => {});
  }
}

/** An iptables-save rule's words, its quoted comments kept whole. */
function splitRule(rule: string): string[] {
  return [...rule.matchAll(/"([^"]*)"|(\S+)/g)].map((m) => m[1] ?? m[2]);
}

/** Runs tests/harness/node/build.sh (a no-op when cached) and returns its output directory. */
export async function buildNodeBinaries(): Promise<string> {
  const out = await new Deno.Command("bash", {
    args: [BUILD_SCRIPT],
    stdin: "null",
    stdout: "piped",
    stderr: "inherit",
  }).output();
  if (!out.success) {
    throw new Error(`Cannot build the node's programs: build.sh exited ${out.code}`);
  }
  return new TextDecoder().decode(out.stdout).trim().split("\n").at(-1)!;
}

function spawn(dir: string, name: string, program: string, args: string[]): Promise<Managed> {
  return spawnManaged(name, program, args, { logPath: join(dir, "logs", `${name}.log`) });
}

/** The names, paths and addresses one test node uses; every step reads them. */
interface NodeLayout {
  name: string;
  dir: string;
  ctrDir: string;
  containerdSocket: string;
  kubeletDir: string;
  cniDir: string;
  podCidr: string;
  bridge: string;
  /** The node's address for the apiserver, when it is not loopback. */
  nodeIp?: string;
  isolated: boolean;
  /** The node's programs (build.sh's output). */
  bin: string;
  /** containerd 2's directory, when the node runs it instead of Debian's 1.6. */
  containerdV2?: string;
  /** build_multus.sh's output, when the pod network is chained through Multus. */
  multus?: string;
  /** Where containerd and Multus find the CNI plugins. */
  cniBinDir: string;
  /** The cluster's kubeconfig (Multus reads the pods and their networks with it). */
  kubeconfig: string;
  /** The loopback ports of the kubelet and the cluster services, picked together. */
  ports: {
    kubelet: number;
    scheduler: number;
    controllerManager: number;
    proxyHealth: number;
    proxyMetrics: number;
  };
}

/** What a running node holds: its processes, what it made on the host, how it enters. */
interface NodeState {
  processes: Managed[];
  /** The topmost host paths the node made (removed when it stops). */
  created: (string | undefined)[];
  /** The command prefix that runs a program in the node's mount namespace (isolated). */
  enter: string[];
  host: Promise<KubeletHostState>;
}

/** Runs containerd's `ctr` against the node's containerd, in the kubelet's namespace. */
function ctrOf(layout: NodeLayout): (args: string[]) => Promise<string> {
  return (args) => run("ctr", ["--address", layout.containerdSocket, "-n", "k8s.io", ...args]);
}

/** Starts a node registered with `cluster`; resolves once the Node is Ready. */
export async function startNode(cluster: Cluster, options: StartNodeOptions = {}): Promise<Node> {
  const layout = await nodeLayout(cluster, options);
  const state = await claimHostPaths(layout);
  let stopped = false;
  const stop = async () => {
    if (stopped) return;
    stopped = true;
    await tearDownNode(layout, state);
  };
  try {
    await prepareNodeMounts(layout, state);
    const pauseArchive = await writeNodeConfigs(layout);
    await startContainerd(layout, state, pauseArchive);
    const kubelet = await startKubelet(layout, state, cluster, options);
    if (options.clusterServices ?? true) await startClusterServices(layout, state, cluster);
    await waitNodeReady(layout, state, cluster, kubelet);
    if (layout.multus) await applyNetworkAttachmentCrd(cluster.kubeconfigPath);
  } catch (error) {
    await stop();
    throw error;
  }
  return nodeHandle(layout, state, stop);
}

/** Step 1: the node's names, folder and pod network, and the programs it runs. */
async function nodeLayout(cluster: Cluster, options: StartNodeOptions): Promise<NodeLayout> {
  const bin = await buildNodeBinaries();
  const containerdV2 = options.containerd === "v2" ? await buildContainerdV2() : undefined;
  const multus = options.multus ? await buildMultus() : undefined;
  const id = crypto.randomUUID().slice(0, 6);
  const dir = await Deno.makeTempDir({ prefix: "virtnode-node-" });
  const ctrDir = join(dir, "containerd");
  // One /24 per node, picked at random from 10.244.0.0/16; the bridge is named after it.
  const octet = 1 + Math.floor(Math.random() * 250);
  // The apiserver reaches the kubelet (logs, exec) at the node's address: the host's, when
  // the apiserver listens on it (a pod-network cluster); a kubelet refuses a loopback one.
  const serverHost = new URL(cluster.server).hostname;
  const [kubelet, scheduler, controllerManager, proxyHealth, proxyMetrics] = freePorts(5);
  return {
    name: options.name ?? `node-${id}`,
    dir,
    ctrDir,
    containerdSocket: join(ctrDir, "containerd.sock"),
    kubeletDir: join(dir, "kubelet"),
    cniDir: join(dir, "cni"),
    podCidr: `10.244.${octet}.0/24`,
    bridge: `vnt${id}`,
    nodeIp: serverHost === "127.0.0.1" ? undefined : serverHost,
    isolated: options.isolated ?? false,
    bin,
    containerdV2,
    multus,
    // With Multus, the node's own folder: Debian's plugins linked beside Multus's.
    cniBinDir: multus ? join(dir, "cni", "bin") : CNI_BIN_DIR,
    kubeconfig: cluster.kubeconfigPath,
    ports: { kubelet, scheduler, controllerManager, proxyHealth, proxyMetrics },
  };
}

/**
 * Step 2: what the node will make on the host, noted before it does. The device plugin
 * directory is the host's, and containerd 1.6 keeps its shims' sockets in
 * /run/containerd/s whatever its state directory: what the node creates goes with it. An
 * isolated node makes the mount points of its own paths on the host.
 */
async function claimHostPaths(layout: NodeLayout): Promise<NodeState> {
  const created = layout.isolated
    ? await Promise.all(Object.keys(ISOLATED_PATHS).map((p) => firstMissing(p)))
    : [await firstMissing(DEVICE_PLUGINS_DIR), await firstMissing(CONTAINERD_SHIM_SOCKETS)];
  kubeletHost ??= probeKubeletHost();
  const host = kubeletHost;
  (await host).nodes++;
  return { processes: [], created, enter: [], host };
}

/**
 * Ends the node's processes and removes everything it left on the host. Each step is best
 * effort (its `.catch(() => {})` is deliberate): what one finds gone already, or never made,
 * must not keep the next from running, and the tier's leftover check reports what stays.
 */
async function tearDownNode(layout: NodeLayout, state: NodeState): Promise<void> {
  const { dir, bin, bridge, containerdSocket, isolated } = layout;
  const { processes, created, host } = state;
  const ctr = ctrOf(layout);
  // The kubelet first, so nothing restarts what containerd is told to end.
  for (const p of [...processes].reverse()) {
    if (p.name !== "containerd") await terminate(p);
  }
  const containerd = processes.find((p) => p.name === "containerd");
  // Killed rather than stopped through the CRI, a pod sandbox leaves on the host what the
  // CRI would have torn down: its network namespace pinned in /run/netns and the CNI
  // library's cached results in /var/lib/cni/results, both named by the sandbox.
  const sandboxes: { id: string; netns: string }[] = [];
  if (containerd) {
    const ids = (await ctr(["containers", "list", "-q"]).catch(() => "")).split("\n")
      .filter(Boolean);
    for (const id of ids) {
      const info = JSON.parse(await ctr(["containers", "info", id]).catch(() => "{}")) as {
        Spec?: { linux?: { namespaces?: { type: string; path?: string }[] } };
      };
      const netns = info.Spec?.linux?.namespaces?.find((n) => n.type === "network")?.path;
      if (netns && /^\/(var\/)?run\/netns\/cni-[0-9a-f-]+$/.test(netns)) {
        sandboxes.push({ id, netns });
      }
    }
    // The pods' sandboxes, so their network namespaces and addresses go with them.
    for (const task of (await ctr(["tasks", "list", "-q"]).catch(() => "")).split("\n")) {
      if (task) await ctr(["tasks", "kill", "-s", "SIGKILL", task]).catch(() => {});
    }
    await sleep(500);
    for (const id of ids) await ctr(["containers", "delete", id]).catch(() => {});
    await terminate(containerd);
  }
  for (const { netns } of sandboxes) {
    await run("umount", [netns]).catch(() => {});
    await removeLeftover(netns);
  }
  if (sandboxes.length > 0) {
    // `<network>-<sandbox id>-<interface>`, one per network the sandbox was attached to.
    const cached = await Array.fromAsync(Deno.readDir(CNI_RESULTS)).catch(() => []);
    for (const { name } of cached) {
      if (sandboxes.some(({ id }) => name.includes(`-${id}-`))) {
        await removeLeftover(join(CNI_RESULTS, name));
      }
    }
  }
  // runc's container processes live in their own sessions: end any left.
  // containerd 1.6 gives a shim its namespace, then its address; containerd 2 its
  // namespace, its id, then its address.
  await run("pkill", [
    "-KILL",
    "-f",
    `containerd-shim-runc-v2 -namespace k8s.io (-id [^ ]+ )?-address ${containerdSocket}`,
  ])
    .catch(() => {});
  await run("ip", ["link", "delete", bridge]).catch(() => {});
  // kube-proxy's chains and rules in the host's tables.
  await run(join(bin, "kube-proxy"), ["--cleanup"]).catch(() => {});
  // Mounts the kubelet and containerd made below the directory (volumes, rootfs, shm).
  // The directory's own bind mount last (the sort puts it after everything below it).
  const mounts = (await Deno.readTextFile("/proc/self/mountinfo")).split("\n")
    .map((l) => l.split(" ")[4]).filter((m) => m?.startsWith(dir)).sort().reverse();
  for (const m of mounts) await run("umount", ["-l", m]).catch(() => {});
  await removeLeftover(dir, { recursive: true });
  if (!isolated) await removeLeftover(join(DEVICE_PLUGINS_DIR, "kubelet.sock"));
  for (const path of created) {
    if (path) await removeLeftover(path, { recursive: true });
  }
  const shared = await host;
  if (--shared.nodes === 0) {
    if (kubeletHost === host) kubeletHost = undefined;
    if (!shared.hadChains) await removeKubeChains();
    if (shared.logDir) await removeLeftover(shared.logDir, { recursive: true });
  }
}

/** Step 3: the node's folder as a shared mount, and an isolated node's mount namespace. */
async function prepareNodeMounts(layout: NodeLayout, state: NodeState): Promise<void> {
  const { dir, ctrDir, kubeletDir, cniDir, isolated } = layout;
  const { processes } = state;
  await Deno.mkdir(join(dir, "logs"));
  await Deno.mkdir(join(cniDir, "net.d"), { recursive: true });
  await Deno.mkdir(ctrDir);
  await Deno.mkdir(kubeletDir);
  // As on a host under systemd, mounts propagate (this directory only: the host's root
  // stays private): virt-handler's pod mounts its kubelet and share directories
  // Bidirectional, which the kubelet allows only on a shared mount.
  await run("mount", ["--bind", dir, dir]);
  await run("mount", ["--make-rshared", dir]);
  if (isolated) {
    // The node's mount namespace, held by a process of its own: its paths bound from the
    // node's folder. The folder's own mount is shared with this namespace, so what the
    // kubelet mounts below /var/lib/kubelet shows in containerd's namespace and here.
    for (const [at, name] of Object.entries(ISOLATED_PATHS)) {
      await Deno.mkdir(join(dir, name), { recursive: true });
      await Deno.mkdir(at, { recursive: true });
    }
    await Deno.mkdir(join(kubeletDir, "device-plugins"), { recursive: true });
    const ready = join(dir, "namespace.ready");
    const holder = await spawn(dir, "node-namespace", "unshare", [
      "--mount",
      "--propagation",
      "unchanged",
      "sh",
      "-c",
      [
        "set -e",
        ...Object.entries(ISOLATED_PATHS).map(([at, name]) =>
          `mount --bind ${join(dir, name)} ${at}`
        ),
        `touch ${ready}`,
        "exec sleep infinity",
      ].join("\n"),
    ]);
    processes.push(holder);
    await waitUntil(holder, READY_TIMEOUT_MS, () => Deno.stat(ready).then(() => true));
    state.enter = ["nsenter", `--mount=/proc/${holder.child.pid}/ns/mnt`, "--"];
  } else {
    // The device-plugin directory is a constant of the kubelet's API, not below its root:
    // the host's, shown where a pod that mounts the kubelet's root looks for it.
    await Deno.mkdir(DEVICE_PLUGINS_DIR, { recursive: true });
    await Deno.mkdir(join(kubeletDir, "device-plugins"));
    await run("mount", ["--bind", DEVICE_PLUGINS_DIR, join(kubeletDir, "device-plugins")]);
  }
}

/** Runs a program in the node's mount namespace (an isolated node's), or as it is. */
function spawnInNode(
  layout: NodeLayout,
  state: NodeState,
  name: string,
  program: string,
  args: string[],
): Promise<Managed> {
  const { enter } = state;
  return enter.length > 0
    ? spawn(layout.dir, name, enter[0], [...enter.slice(1), program, ...args])
    : spawn(layout.dir, name, program, args);
}

/** Step 4: the sandbox image, the CNI network and containerd's configuration. */
async function writeNodeConfigs(layout: NodeLayout): Promise<string> {
  const { dir, bin, cniDir, ctrDir, bridge, podCidr, containerdSocket } = layout;
  // Images: the sandbox image first.
  const pauseRoot = join(dir, "pause-root");
  await Deno.mkdir(pauseRoot);
  await Deno.copyFile(join(bin, "pause"), join(pauseRoot, "pause"));
  await Deno.chmod(join(pauseRoot, "pause"), 0o755);
  const pauseArchive = join(dir, "pause.tar");
  await buildImageArchive(
    { name: PAUSE_IMAGE, root: pauseRoot, entrypoint: ["/pause"] },
    pauseArchive,
  );

  const podNetwork = {
    cniVersion: "0.4.0",
    name: "virtnode-test",
    plugins: [{
      type: "bridge",
      bridge,
      isGateway: true,
      ipMasq: false,
      hairpinMode: true,
      ipam: {
        type: "host-local",
        dataDir: join(cniDir, "ipam"),
        ranges: [[{ subnet: podCidr }]],
        routes: [{ dst: "0.0.0.0/0" }],
      },
    }],
  };
  if (layout.multus) {
    // Multus's thin plugin first in the configuration directory, the pod network its one
    // delegate (each pod's default network, eth0), the plugins in the node's own folder.
    await Deno.mkdir(layout.cniBinDir, { recursive: true });
    for await (const plugin of Deno.readDir(CNI_BIN_DIR)) {
      await Deno.symlink(join(CNI_BIN_DIR, plugin.name), join(layout.cniBinDir, plugin.name));
    }
    await Deno.copyFile(join(layout.multus, "multus"), join(layout.cniBinDir, "multus"));
    await Deno.chmod(join(layout.cniBinDir, "multus"), 0o755);
    await Deno.writeTextFile(
      join(cniDir, "net.d", "00-multus.conf"),
      JSON.stringify({
        cniVersion: "0.4.0",
        name: "multus-cni-network",
        type: "multus",
        kubeconfig: layout.kubeconfig,
        confDir: join(cniDir, "multus.d"),
        cniDir: join(cniDir, "multus"),
        binDir: layout.cniBinDir,
        logFile: join(dir, "logs", "multus.log"),
        logLevel: "verbose",
        logToStderr: false,
        delegates: [podNetwork],
      }),
    );
  } else {
    await Deno.writeTextFile(
      join(cniDir, "net.d", "10-virtnode-test.conflist"),
      JSON.stringify(podNetwork),
    );
  }
  await Deno.writeTextFile(
    join(ctrDir, "config.toml"),
    [
      "version = 2",
      `root = "${join(ctrDir, "root")}"`,
      `state = "${join(ctrDir, "state")}"`,
      "[grpc]",
      `  address = "${containerdSocket}"`,
      "[ttrpc]",
      `  address = "${join(ctrDir, "ttrpc.sock")}"`,
      '[plugins."io.containerd.grpc.v1.cri"]',
      `  sandbox_image = "${PAUSE_IMAGE}"`,
      // Lowering a process's OOM score needs CAP_SYS_RESOURCE, which this machine's
      // root lacks: the pods keep at least the node's own score.
      "  restrict_oom_score_adj = true",
      '[plugins."io.containerd.grpc.v1.cri".cni]',
      `  bin_dir = "${layout.cniBinDir}"`,
      `  conf_dir = "${join(cniDir, "net.d")}"`,
      '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]',
      '  runtime_type = "io.containerd.runc.v2"',
      '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]',
      `  Root = "${join(ctrDir, "runc")}"`,
      "",
    ].join("\n"),
  );
  return pauseArchive;
}

/** Step 5: containerd, in a PID namespace of its own, with the sandbox image imported. */
async function startContainerd(
  layout: NodeLayout,
  state: NodeState,
  pauseArchive: string,
): Promise<void> {
  const { ctrDir, containerdV2 } = layout;
  const ctr = ctrOf(layout);
  // containerd in a PID namespace of its own, as the first process in it: the node's
  // "host" PID namespace for hostPID pods. virt-handler enters the mount namespace of
  // PID 1 (virt-chroot --mount /proc/1/ns/mnt); this machine's own PID 1 is a sandbox
  // process whose namespaces not even root may open.
  const containerd = await spawnInNode(layout, state, "containerd", "unshare", [
    "--pid",
    "--fork",
    "--kill-child",
    // Its own /proc for that namespace, in a mount namespace that still shares the
    // node's directory (an rshared mount) with the kubelet in both directions.
    "--mount-proc",
    "--propagation",
    "unchanged",
    // containerd 2 finds its own runc shim first on its PATH.
    ...(containerdV2 ? ["env", `PATH=${containerdV2}:${Deno.env.get("PATH") ?? ""}`] : []),
    containerdV2 ? join(containerdV2, "containerd") : "containerd",
    "--config",
    join(ctrDir, "config.toml"),
  ]);
  state.processes.push(containerd);
  await waitUntil(containerd, READY_TIMEOUT_MS, async () => {
    await ctr(["version"]);
    return true;
  });
  await ctr(["images", "import", pauseArchive]);
}

/** Step 6: the kubelet, with its configuration; returns its process. */
async function startKubelet(
  layout: NodeLayout,
  state: NodeState,
  cluster: Cluster,
  options: StartNodeOptions,
): Promise<Managed> {
  const { dir, name, kubeletDir, containerdSocket, nodeIp, podCidr, isolated, bin } = layout;
  const kubeletPort = layout.ports.kubelet;
  await Deno.writeTextFile(
    join(dir, "kubelet.yaml"),
    JSON.stringify({
      apiVersion: "kubelet.config.k8s.io/v1beta1",
      kind: "KubeletConfiguration",
      failCgroupV1: false,
      cgroupDriver: "cgroupfs",
      cgroupsPerQOS: false,
      enforceNodeAllocatable: [],
      containerRuntimeEndpoint: `unix://${containerdSocket}`,
      address: nodeIp ?? "127.0.0.1",
      port: kubeletPort,
      readOnlyPort: 0,
      healthzPort: 0,
      authentication: { anonymous: { enabled: true }, webhook: { enabled: false } },
      authorization: { mode: "AlwaysAllow" },
      failSwapOn: false,
      podCIDR: podCidr,
      podLogsDir: join(dir, "pod-logs"),
      resolvConf: "/etc/resolv.conf",
      ...(options.clusterDns
        ? { clusterDNS: [options.clusterDns], clusterDomain: CLUSTER_DOMAIN }
        : {}),
      imageGCHighThresholdPercent: 100,
      imageGCLowThresholdPercent: 99,
      evictionHard: {
        "memory.available": "1Mi",
        "nodefs.available": "1%",
        "imagefs.available": "1%",
      },
      serializeImagePulls: false,
      ...(options.cpuManager === "static"
        ? { cpuManagerPolicy: "static", kubeReserved: { cpu: "100m" } }
        : {}),
    }),
  );
  // An isolated node's kubelet has its root where a kubelet's is, /var/lib/kubelet.
  const kubeletRoot = isolated ? "/var/lib/kubelet" : kubeletDir;
  const kubelet = await spawnInNode(layout, state, "kubelet", join(bin, "kubelet"), [
    `--config=${join(dir, "kubelet.yaml")}`,
    `--kubeconfig=${cluster.kubeconfigPath}`,
    `--hostname-override=${name}`,
    ...(nodeIp ? [`--node-ip=${nodeIp}`] : []),
    `--root-dir=${kubeletRoot}`,
    `--cert-dir=${join(kubeletRoot, "pki")}`,
  ]);
  state.processes.push(kubelet);
  return kubelet;
}

/** Step 7: the scheduler, the controller manager and kube-proxy (Services, as pods use them). */
async function startClusterServices(
  layout: NodeLayout,
  state: NodeState,
  cluster: Cluster,
): Promise<void> {
  const { dir, name, podCidr, bin } = layout;
  const { processes } = state;
  const { scheduler: schedulerPort, controllerManager: controllerManagerPort } = layout.ports;
  const { proxyHealth: proxyHealthPort, proxyMetrics: proxyMetricsPort } = layout.ports;
  const common = [`--kubeconfig=${cluster.kubeconfigPath}`, "--leader-elect=false"];
  processes.push(
    await spawn(dir, "kube-scheduler", join(bin, "kube-scheduler"), [
      ...common,
      `--secure-port=${schedulerPort}`,
      "--bind-address=127.0.0.1",
    ]),
  );
  processes.push(
    await spawn(dir, "kube-controller-manager", join(bin, "kube-controller-manager"), [
      ...common,
      `--secure-port=${controllerManagerPort}`,
      "--bind-address=127.0.0.1",
      // No cloud, no node IPAM: the kubelet has its pod CIDR from its configuration.
      "--controllers=*,-nodeipam",
      `--service-account-private-key-file=${join(cluster.dir, "service-account.key")}`,
      "--use-service-account-credentials=false",
    ]),
  );
  // Services, as pods use them: the apiserver's own (`kubernetes`, 10.0.0.1:443) above all.
  processes.push(
    await spawn(dir, "kube-proxy", join(bin, "kube-proxy"), [
      `--kubeconfig=${cluster.kubeconfigPath}`,
      `--hostname-override=${name}`,
      "--proxy-mode=iptables",
      `--cluster-cidr=${podCidr}`,
      // Leave the host's conntrack table size alone.
      "--conntrack-max-per-core=0",
      `--healthz-bind-address=127.0.0.1:${proxyHealthPort}`,
      `--metrics-bind-address=127.0.0.1:${proxyMetricsPort}`,
    ]),
  );
}

/** Step 8: waits for the Node to be Ready and every process of it to still run. */
async function waitNodeReady(
  layout: NodeLayout,
  state: NodeState,
  cluster: Cluster,
  kubelet: Managed,
): Promise<void> {
  const { name } = layout;
  const { processes } = state;
  await waitUntil(kubelet, READY_TIMEOUT_MS, async () => {
    const out = await run("kubectl", [
      "--kubeconfig",
      cluster.kubeconfigPath,
      "get",
      "node",
      name,
      "-o",
      'jsonpath={.status.conditions[?(@.type=="Ready")].status}',
    ]);
    return out.trim() === "True";
  });
  // Ready says nothing of the scheduler and the controller manager: each must still run.
  await sleep(1_000);
  for (const p of processes) {
    // An exited child's status is settled: it wins the race against the resolved value.
    const exited = await Promise.race([p.child.status, Promise.resolve(undefined)]);
    if (exited) {
      throw new ClusterError(`${p.name} exited (${exited.code}): ${await logTail(p.logPath)}`);
    }
  }
}

/** Step 9: the running node as tests use it. */
function nodeHandle(layout: NodeLayout, state: NodeState, stop: () => Promise<void>): Node {
  const { name, dir, containerdSocket, kubeletDir, podCidr, isolated } = layout;
  const { processes } = state;
  const ctr = ctrOf(layout);
  return {
    name,
    dir,
    containerdSocket,
    kubeletDir,
    devicePluginsDir: isolated ? join(kubeletDir, "device-plugins") : DEVICE_PLUGINS_DIR,
    podCidr,
    importImage: async (archive, names = []) => {
      await ctr(["images", "import", archive]);
      // A registry's image has a repo digest (name@sha256:<manifest>), which the kubelet
      // reports as a container's imageID and virt-controller pins a migration target's
      // containerDisk to; an imported one has only its tag until it is given one.
      const index = JSON.parse(await run("tar", ["-xOf", archive, "index.json"])) as {
        manifests?: { digest: string; annotations?: Record<string, string> }[];
      };
      for (const m of index.manifests ?? []) {
        const name = m.annotations?.["io.containerd.image.name"];
        if (!name) continue;
        for (const alias of [name, ...names]) {
          if (alias !== name) await ctr(["images", "tag", "--force", name, alias]);
          const repo = alias.replace(/:[^:/]+$/, "");
          await ctr(["images", "tag", "--force", name, `${repo}@${m.digest}`]);
        }
      }
    },
    complaints: async () => {
      const parts: string[] = [];
      for (const p of processes) {
        const lines = (await Deno.readTextFile(p.logPath).catch(() => "")).split("\n")
          .filter((l) => /^[EW]\d{4}|level=(error|warning)|"level":"(error|warn)/.test(l));
        parts.push(`--- ${p.name}:\n${lines.slice(-15).join("\n")}`);
      }
      if (layout.multus) {
        const multusLog = (await Deno.readTextFile(join(dir, "logs", "multus.log")).catch(() => ""))
          .split("\n").filter((l) => /\[(error|panic)\]/.test(l));
        parts.push(`--- multus:\n${multusLog.slice(-15).join("\n")}`);
      }
      const podLogs = await run("bash", [
        "-c",
        `for f in ${join(dir, "pod-logs")}/*/*/*.log; do [ -f "$f" ] && echo "--- $f" && ` +
        `grep -E '"level":"(error|warn|warning)"|panic|qemu-system[^ ]*: ' "$f" | tail -12 | cut -c1-400; done`,
      ]).catch(() => "");
      return parts.join("\n") + "\n" + podLogs;
    },
    stop,
  };
}

const IMAGES_SCRIPT = new URL("./images.sh", import.meta.url).pathname;

/** An image archive built here, and the name containerd knows it by once imported. */
export interface BuiltImage {
  name: string;
  archive: string;
}

/**
 * KubeVirt's virt-launcher image: Debian 12 with libvirt and QEMU, and KubeVirt's own
 * virt-launcher and virt-launcher-monitor (tests/harness/node/images.sh; cached by key, as is
 * the archive packed from it).
 */
export async function launcherImage(): Promise<BuiltImage> {
  const dir = await imagesScript(["launcher", await buildKubevirtPeers()], "the launcher image");
  const key = dir.slice(dir.lastIndexOf("-") + 1);
  const name = `virtnode.local/virt-launcher:${key}`;
  const archive = join(dir, "image.tar");
  try {
    await Deno.stat(archive);
  } catch {
    const partial = `${archive}.${Deno.pid}`;
    await buildImageArchive({
      name,
      root: join(dir, "root"),
      entrypoint: ["/usr/bin/virt-launcher-monitor"],
    }, partial);
    await Deno.rename(partial, archive);
  }
  return { name, archive };
}

const REPO_ROOT = new URL("../../../", import.meta.url).pathname;

async function imagesScript(args: string[], what: string): Promise<string> {
  const out = await new Deno.Command("bash", {
    args: [IMAGES_SCRIPT, ...args],
    stdin: "null",
    stdout: "piped",
    stderr: "inherit",
  }).output();
  if (!out.success) throw new Error(`Cannot build ${what}: images.sh exited ${out.code}`);
  return new TextDecoder().decode(out.stdout).trim().split("\n").at(-1)!;
}

/**
 * The virtnode image, as `deno task image` builds it (deploy/image/main.ts, run here as a
 * user runs it; cached by content there): the DaemonSet's image, compiled where this
 * machine has `DENORT_BIN`, from source otherwise.
 */
export async function virtnodeImage(): Promise<BuiltImage> {
  const out = join(
    Deno.env.get("VIRTNODE_CACHE") ?? `${Deno.env.get("HOME")}/.cache/virtnode`,
    "images",
    "out",
  );
  const task = await new Deno.Command(Deno.execPath(), {
    args: ["task", "--quiet", "image", "--out", out, "--json"],
    cwd: REPO_ROOT,
    stdin: "null",
    stdout: "piped",
    stderr: "inherit",
  }).output();
  if (!task.success) {
    throw new Error(`Cannot build the virtnode image: deno task image exited ${task.code}`);
  }
  const built = JSON.parse(new TextDecoder().decode(task.stdout).trim().split("\n").at(-1)!);
  return { name: built.name, archive: built.file };
}

/**
 * KubeVirt's virt-handler image, as its release has it for this test: the launcher image's
 * root (Debian 12 with libvirt and QEMU, which virt-handler's tools and its node
 * labeller's init container use) with KubeVirt's own `virt-handler` and `virt-chroot` in
 * a layer above it. The yardstick virtnode is measured against.
 */
export async function virtHandlerImage(): Promise<BuiltImage> {
  const kubevirt = await buildKubevirtPeers();
  const launcherRoot = await imagesScript(["launcher", kubevirt], "the launcher image");
  const hash = new ContentHash();
  hash.add(`${launcherRoot}\n${await Deno.readTextFile(new URL(import.meta.url))}`);
  for (const program of ["virt-handler", "virt-chroot"]) {
    hash.add(await Deno.readFile(join(kubevirt, program)));
  }
  const key = await hash.hex();
  const name = `virtnode.local/virt-handler:${key}`;
  const archive = await cachedImage(
    join(launcherRoot, ".."),
    "virt-handler",
    key,
    async (staging) => {
      const bin = join(staging, "root", "usr", "bin");
      await Deno.mkdir(bin, { recursive: true });
      for (const program of ["virt-handler", "virt-chroot"]) {
        await Deno.copyFile(join(kubevirt, program), join(bin, program));
        await Deno.chmod(join(bin, program), 0o755);
      }
      await buildImageArchive({
        name,
        root: [join(launcherRoot, "root"), join(staging, "root")],
        entrypoint: ["/usr/bin/virt-handler"],
      }, join(staging, "image.tar"));
    },
  );
  return { name, archive };
}

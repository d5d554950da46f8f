/**
 * The two node agents as a test node installs them, for the node tier's swap test and the
 * bench's side-by-side scenario: virtnode's DaemonSet from `deploy/daemonset.yaml`, and
 * KubeVirt's virt-handler DaemonSet as virt-operator makes it (`kubevirt-install
 * --handler-image`). Each is applied as shipped but for what a test node has elsewhere
 * than a production node: the image (built here, never pulled) and the host directories
 * (below the node's temporary directory, so nothing is left on the host).
 *
 * @module
 */
import { join } from "node:path";
import { load } from "js-yaml";
import type { Node } from "./node.ts";
import { GUEST_CPU_FEATURES } from "../guest_cpu.ts";
import { kvmUsable } from "../../../mod/host/mod.ts";

const REPO = new URL("../../../", import.meta.url).pathname;

/** The host directories virtnode's DaemonSet mounts. */
export interface VirtnodeDirs {
  kubeletPods: string;
  state: string;
  run: string;
  nodeLabeller: string;
}

/** The directories of `node` virtnode's DaemonSet uses (beside virt-handler's `kubevirt-run`). */
export function virtnodeDirs(node: Node): VirtnodeDirs {
  return {
    kubeletPods: join(node.kubeletDir, "pods"),
    state: join(node.dir, "virtnode-state"),
    run: join(node.dir, "kubevirt-run"),
    nodeLabeller: join(node.dir, "kubevirt-node-labeller"),
  };
}

/**
 * deploy/daemonset.yaml with virtnode's `image`, KubeVirt's `launcherImage` (its
 * node-labeller init container) and `dirs`, as JSON for `kubectl apply -f -`; without
 * `dirs`, the host paths as shipped (isolated test nodes have them of their own).
 */
export async function virtnodeDaemonSet(
  image: string,
  launcherImage: string,
  dirs?: VirtnodeDirs,
): Promise<string> {
  // deno-lint-ignore no-explicit-any
  const ds = load(await Deno.readTextFile(join(REPO, "deploy/daemonset.yaml"))) as any;
  const pod = ds.spec.template.spec;
  const [container] = pod.containers;
  container.image = image;
  container.imagePullPolicy = "Never";
  const [labeller] = pod.initContainers;
  labeller.image = launcherImage;
  labeller.imagePullPolicy = "Never";
  const hostPaths: Record<string, string> = dirs
    ? {
      "kubelet-pods": dirs.kubeletPods,
      "state-dir": dirs.state,
      "virt-share-dir": dirs.run,
      "node-labeller": dirs.nodeLabeller,
    }
    : {};
  for (const volume of pod.volumes) {
    if (hostPaths[volume.name]) volume.hostPath.path = hostPaths[volume.name];
  }
  return JSON.stringify(ds);
}

/**
 * virt-handler's DaemonSet as virt-operator makes it, with this machine's images and `node`'s
 * directories; without `node`, the host paths as shipped (isolated test nodes have them of
 * their own).
 */
export async function virtHandlerDaemonSet(
  kubevirtDir: string,
  image: string,
  launcherImage: string,
  node?: Node,
): Promise<string> {
  const out = await new Deno.Command(join(kubevirtDir, "kubevirt-install"), {
    args: [`--handler-image=${image}`, `--launcher-image=${launcherImage}`],
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) throw new Error(`kubevirt-install: ${new TextDecoder().decode(out.stderr)}`);
  const ds = JSON.parse(new TextDecoder().decode(out.stdout));
  const pod = ds.spec.template.spec;
  // deno-lint-ignore no-explicit-any
  for (const c of [...pod.initContainers, ...pod.containers] as any[]) c.imagePullPolicy = "Never";
  if (!node) {
    // An isolated node's own paths are mounts of its namespace, where /var/run is a link to
    // /run: containerd looks a Bidirectional volume's mount up by the path as written, so it
    // is given as the mount is (else it finds "/", not shared, and refuses the container).
    for (const volume of pod.volumes) {
      const path: string | undefined = volume.hostPath?.path;
      if (path?.startsWith("/var/run/")) volume.hostPath.path = path.slice("/var".length);
    }
    return JSON.stringify(ds);
  }
  const hostPaths: Record<string, string> = {
    "libvirt-runtimes": join(node.dir, "kubevirt-libvirt-runtimes"),
    "virt-share-dir": join(node.dir, "kubevirt-run"),
    "virt-private-dir": join(node.dir, "kubevirt-private"),
    "kubelet-pods": join(node.kubeletDir, "pods"),
    "kubelet": node.kubeletDir,
    "node-labeller": join(node.dir, "kubevirt-node-labeller"),
  };
  for (const volume of pod.volumes) {
    if (!volume.hostPath) continue;
    const path = hostPaths[volume.name];
    if (!path) throw new Error(`No test-node directory for virt-handler's ${volume.name}`);
    volume.hostPath.path = path;
  }
  return JSON.stringify(ds);
}

/** Whether an allocatable quantity ("1k", "1000", "0") offers any device. */
export function offered(quantity: string | undefined): boolean {
  return quantity !== undefined && !/^0+[a-zA-Z]*$/.test(quantity);
}

/** The name of each agent's DaemonSet in the `kubevirt` namespace. */
export const DAEMONSET_NAMES = {
  "virtnode": "virtnode-handler",
  "virt-handler": "virt-handler",
} as const;

/** The Node fields {@linkcode cpuModelFor} reads. */
export interface LabelledNode {
  metadata: { labels: Record<string, string> };
}

/**
 * The CPU model a VMI on `node` asks for: `host-passthrough` with KVM. Without it, a model
 * the node's labels offer: this kind of machine's host model (kvm64) is in KubeVirt's
 * obsolete list, and virt-controller keeps host-model VMIs off such nodes. A node that
 * offers none but a host model (KubeVirt's labeller where only kvm-pvm is behind /dev/kvm,
 * with no obsolete models configured) gets `host-model`.
 */
export function cpuModelFor(node: LabelledNode): string {
  if (kvmUsable()) return "host-passthrough";
  const prefix = "cpu-model.node.kubevirt.io/";
  const models = Object.keys(node.metadata.labels).filter((l) => l.startsWith(prefix)).sort();
  if (models.length > 0) return models[0].slice(prefix.length);
  // KubeVirt's labeller on a kvm-pvm host reads KVM's capabilities: no named model.
  if (
    Object.keys(node.metadata.labels).some((l) => l.startsWith("host-model-cpu.node.kubevirt.io/"))
  ) {
    return "host-model";
  }
  throw new Error("The node offers no CPU model");
}

/**
 * A VMI as a user writes it: no node named, the CPU model this node can give, 64Mi of guest
 * memory, no NIC, the CPU features of `tests/harness/guest_cpu.ts`. `cpuRequest` replaces KubeVirt's default request (a tenth of a core per
 * vCPU), so that more VMIs than a tenth of the node's cores fit.
 */
export function userVmi(name: string, cpuModel: string, cpuRequest?: string) {
  return {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachineInstance",
    metadata: { name, namespace: "default" },
    spec: {
      terminationGracePeriodSeconds: 1,
      domain: {
        cpu: { cores: 1, model: cpuModel, features: GUEST_CPU_FEATURES },
        memory: { guest: "64Mi" },
        devices: { autoattachPodInterface: false },
        ...(cpuRequest ? { resources: { requests: { cpu: cpuRequest } } } : {}),
      },
    },
  };
}

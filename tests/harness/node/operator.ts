/**
 * KubeVirt installed on a test node the way its users install it: by its own virt-operator.
 * The operator's release manifest (`kubevirt-operator.yaml.in`, filled in by KubeVirt's
 * manifest-templator, tests/harness/kubevirt/build_suite.sh) is applied as published, then a
 * KubeVirt CR; the operator makes everything else — virt-api, virt-controller, the
 * virt-handler DaemonSet, their certificates, RBAC and webhooks — and writes the CR's
 * status itself.
 *
 * No registry is reachable here, so the images the manifest names
 * (`virtnode.local/kubevirt/<component>:v1.7.0`) are built on this machine from the
 * programs built from KubeVirt's module and imported into the node's containerd under
 * those names: virt-operator, virt-api and virt-controller as small images running as
 * user 1001 (as KubeVirt's are), virt-handler and virt-launcher as the node tier builds them
 * (Debian 12 with libvirt and QEMU below KubeVirt's programs).
 *
 * virtnode takes virt-handler's place as an operator-managed cluster allows it: the CR's
 * `spec.customizeComponents.patches` point the `virt-handler` DaemonSet's container at
 * virtnode's image, command and folders: deploy/kubevirt-cr-patch.yaml's own patch, the one
 * an operator applies ({@linkcode handlerPatches}). Removing it gives the node KubeVirt's
 * own virt-handler back; the operator rolls the DaemonSet either way.
 *
 * The test node's host folders that KubeVirt's DaemonSet would take from the host itself
 * (`/var/run/kubevirt-private`, `/var/run/kubevirt-libvirt-runtimes`,
 * `/var/lib/kubevirt-node-labeller`) are patched to folders below the node's own, so that
 * nothing is left on the host; the node must be an isolated one (`startNode(cluster,
 * { isolated: true })`), which has the kubelet's and KubeVirt's other folders at their real
 * places. The cluster must have none of KubeVirt's CRDs beforehand (`startCluster({ crdDir:
 * false, podNetwork: true })`): the operator creates them, and refuses ones it did not make.
 *
 * @module
 */
import { buildKubevirtPeers } from "../kubevirt/peers.ts";
import { join } from "node:path";
import { loadYaml } from "@kubernetes/client-node";
import { kvmUsable } from "../../../mod/host/mod.ts";
import { removeIfPresent } from "../../../mod/lifecycle/mod.ts";
import { type Cluster, KUBEVIRT_NAMESPACE } from "../../../deploy/cluster/cluster.ts";
import { kubectl } from "../../../deploy/cluster/cluster.ts";
import { launcherImage, type Node, virtHandlerImage, virtnodeImage } from "./node.ts";
import { buildImageArchive } from "../../../deploy/image/oci.ts";

const SUITE_BUILD = new URL("../kubevirt/build_suite.sh", import.meta.url).pathname;
/** The registry and path of the images the operator's manifest names (build_suite.sh). */
export const KUBEVIRT_IMAGE_PREFIX = "virtnode.local/kubevirt";
/** Their tag: the release the manifests come from. */
export const KUBEVIRT_IMAGE_TAG = "v1.7.0";
const READY_TIMEOUT_MS = 600_000;

/** Which node agent the operator's `virt-handler` DaemonSet runs. */
export type HandlerKind = "virtnode" | "virt-handler";

/**
 * Runs tests/harness/kubevirt/build_suite.sh (a no-op when cached) and returns its directory:
 * the suite's `tests.test`, `virt-operator`, the filled-in manifests and the suite's data.
 */
export async function buildSuite(): Promise<string> {
  const out = await new Deno.Command("bash", {
    args: [SUITE_BUILD],
    stdin: "null",
    stdout: "piped",
    stderr: "inherit",
  }).output();
  if (!out.success) {
    throw new Error(`Cannot build KubeVirt's suite: build_suite.sh exited ${out.code}`);
  }
  return new TextDecoder().decode(out.stdout).trim().split("\n").at(-1)!;
}

/** The reference of KubeVirt's image of `component`, as the operator's manifest names it. */
export function kubevirtImage(component: string): string {
  return `${KUBEVIRT_IMAGE_PREFIX}/${component}:${KUBEVIRT_IMAGE_TAG}`;
}

/**
 * An image holding `programs` in /usr/bin, running as user 1001 (KubeVirt's non-root
 * components' user), with a /tmp and the passwd entries a Go program looks up; cached by
 * the programs' content in `cache`.
 */
async function programImage(
  cache: string,
  component: string,
  programs: string[],
): Promise<string> {
  const hash = new Uint8Array(
    await crypto.subtle.digest(
      "SHA-256",
      new Uint8Array(
        (await Promise.all(programs.map((p) => Deno.readFile(p)))).flatMap((b) => [...b]),
      ),
    ),
  );
  const key = [...hash.slice(0, 8)].map((b) => b.toString(16).padStart(2, "0")).join("");
  const dir = join(cache, `${component}-${key}`);
  const archive = join(dir, "image.tar");
  try {
    await Deno.stat(archive);
    return archive;
  } catch {
    // Not built yet.
  }
  await Deno.mkdir(cache, { recursive: true });
  const staging = await Deno.makeTempDir({ dir: cache, prefix: `.${component}-` });
  try {
    const root = join(staging, "root");
    await Deno.mkdir(join(root, "usr/bin"), { recursive: true });
    await Deno.mkdir(join(root, "etc"));
    await Deno.mkdir(join(root, "tmp"));
    await Deno.chmod(join(root, "tmp"), 0o1777);
    for (const program of programs) {
      const target = join(root, "usr/bin", program.slice(program.lastIndexOf("/") + 1));
      await Deno.copyFile(program, target);
      await Deno.chmod(target, 0o755);
    }
    await Deno.writeTextFile(
      join(root, "etc/passwd"),
      "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:1001:1001::/tmp:/sbin/nologin\n",
    );
    await Deno.writeTextFile(join(root, "etc/group"), "root:x:0:\nnonroot:x:1001:\n");
    await buildImageArchive({
      name: kubevirtImage(component),
      root,
      entrypoint: [`/usr/bin/${component}`],
      user: "1001",
    }, join(staging, "image.tar"));
    await Deno.remove(root, { recursive: true });
    await Deno.rename(staging, dir);
  } catch (error) {
    // The build's own error is what matters here; a staging dir left behind is reported.
    await removeIfPresent(staging, { recursive: true }).catch((error) =>
      console.warn(`cannot remove ${staging}: ${error}`)
    );
    try {
      await Deno.stat(archive);
    } catch {
      throw error;
    }
  }
  return archive;
}

/**
 * Builds KubeVirt's component images (cached) and imports them into `node` under the names
 * the operator's manifest gives them; also virtnode's image, under its own name, which it
 * returns.
 */
export async function importKubevirtImages(node: Node, suiteDir: string): Promise<string> {
  const kubevirtDir = await buildKubevirtPeers();
  const cache = join(suiteDir, "..", "images");
  await node.importImage(
    await programImage(cache, "virt-operator", [join(suiteDir, "virt-operator")]),
  );
  for (const component of ["virt-api", "virt-controller"]) {
    await node.importImage(await programImage(cache, component, [join(kubevirtDir, component)]));
  }
  const launcher = await launcherImage();
  await node.importImage(launcher.archive, [kubevirtImage("virt-launcher")]);
  const handler = await virtHandlerImage();
  await node.importImage(handler.archive, [kubevirtImage("virt-handler")]);
  const virtnode = await virtnodeImage();
  await node.importImage(virtnode.archive);
  return virtnode.name;
}

/** A patch of the KubeVirt CR's `spec.customizeComponents`. */
interface ComponentPatch {
  resourceType: string;
  resourceName: string;
  type: "strategic" | "json" | "merge";
  patch: string;
}

/** virtnode's shipped patch of the CR: the one an operator applies (deploy/). */
const CR_PATCH = new URL("../../../deploy/kubevirt-cr-patch.yaml", import.meta.url);

/**
 * The CR's patches of the `virt-handler` DaemonSet on `node`: the host folders a test node
 * keeps below its own folder, and, for virtnode, deploy/kubevirt-cr-patch.yaml's own patch
 * (the handler container's image, command and arguments, and virtnode's folder), which
 * the operator applies after the first. virtnode's image must be the one the shipped patch
 * names: `imageName`'s, which `deno task image` builds.
 */
export async function handlerPatches(
  node: Node,
  handler: HandlerKind,
  virtnodeImageName: string,
): Promise<ComponentPatch[]> {
  const hostPath = (name: string, path: string) => ({
    name,
    hostPath: { path, type: "DirectoryOrCreate" },
  });
  const volumes = [
    // The same folder: /var/run is a link to /run. containerd looks the mount of a
    // Bidirectional volume up by its path as written, and the isolated node's bind mount is
    // listed at /run/kubevirt.
    hostPath("virt-share-dir", "/run/kubevirt"),
    hostPath("virt-private-dir", join(node.dir, "kubevirt-private")),
    hostPath("libvirt-runtimes", join(node.dir, "kubevirt-libvirt-runtimes")),
    hostPath("node-labeller", join(node.dir, "kubevirt-node-labeller")),
  ];
  const patches: ComponentPatch[] = [{
    resourceType: "DaemonSet",
    resourceName: "virt-handler",
    type: "strategic",
    patch: JSON.stringify({ spec: { template: { spec: { volumes } } } }),
  }];
  if (handler === "virtnode") {
    const shipped = (loadYaml(await Deno.readTextFile(CR_PATCH)) as {
      spec: { customizeComponents: { patches: ComponentPatch[] } };
    }).spec.customizeComponents.patches;
    const image = JSON.parse(shipped[0].patch).spec.template.spec.containers[0].image;
    if (image !== virtnodeImageName) {
      throw new Error(
        `deploy/kubevirt-cr-patch.yaml names the image ${image}, the node has ${virtnodeImageName}`,
      );
    }
    patches.push(...shipped);
  }
  return patches;
}

/** KubeVirt installed by its operator on a test cluster. */
export interface OperatorInstall {
  /** The directory of build_suite.sh's output. */
  readonly suiteDir: string;
  /**
   * Points the `virt-handler` DaemonSet at `handler`, with `configuration` merged into the
   * CR's `spec.configuration` over this install's own, and waits until the CR is Available.
   */
  useHandler(handler: HandlerKind, configuration?: Record<string, unknown>): Promise<void>;
  /** The node agent the DaemonSet runs now. */
  readonly handler: HandlerKind;
  /** What was merged into the CR's configuration last (`{}`: nothing). */
  readonly configuration: Record<string, unknown>;
  /** Deletes the CR (the operator removes what it made), then the operator's manifest. */
  uninstall(): Promise<void>;
}

interface Condition {
  type: string;
  status: string;
  reason?: string;
  message?: string;
}

/**
 * Applies the operator's manifest and a KubeVirt CR whose `virt-handler` DaemonSet runs
 * `handler`; resolves once the operator reports the CR Available (its own conditions).
 */
export async function installByOperator(
  cluster: Cluster,
  node: Node,
  handler: HandlerKind,
  configuration: Record<string, unknown> = {},
): Promise<OperatorInstall> {
  const suiteDir = await buildSuite();
  const virtnode = await importKubevirtImages(node, suiteDir);
  const kc = cluster.kubeconfigPath;
  // The operator and KubeVirt's control plane run on control-plane nodes only; this node is
  // the one the cluster's control plane runs on, as a single-node cluster's is.
  await kubectl(kc, [
    "label",
    "--overwrite",
    "node",
    node.name,
    "node-role.kubernetes.io/control-plane=",
  ]);
  await kubectl(kc, ["apply", "--server-side", "-f", join(suiteDir, "virt-operator.yaml")]);
  await kubectl(kc, [
    "rollout",
    "status",
    "-n",
    KUBEVIRT_NAMESPACE,
    "deployment/virt-operator",
    `--timeout=${READY_TIMEOUT_MS / 1000}s`,
  ]);
  const useEmulation = !kvmUsable();
  let current = handler;
  let merged = configuration;
  const cr = async (kind: HandlerKind, extra: Record<string, unknown>) => ({
    apiVersion: "kubevirt.io/v1",
    kind: "KubeVirt",
    metadata: { name: "kubevirt", namespace: KUBEVIRT_NAMESPACE },
    spec: {
      certificateRotateStrategy: {},
      imagePullPolicy: "IfNotPresent",
      workloadUpdateStrategy: {},
      configuration: {
        imagePullPolicy: "IfNotPresent",
        developerConfiguration: {
          featureGates: [],
          ...(useEmulation ? { useEmulation: true } : {}),
        },
        // Where KVM is only kvm-pvm, the node labeller reads KVM's capabilities, which offer
        // no named model and a host model on the default obsolete list (daemonsets.ts).
        ...(useEmulation ? { obsoleteCPUModels: {} } : {}),
        ...extra,
      },
      customizeComponents: { patches: await handlerPatches(node, kind, virtnode) },
    },
  });
  const apply = async (kind: HandlerKind, extra: Record<string, unknown> = {}) => {
    await kubectl(
      kc,
      ["apply", "-f", "-"],
      JSON.stringify(await cr(kind, extra)),
    );
    if (useEmulation) {
      // An apply leaves out the empty map (the CR's way to say that no model is obsolete):
      // a JSON patch sets it.
      await kubectl(kc, [
        "patch",
        "kubevirt",
        "kubevirt",
        "-n",
        KUBEVIRT_NAMESPACE,
        "--type",
        "json",
        "-p",
        '[{"op":"add","path":"/spec/configuration/obsoleteCPUModels","value":{}}]',
      ]);
    }
    current = kind;
    merged = extra;
    await waitAvailable(kc, kind);
  };
  await apply(handler, configuration);
  return {
    suiteDir,
    get handler() {
      return current;
    },
    get configuration() {
      return merged;
    },
    useHandler: apply,
    uninstall: async () => {
      await kubectl(kc, [
        "delete",
        "kubevirt",
        "kubevirt",
        "-n",
        KUBEVIRT_NAMESPACE,
        "--wait=true",
        "--timeout=300s",
      ]).catch(() => {});
      await kubectl(kc, [
        "delete",
        "--ignore-not-found",
        "--wait=true",
        "--timeout=120s",
        "-f",
        join(suiteDir, "virt-operator.yaml"),
      ]).catch(() => {});
    },
  };
}

/**
 * Waits until the operator reports the CR Available, not Progressing and not Degraded for
 * the generation last applied, and the `virt-handler` DaemonSet's pods run `kind`.
 */
async function waitAvailable(kc: string, kind: HandlerKind): Promise<void> {
  const deadline = Date.now() + READY_TIMEOUT_MS;
  let last = "";
  while (Date.now() < deadline) {
    const kv = JSON.parse(
      await kubectl(kc, ["get", "kubevirt", "kubevirt", "-n", KUBEVIRT_NAMESPACE, "-o", "json"]),
    );
    const conditions = (kv.status?.conditions ?? []) as Condition[];
    const is = (type: string, status: string) =>
      conditions.some((c) => c.type === type && c.status === status);
    const settled = kv.status?.observedGeneration === kv.metadata.generation &&
      is("Available", "True") && is("Progressing", "False") && is("Degraded", "False");
    let pods: { spec: { containers: { name: string; image: string }[] } }[] = [];
    if (settled) {
      pods = JSON.parse(
        await kubectl(kc, [
          "get",
          "pods",
          "-n",
          KUBEVIRT_NAMESPACE,
          "-l",
          "kubevirt.io=virt-handler",
          "-o",
          "json",
        ]),
      ).items;
      const runs = (p: (typeof pods)[number]) =>
        p.spec.containers.some((c) =>
          c.name === "virt-handler" &&
          (kind === "virtnode"
            ? c.image.includes("/virtnode:")
            : c.image.includes("/virt-handler:"))
        );
      if (pods.length > 0 && pods.every(runs)) return;
    }
    last = `phase ${kv.status?.phase}, ` +
      conditions.map((c) => `${c.type}=${c.status}${c.reason ? ` (${c.reason})` : ""}`).join(", ");
    await new Promise((r) => setTimeout(r, 2000));
  }
  throw new Error(`KubeVirt's operator did not make the CR Available with ${kind}: ${last}`);
}

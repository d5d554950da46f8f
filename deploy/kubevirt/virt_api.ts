/**
 * KubeVirt's own `virt-api` on a cluster of `deploy/cluster`, run as a process of this host
 * the way virt-operator's Deployment runs it: with what the operator makes for it
 * (`kubevirt-install`, which calls the operator's generators): ServiceAccounts and RBAC,
 * the CA and certificate Secrets, the `kubevirt-ca` ConfigMap, the APIService of
 * `subresources.kubevirt.io` and the webhook configurations. virt-api runs with its own
 * ServiceAccount's token and its certificate files in a directory of their own, as the
 * operator mounts the Secrets.
 *
 * Its webhooks and APIService point at the Service `kubevirt/virt-api`, as the operator's
 * do; the Service has no selector (no virt-api pod) and its EndpointSlice names this host's
 * address and virt-api's port, which the apiserver calls directly
 * (`--enable-aggregator-routing`). Local mode's `--virtctl` runs it; so do the tests,
 * which add virt-controller (tests/harness/node/kubevirt.ts).
 *
 * @module
 */
import { join } from "node:path";
import { removeIfPresent } from "../../mod/lifecycle/mod.ts";
import {
  type Cluster,
  createKubevirtCr,
  hostAddress,
  kubectl,
  KUBEVIRT_NAMESPACE,
  serviceAccountKubeconfig,
} from "../cluster/cluster.ts";
import {
  ClusterError,
  freePorts,
  logTail,
  type Managed,
  spawnManaged,
  terminate,
  waitUntil,
} from "../cluster/processes.ts";

/** How long virt-api gets to serve, and the apiserver to mark its APIService Available. */
const READY_TIMEOUT_MS = 120_000;
/** virt-api's ServiceAccount, as the operator names it. */
const API_SERVICE_ACCOUNT = "kubevirt-apiserver";

/**
 * CDI's `cdi.kubevirt.io:config-reader` role and its binding, as CDI's install makes them:
 * virt-api reads CDI's `CDIConfig` before it takes a memory dump request, and where CDI is not
 * installed this read finds none and KubeVirt's default file system overhead holds.
 */
export const CDI_CONFIG_READER = {
  apiVersion: "v1",
  kind: "List",
  items: [{
    apiVersion: "rbac.authorization.k8s.io/v1",
    kind: "ClusterRole",
    metadata: { name: "cdi.kubevirt.io:config-reader" },
    rules: [{
      apiGroups: ["cdi.kubevirt.io"],
      resources: ["cdiconfigs", "storageprofiles"],
      verbs: ["get", "list", "watch"],
    }],
  }, {
    apiVersion: "rbac.authorization.k8s.io/v1",
    kind: "ClusterRoleBinding",
    metadata: { name: "cdi.kubevirt.io:config-reader" },
    roleRef: {
      apiGroup: "rbac.authorization.k8s.io",
      kind: "ClusterRole",
      name: "cdi.kubevirt.io:config-reader",
    },
    subjects: [{
      apiGroup: "rbac.authorization.k8s.io",
      kind: "Group",
      name: "system:authenticated",
    }],
  }],
};

/** Options of {@linkcode startVirtApi}. */
export interface StartVirtApiOptions {
  /** A directory with `virt-api` and `kubevirt-install` (build_virtctl.sh's output). */
  kubevirtDir: string;
  /** The KubeVirt CR's `spec.configuration.developerConfiguration`. */
  developerConfiguration?: Record<string, unknown>;
  /** The rest of the KubeVirt CR's `spec.configuration`. */
  configuration?: Record<string, unknown>;
  /** The port handlers serve their REST API on, which virt-api calls (KubeVirt's: 8186). */
  consoleServerPort?: number;
}

/** virt-api, running, and the operator's objects and files it runs with. */
export interface VirtApi {
  /** The directory of its files (certificates, kubeconfigs, logs). */
  readonly dir: string;
  /** The process. */
  readonly process: Managed;
  /**
   * The address the apiserver reaches virt-api at (its Service's endpoint): this host's,
   * which handlers on this host serve virt-api at too.
   */
  readonly address: string;
  /**
   * The folder holding the files of the operator's Secret `name` (`tls.crt`, `tls.key`,
   * ...), as a Secret volume would; throws when kubevirt-install made no such Secret.
   */
  secretDir(name: string): string;
  /** A kubeconfig file for the ServiceAccount `name` of KubeVirt's namespace. */
  kubeconfig(name: string): Promise<string>;
  /** Ends virt-api and removes its files (the cluster's objects stay). */
  stop(): Promise<void>;
}

interface Secret {
  kind: string;
  metadata: { name: string };
  data?: Record<string, string>;
}

/** Writes a Secret's files as a Secret volume would hold them; returns the directory. */
async function writeSecret(dir: string, secret: Secret): Promise<string> {
  const target = join(dir, "secrets", secret.metadata.name);
  await Deno.mkdir(target, { recursive: true, mode: 0o700 });
  for (const [key, value] of Object.entries(secret.data ?? {})) {
    const bytes = Uint8Array.from(atob(value), (c) => c.charCodeAt(0));
    await Deno.writeFile(join(target, key), bytes, { mode: 0o600 });
  }
  return target;
}

/**
 * Installs what virt-operator installs for virt-api (and the handler) on `cluster`, creates
 * the KubeVirt CR with the given configuration, and starts virt-api; resolves once the
 * apiserver serves `subresources.kubevirt.io` through it, the path virtctl's calls take.
 * The cluster must have no other admission for KubeVirt's kinds (start it without
 * `admission`): virt-api's webhooks are KubeVirt's admission from then on.
 */
export async function startVirtApi(
  cluster: Cluster,
  options: StartVirtApiOptions,
): Promise<VirtApi> {
  const { kubevirtDir } = options;
  const dir = await Deno.makeTempDir({ prefix: "virtnode-kubevirt-" });
  let api: Managed | undefined;
  const stop = async () => {
    if (api) await terminate(api);
    api = undefined;
    // Stopping goes on either way; what is left is reported.
    await removeIfPresent(dir, { recursive: true }).catch((error) =>
      console.warn(`cannot remove ${dir}: ${error}`)
    );
  };
  const secrets = new Map<string, string>();
  const secretDir = (name: string) => {
    const found = secrets.get(name);
    if (!found) throw new ClusterError(`kubevirt-install made no Secret ${name}`);
    return found;
  };
  const kubeconfig = (account: string) =>
    serviceAccountKubeconfig(
      cluster,
      KUBEVIRT_NAMESPACE,
      account,
      join(dir, `${account}.kubeconfig`),
    );
  try {
    await kubectl(cluster.kubeconfigPath, ["create", "namespace", KUBEVIRT_NAMESPACE]).catch(
      (error) => {
        if (!/AlreadyExists/.test(String(error))) throw error;
      },
    );
    const install = await new Deno.Command(join(kubevirtDir, "kubevirt-install"), {
      args: [`--namespace=${KUBEVIRT_NAMESPACE}`],
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).output();
    if (!install.success) {
      throw new ClusterError(`kubevirt-install: ${new TextDecoder().decode(install.stderr)}`);
    }
    const list = new TextDecoder().decode(install.stdout);
    await kubectl(cluster.kubeconfigPath, ["apply", "--server-side", "-f", "-"], list);
    for (const item of JSON.parse(list).items as Secret[]) {
      if (item.kind === "Secret") secrets.set(item.metadata.name, await writeSecret(dir, item));
    }
    await createKubevirtCr(
      cluster.kubeconfigPath,
      dir,
      options.developerConfiguration ?? {},
      options.configuration ?? {},
    );

    const [apiPort] = freePorts(1);
    // An endpoint may not be a loopback address: a loopback-only cluster's apiserver calls
    // virt-api at this host's address too.
    const server = new URL(cluster.server).hostname;
    const host = server.startsWith("127.") ? await hostAddress() : server;
    // virt-api's Service, as the operator's (port 443), with this host as its endpoint.
    await kubectl(
      cluster.kubeconfigPath,
      ["apply", "-f", "-"],
      JSON.stringify({
        apiVersion: "v1",
        kind: "List",
        items: [{
          apiVersion: "v1",
          kind: "Service",
          metadata: { name: "virt-api", namespace: KUBEVIRT_NAMESPACE },
          spec: { ports: [{ name: "https", port: 443, targetPort: apiPort, protocol: "TCP" }] },
        }, {
          apiVersion: "discovery.k8s.io/v1",
          kind: "EndpointSlice",
          metadata: {
            name: "virt-api-host",
            namespace: KUBEVIRT_NAMESPACE,
            labels: { "kubernetes.io/service-name": "virt-api" },
          },
          addressType: "IPv4",
          endpoints: [{ addresses: [host], conditions: { ready: true } }],
          ports: [{ name: "https", port: apiPort, protocol: "TCP" }],
        }],
      }),
    );

    const certs = (secret: string, prefix: string) => [
      `--${prefix}-cert-file=${join(secretDir(secret), "tls.crt")}`,
      `--${prefix}-key-file=${join(secretDir(secret), "tls.key")}`,
    ];
    // As virt-operator's Deployment runs it (its port, its certificates).
    api = await spawnManaged("virt-api", join(kubevirtDir, "virt-api"), [
      `--kubeconfig=${await kubeconfig(API_SERVICE_ACCOUNT)}`,
      "--listen=0.0.0.0",
      `--port=${apiPort}`,
      "--subresources-only",
      ...certs("kubevirt-virt-api-certs", "tls"),
      ...certs("kubevirt-virt-handler-certs", "handler"),
      ...(options.consoleServerPort ? [`--console-server-port=${options.consoleServerPort}`] : []),
      "-v=2",
    ], {
      logPath: join(dir, "virt-api.log"),
      cwd: dir,
      // virt-api makes a temporary certificates directory and never removes it: in this
      // directory it goes with the rest.
      env: { TMPDIR: dir },
    });
    const started = api;
    // virt-api listens once its caches are synced; through its Service it is what the
    // apiserver calls for every VMI.
    await waitUntil(started, READY_TIMEOUT_MS, async () => {
      const conn = await Deno.connect({ hostname: "127.0.0.1", port: apiPort });
      conn.close();
      return true;
    });
    // The apiserver proxies subresources.kubevirt.io only once its availability check has
    // marked the APIService Available; until then a call answers 503. A discovery read
    // through the apiserver is the same path virtctl's calls take.
    await waitUntil(started, READY_TIMEOUT_MS, async () => {
      await kubectl(cluster.kubeconfigPath, ["get", "--raw", "/apis/subresources.kubevirt.io/v1"]);
      return true;
    });
    return { dir, process: started, address: host, secretDir, kubeconfig, stop };
  } catch (error) {
    const log = api ? `\n--- virt-api:\n${await logTail(api.logPath)}` : "";
    await stop();
    throw new ClusterError(`Cannot start KubeVirt's virt-api: ${error}${log}`, { cause: error });
  }
}

/** The label virt-api finds a node's handler by (`kubevirt.io: virt-handler`). */
const HANDLER_POD_LABELS = { "kubevirt.io": "virt-handler" };

/**
 * Registers the pod-less handler of `node` with virt-api, which finds a node's handler as
 * the Pod labelled `kubevirt.io: virt-handler` on that node and calls its REST API at the
 * Pod's IP. A pod-less node has no such Pod, so this writes one for it: no kubelet runs it,
 * and its status, written here, names the address the handler serves at. It goes with the
 * cluster.
 */
export async function registerPodlessHandler(
  cluster: Cluster,
  node: string,
  address: string,
): Promise<void> {
  const name = `virt-handler-${node}`.toLowerCase().replace(/[^a-z0-9.-]+/g, "-").slice(0, 63)
    .replace(/[-.]+$/, "");
  await kubectl(
    cluster.kubeconfigPath,
    ["apply", "-f", "-"],
    JSON.stringify({
      apiVersion: "v1",
      kind: "Pod",
      metadata: {
        name,
        namespace: KUBEVIRT_NAMESPACE,
        labels: HANDLER_POD_LABELS,
        annotations: {
          "virtnode.dev/podless": "this node's handler runs outside pods; no kubelet runs this one",
        },
      },
      spec: {
        nodeName: node,
        containers: [{ name: "virt-handler", image: "virtnode-podless-handler" }],
      },
    }),
  );
  await kubectl(cluster.kubeconfigPath, [
    "patch",
    "pod",
    name,
    "-n",
    KUBEVIRT_NAMESPACE,
    "--subresource=status",
    "--type=merge",
    "-p",
    JSON.stringify({
      status: {
        phase: "Running",
        hostIP: address,
        podIP: address,
        podIPs: [{ ip: address }],
      },
    }),
  ]);
}

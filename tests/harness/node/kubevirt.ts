/**
 * KubeVirt's control plane on a test cluster, as virt-operator would install it, run as
 * processes of this host: KubeVirt's own `virt-api` and `virt-controller` built from
 * `kubevirt.io/kubevirt` (tests/harness/kubevirt/build_peers.sh), with what the operator makes for
 * them (`kubevirt-install`, which calls the operator's generators): ServiceAccounts and
 * RBAC, the CA and certificate Secrets, the `kubevirt-ca` ConfigMap, and virt-api's
 * webhook configurations. Each program runs with its own ServiceAccount's token and its
 * certificate files in a directory of their own, as the operator mounts the Secrets.
 *
 * virt-api's webhooks point at the Service `kubevirt/virt-api`, as the operator's do: it
 * has no selector (no virt-api pod), and its EndpointSlice names this host's address and
 * virt-api's port, which the apiserver reaches through the node's kube-proxy. So the
 * cluster must be a pod-network one (`startCluster({ podNetwork: true })`) with a node.
 *
 * @module
 */
import { join } from "node:path";
import { kvmUsable } from "../../../mod/host/mod.ts";
import { removeIfPresent } from "../../../mod/lifecycle/mod.ts";
import {
  type Cluster,
  CONTROLLER_SERVICE_ACCOUNT,
  createKubevirtCr,
  KUBEVIRT_NAMESPACE,
  serviceAccountKubeconfig,
} from "../../../deploy/cluster/cluster.ts";
import {
  ClusterError,
  freePorts,
  logTail,
  type Managed,
  spawnManaged,
  terminate,
  waitUntil,
} from "../../../deploy/cluster/processes.ts";

const READY_TIMEOUT_MS = 120_000;
const API_SERVICE_ACCOUNT = "kubevirt-apiserver";

/** KubeVirt's control plane, running. */
export interface KubevirtControlPlane {
  /** The directory of its files (certificates, kubeconfigs, logs). */
  readonly dir: string;
  /** The launcher image virt-controller puts in launcher pods. */
  readonly launcherImage: string;
  /** The log lines of virt-api and virt-controller with errors, for a failing test. */
  complaints(): Promise<string>;
  /** Ends both programs and removes their files (the cluster's objects stay). */
  stop(): Promise<void>;
}

/** Options of {@linkcode startKubevirt}. */
export interface StartKubevirtOptions {
  /** The directory of tests/harness/kubevirt/build_peers.sh's output. */
  kubevirtDir: string;
  /** The launcher image (a name containerd knows on the node). */
  launcherImage: string;
  /**
   * Let guests run without KVM (`developerConfiguration.useEmulation`): launcher pods then
   * ask for no `devices.kubevirt.io/kvm`. Default: when KVM cannot run guests here
   * (`kvmUsable`: no `/dev/kvm`, or only `kvm-pvm` behind it).
   */
  useEmulation?: boolean;
  /**
   * Start virt-controller (the default). Without it only virt-api runs (its webhooks and
   * subresources), as a pod-less handler, which plays virt-controller's part, wants.
   */
  controller?: boolean;
}

interface Secret {
  kind: string;
  metadata: { name: string };
  data?: Record<string, string>;
}

async function kubectl(cluster: Cluster, args: string[], input?: string): Promise<string> {
  const child = new Deno.Command("kubectl", {
    args: ["--kubeconfig", cluster.kubeconfigPath, ...args],
    stdin: input === undefined ? "null" : "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  if (input !== undefined) {
    const writer = child.stdin.getWriter();
    await writer.write(new TextEncoder().encode(input));
    await writer.close();
  }
  const out = await child.output();
  const dec = new TextDecoder();
  if (!out.success) {
    throw new ClusterError(`kubectl ${args.join(" ")}: ${dec.decode(out.stderr).trim()}`);
  }
  return dec.decode(out.stdout);
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
 * Installs KubeVirt's control plane objects on `cluster` and starts virt-api and
 * virt-controller (unless told not to); resolves once virt-api serves and virt-controller
 * leads.
 */
export async function startKubevirt(
  cluster: Cluster,
  options: StartKubevirtOptions,
): Promise<KubevirtControlPlane> {
  const { kubevirtDir } = options;
  const useEmulation = options.useEmulation ?? !kvmUsable();
  const dir = await Deno.makeTempDir({ prefix: "virtnode-kubevirt-" });
  const processes: Managed[] = [];
  const stop = async () => {
    for (const p of processes.splice(0).reverse()) await terminate(p);
    // Stopping goes on either way; what is left is reported.
    await removeIfPresent(dir, { recursive: true }).catch((error) =>
      console.warn(`cannot remove ${dir}: ${error}`)
    );
  };
  try {
    await kubectl(cluster, ["create", "namespace", KUBEVIRT_NAMESPACE]).catch((error) => {
      if (!/AlreadyExists/.test(String(error))) throw error;
    });
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
    await kubectl(cluster, ["apply", "--server-side", "-f", "-"], list);
    const secrets = new Map<string, string>();
    for (const item of JSON.parse(list).items as Secret[]) {
      if (item.kind === "Secret") secrets.set(item.metadata.name, await writeSecret(dir, item));
    }

    await createKubevirtCr(
      cluster.kubeconfigPath,
      dir,
      // HostDisk: the yardstick's network guests boot from a disk image on the node.
      // HotplugVolumes: virt-api's addvolume and removevolume on a running VMI.
      {
        ...(useEmulation ? { useEmulation: true } : {}),
        featureGates: ["HostDisk", "HotplugVolumes"],
      },
      // No CPU model is obsolete: where KVM is only kvm-pvm, KubeVirt's labeller reads the
      // KVM capabilities, which offer no named model and a host model (kvm64) on the
      // default obsolete list, and no VMI could be placed (tests/harness/node/daemonsets.ts).
      useEmulation ? { obsoleteCPUModels: {} } : {},
    );

    const [apiPort, controllerPort] = freePorts(2);
    const host = new URL(cluster.server).hostname;
    // virt-api's Service, as the operator's (port 443), with this host as its endpoint.
    await kubectl(
      cluster,
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

    const kubeconfig = (account: string) =>
      serviceAccountKubeconfig(
        cluster,
        KUBEVIRT_NAMESPACE,
        account,
        join(dir, `${account}.kubeconfig`),
      );
    const spawn = async (name: string, args: string[]) => {
      const managed = await spawnManaged(name, join(kubevirtDir, name), args, {
        logPath: join(dir, `${name}.log`),
        cwd: dir,
        // virt-api makes a temporary certificates directory and never removes it: in
        // this directory it goes with the rest.
        env: { TMPDIR: dir },
      });
      processes.push(managed);
      return managed;
    };
    const certs = (secret: string, prefix: string) => {
      const d = secrets.get(secret);
      if (!d) throw new ClusterError(`kubevirt-install made no Secret ${secret}`);
      return [
        `--${prefix}-cert-file=${join(d, "tls.crt")}`,
        `--${prefix}-key-file=${join(d, "tls.key")}`,
      ];
    };

    // As virt-operator's Deployment runs it (its port, its certificates).
    const api = await spawn("virt-api", [
      `--kubeconfig=${await kubeconfig(API_SERVICE_ACCOUNT)}`,
      "--listen=0.0.0.0",
      `--port=${apiPort}`,
      "--subresources-only",
      ...certs("kubevirt-virt-api-certs", "tls"),
      ...certs("kubevirt-virt-handler-certs", "handler"),
      "-v=2",
    ]);
    const controller = options.controller === false ? undefined : await spawn("virt-controller", [
      `--kubeconfig=${await kubeconfig(CONTROLLER_SERVICE_ACCOUNT)}`,
      "--listen=127.0.0.1",
      `--port=${controllerPort}`,
      `--launcher-image=${options.launcherImage}`,
      ...certs("kubevirt-controller-certs", "prom"),
      "-v=2",
    ]);

    // virt-api listens once its caches are synced; through its Service it is what the
    // apiserver calls for every VMI.
    await waitUntil(api, READY_TIMEOUT_MS, async () => {
      const conn = await Deno.connect({ hostname: "127.0.0.1", port: apiPort });
      conn.close();
      return true;
    });
    // The apiserver proxies subresources.kubevirt.io only once its availability check has
    // marked the APIService Available; until then a call answers 503. A discovery read
    // through the apiserver is the same path virtctl's calls take.
    await waitUntil(api, READY_TIMEOUT_MS, async () => {
      await kubectl(cluster, ["get", "--raw", "/apis/subresources.kubevirt.io/v1"]);
      return true;
    });
    if (controller) {
      await waitUntil(controller, READY_TIMEOUT_MS, async () => {
        const holder = await kubectl(cluster, [
          "get",
          "lease",
          "virt-controller",
          "-n",
          KUBEVIRT_NAMESPACE,
          "-o",
          "jsonpath={.spec.holderIdentity}",
        ]);
        return holder.trim() !== "";
      });
    }
  } catch (error) {
    const logs = await Promise.all(
      processes.map(async (p) => `--- ${p.name}:\n${await logTail(p.logPath)}`),
    );
    await stop();
    throw new ClusterError(`Cannot start KubeVirt's control plane: ${error}\n${logs.join("\n")}`, {
      cause: error,
    });
  }
  return {
    dir,
    launcherImage: options.launcherImage,
    complaints: async () => {
      const parts: string[] = [];
      for (const p of processes) {
        const lines = (await Deno.readTextFile(p.logPath).catch(() => "")).split("\n")
          .filter((l) => /"level":"error"|^E\d{4}|panic/.test(l));
        parts.push(`--- ${p.name}:\n${lines.slice(-15).map((l) => l.slice(0, 600)).join("\n")}`);
      }
      return parts.join("\n");
    },
    stop,
  };
}

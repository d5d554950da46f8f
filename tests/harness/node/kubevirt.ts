/**
 * KubeVirt's control plane on a test cluster, as virt-operator would install it, run as
 * processes of this host: KubeVirt's own `virt-api` (deploy/kubevirt/virt_api.ts, with
 * what the operator makes for it) and `virt-controller`, built from `kubevirt.io/kubevirt`
 * (tests/harness/kubevirt/build_peers.sh). virt-controller runs with its own
 * ServiceAccount's token and certificate files, as the operator mounts them.
 *
 * Launcher pods need a node: the cluster is a pod-network one
 * (`startCluster({ podNetwork: true })`) with the real node of tests/harness/node.
 *
 * @module
 */
import { join } from "node:path";
import { kvmUsable } from "../../../mod/host/mod.ts";
import {
  type Cluster,
  CONTROLLER_SERVICE_ACCOUNT,
  kubectl,
  KUBEVIRT_NAMESPACE,
} from "../../../deploy/cluster/cluster.ts";
import { startVirtApi } from "../../../deploy/kubevirt/virt_api.ts";
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
  /** Feature gates beside the three every node test has. */
  featureGates?: string[];
}

/**
 * Installs KubeVirt's control plane objects on `cluster` and starts virt-api
 * (deploy/kubevirt/virt_api.ts) and virt-controller (unless told not to); resolves once
 * virt-api serves and virt-controller leads.
 */
export async function startKubevirt(
  cluster: Cluster,
  options: StartKubevirtOptions,
): Promise<KubevirtControlPlane> {
  const { kubevirtDir } = options;
  const useEmulation = options.useEmulation ?? !kvmUsable();
  const api = await startVirtApi(cluster, {
    kubevirtDir,
    // HostDisk: the yardstick's network guests boot from a disk image on the node.
    // HotplugVolumes: virt-api's addvolume and removevolume on a running VMI.
    // DownwardMetrics: the downwardMetrics device of the network guests.
    developerConfiguration: {
      ...(useEmulation ? { useEmulation: true } : {}),
      featureGates: [
        "HostDisk",
        "HotplugVolumes",
        "DownwardMetrics",
        ...(options.featureGates ?? []),
      ],
    },
    // No CPU model is obsolete: where KVM is only kvm-pvm, KubeVirt's labeller reads the
    // KVM capabilities, which offer no named model and a host model (kvm64) on the
    // default obsolete list, and no VMI could be placed (tests/harness/node/daemonsets.ts).
    configuration: useEmulation ? { obsoleteCPUModels: {} } : {},
  });
  let controller: Managed | undefined;
  const processes = () => [api.process, ...(controller ? [controller] : [])];
  const stop = async () => {
    if (controller) await terminate(controller);
    controller = undefined;
    await api.stop();
  };
  if (options.controller !== false) {
    try {
      const secret = api.secretDir("kubevirt-controller-certs");
      controller = await spawnManaged(
        "virt-controller",
        join(kubevirtDir, "virt-controller"),
        [
          `--kubeconfig=${await api.kubeconfig(CONTROLLER_SERVICE_ACCOUNT)}`,
          "--listen=127.0.0.1",
          `--port=${freePorts(1)[0]}`,
          `--launcher-image=${options.launcherImage}`,
          `--prom-cert-file=${join(secret, "tls.crt")}`,
          `--prom-key-file=${join(secret, "tls.key")}`,
          "-v=2",
        ],
        { logPath: join(api.dir, "virt-controller.log"), cwd: api.dir, env: { TMPDIR: api.dir } },
      );
      const started = controller;
      await waitUntil(started, READY_TIMEOUT_MS, async () => {
        const holder = await kubectl(cluster.kubeconfigPath, [
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
    } catch (error) {
      const logs = await Promise.all(
        processes().map(async (p) => `--- ${p.name}:\n${await logTail(p.logPath)}`),
      );
      await stop();
      throw new ClusterError(
        `Cannot start KubeVirt's control plane: ${error}\n${logs.join("\n")}`,
        { cause: error },
      );
    }
  }
  return {
    dir: api.dir,
    launcherImage: options.launcherImage,
    complaints: async () => {
      const parts: string[] = [];
      for (const p of processes()) {
        const lines = (await Deno.readTextFile(p.logPath).catch(() => "")).split("\n")
          .filter((l) => /"level":"error"|^E\d{4}|panic/.test(l));
        parts.push(`--- ${p.name}:\n${lines.slice(-15).map((l) => l.slice(0, 600)).join("\n")}`);
      }
      return parts.join("\n");
    },
    stop,
  };
}

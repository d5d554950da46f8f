/**
 * A cluster DNS Service for a test cluster, where KubeVirt's functional suite looks for one
 * (`kube-system/kube-dns`: it puts the Service's address into its guests' cloud-init network
 * data). The server behind it is Debian's dnsmasq on this host, reached from pods through
 * the Service's EndpointSlice and the node's kube-proxy, as virt-api's is in
 * tests/harness/node/kubevirt.ts.
 *
 * It answers what a cluster's CoreDNS answers for Services, `<name>.<namespace>.svc.` under
 * the cluster domain with the cluster IP: a watch of the cluster's Services writes them into
 * a hosts file that dnsmasq reads again whenever it changes (`--hostsdir`). Other names in the
 * cluster domain get NXDOMAIN, so a pod's resolver walks its search list as it does with
 * CoreDNS; names outside it come from this host's /etc/hosts, and the rest is refused (no
 * upstream is reachable here). Pods use it when their kubelet is told its address
 * (`startNode`'s `clusterDns`). Not served: headless Services, pod names and SRV records.
 *
 * @module
 */
import { join } from "node:path";
import type { Cluster } from "../../../deploy/cluster/cluster.ts";
import {
  freePorts,
  type Managed,
  spawnManaged,
  terminate,
} from "../../../deploy/cluster/processes.ts";
import { kubectl } from "../../../deploy/cluster/cluster.ts";
import { CLUSTER_DOMAIN } from "./node.ts";
import { Informer, type KubeObject, loadKubeClient } from "../../../mod/kube/mod.ts";
import { removeIfPresent } from "../../../mod/lifecycle/mod.ts";

interface Service extends KubeObject {
  spec?: { clusterIP?: string; clusterIPs?: string[] };
}

/** The hosts-file lines of `services`: each cluster IP with the Service's DNS name. */
export function serviceHostLines(services: Service[]): string[] {
  const lines: string[] = [];
  for (const service of services) {
    const { name, namespace } = service.metadata ?? {};
    if (!name || !namespace) continue;
    const ips = service.spec?.clusterIPs ?? [service.spec?.clusterIP ?? ""];
    for (const ip of ips) {
      if (!ip || ip === "None") continue;
      lines.push(`${ip} ${name}.${namespace}.svc.${CLUSTER_DOMAIN}`);
    }
  }
  return lines.sort();
}

/** The cluster DNS, running. */
export interface ClusterDns {
  /** The Service's cluster IP. */
  readonly address: string;
  /** Ends dnsmasq and removes the Service and its files. */
  stop(): Promise<void>;
}

/** Starts dnsmasq on this host and the `kube-system/kube-dns` Service in front of it. */
export async function startClusterDns(cluster: Cluster): Promise<ClusterDns> {
  const dir = await Deno.makeTempDir({ prefix: "virtnode-dns-" });
  const hostsDir = join(dir, "hosts");
  await Deno.mkdir(hostsDir);
  const host = new URL(cluster.server).hostname;
  const [port] = freePorts(1);
  let dnsmasq: Managed | undefined;
  const watching = new AbortController();
  const client = await loadKubeClient({ kubeconfigPath: cluster.kubeconfigPath });
  const services = new Informer<Service>(client, {
    path: "/api/v1/services",
    resource: "services",
    onError: (error) => console.log(`cluster DNS: Service watch interrupted: ${error.message}`),
  });
  // Written beside the hosts folder and renamed into it, so dnsmasq never reads half a file.
  let writing = Promise.resolve();
  const write = () => {
    writing = writing.then(async () => {
      const staged = join(dir, "services.staged");
      await Deno.writeTextFile(staged, serviceHostLines(services.list()).join("\n") + "\n");
      await Deno.rename(staged, join(hostsDir, "services"));
    }).catch((error) => console.log(`cluster DNS: cannot write the Service names: ${error}`));
  };
  services.addHandlers({ onAdd: write, onUpdate: write, onDelete: write });
  let watch: Promise<void> | undefined;
  const stop = async () => {
    watching.abort();
    await watch?.catch(() => {});
    await writing;
    client.close();
    await kubectl(cluster.kubeconfigPath, [
      "delete",
      "--ignore-not-found",
      "-n",
      "kube-system",
      "service/kube-dns",
      "endpointslice/kube-dns-host",
    ]).catch(() => {});
    if (dnsmasq) await terminate(dnsmasq);
    // Stopping goes on either way; what is left is reported.
    await removeIfPresent(dir, { recursive: true }).catch((error) =>
      console.warn(`cluster DNS: cannot remove ${dir}: ${error}`)
    );
  };
  try {
    dnsmasq = await spawnManaged("dnsmasq", "dnsmasq", [
      "--keep-in-foreground",
      "--no-daemon",
      "--conf-file=/dev/null",
      "--no-resolv",
      `--hostsdir=${hostsDir}`,
      `--local=/${CLUSTER_DOMAIN}/`,
      `--listen-address=${host}`,
      "--bind-interfaces",
      `--port=${port}`,
      `--pid-file=${join(dir, "dnsmasq.pid")}`,
      "--user=root",
    ], { logPath: join(dir, "dnsmasq.log") });
    watch = services.run(watching.signal);
    const ports = (protocol: string) => ({ name: `dns-${protocol.toLowerCase()}`, protocol });
    await kubectl(
      cluster.kubeconfigPath,
      ["apply", "-f", "-"],
      JSON.stringify({
        apiVersion: "v1",
        kind: "List",
        items: [{
          apiVersion: "v1",
          kind: "Service",
          metadata: {
            name: "kube-dns",
            namespace: "kube-system",
            labels: { "k8s-app": "kube-dns" },
          },
          spec: {
            ports: ["UDP", "TCP"].map((p) => ({ ...ports(p), port: 53, targetPort: port })),
          },
        }, {
          apiVersion: "discovery.k8s.io/v1",
          kind: "EndpointSlice",
          metadata: {
            name: "kube-dns-host",
            namespace: "kube-system",
            labels: { "kubernetes.io/service-name": "kube-dns" },
          },
          addressType: "IPv4",
          endpoints: [{ addresses: [host], conditions: { ready: true } }],
          ports: ["UDP", "TCP"].map((p) => ({ ...ports(p), port })),
        }],
      }),
    );
    const address = (await kubectl(cluster.kubeconfigPath, [
      "get",
      "service",
      "-n",
      "kube-system",
      "kube-dns",
      "-o",
      "jsonpath={.spec.clusterIP}",
    ])).trim();
    return { address, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}

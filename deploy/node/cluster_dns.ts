/**
 * A cluster DNS Service for a test cluster, where KubeVirt's functional suite looks for one
 * (`kube-system/kube-dns`: it puts the Service's address into its guests' cloud-init network
 * data). The server behind it is Debian's dnsmasq on this host, reached from pods through
 * the Service's EndpointSlice and the node's kube-proxy, as virt-api's is in
 * deploy/node/kubevirt.ts. No upstream is reachable here: it answers from this host's
 * /etc/hosts and refuses the rest (no cluster names: there is no CoreDNS).
 *
 * @module
 */
import { join } from "node:path";
import type { Cluster } from "../cluster/cluster.ts";
import { freePorts, type Managed, spawnManaged, terminate } from "../cluster/processes.ts";
import { kubectl } from "./daemonsets.ts";

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
  const host = new URL(cluster.server).hostname;
  const [port] = freePorts(1);
  let dnsmasq: Managed | undefined;
  const stop = async () => {
    await kubectl(cluster.kubeconfigPath, [
      "delete",
      "--ignore-not-found",
      "-n",
      "kube-system",
      "service/kube-dns",
      "endpointslice/kube-dns-host",
    ]).catch(() => {});
    if (dnsmasq) await terminate(dnsmasq);
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  };
  try {
    dnsmasq = await spawnManaged("dnsmasq", "dnsmasq", [
      "--keep-in-foreground",
      "--no-daemon",
      "--conf-file=/dev/null",
      "--no-resolv",
      `--listen-address=${host}`,
      "--bind-interfaces",
      `--port=${port}`,
      `--pid-file=${join(dir, "dnsmasq.pid")}`,
      "--user=root",
    ], { logPath: join(dir, "dnsmasq.log") });
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

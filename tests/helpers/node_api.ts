/**
 * What the node tier's tests read of their cluster: the few fields of pods, VMIs and Nodes
 * they look at, and the reads they make of them.
 *
 * @module
 */
import type { KubeClient } from "../../mod/kube/mod.ts";
import { userVmi } from "../harness/node/daemonsets.ts";
import { GUEST_IMAGE } from "./guest.ts";

/** The fields of a Pod the node tests read. */
export interface Pod {
  metadata: {
    name: string;
    uid: string;
    labels?: Record<string, string>;
    annotations?: Record<string, string>;
  };
  spec: { nodeName?: string };
  status?: {
    phase?: string;
    conditions?: { type: string; status: string }[];
    containerStatuses?: { name: string; restartCount: number }[];
  };
}

/** The fields of a VMI the node tests read. */
export interface Vmi {
  metadata: { name: string; uid: string; labels?: Record<string, string> };
  status?: {
    phase?: string;
    interfaces?: {
      name?: string;
      mac?: string;
      ipAddress?: string;
      ipAddresses?: string[];
      podInterfaceName?: string;
      infoSource?: string;
    }[];
    nodeName?: string;
    activePods?: Record<string, string>;
    phaseTransitionTimestamps?: { phase: string }[];
    conditions?: { type: string; status: string }[];
    migrationState?: Record<string, unknown>;
  };
}

/** The fields of a Node the node tests read. */
export interface NodeObject {
  metadata: { labels: Record<string, string>; annotations?: Record<string, string> };
  status: { allocatable: Record<string, string> };
}

/** Reads of the cluster through `admin`. */
export function nodeApi(admin: KubeClient): {
  getVmi(name: string): Promise<Vmi | undefined>;
  pods(selector: string, namespace?: string): Promise<Pod[]>;
} {
  return {
    getVmi: (name) =>
      admin.request<Vmi>(
        "GET",
        `/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances/${name}`,
      )
        .catch(() => undefined),
    pods: async (selector, namespace = "default") =>
      (await admin.request<{ items: Pod[] }>(
        "GET",
        `/api/v1/namespaces/${namespace}/pods?labelSelector=${encodeURIComponent(selector)}`,
      )).items,
  };
}

/** Whether a pod is Ready. */
export function podReady(p: Pod): boolean {
  return p.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True") ?? false;
}

/** Prints a step with the seconds since this was called. */
export function stepper(): (what: string) => void {
  const t0 = performance.now();
  return (what) =>
    console.log(`${((performance.now() - t0) / 1000).toFixed(1).padStart(6)} s  ${what}`);
}

/**
 * A user's VMI that boots the test guest with its one interface on the pod network: from its
 * containerDisk (the OCI image imported into the node's containerd), or from a disk image on
 * the node (`hostDisk`, read-only) for KubeVirt's own handler, which looks for launcher pods
 * below `/var/lib/kubelet` of the host's root only, where this test node has none.
 */
export function networkVmi(
  name: string,
  cpuModel: string,
  binding: "bridge" | "masquerade",
  hostDisk?: string,
) {
  const vmi = userVmi(name, cpuModel);
  return {
    ...vmi,
    spec: {
      ...vmi.spec,
      domain: {
        ...vmi.spec.domain,
        memory: { guest: "128Mi" },
        devices: {
          disks: [{
            name: "boot",
            disk: { bus: "virtio", ...(hostDisk ? { readonly: true } : {}) },
          }],
          interfaces: [{ name: "default", [binding]: {} }],
        },
      },
      networks: [{ name: "default", pod: {} }],
      volumes: [{
        name: "boot",
        ...(hostDisk
          ? { hostDisk: { path: hostDisk, type: "Disk" } }
          : { containerDisk: { image: GUEST_IMAGE, imagePullPolicy: "Never" } }),
      }],
    },
  };
}

/**
 * KubeVirt's own virt-launcher image in a pod the real kubelet runs (containerd, runc,
 * the pod's emptyDir volumes, its own namespaces and cgroup), driven by virtnode's
 * handler in KubeVirt mode on that node, under KubeVirt's CRDs and admission. The handler
 * registers its device plugins with the real kubelet, finds the launcher's socket in the
 * kubelet's volume directory and opens the notify pipe inside the container's root.
 *
 * The test plays virt-controller (KubeVirt's own virt-controller creating the pod is a
 * later step of this issue): it creates the launcher pod as virt-controller renders it for
 * a root VMI (labels, owner, command line, volumes, capabilities) and writes the VMI's
 * `Scheduled` status with the pod in `activePods`.
 */
import assert from "node:assert/strict";
import { useCluster } from "../../deploy/cluster/cluster.ts";
import { launcherImage, startNode } from "../harness/node/node.ts";
import {
  createVmi,
  deleteVmi,
  eventsFor,
  getVmi,
  kubeClient,
  releaseVmi,
  scheduleToPod,
  startHandlerProcess,
  testVmi,
  waitFor,
  waitForPhase,
} from "../helpers/handler_process.ts";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { launcherMonitorArgs } from "../helpers/launcher_pod.ts";

const EXPECTED_DEVICES: [string, string][] = [
  ["devices.kubevirt.io/kvm", "/dev/kvm"],
  ["devices.kubevirt.io/tun", "/dev/net/tun"],
  ["devices.kubevirt.io/vhost-net", "/dev/vhost-net"],
];

function exists(path: string): boolean {
  try {
    Deno.statSync(path);
    return true;
  } catch {
    return false;
  }
}

interface Pod {
  metadata: { name: string; uid: string };
  spec: { nodeName?: string };
  status?: { phase?: string; podIP?: string };
}

const EMPTY_DIRS: [string, string][] = [
  ["private", "/var/run/kubevirt-private"],
  ["public", "/var/run/kubevirt"],
  ["ephemeral-disks", "/var/run/kubevirt-ephemeral-disks"],
  ["libvirt-runtime", "/var/run/libvirt"],
  ["sockets", "/var/run/kubevirt/sockets"],
  ["container-disks", "/var/run/kubevirt/container-disks"],
];

/** The launcher pod of a root VMI, as virt-controller renders it (the parts that matter here). */
function launcherPod(vmi: VirtualMachineInstance, image: string, node: string, grace: number) {
  const { name, namespace, uid } = vmi.metadata;
  return {
    apiVersion: "v1",
    kind: "Pod",
    metadata: {
      generateName: `virt-launcher-${name}-`,
      namespace,
      labels: {
        "kubevirt.io": "virt-launcher",
        "kubevirt.io/created-by": uid,
        "vm.kubevirt.io/name": name,
      },
      annotations: { "kubevirt.io/domain": name },
      ownerReferences: [{
        apiVersion: "kubevirt.io/v1",
        kind: "VirtualMachineInstance",
        name,
        uid,
        controller: true,
        blockOwnerDeletion: true,
      }],
    },
    spec: {
      nodeSelector: { "kubernetes.io/hostname": node },
      restartPolicy: "Never",
      terminationGracePeriodSeconds: grace + 15,
      automountServiceAccountToken: false,
      containers: [{
        name: "compute",
        image,
        imagePullPolicy: "Never",
        command: [
          "/usr/bin/virt-launcher-monitor",
          ...launcherMonitorArgs({ name, namespace: namespace!, uid: uid! }, grace),
        ],
        securityContext: {
          runAsUser: 0,
          runAsNonRoot: false,
          capabilities: { add: ["NET_BIND_SERVICE", "SYS_NICE"] },
        },
        volumeMounts: EMPTY_DIRS.map(([n, mountPath]) => ({
          name: n,
          mountPath,
          ...(n === "container-disks" ? { mountPropagation: "HostToContainer" } : {}),
        })),
      }],
      volumes: EMPTY_DIRS.map(([n]) => ({ name: n, emptyDir: {} })),
    },
  };
}

Deno.test("node: KubeVirt's virt-launcher in a real kubelet's pod runs a VMI under virtnode's handler", async () => {
  // The handler also registers its device plugins with that kubelet.
  const cluster = await useCluster();
  const admin = await kubeClient(cluster.kubeconfigPath);
  const controller = await kubeClient(cluster.handlerKubeconfigPath);
  const image = await launcherImage();
  const node = await startNode(cluster);
  let h: Awaited<ReturnType<typeof startHandlerProcess>> | undefined;
  let ok = false;
  const t0 = performance.now();
  const step = (what: string) =>
    console.log(`${((performance.now() - t0) / 1000).toFixed(1).padStart(5)} s  ${what}`);
  try {
    await node.importImage(image.archive);
    step("node Ready, launcher image imported");
    h = await startHandlerProcess({
      kubeconfig: cluster.handlerKubeconfigPath,
      nodeName: node.name,
      libvirtUri: "test:///default",
      kubeletPodsDir: `${node.kubeletDir}/pods`,
      devicePluginsDir: node.devicePluginsDir,
    });
    await waitFor("the handler's device plugins in the node's allocatable", async () => {
      const n = await admin.request<{ status?: { allocatable?: Record<string, string> } }>(
        "GET",
        `/api/v1/nodes/${node.name}`,
      );
      const a = n.status?.allocatable ?? {};
      // Every plugin registers, as KubeVirt's do; a device this machine lacks (some have no
      // KVM or vhost-net) has its resource listed with none allocatable.
      return EXPECTED_DEVICES.every(([resource, path]) =>
        a[resource] !== undefined && (a[resource] !== "0") === exists(path)
      );
    }, 60_000);
    step("device plugins registered with the kubelet");

    const name = `vm-${crypto.randomUUID().slice(0, 8)}`;
    const vmi = await createVmi(controller, testVmi(name, node.name, { placed: true, grace: 1 }));
    const pod = await admin.request<Pod>(
      "POST",
      "/api/v1/namespaces/default/pods",
      launcherPod(vmi, image.name, node.name, 1),
    );
    const running = await waitFor("the launcher pod to run", async () => {
      const p = await admin.request<Pod>(
        "GET",
        `/api/v1/namespaces/default/pods/${pod.metadata.name}`,
      );
      return p.status?.phase === "Running" ? p : undefined;
    }, 120_000);
    assert.equal(running.spec.nodeName, node.name);
    step("launcher pod Running");
    await scheduleToPod(controller, "default", name, node.name, pod.metadata.uid);
    await waitForPhase(admin, "default", name, "Running", 120_000);
    step("VMI Running");
    const volumes = `${node.kubeletDir}/pods/${pod.metadata.uid}/volumes/kubernetes.io~empty-dir`;
    const pipe = await Deno.lstat(`${volumes}/public/domain-notify-pipe.sock`);
    assert.ok(pipe.isSocket, "the notify pipe is in the pod's share directory");
    await waitFor("Created and Started events", async () => {
      const reasons = (await eventsFor(admin, "default", name)).map((e) => e.reason);
      return reasons.includes("Created") && reasons.includes("Started");
    });

    await deleteVmi(admin, "default", name);
    await waitFor("the VMI to be final", async () => {
      const v = await getVmi(admin, "default", name);
      return v?.status?.phase === "Succeeded" || v?.status?.phase === "Failed";
    }, 60_000);
    await waitFor("the launcher pod to complete", async () => {
      const p = await admin.request<Pod>(
        "GET",
        `/api/v1/namespaces/default/pods/${pod.metadata.name}`,
      );
      return p.status?.phase === "Succeeded" || p.status?.phase === "Failed";
    }, 60_000);
    step("VMI final, launcher pod completed");
    // virt-controller's part: the pod goes, then virt-api's finalizer.
    await admin.request("DELETE", `/api/v1/namespaces/default/pods/${pod.metadata.name}`);
    await waitFor("the pod to be gone", async () => {
      try {
        await admin.request("GET", `/api/v1/namespaces/default/pods/${pod.metadata.name}`);
        return false;
      } catch {
        return true;
      }
    }, 60_000);
    await releaseVmi(controller, "default", name);
    step("pod and VMI gone");
    const log = await Deno.readTextFile(h.logFile);
    assert.match(log, /Notify pipe open in the launcher pod/);
    const complaints = log.split("\n").filter((l) =>
      /"level":"(warn|error)"/.test(l) && /"logger":"handler\./.test(l)
    );
    assert.deepEqual(complaints, [], "no warning or error from the VMI controller");
    ok = true;
  } finally {
    if (!ok) {
      if (h) console.error(`handler log:\n${(await Deno.readTextFile(h.logFile)).slice(-5000)}`);
      console.error(await node.complaints());
    }
    await h?.kill("SIGTERM");
    await node.stop();
    await admin.request("DELETE", `/api/v1/nodes/${node.name}`).catch(() => {});
    if (h) await Deno.remove(h.dir, { recursive: true }).catch(() => {});
    admin.close();
    controller.close();
    await cluster.stop();
  }
});

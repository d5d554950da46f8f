/**
 * Live migration, a live CPU change and a NIC hot-plug on a cluster of two real nodes, with
 * either handler: two kubelets and containerds on this machine, each node isolated in a
 * mount namespace of its own (`startNode({ isolated: true })`), KubeVirt's virt-api and
 * virt-controller, KubeVirt's own virt-launcher image, and the handler's DaemonSet (virtnode's
 * as shipped, or virt-handler's as virt-operator makes it: the yardstick).
 *
 * A VirtualMachine runs the test guest (kernel boot, no disk: a live migration proper) with
 * one vCPU socket; virt-api gives it room for 4.
 * 1. A VirtualMachineInstanceMigration, as a user writes one: virt-controller makes the target
 *    launcher pod on the other node and the handlers carry the guest over; it keeps its boot.
 * 2. virtnode's journey (both nodes chain Multus): `kubectl patch vm` adds a bridge interface on
 *    a secondary network (a NetworkAttachmentDefinition on a Linux bridge of the host);
 *    virt-controller copies it into the VMI and migrates the VMI to a pod Multus attached the
 *    network to, where the handler builds the binding and KubeVirt's launcher attaches the NIC.
 *    The status has it from the domain and Multus, and the guest sees its MAC in the same boot.
 * 3. `state: absent` unplugs it: the launcher detaches it, the handler takes its binding down,
 *    and once virt-controller has moved the VMI to a pod without the network, KubeVirt drops
 *    the interface from the VMI and the VM; the guest no longer has the MAC, same boot.
 * 4. `kubectl patch vm` asks for a second socket and 128 MiB more memory (KubeVirt's default
 *    LiveUpdate rollout, the KubeVirt CR's workload updates by live migration, as KubeVirt's
 *    docs set it): virt-controller changes the VMI and migrates it to a target pod sized for
 *    it, and the target's handler plugs the vCPU and the memory (KubeVirt's virtio-mem device)
 *    at the end of the migration. The guest reports two online vCPUs and its memory grown, and
 *    the VMI's status says so as virt-handler writes it.
 *
 * The guest has 1Gi of memory: virt-api gives a VMI room for memory hot-plug (`maxGuest`) from
 * 1Gi on. KubeVirt's launcher image runs bookworm-backports' libvirt 11.3 and QEMU 10.0
 * (tests/harness/node/images.sh): Debian 12's libvirt 9.0 refuses the domain of such a VMI.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { kubectl, startCluster } from "../../../deploy/cluster/cluster.ts";
import type { VirtualMachineInstance } from "../../../mod/api/mod.ts";
import { buildKubevirtPeers } from "../kubevirt/peers.ts";
import { launcherImage, type Node, startNode, virtHandlerImage, virtnodeImage } from "./node.ts";
import { startKubevirt } from "./kubevirt.ts";
import {
  cpuModelFor,
  offered,
  userVmi,
  virtHandlerDaemonSet,
  virtnodeDaemonSet,
} from "./daemonsets.ts";
import { ensureLibvirtd } from "../../helpers/libvirtd.ts";
import { kubeClient, waitFor } from "../../helpers/handler_process.ts";
import { nodeApi, type NodeObject, podReady, stepper } from "../../helpers/node_api.ts";
import { httpGet, TEST_KERNEL_BOOT, testKernelOciArchive } from "../../helpers/guest.ts";
import {
  guestMac,
  networkAttachment,
  type NodeBridges,
  nodeBridges,
  secondaryNetworks,
} from "../../helpers/secondary_networks.ts";

const REPO = new URL("../../../", import.meta.url).pathname;
const VMIS = "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances";
const VMIMS = "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstancemigrations";

/** The handler a journey runs with. */
export type MigrationHandler = "virtnode" | "virt-handler";

async function guestBoot(ip: string): Promise<{ bootId: string; uptime: number } | undefined> {
  const bootId = (await httpGet(`http://${ip}/boot_id`))?.trim();
  const uptime = Number((await httpGet(`http://${ip}/cgi-bin/uptime`))?.trim());
  return bootId && Number.isFinite(uptime) ? { bootId, uptime } : undefined;
}

/** What the guest has: online vCPUs, MemTotal in KiB, its NICs' MACs (the test guest's /cgi-bin/hw). */
async function guestHardware(
  ip: string,
): Promise<{ cpus: number; memoryKib: number; macs: string[] } | undefined> {
  const text = await httpGet(`http://${ip}/cgi-bin/hw`);
  const match = /cpus=(\d+) memory_kib=(\d+) macs=(\S*)/.exec(text ?? "");
  return match
    ? { cpus: Number(match[1]), memoryKib: Number(match[2]), macs: match[3].split(",") }
    : undefined;
}

/** Runs the journey of the module doc with `handler`'s DaemonSet on both nodes. */
export async function migrationJourney(handler: MigrationHandler): Promise<void> {
  // virtnode's labeller reads the host's libvirtd, as the DaemonSet's does on a real node.
  const libvirtUri = await ensureLibvirtd();
  assert.equal(libvirtUri, "qemu:///system");
  const cluster = await startCluster({ podNetwork: true });
  const kc = cluster.kubeconfigPath;
  const admin = await kubeClient(kc);
  const nodes: Node[] = [];
  let kubevirt: Awaited<ReturnType<typeof startKubevirt>> | undefined;
  let bridges: NodeBridges | undefined;
  let ok = false;
  const step = stepper();
  const { getVmi, pods } = nodeApi(admin);
  const vmi = () => admin.request<VirtualMachineInstance>("GET", `${VMIS}/vm-mig`);
  try {
    // virtnode's journey plugs a NIC on a secondary network too: both nodes chain Multus.
    const multus = handler === "virtnode";
    nodes.push(await startNode(cluster, { isolated: true, multus }));
    nodes.push(await startNode(cluster, { isolated: true, clusterServices: false, multus }));
    const launcher = await launcherImage();
    const handlerImage = handler === "virtnode" ? await virtnodeImage() : await virtHandlerImage();
    const kernel = await testKernelOciArchive();
    for (const node of nodes) {
      await node.importImage(launcher.archive);
      await node.importImage(handlerImage.archive);
      await node.importImage(kernel);
    }
    step("two nodes Ready, images imported into both");
    const kubevirtDir = await buildKubevirtPeers();
    kubevirt = await startKubevirt(cluster, { kubevirtDir, launcherImage: launcher.name });
    // Workload updates by live migration: how virt-controller carries a live CPU change
    // (KubeVirt's docs on CPU hot-plug set it so).
    await kubectl(kc, [
      "patch",
      "kubevirt",
      "kubevirt",
      "-n",
      "kubevirt",
      "--type=merge",
      "-p",
      JSON.stringify({
        spec: { workloadUpdateStrategy: { workloadUpdateMethods: ["LiveMigrate"] } },
      }),
    ]);
    if (handler === "virtnode") {
      await kubectl(kc, ["apply", "-f", join(REPO, "deploy/rbac.yaml")]);
      await kubectl(
        kc,
        ["apply", "-f", "-"],
        await virtnodeDaemonSet(handlerImage.name, launcher.name),
      );
    } else {
      await kubectl(
        kc,
        ["apply", "-f", "-"],
        await virtHandlerDaemonSet(kubevirtDir, handlerImage.name, launcher.name),
      );
    }
    await waitFor("a Ready handler pod on each node", async () => {
      const handlers = (await pods("kubevirt.io=virt-handler", "kubevirt")).filter(podReady);
      return new Set(handlers.map((p) => p.spec.nodeName)).size === 2;
    }, 240_000);
    let labelled: NodeObject | undefined;
    for (const node of nodes) {
      labelled = await waitFor(`${node.name} schedulable with its devices`, async () => {
        const n = await admin.request<NodeObject>("GET", `/api/v1/nodes/${node.name}`);
        return n.metadata.labels["kubevirt.io/schedulable"] === "true" &&
            offered(n.status.allocatable["devices.kubevirt.io/tun"])
          ? n
          : undefined;
      }, 120_000);
    }
    step(`${handler}'s DaemonSet Ready on both nodes, both take VMIs`);

    // The test guest booted from its kernel and initramfs (a kernel boot container): no
    // disk, so a live migration proper, not a block migration (KubeVirt 1.7's launcher asks
    // libvirt for `migrate_disks_detect_zeroes`, which Debian 12's libvirt 9.0 lacks).
    const base = userVmi("vm-mig", cpuModelFor(labelled!));
    const template = {
      metadata: { labels: { "kubevirt.io/vm": "vm-mig" } },
      spec: {
        ...base.spec,
        domain: {
          ...base.spec.domain,
          cpu: { ...base.spec.domain.cpu, sockets: 1, cores: 1, threads: 1 },
          memory: { guest: "1Gi" },
          devices: { interfaces: [{ name: "default", masquerade: {} }] },
          firmware: { kernelBoot: TEST_KERNEL_BOOT },
        },
        networks: [{ name: "default", pod: {} }],
      },
    };
    await kubectl(
      kc,
      ["apply", "-f", "-"],
      JSON.stringify({
        apiVersion: "kubevirt.io/v1",
        kind: "VirtualMachine",
        metadata: { name: "vm-mig", namespace: "default" },
        spec: { runStrategy: "Always", template },
      }),
    );
    const running = await waitFor("vm-mig Running with its pod IP", async () => {
      const v = await getVmi("vm-mig");
      return v?.status?.phase === "Running" && v.status.interfaces?.[0]?.ipAddress ? v : undefined;
    }, 240_000);
    const source = running.status!.nodeName!;
    const ip = running.status!.interfaces![0].ipAddress!;
    const before = await waitFor(`the guest's HTTP on ${ip}`, () => guestBoot(ip), 300_000, 1_000);
    const live = await waitFor(
      "vm-mig LiveMigratable",
      async () =>
        (await getVmi("vm-mig"))?.status?.conditions?.find((c) => c.type === "LiveMigratable"),
      60_000,
    );
    assert.equal(live.status, "True", JSON.stringify(live));
    const room = (await vmi()).spec.domain;
    assert.equal(room.cpu?.maxSockets, 4, "virt-api's room for CPU hot-plug");
    step(`vm-mig Running on ${source}, its guest answering on ${ip}`);

    // 1. A VirtualMachineInstanceMigration, as a user writes it (virtctl migrate names VMs,
    // not VMIs): KubeVirt's controller and the handlers do the rest.
    const started = performance.now();
    await kubectl(
      kc,
      ["create", "-f", "-"],
      JSON.stringify({
        apiVersion: "kubevirt.io/v1",
        kind: "VirtualMachineInstanceMigration",
        metadata: { name: "vm-mig-move", namespace: "default" },
        spec: { vmiName: "vm-mig" },
      }),
    );
    const vmim = await waitFor(
      "the migration to end",
      () => migrationEnded("vm-mig-move"),
      300_000,
      500,
    );
    assert.equal(vmim.status?.phase, "Succeeded", JSON.stringify(vmim.status));
    const moved = await waitFor(
      "vm-mig on the other node",
      async () => {
        const v = await getVmi("vm-mig");
        return v?.status?.nodeName !== source && v?.status?.migrationState?.completed &&
            v.status.interfaces?.[0]?.ipAddress && v.status.interfaces[0].ipAddress !== ip
          ? v
          : undefined;
      },
      60_000,
      500,
    );
    const target = moved.status!.nodeName!;
    assert.equal(moved.metadata.labels?.["kubevirt.io/nodeName"], target);
    const newIp = moved.status!.interfaces![0].ipAddress!;
    step(
      `migrated ${source} -> ${target} in ${
        ((performance.now() - started) / 1000).toFixed(1)
      } s (VMIM created to Succeeded); pod IP ${ip} -> ${newIp}`,
    );
    const after = await waitFor(
      `the guest's HTTP on ${newIp}`,
      () => guestBoot(newIp),
      60_000,
      500,
    );
    assert.equal(after.bootId, before.bootId, "the same boot: the guest moved");
    assert.ok(after.uptime > before.uptime);
    const launchers = await pods(`kubevirt.io/created-by=${running.metadata.uid}`);
    const onTarget = launchers.find((p) => p.spec.nodeName === target);
    assert.equal(onTarget?.status?.phase, "Running", "the target launcher pod runs the guest");
    await waitFor(
      "the source launcher pod to finish",
      async () => {
        const p = (await pods(`kubevirt.io/created-by=${running.metadata.uid}`))
          .find((p) => p.spec.nodeName === source);
        return !p || p.status?.phase === "Succeeded";
      },
      120_000,
      1_000,
    );
    step("the source's launcher pod done, the target's runs the guest");

    // Where the guest answers now (each migration gives it the new pod's address).
    let guestIp = newIp;
    if (handler === "virtnode") {
      // 2. A NIC plugged into the running VM: a bridge interface on a secondary network added
      // to its template. virt-controller puts it into the VMI and, with no in-place Multus
      // plug, migrates the VMI to a pod Multus attached the network to; there the handler
      // builds the binding and KubeVirt's launcher attaches the NIC. (virt-handler's bridge
      // binding cannot be built on this kernel: no dummy links, see docs/compatibility.md.)
      const [red] = secondaryNetworks(crypto.randomUUID().slice(0, 6));
      bridges = await nodeBridges([red]);
      await kubectl(kc, ["apply", "-f", "-"], JSON.stringify(networkAttachment(red, "default")));
      const mac = guestMac(red, 10);
      const beforePlug = (await vmi()).status?.migrationState?.migrationUid;
      const plugStarted = performance.now();
      await kubectl(kc, [
        "patch",
        "vm",
        "vm-mig",
        "--type=json",
        "-p",
        JSON.stringify([
          {
            op: "add",
            path: "/spec/template/spec/domain/devices/interfaces/-",
            value: { name: red.name, bridge: {}, macAddress: mac },
          },
          {
            op: "add",
            path: "/spec/template/spec/networks/-",
            value: { name: red.name, multus: { networkName: red.name } },
          },
        ]),
      ]);
      const nic = await waitFor(
        "the NIC in the VMI's status from the domain and Multus, after a migration",
        async () => {
          const v = await vmi();
          const entry = v.status?.interfaces?.find((i) => i.name === red.name);
          const sources = entry?.infoSource?.split(", ") ?? [];
          return v.status?.migrationState?.migrationUid !== beforePlug &&
              v.status?.migrationState?.completed && sources.includes("domain") &&
              sources.includes("multus-status")
            ? v
            : undefined;
        },
        300_000,
        1_000,
      ).catch(async (error) => {
        const v = await vmi();
        throw new Error(
          `${error.message}; spec interfaces ${
            JSON.stringify(v.spec.domain.devices.interfaces)
          }, status ${JSON.stringify(v.status)}`,
        );
      });
      const entry = nic.status!.interfaces!.find((i) => i.name === red.name)!;
      assert.equal(entry.mac, mac);
      assert.equal(entry.podInterfaceName, "podb1f51a511f1", "KubeVirt's name for network red");
      const nicIp = nic.status!.interfaces![0].ipAddress!;
      const seen = await waitFor(
        "the guest to see the plugged NIC",
        async () => {
          const hw = await guestHardware(nicIp);
          return hw?.macs.includes(mac) ? hw : undefined;
        },
        120_000,
        1_000,
      );
      const sameBoot = await guestBoot(nicIp);
      assert.equal(sameBoot?.bootId, before.bootId, "the same boot: no restart");
      step(
        `NIC ${mac} plugged through migration ${nic.status!.migrationState!.migrationUid} in ${
          ((performance.now() - plugStarted) / 1000).toFixed(1)
        } s (patch to status); the guest has ${seen.macs.join(", ")}`,
      );

      // 3. The NIC unplugged: `state: absent` in the template. The launcher detaches it in
      // place, the handler takes its binding down, virt-controller moves the VMI to a pod
      // without the network, and KubeVirt drops the interface from the VMI and the VM.
      const beforeUnplug = nic.status?.migrationState?.migrationUid;
      const unplugStarted = performance.now();
      await kubectl(kc, [
        "patch",
        "vm",
        "vm-mig",
        "--type=json",
        "-p",
        JSON.stringify([{
          op: "add",
          path: "/spec/template/spec/domain/devices/interfaces/1/state",
          value: "absent",
        }]),
      ]);
      const unplugged = await waitFor(
        "the NIC gone from the guest, the VMI and the VM",
        async () => {
          const v = await vmi();
          const vm = await admin.request<
            { spec: { template: { spec: VirtualMachineInstance["spec"] } } }
          >(
            "GET",
            "/apis/kubevirt.io/v1/namespaces/default/virtualmachines/vm-mig",
          );
          const ip = v.status?.interfaces?.[0]?.ipAddress;
          const hw = ip ? await guestHardware(ip) : undefined;
          const named = (list: { name: string }[] | undefined) =>
            (list ?? []).some((i) => i.name === red.name);
          return hw && !hw.macs.includes(mac) && !named(v.spec.domain.devices.interfaces) &&
              !named(v.spec.networks) && !named(v.status?.interfaces as { name: string }[]) &&
              !named(vm.spec.template.spec.domain.devices.interfaces)
            ? { v, hw }
            : undefined;
        },
        300_000,
        1_000,
      ).catch(async (error) => {
        const v = await vmi();
        throw new Error(
          `${error.message}; spec interfaces ${
            JSON.stringify(v.spec.domain.devices.interfaces)
          }, status ${JSON.stringify(v.status)}`,
        );
      });
      guestIp = unplugged.v.status!.interfaces![0].ipAddress!;
      const afterUnplug = await guestBoot(guestIp);
      assert.equal(afterUnplug?.bootId, before.bootId, "the same boot: no restart");
      step(
        `NIC ${mac} unplugged in ${
          ((performance.now() - unplugStarted) / 1000).toFixed(1)
        } s (patch to gone from the VM; migration ${
          unplugged.v.status?.migrationState?.migrationUid === beforeUnplug
            ? "none"
            : unplugged.v.status?.migrationState?.migrationUid
        }); the guest has ${unplugged.hw.macs.join(", ")}`,
      );
    }

    // 4. A live CPU and memory change: one more socket, 128 MiB more.
    const hardware = await waitFor("the guest's hardware", () => guestHardware(guestIp), 30_000);
    assert.equal(hardware.cpus, 1);
    const firstMigration = (await vmi()).status?.migrationState?.migrationUid;
    const changed = performance.now();
    await kubectl(kc, [
      "patch",
      "vm",
      "vm-mig",
      "--type=merge",
      "-p",
      JSON.stringify({
        spec: {
          template: { spec: { domain: { cpu: { sockets: 2 }, memory: { guest: "1152Mi" } } } },
        },
      }),
    ]);
    const plugged = await waitFor(
      "the VMI migrated for the change, with its status showing it",
      async () => {
        const v = await vmi();
        const s = v.status;
        // The pod IP too: a handler may report the new pod's address a sync later.
        return s?.migrationState?.migrationUid !== firstMigration && s?.migrationState?.completed &&
            s.currentCPUTopology?.sockets === 2 && s.memory?.guestRequested === "1152Mi" &&
            !s.conditions?.some((c) =>
              c.type === "HotVCPUChange" || c.type === "HotMemoryChange"
            ) &&
            s.interfaces?.[0]?.ipAddress && s.interfaces[0].ipAddress !== guestIp
          ? v
          : undefined;
      },
      300_000,
      1_000,
    ).catch(async (error) => {
      const v = await vmi();
      throw new Error(
        `${error.message}; the VMI's spec CPU ${JSON.stringify(v.spec.domain.cpu)}, status ${
          JSON.stringify(v.status)
        }`,
      );
    });
    const hotIp = plugged.status!.interfaces![0].ipAddress!;
    step(
      `live change carried by migration ${plugged.status!.migrationState!.migrationUid} to ${
        plugged.status!.nodeName
      } in ${((performance.now() - changed) / 1000).toFixed(1)} s (patch to status)`,
    );
    assert.equal(plugged.spec.domain.cpu?.sockets, 2);
    assert.equal(plugged.status?.currentCPUTopology?.cores, 1);
    assert.equal(plugged.status?.currentCPUTopology?.threads, 1);
    assert.equal(plugged.spec.domain.memory?.guest, "1152Mi");
    assert.equal(plugged.status?.memory?.guestAtBoot, "1Gi");
    // The guest's driver plugs 64 blocks of 2 MiB; MemTotal grows by that, less the page
    // tables the kernel may keep in the new memory.
    const grown = await waitFor(
      "the guest's second vCPU and 128 MiB more",
      async () => {
        const now = await guestHardware(hotIp);
        return now?.cpus === 2 && now.memoryKib - hardware.memoryKib >= 120 * 1024
          ? now
          : undefined;
      },
      120_000,
      1_000,
    ).catch(async (error) => {
      throw new Error(
        `${error.message}; the guest has ${JSON.stringify(await guestHardware(hotIp))}`,
      );
    });
    assert.ok(
      grown.memoryKib - hardware.memoryKib <= 128 * 1024,
      JSON.stringify({ hardware, grown }),
    );
    const stillBooted = await guestBoot(hotIp);
    assert.equal(stillBooted?.bootId, before.bootId, "the same boot: no restart");
    step(
      `the guest has ${grown.cpus} vCPUs online and MemTotal ${hardware.memoryKib} -> ${grown.memoryKib} KiB, in the same boot`,
    );

    await kubectl(kc, ["delete", "vm", "vm-mig", "--wait=true", "--timeout=120s"]);
    await waitFor("vm-mig's VMI gone", async () => !(await getVmi("vm-mig")), 120_000);
    ok = true;
  } finally {
    if (!ok) {
      for (const node of nodes) console.log(await node.complaints());
      for (
        const args of [
          ["get", "vmim", "-o", "yaml"],
          ["get", "pods", "-A", "-o", "wide"],
          ["get", "events", "-A"],
          ["get", "vmi", "-o", "yaml"],
        ]
      ) {
        console.log(await kubectl(kc, args).catch((e) => String(e)));
      }
      const logs = await kubectl(kc, [
        "logs",
        "-n",
        "kubevirt",
        "-l",
        "kubevirt.io=virt-handler",
        "--tail=80",
        "--prefix",
      ]).catch((e) => String(e));
      console.log(logs);
      if (kubevirt) console.log(await kubevirt.complaints());
    }
    await bridges?.remove();
    await kubevirt?.stop();
    for (const node of nodes.reverse()) await node.stop();
    admin.close();
    await cluster.stop();
  }

  async function migrationEnded(name: string) {
    const m = await admin.request<{ status?: { phase?: string } }>("GET", `${VMIMS}/${name}`);
    return m?.status?.phase === "Succeeded" || m?.status?.phase === "Failed" ? m : undefined;
  }
}

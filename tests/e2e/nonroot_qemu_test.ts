/**
 * Pod-less mode with QEMU as a non-root user, KubeVirt's 107: a libvirtd of the test's own
 * whose qemu.conf names that user (the machine's libvirtd, which every other test shares,
 * runs QEMU as root). The test guest boots from its containerDisk (the pod-less store),
 * with a NoCloud ISO, an empty disk and the serial console and VNC sockets, and answers HTTP through masquerade: every file QEMU opens was prepared
 * for that user, and QEMU really runs as it.
 */
import assert from "node:assert/strict";
import { useCluster } from "../../deploy/cluster/cluster.ts";
import { getXattrBytes, removeXattr, setXattrBytes } from "../../ffi/mod.ts";
import { decodeAcl } from "../../mod/host/mod.ts";
import { kvmUsable } from "../../mod/host/mod.ts";
import { runText } from "../helpers/command.ts";
import { startPrivateLibvirtd } from "../helpers/libvirtd.ts";
import { guestVmi, httpGet, installTestGuest } from "../helpers/guest.ts";
import {
  createVmi,
  deleteVmi,
  getVmi,
  hostLogOf,
  killLaunchers,
  kubeClient,
  removeTestPodNetwork,
  startHandlerProcess,
  testPodNetwork,
  waitFor,
  waitForPhase,
} from "../helpers/handler_process.ts";

const QEMU_USER = 107;
/** A guest booting under software emulation takes its time on a busy 2-core machine. */
const BOOT_MS = 180_000;

/** The real user and group IDs of the QEMU process whose command line names `guest`. */
function qemuIds(guest: string): { uid: number; gid: number } | undefined {
  for (const entry of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    const cmdline = (() => {
      try {
        return Deno.readTextFileSync(`/proc/${entry.name}/cmdline`);
      } catch {
        return "";
      }
    })();
    if (!cmdline.startsWith("/usr/bin/qemu-system") || !cmdline.includes(`guest=${guest},`)) {
      continue;
    }
    const status = Deno.readTextFileSync(`/proc/${entry.name}/status`);
    const field = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+)`, "m").exec(status)![1]);
    return { uid: field("Uid"), gid: field("Gid") };
  }
  return undefined;
}

const KVM = "/dev/kvm";
const ACL = "system.posix_acl_access";

/** /dev/kvm's mode bits; undefined on a machine without it. */
function kvmMode(): number | undefined {
  try {
    return Deno.statSync(KVM).mode! & 0o7777;
  } catch {
    return undefined;
  }
}

/** /dev/kvm's ACL before the test, to give it back after (undefined: none, or no device). */
function kvmAcl(): Uint8Array | undefined {
  try {
    return getXattrBytes(KVM, ACL);
  } catch {
    return undefined;
  }
}

Deno.test("pod-less mode with QEMU as user 107: the test guest boots from its containerDisk and answers HTTP", async () => {
  // QEMU is not root. The guest also has cloud-init, an empty disk and console sockets.
  const kvmBefore = kvmAcl();
  const kvmModeBefore = kvmMode();
  const libvirtd = await startPrivateLibvirtd({ user: QEMU_USER, group: QEMU_USER });
  const cluster = await useCluster();
  const client = await kubeClient(cluster.kubeconfigPath);
  const id = crypto.randomUUID().slice(0, 8);
  const ns = `nonroot-${id}`;
  const node = `nonroot-node-${id}`;
  const network = testPodNetwork();
  await client.request("POST", "/api/v1/namespaces", { metadata: { name: ns } });
  const dir = await Deno.makeTempDir({ prefix: "virtnode-nonroot-" });
  await installTestGuest(`${dir}/state/images`);
  const h = await startHandlerProcess({
    kubeconfig: cluster.handlerKubeconfigPath,
    nodeName: node,
    libvirtUri: libvirtd.uri,
    dir,
    podNetwork: network,
  });
  let ok = false;
  try {
    const vmi = guestVmi("guest", node, { namespace: ns, binding: "masquerade" });
    const devices = vmi.spec.domain.devices;
    devices.disks!.push(
      { name: "cloudinit", disk: { bus: "virtio" } },
      { name: "scratch", disk: { bus: "virtio" } },
    );
    vmi.spec.volumes!.push(
      { name: "cloudinit", cloudInitNoCloud: { userData: "#cloud-config\n" } },
      { name: "scratch", emptyDisk: { capacity: "16Mi" } },
    );
    await createVmi(client, vmi);
    // The first start waits for libvirt to probe QEMU as its user (again, once /dev/kvm
    // let that user in).
    const running = await waitForPhase(client, ns, "guest", "Running", 300_000);
    const ids = qemuIds(`${ns}_guest`);
    assert.deepEqual(ids, { uid: QEMU_USER, gid: QEMU_USER }, "QEMU runs as 107:107");
    const ip = await waitFor("the pod IP", async () => {
      const v = await getVmi(client, ns, "guest");
      return v?.status?.interfaces?.[0]?.ipAddress;
    });
    const answer = await waitFor(
      `the guest to answer HTTP on ${ip}`,
      () => httpGet(`http://${ip}/dhcp`),
      BOOT_MS,
      1_000,
    );
    assert.match(answer, /ip=10\.0\.2\.2/);
    const targets = (running.status?.volumeStatus ?? []).map((s) => s.name).sort();
    assert.deepEqual(targets, ["boot", "cloudinit", "scratch"]);
    const xml = await runText("virsh", "-c", libvirtd.uri, "dumpxml", `${ns}_guest`);
    assert.match(
      xml,
      new RegExp(`<domain type='${kvmUsable() ? "kvm" : "qemu"}'`),
      "KVM where the machine has it, for QEMU's user too",
    );
    if (kvmModeBefore !== undefined) {
      const acl = decodeAcl(getXattrBytes(KVM, ACL)!);
      assert.ok(
        acl.some((e) => e.tag === 2 && e.id === QEMU_USER && (e.perm & 6) === 6),
        "an ACL entry lets QEMU's user use /dev/kvm",
      );
    }
    await deleteVmi(client, ns, "guest");
    await waitFor("the VMI to go", async () => !(await getVmi(client, ns, "guest")), 60_000);
    ok = true;
  } finally {
    if (!ok) {
      console.error(`handler log:\n${(await Deno.readTextFile(h.logFile)).slice(-6000)}`);
      const hostLog = await Deno.readTextFile(hostLogOf(h.stateDir)).catch(() => "");
      console.error(`launcher host log:\n${hostLog.slice(-6000)}`);
    }
    await h.kill("SIGTERM");
    killLaunchers(h.stateDir);
    await libvirtd.stop();
    // /dev/kvm as it was: the machine's other tests run QEMU as root.
    if (kvmModeBefore !== undefined) {
      if (kvmBefore) setXattrBytes(KVM, ACL, kvmBefore);
      else removeXattr(KVM, ACL);
      // An ACL's mask shows in the group bits: they come back too.
      Deno.chmodSync(KVM, kvmModeBefore);
    }
    await removeTestPodNetwork(network);
    await client.request("DELETE", `/api/v1/namespaces/${ns}`).catch(() => {});
    client.close();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    await cluster.stop();
  }
});

/**
 * Hotplug in pod-less mode, through KubeVirt's own virt-api (built from the v1.7.0 module;
 * its webhooks and its `addvolume`/`removevolume` subresources, no virt-controller): a
 * claim bound to a local PersistentVolume in its namespace's folder of the handler's host
 * disk root is attached by the launcher host to the running QEMU domain, with no attachment
 * pod, and detached on removal. A filesystem claim (`disk.img` in the volume's folder) and a
 * block claim (a loop device's node under the root) alike; a claim whose volume lies in
 * another namespace's folder fails the sync naming the field, and the guest keeps running
 * untouched.
 */
import { buildKubevirtPeers } from "../harness/kubevirt/peers.ts";
import assert from "node:assert/strict";
import { join } from "node:path";
import { startCluster } from "../../deploy/cluster/cluster.ts";
import { podlessHandlerKubeconfig } from "../helpers/podless_beside_virt_api.ts";
import { startKubevirt } from "../harness/node/kubevirt.ts";
import type { KubeClient } from "../../mod/kube/mod.ts";
import { ensureLibvirtd } from "../helpers/libvirtd.ts";
import {
  createVmi,
  deleteVmi,
  eventsFor,
  getVmi,
  killLaunchers,
  kubeClient,
  startHandlerProcess,
  testVmi,
  waitFor,
  waitForPhase,
} from "../helpers/handler_process.ts";
import { runText as run } from "../helpers/command.ts";
import { localClaim, localVolume } from "../helpers/local_volumes.ts";

const virsh = (...args: string[]) => run("virsh", "-c", "qemu:///system", ...args);

/** A local PersistentVolume at `path` on `node` and its claim, bound to each other. */
async function claim(
  client: KubeClient,
  o: { ns: string; name: string; node: string; path: string; block?: boolean; pinnedTo?: string },
): Promise<void> {
  const volume = `${o.ns}-${o.name}`;
  await client.request(
    "POST",
    "/api/v1/persistentvolumes",
    localVolume({
      name: volume,
      path: o.path,
      size: "16Mi",
      node: o.pinnedTo ?? o.node,
      block: o.block,
      claimRef: { namespace: o.ns, name: o.name },
    }),
  );
  await client.request(
    "POST",
    `/api/v1/namespaces/${o.ns}/persistentvolumeclaims`,
    localClaim({ name: o.name, volumeName: volume, size: "16Mi", block: o.block, namespace: o.ns }),
  );
}

function subresource(ns: string, vmi: string, verb: string): string {
  return `/apis/subresources.kubevirt.io/v1/namespaces/${ns}/virtualmachineinstances/${vmi}/${verb}`;
}

/** A call of virt-api's subresource, as virtctl makes it (virt-api answers 202, no body). */
async function callSubresource(kubeconfig: string, path: string, body: unknown) {
  const file = await Deno.makeTempFile({ prefix: "virtnode-volume-", suffix: ".json" });
  try {
    await Deno.writeTextFile(file, JSON.stringify(body));
    await run("kubectl", "--kubeconfig", kubeconfig, "replace", "--raw", path, "-f", file);
  } finally {
    await Deno.remove(file);
  }
}

function addVolume(kubeconfig: string, ns: string, vmi: string, name: string) {
  return callSubresource(kubeconfig, subresource(ns, vmi, "addvolume"), {
    name,
    disk: { name, disk: { bus: "scsi" } },
    volumeSource: { persistentVolumeClaim: { claimName: name } },
  });
}

function removeVolume(kubeconfig: string, ns: string, vmi: string, name: string) {
  return callSubresource(kubeconfig, subresource(ns, vmi, "removevolume"), { name });
}

/** The domain's disks now: alias -> [type, source, target]. */
async function domainDisks(domain: string): Promise<Map<string, string[]>> {
  const xml = await virsh("dumpxml", domain);
  const disks = new Map<string, string[]>();
  for (const m of xml.matchAll(/<disk type='(\w+)'[\s\S]*?<\/disk>/g)) {
    const source = /<source (?:file|dev)='([^']*)'/.exec(m[0])?.[1] ?? "";
    const target = /<target dev='([^']*)'/.exec(m[0])?.[1] ?? "";
    const alias = /<alias name='([^']*)'/.exec(m[0])?.[1] ?? "";
    disks.set(alias, [m[1], source, target]);
  }
  return disks;
}

Deno.test("pod-less hotplug via virt-api: claims under the host disk root attach and detach live", async () => {
  // A filesystem claim and a block claim are attached to the running domain and detached on
  // removal. A claim outside the root, or pinned to another node, fails the sync naming its field.
  const uri = await ensureLibvirtd();
  const kubevirtDir = await buildKubevirtPeers();
  const cluster = await startCluster({ podNetwork: true });
  const cleanups: (() => Promise<unknown>)[] = [() => cluster.stop()];
  let logFile: string | undefined;
  let ok = false;
  try {
    const kubevirt = await startKubevirt(cluster, {
      kubevirtDir,
      launcherImage: "unused.invalid/launcher:none",
      controller: false,
    });
    cleanups.unshift(() => kubevirt.stop());
    const handlerKubeconfig = await podlessHandlerKubeconfig(
      cluster,
      kubevirt.dir,
      "podless-hotplug",
    );

    const id = crypto.randomUUID().slice(0, 8);
    const ns = `hotplug-${id}`;
    const node = `hotplug-node-${id}`;
    const root = await Deno.makeTempDir({ prefix: "virtnode-hostdisks-" });
    cleanups.push(() => Deno.remove(root, { recursive: true }));
    // A claim's volume lies in its namespace's folder of the root.
    const fsDir = join(root, ns, "claims", "fs1");
    await Deno.mkdir(fsDir, { recursive: true });
    await run("truncate", "-s", "16M", join(fsDir, "disk.img"));
    const backing = join(root, "blk1.img");
    await run("truncate", "-s", "16M", backing);
    const loop = (await run("losetup", "--find", "--show", backing)).trim();
    cleanups.push(() => run("losetup", "-d", loop));
    const [major, minor] = (await run("stat", "-c", "%t %T", loop)).trim().split(" ")
      .map((hex) => String(parseInt(hex, 16)));
    const blockNode = join(root, ns, "claims", "blk1");
    await run("mknod", blockNode, "b", major, minor);
    // Another namespace's volume, under the same root.
    const outside = join(root, "someone-else", "claims", "out1");
    await Deno.mkdir(outside, { recursive: true });
    await run("truncate", "-s", "16M", join(outside, "disk.img"));

    const client = await kubeClient(cluster.kubeconfigPath);
    cleanups.unshift(() => Promise.resolve(client.close()));
    await client.request("POST", "/api/v1/namespaces", { metadata: { name: ns } });
    await claim(client, { ns, name: "fs1", node, path: fsDir });
    await claim(client, { ns, name: "blk1", node, path: blockNode, block: true });
    await claim(client, { ns, name: "out1", node, path: outside });
    // Another node's local volume: its path here is not its disk.
    await claim(client, { ns, name: "away1", node, path: fsDir, pinnedTo: "another-node" });

    const h = await startHandlerProcess({
      kubeconfig: handlerKubeconfig,
      nodeName: node,
      libvirtUri: uri,
      hostDiskRoot: root,
    });
    logFile = h.logFile;
    cleanups.unshift(async () => {
      for (const name of ["vm1"]) await deleteVmi(client, ns, name).catch(() => {});
      await waitFor("the VMI to be gone", async () => !(await getVmi(client, ns, "vm1")), 60_000)
        .catch((e) => console.error(e.message));
      await h.kill("SIGTERM");
      killLaunchers(h.stateDir);
      await Deno.remove(h.dir, { recursive: true }).catch(() => {});
    });

    await createVmi(client, testVmi("vm1", node, { namespace: ns }));
    await waitForPhase(client, ns, "vm1", "Running", 90_000);
    const domain = `${ns}_vm1`;
    const before = await domainDisks(domain);
    const entry = async (name: string) =>
      (await getVmi(client, ns, "vm1"))?.status?.volumeStatus?.find((s) => s.name === name);

    // The filesystem claim: Ready with its target, the domain has its disk.img.
    let started = performance.now();
    await addVolume(cluster.kubeconfigPath, ns, "vm1", "fs1");
    const ready = await waitFor("fs1 to be Ready", async () => {
      const e = await entry("fs1");
      return e?.phase === "Ready" ? e : undefined;
    }, 60_000);
    console.log(
      `fs1 Ready as ${ready.target} ${Math.round(performance.now() - started)} ms after addvolume`,
    );
    assert.equal(ready.target, "sda");
    assert.deepEqual(ready.hotplugVolume, {});
    assert.equal(ready.persistentVolumeClaimInfo?.claimName, "fs1");
    assert.equal(ready.persistentVolumeClaimInfo?.volumeMode, "Filesystem");
    assert.deepEqual(ready.persistentVolumeClaimInfo?.capacity, { storage: "16Mi" });
    assert.deepEqual((await domainDisks(domain)).get("ua-fs1"), [
      "file",
      join(fsDir, "disk.img"),
      "sda",
    ]);

    // The block claim: its device node, on the next free SCSI name.
    await addVolume(cluster.kubeconfigPath, ns, "vm1", "blk1");
    const blk = await waitFor("blk1 to be Ready", async () => {
      const e = await entry("blk1");
      return e?.phase === "Ready" ? e : undefined;
    }, 60_000);
    assert.equal(blk.target, "sdb");
    assert.equal(blk.persistentVolumeClaimInfo?.volumeMode, "Block");
    assert.deepEqual((await domainDisks(domain)).get("ua-blk1"), ["block", blockNode, "sdb"]);

    // A claim whose volume is in another namespace's folder: a SyncFailed Event naming the
    // field and the folder it may use, the guest running on with the disks it had.
    /** Adds `name` and waits for the SyncFailed Event that refuses it. */
    const refused = async (name: string) => {
      await addVolume(cluster.kubeconfigPath, ns, "vm1", name);
      return await waitFor(
        `the refusal of ${name}`,
        async () =>
          (await eventsFor(client, ns, "vm1")).find((e) =>
            e.reason === "SyncFailed" && e.message.includes(name)
          ),
        60_000,
      );
    };
    const refusal = await refused("out1");
    assert.match(refusal.message, /spec\.volumes\[\d\]\.persistentVolumeClaim\.claimName/);
    assert.ok(
      refusal.message.includes(
        `is outside "${join(root, ns)}/", the host disk root of namespace "${ns}"`,
      ),
      refusal.message,
    );
    assert.equal((await getVmi(client, ns, "vm1"))?.status?.phase, "Running");
    assert.equal((await domainDisks(domain)).has("ua-out1"), false);
    await removeVolume(cluster.kubeconfigPath, ns, "vm1", "out1");
    await waitFor("out1 to leave the status", async () => !(await entry("out1")), 60_000);
    const away = await refused("away1");
    assert.match(away.message, /not pinned to this node/);
    assert.equal((await domainDisks(domain)).has("ua-away1"), false);
    await removeVolume(cluster.kubeconfigPath, ns, "vm1", "away1");

    // Removal: the disks leave the domain, the entries the status; the rest is as before.
    started = performance.now();
    await removeVolume(cluster.kubeconfigPath, ns, "vm1", "fs1");
    await removeVolume(cluster.kubeconfigPath, ns, "vm1", "blk1");
    await waitFor("the hotplugged disks to be detached", async () => {
      const v = await getVmi(client, ns, "vm1");
      const names = (v?.status?.volumeStatus ?? []).map((s) => s.name);
      return !names.some((n) => ["fs1", "blk1", "out1", "away1"].includes(n));
    }, 60_000);
    console.log(`both detached ${Math.round(performance.now() - started)} ms after removevolume`);
    assert.deepEqual(await domainDisks(domain), before);
    assert.equal((await getVmi(client, ns, "vm1"))?.status?.phase, "Running");
    ok = true;
  } finally {
    if (!ok && logFile) {
      console.error(
        `handler log:\n${(await Deno.readTextFile(logFile).catch(() => "")).slice(-8000)}`,
      );
    }
    for (const cleanup of cleanups) {
      await cleanup().catch((error) => console.error(`cleanup: ${error}`));
    }
  }
});

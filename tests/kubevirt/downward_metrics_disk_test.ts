/**
 * The `downwardMetrics` volume's vhostmd disk, as the handler fills it in KubeVirt mode,
 * read back by KubeVirt's own reader (`pkg/downwardmetrics/vhostmd`, built from the v1.7.0
 * module as `vhostmd-read`): the header, busy flag, checksum and XML as KubeVirt's code
 * checks them, over a disk KubeVirt's launcher made (256 KiB) and over an earlier, longer
 * report. A disk caught mid-write reads as locked.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { DownwardMetricsChannels } from "../../mod/handler/testing.ts";
import { VHOSTMD_DISK_SIZE, vhostmdWrite } from "../../mod/metrics/mod.ts";
import { buildKubevirtPeers } from "../harness/kubevirt/peers.ts";

interface Read {
  metrics: { name: string; type: string; context: string; value: string; unit?: string }[];
}

async function kubevirtReads(peers: string, disk: string): Promise<Read | string> {
  const out = await new Deno.Command(join(peers, "vhostmd-read"), {
    args: [disk],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder();
  return out.success ? JSON.parse(text.decode(out.stdout)) : text.decode(out.stderr).trim();
}

Deno.test("the handler's vhostmd disk reads with KubeVirt's own reader: checksum, flag, XML", async () => {
  const peers = await buildKubevirtPeers();
  const dir = await Deno.makeTempDir({ prefix: "virtnode-vhostmd-" });
  const disk = join(dir, "vhostmd0");
  // As KubeVirt's launcher makes it: 256 KiB, with a longer report already in it.
  const file = await Deno.open(disk, { create: true, write: true });
  await file.truncate(VHOSTMD_DISK_SIZE);
  const earlier = vhostmdWrite(`<metrics>${"<!-- padding -->".repeat(400)}</metrics>`);
  await file.write(earlier.unlocked);
  await file.write(earlier.body);
  file.close();
  const vmi = {
    metadata: { namespace: "ns", name: "vm1", uid: "uid-1" },
    spec: {
      domain: { devices: { disks: [{ name: "metrics", disk: { bus: "virtio" } }] } },
      volumes: [{ name: "metrics", downwardMetrics: {} }],
    },
    status: { phase: "Running" },
  } as unknown as VirtualMachineInstance;
  let opened = 0;
  const metrics = new DownwardMetricsChannels({
    nodeName: "node1",
    vmis: () => [vmi],
    open: () => Promise.reject(new Error("no channel: the VMI has the disk only")),
    launcher: () =>
      Promise.resolve({
        getDomainStats: () =>
          Promise.resolve({
            NrVirtCpu: 2,
            Vcpu: [{ Time: 1.5e9 }, { Time: 0.5e9 }],
            Memory: { ActualBalloon: 131072 },
          }),
        getQemuVersion: () => Promise.resolve("QEMU 7.2.19"),
      }),
    disk: () => {
      opened++;
      return Deno.open(disk, { read: true, write: true });
    },
  });
  try {
    await metrics.reconcile();
    assert.equal(opened, 1, "the disk of the running VMI was written");
    assert.equal((await Deno.stat(disk)).size, VHOSTMD_DISK_SIZE, "written in place");
    const read = await kubevirtReads(peers, disk);
    assert.ok(typeof read !== "string", `KubeVirt's reader: ${read}`);
    // Some names are the node's and the VM's both (TotalCPUTime): keyed by context too.
    const byName = new Map(read.metrics.map((m) => [`${m.context}/${m.name}`, m]));
    assert.deepEqual(byName.get("host/HostName"), {
      name: "HostName",
      type: "string",
      context: "host",
      value: "node1",
    });
    assert.equal(byName.get("host/VirtProductInfo")?.value, "QEMU 7.2.19");
    assert.deepEqual(byName.get("vm/TotalCPUTime"), {
      name: "TotalCPUTime",
      type: "real64",
      context: "vm",
      value: "2.000000",
      unit: "s",
    });
    assert.equal(byName.get("vm/ResourceProcessorLimit")?.value, "2");
    assert.equal(byName.get("vm/PhysicalMemoryAllocatedToVirtualSystem")?.value, "131072");
    assert.ok(byName.has("host/FreePhysicalMemory"), "the node's metrics too");

    // Caught between the locked header and the body's end, KubeVirt's reader backs off.
    const now = vhostmdWrite("<metrics></metrics>");
    const partial = await Deno.open(disk, { write: true });
    await partial.write(now.locked);
    partial.close();
    assert.equal(await kubevirtReads(peers, disk), "failed to verify vhostmd file: file is locked");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

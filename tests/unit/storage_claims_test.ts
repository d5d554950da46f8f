import assert from "node:assert/strict";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { claimImageSize, replaceClaimsByHostDisks, VolumeError } from "../../mod/storage/mod.ts";

const MIB = 1024 * 1024;

function vmi(
  volumes: NonNullable<VirtualMachineInstance["spec"]["volumes"]>,
  volumeStatus: NonNullable<NonNullable<VirtualMachineInstance["status"]>["volumeStatus"]> = [],
): VirtualMachineInstance {
  return {
    metadata: { name: "vm", namespace: "default", uid: "u" },
    spec: { domain: { devices: {} }, volumes },
    status: { volumeStatus },
  } as VirtualMachineInstance;
}

Deno.test("replaceClaimsByHostDisks(): filesystem claims and DataVolumes become DiskOrCreate host disks", () => {
  // Each host disk sits where the kubelet mounts the claim, with the claim's size.
  const given = vmi([
    { name: "root", containerDisk: { image: "i" } },
    { name: "data", persistentVolumeClaim: { claimName: "pvc-data" } },
    { name: "dv", dataVolume: { name: "dv-1" } },
  ], [
    {
      name: "data",
      target: "",
      persistentVolumeClaimInfo: {
        claimName: "pvc-data",
        accessModes: ["ReadWriteOnce"],
        volumeMode: "Filesystem",
        capacity: { storage: "2Gi" },
        requests: { storage: "1Gi" },
      },
    },
    {
      name: "dv",
      target: "",
      persistentVolumeClaimInfo: {
        claimName: "dv-1",
        accessModes: ["ReadWriteMany"],
        capacity: { storage: "100M" },
      },
    },
  ]);
  const before = structuredClone(given);
  const out = replaceClaimsByHostDisks(given);
  assert.deepEqual(given, before, "the VMI given is not changed");
  assert.deepEqual(out.spec.volumes, [
    { name: "root", containerDisk: { image: "i" } },
    {
      name: "data",
      hostDisk: {
        path: "/var/run/kubevirt-private/vmi-disks/data/disk.img",
        type: "DiskOrCreate",
        capacity: String(1024 * MIB),
        shared: false,
      },
    },
    {
      name: "dv",
      hostDisk: {
        path: "/var/run/kubevirt-private/vmi-disks/dv/disk.img",
        type: "DiskOrCreate",
        capacity: String(95 * MIB), // 100 MB aligned down to whole MiB
        shared: true,
      },
    },
  ]);
});

Deno.test("replaceClaimsByHostDisks(): block and hotplugged claims, or a VMI without claims, stay as they are", () => {
  const none = vmi([{ name: "root", containerDisk: { image: "i" } }]);
  assert.equal(replaceClaimsByHostDisks(none), none);
  const block = { name: "blk", persistentVolumeClaim: { claimName: "b" } };
  const hot = { name: "hp", persistentVolumeClaim: { claimName: "h", hotpluggable: true } };
  const attached = { name: "att", persistentVolumeClaim: { claimName: "a" } };
  const out = replaceClaimsByHostDisks(vmi([block, hot, attached], [
    {
      name: "blk",
      target: "",
      persistentVolumeClaimInfo: { volumeMode: "Block", capacity: { storage: "1Gi" } },
    },
    { name: "att", target: "", hotplugVolume: { attachPodName: "hp-volume-x" } },
  ]));
  assert.deepEqual(out.spec.volumes, [block, hot, attached]);
});

Deno.test("replaceClaimsByHostDisks(): a claim virt-controller gave no info for is refused", () => {
  // The error names the volume's field and the claim.
  assert.throws(
    () =>
      replaceClaimsByHostDisks(vmi([
        { name: "root", containerDisk: { image: "i" } },
        { name: "dv", dataVolume: { name: "missing-dv" } },
      ])),
    (error: unknown) =>
      error instanceof VolumeError && error.field === "spec.volumes[1]" &&
      /DataVolume "missing-dv".*PersistentVolumeClaim "missing-dv" exists/.test(error.message),
  );
});

Deno.test("claimImageSize(): the request or the smaller volume, aligned down to 1 MiB", () => {
  // No size at all, or less than 1 MiB, is an error.
  assert.equal(claimImageSize({ requests: { storage: "10Mi" } }, "f"), 10 * MIB);
  assert.equal(claimImageSize({ capacity: { storage: "10Mi" } }, "f"), 10 * MIB);
  assert.equal(
    claimImageSize({ requests: { storage: "10Mi" }, capacity: { storage: "8Mi" } }, "f"),
    8 * MIB,
  );
  assert.equal(
    claimImageSize({ requests: { storage: "5Mi" }, capacity: { storage: "8Mi" } }, "f"),
    5 * MIB,
  );
  assert.equal(claimImageSize({ requests: { storage: "1500Ki" } }, "f"), MIB);
  assert.throws(() => claimImageSize({ claimName: "c" }, "f"), /claim "c" states no storage/);
  assert.throws(() => claimImageSize({ requests: { storage: "1000Ki" } }, "f"), /below 1 MiB/);
});

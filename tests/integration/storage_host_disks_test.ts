/**
 * The images of filesystem claims and DiskOrCreate host disks, made by the handler inside a
 * launcher's root (a directory standing for `/proc/<pid>/root`, its claim a small tmpfs so
 * free space is known): sparse, of the claim's size, QEMU's user's, never resized or
 * overwritten; a short claim within the toleration gets an image filling it, beyond it a
 * clear refusal; and a symlink planted in the root never makes the handler write or chown
 * outside it.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import type { VirtualMachineInstance, Volume } from "../../mod/api/mod.ts";
import {
  prepareHostDisks,
  QEMU_USER,
  replaceClaimsByHostDisks,
  VolumeError,
} from "../../mod/storage/mod.ts";

const MIB = 1024 * 1024;

function claimVmi(size: string, runtimeUser = 0, extra: Volume[] = []): VirtualMachineInstance {
  return {
    metadata: { name: "vm", namespace: "default", uid: "u" },
    spec: {
      domain: { devices: {} },
      volumes: [{ name: "data", persistentVolumeClaim: { claimName: "c" } }, ...extra],
    },
    status: {
      runtimeUser,
      volumeStatus: [{
        name: "data",
        target: "",
        persistentVolumeClaimInfo: {
          claimName: "c",
          volumeMode: "Filesystem",
          accessModes: ["ReadWriteOnce"],
          capacity: { storage: size },
        },
      }],
    },
  } as VirtualMachineInstance;
}

async function run(cmd: string, ...args: string[]): Promise<void> {
  const out = await new Deno.Command(cmd, { args, stdout: "null", stderr: "piped" }).output();
  if (!out.success) throw new Error(`${cmd}: ${new TextDecoder().decode(out.stderr)}`);
}

/** A launcher root whose claim directory is a tmpfs of `mib` MiB; removed after `fn`. */
async function withRoot(mib: number, fn: (root: string, claimDir: string) => Promise<void>) {
  const root = await Deno.makeTempDir({ prefix: "vn-hostdisk-" });
  const claimDir = join(root, "var/run/kubevirt-private/vmi-disks/data");
  await Deno.mkdir(claimDir, { recursive: true });
  await run("mount", "-t", "tmpfs", "-o", `size=${mib}m`, "tmpfs", claimDir);
  try {
    await fn(root, claimDir);
  } finally {
    await run("umount", claimDir);
    await Deno.remove(root, { recursive: true });
  }
}

Deno.test("host disks: a filesystem claim's disk.img is made sparse, at the claim's size, for QEMU's user", async () => {
  // Once made, the image is never resized or overwritten.
  await withRoot(64, async (root, claimDir) => {
    const vmi = replaceClaimsByHostDisks(claimVmi("16Mi"));
    const done = await prepareHostDisks(vmi, { root, runtimeUser: 0 });
    const image = join(claimDir, "disk.img");
    assert.deepEqual(done.created, ["/var/run/kubevirt-private/vmi-disks/data/disk.img"]);
    assert.deepEqual(done.tolerated, []);
    const st = await Deno.stat(image);
    assert.equal(st.size, 16 * MIB);
    assert.equal(st.blocks, 0, "sparse");
    assert.equal(st.uid, QEMU_USER);
    assert.equal(st.gid, QEMU_USER);
    assert.equal(st.mode! & 0o777, 0o660);
    assert.deepEqual(
      [...Deno.readDirSync(claimDir)].map((e) => e.name),
      ["disk.img"],
      "no temporary file left",
    );

    // The guest's data stays; a larger claim later does not resize it here.
    await Deno.writeTextFile(image, "guest data");
    const again = await prepareHostDisks(replaceClaimsByHostDisks(claimVmi("32Mi")), {
      root,
      runtimeUser: 0,
    });
    assert.deepEqual(again.created, []);
    assert.equal(await Deno.readTextFile(image), "guest data");
  });
});

Deno.test("host disks: a slightly short claim gets an image filling it; one too short is refused", async () => {
  // A claim a little smaller than asked is tolerated (ToleratedSmallPV).
  // One much too small is refused naming the volume, and nothing is made.
  await withRoot(20, async (root, claimDir) => {
    const short = await prepareHostDisks(replaceClaimsByHostDisks(claimVmi("21Mi")), {
      root,
      runtimeUser: 0,
    });
    assert.equal(short.tolerated.length, 1);
    const t = short.tolerated[0];
    assert.equal(t.volume, "data");
    assert.equal(t.expected, 21 * MIB);
    assert.ok(t.found < 20 * MIB && t.found > 19 * MIB, String(t.found));
    assert.equal((await Deno.stat(join(claimDir, "disk.img"))).size, t.found);
    await Deno.remove(join(claimDir, "disk.img"));

    await assert.rejects(
      () => prepareHostDisks(replaceClaimsByHostDisks(claimVmi("30Mi")), { root, runtimeUser: 0 }),
      (e: unknown) =>
        e instanceof VolumeError && e.field === "spec.volumes[0]" &&
        /more than 10 % short/.test(e.message),
    );
    assert.deepEqual([...Deno.readDirSync(claimDir)], []);
  });
});

Deno.test("host disks: a claim the kubelet has not mounted is a clear error, not a directory the handler makes", async () => {
  const root = await Deno.makeTempDir({ prefix: "vn-hostdisk-" });
  try {
    await assert.rejects(
      () => prepareHostDisks(replaceClaimsByHostDisks(claimVmi("16Mi")), { root, runtimeUser: 0 }),
      /vmi-disks\/data of volume "data" is not in the launcher pod/,
    );
    assert.deepEqual([...Deno.readDirSync(root)], []);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("host disks: symlinks planted in the launcher's root never make the handler write or chown outside it", async () => {
  const outside = await Deno.makeTempDir({ prefix: "vn-outside-" });
  const victim = join(outside, "victim");
  await Deno.writeTextFile(victim, "host file");
  const victimDevice = join(outside, "victim-dev");
  await run("mknod", victimDevice, "b", "7", "250");
  const before = await Deno.stat(victim);
  try {
    await withRoot(64, async (root, claimDir) => {
      // write: disk.img is a link out of the root.
      await Deno.symlink(victim, join(claimDir, "disk.img"));
      await assert.rejects(
        () =>
          prepareHostDisks(replaceClaimsByHostDisks(claimVmi("16Mi")), { root, runtimeUser: 0 }),
        /disk\.img is a symlink, which the handler does not follow/,
      );
      // chown: the same, for a non-root runtime user (an existing image is handed over).
      await assert.rejects(
        () =>
          prepareHostDisks(replaceClaimsByHostDisks(claimVmi("16Mi", 107)), {
            root,
            runtimeUser: 107,
          }),
        /disk\.img is a symlink/,
      );
      await Deno.remove(join(claimDir, "disk.img"));

      // write: the claim's directory itself a link to an absolute path, which resolves
      // inside the root (as the launcher would see it), never to the host's.
      const other = join(root, "var/run/kubevirt-private/vmi-disks/other");
      await Deno.symlink(outside, other);
      const linked = {
        ...claimVmi("16Mi"),
        spec: {
          domain: { devices: {} },
          volumes: [{
            name: "other",
            hostDisk: {
              path: "/var/run/kubevirt-private/vmi-disks/other/victim",
              type: "DiskOrCreate",
              capacity: "1Mi",
            },
          }],
        },
      } as VirtualMachineInstance;
      await assert.rejects(
        () => prepareHostDisks(linked, { root, runtimeUser: 0 }),
        /is not in the launcher pod/,
      );

      // chown: a block claim's device node is a link to a device outside.
      await Deno.mkdir(join(root, "dev"));
      await Deno.symlink(victimDevice, join(root, "dev/blk"));
      const block = claimVmi("16Mi", 107, [{
        name: "blk",
        persistentVolumeClaim: { claimName: "b" },
      }]);
      block.status!.volumeStatus!.push({
        name: "blk",
        target: "",
        persistentVolumeClaimInfo: { volumeMode: "Block", capacity: { storage: "1Gi" } },
      });
      await assert.rejects(
        () => prepareHostDisks(replaceClaimsByHostDisks(block), { root, runtimeUser: 107 }),
        /\/dev\/blk is a symlink/,
      );
    });
    const after = await Deno.stat(victim);
    assert.equal(await Deno.readTextFile(victim), "host file");
    assert.equal(after.uid, before.uid);
    assert.equal(after.size, before.size);
    assert.equal((await Deno.stat(victimDevice)).uid, 0);
    assert.deepEqual(
      [...Deno.readDirSync(outside)].map((e) => e.name).sort(),
      ["victim", "victim-dev"],
    );
  } finally {
    await Deno.remove(outside, { recursive: true });
  }
});

Deno.test("host disks: a non-root runtime user gets an existing image and each block claim's device node", async () => {
  await withRoot(64, async (root, claimDir) => {
    await Deno.writeTextFile(join(claimDir, "disk.img"), "data");
    await Deno.mkdir(join(root, "dev"));
    await run("mknod", join(root, "dev/blk"), "b", "7", "250");
    const vmi = claimVmi("16Mi", 107, [{ name: "blk", persistentVolumeClaim: { claimName: "b" } }]);
    vmi.status!.volumeStatus!.push({
      name: "blk",
      target: "",
      persistentVolumeClaimInfo: { volumeMode: "Block", capacity: { storage: "1Gi" } },
    });
    const done = await prepareHostDisks(replaceClaimsByHostDisks(vmi), { root, runtimeUser: 107 });
    assert.deepEqual(done.chowned, [
      "/var/run/kubevirt-private/vmi-disks/data/disk.img",
      "/dev/blk",
    ]);
    assert.equal((await Deno.stat(join(claimDir, "disk.img"))).uid, 107);
    assert.equal((await Deno.lstat(join(root, "dev/blk"))).uid, 107);
    // Once theirs, nothing more to do.
    const again = await prepareHostDisks(replaceClaimsByHostDisks(vmi), { root, runtimeUser: 107 });
    assert.deepEqual(again.chowned, []);
  });
});

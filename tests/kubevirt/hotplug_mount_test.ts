/**
 * KubeVirt mode's hotplugged volumes with KubeVirt's own `container-disk` server (built from
 * the v1.7.0 module) as the attachment pod's process: a "pod" with its own root and mount
 * namespace, the claim mounted at `/<volume>` in that namespace only and the server on
 * `hp.sock` in the pod's `hotplug-disks` volume, and a "launcher" with its own root, mount
 * namespace and devices cgroup. The handler's mounter binds the claim's `disk.img` into the
 * launcher's namespace only, makes a block claim's device node there and lets the launcher's
 * cgroup use it, undoes both when the volume leaves the spec, and follows no link planted in
 * the claim out of the pod's root.
 */
import { buildKubevirtPeers } from "../harness/kubevirt/peers.ts";
import assert from "node:assert/strict";
import { join } from "node:path";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { HotplugMounts } from "../../mod/handler/testing.ts";
import { waitFor } from "../helpers/handler_process.ts";

const HOTPLUG = "volumes/kubernetes.io~empty-dir/hotplug-disks";

function vmi(
  uid: string,
  podUid: string,
  volumes: { name: string; block?: boolean; dump?: boolean }[],
) {
  return {
    metadata: { name: "vm1", namespace: "default", uid },
    spec: {
      domain: { devices: {} },
      volumes: volumes.map((v) =>
        v.dump
          // A memory dump's claim (virtctl memory-dump): its directory, not an image.
          ? { name: v.name, memoryDump: { claimName: v.name, hotpluggable: true } }
          : { name: v.name, persistentVolumeClaim: { claimName: v.name, hotpluggable: true } }
      ),
    },
    status: {
      volumeStatus: volumes.map((v) => ({
        name: v.name,
        target: "",
        phase: "AttachedToNode",
        hotplugVolume: { attachPodName: "hp-volume-x", attachPodUID: podUid },
        persistentVolumeClaimInfo: { volumeMode: v.block ? "Block" : "Filesystem" },
        ...(v.dump ? { memoryDumpVolume: { claimName: v.name } } : {}),
      })),
    },
  } as unknown as VirtualMachineInstance;
}

/**
 * A process with its own mount namespace and `root` as its root, `binds` mounted in it only.
 * A pod gets its own PID namespace and a /proc of it, as a container does: the handler's
 * descriptors are not to be seen through that namespace's /proc.
 */
function rooted(
  root: string,
  binds: [string, string][],
  program: string[],
  ownPids = false,
): Deno.ChildProcess {
  const q = (s: string) => `'${s.replaceAll("'", `'\\''`)}'`;
  const script = [
    "set -e",
    `mount --bind ${q(root)} ${q(root)}`,
    ...binds.map(([from, to]) => `mount --bind ${q(from)} ${q(join(root, to))}`),
    `exec chroot ${q(root)} ${program.map(q).join(" ")}`,
  ].join("\n");
  return new Deno.Command("unshare", {
    args: [
      "--mount",
      "--propagation",
      "private",
      ...(ownPids ? ["--pid", "--fork", "--mount-proc", "--kill-child"] : []),
      "bash",
      "-c",
      script,
    ],
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).spawn();
}

async function inNs(pid: number, ...args: string[]): Promise<{ ok: boolean; text: string }> {
  const out = await new Deno.Command("nsenter", {
    args: ["--mount", `--target=${pid}`, "--root", ...args],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { ok: out.success, text: dec.decode(out.stdout) + dec.decode(out.stderr) };
}

async function run(cmd: string, ...args: string[]): Promise<void> {
  const out = await new Deno.Command(cmd, { args, stdout: "null", stderr: "piped" }).output();
  if (!out.success) throw new Error(`${cmd}: ${new TextDecoder().decode(out.stderr)}`);
}

Deno.test("hotplug (KubeVirt mode): claims are bound into the launcher's namespace only and go on removal", async () => {
  // A filesystem claim's disk.img comes from the attachment pod; a
  // block claim's device node is made in that namespace and let into
  // the launcher's cgroup; a memory dump's claim is bound whole, as a
  // directory. All go when the volumes leave the spec.
  const kubevirt = await buildKubevirtPeers();
  const dir = await Deno.makeTempDir({ prefix: "virtnode-hotplug-" });
  const podsDir = join(dir, "pods");
  const podUid = crypto.randomUUID();
  const podDir = join(podsDir, podUid);
  const podRoot = join(dir, "pod");
  const claim = join(dir, "claim");
  const dumpClaim = join(dir, "dump-claim");
  const launcherRoot = join(dir, "launcher");
  const cgroup = `/sys/fs/cgroup/devices/virtnode-test-${podUid.slice(0, 8)}`;
  await Deno.mkdir(join(podDir, HOTPLUG, "blk"), { recursive: true });
  await run("mknod", join(podDir, HOTPLUG, "blk", "pvc-uid"), "b", "7", "250");
  for (const d of ["usr/bin", "path", "data", "dump", "etc"]) {
    await Deno.mkdir(join(podRoot, d), { recursive: true });
  }
  await Deno.copyFile(join(kubevirt, "container-disk"), join(podRoot, "usr/bin/container-disk"));
  await Deno.chmod(join(podRoot, "usr/bin/container-disk"), 0o755);
  await Deno.writeTextFile(join(podRoot, "etc/secret"), "the pod's own file\n");
  await Deno.mkdir(claim);
  await Deno.writeTextFile(join(claim, "disk.img"), "the claim's disk\n");
  await Deno.mkdir(dumpClaim);
  await Deno.writeTextFile(join(dumpClaim, "vm1-dump-old.memory.dump"), "an earlier dump\n");
  for (const d of ["bin", "var/run/kubevirt/hotplug-disks"]) {
    await Deno.mkdir(join(launcherRoot, d), { recursive: true });
  }
  await Deno.copyFile("/bin/busybox", join(launcherRoot, "bin/busybox"));
  await Deno.mkdir(cgroup);
  const pod = rooted(podRoot, [
    [join(podDir, HOTPLUG), "path"],
    [claim, "data"],
    [dumpClaim, "dump"],
  ], [
    "/usr/bin/container-disk",
    "--copy-path",
    "/path/hp",
  ], true);
  const launcher = rooted(launcherRoot, [], ["/bin/busybox", "sleep", "600"]);
  try {
    await Deno.writeTextFile(join(cgroup, "cgroup.procs"), String(launcher.pid));
    // Every device shut out, as a container's cgroup has all but its own devices.
    await Deno.writeTextFile(join(cgroup, "devices.deny"), "a");
    assert.equal((await Deno.readTextFile(join(cgroup, "devices.list"))).trim(), "");
    await waitFor(
      "the attachment pod's socket",
      () => Deno.stat(join(podDir, HOTPLUG, "hp.sock")).then(() => true, () => false),
      10_000,
    );
    const uid = crypto.randomUUID();
    const both = vmi(uid, podUid, [
      { name: "data" },
      { name: "blk", block: true },
      { name: "dump", dump: true },
    ]);
    const mounts = new HotplugMounts(join(dir, "records"), podsDir);
    await mounts.mount(both, launcher.pid);
    assert.deepEqual([...await mounts.mounted(uid)].sort(), ["blk", "data", "dump"]);

    // The dump's claim is a directory the launcher (QEMU's user) writes the dump into.
    const dumpDir = "/var/run/kubevirt/hotplug-disks/dump";
    const listed = await inNs(launcher.pid, "/bin/busybox", "ls", dumpDir);
    assert.equal(listed.text, "vm1-dump-old.memory.dump\n");
    const dumped = await inNs(
      launcher.pid,
      "/bin/busybox",
      "sh",
      "-c",
      `echo memory > ${dumpDir}/vm1-dump-new.memory.dump`,
    );
    assert.ok(dumped.ok, `the dump's directory is writable: ${dumped.text}`);
    assert.equal(await Deno.readTextFile(join(dumpClaim, "vm1-dump-new.memory.dump")), "memory\n");
    assert.equal((await Deno.stat(dumpClaim)).uid, 107, "QEMU's user owns the claim's directory");

    const seen = await inNs(
      launcher.pid,
      "/bin/busybox",
      "cat",
      "/var/run/kubevirt/hotplug-disks/data.img",
    );
    assert.equal(seen.text, "the claim's disk\n");
    const write = await inNs(
      launcher.pid,
      "/bin/busybox",
      "sh",
      "-c",
      "echo guest >> /var/run/kubevirt/hotplug-disks/data.img",
    );
    assert.ok(write.ok, `read-write: ${write.text}`);
    assert.equal(await Deno.readTextFile(join(claim, "disk.img")), "the claim's disk\nguest\n");
    assert.equal((await Deno.stat(join(claim, "disk.img"))).uid, 107, "QEMU's user's");
    const node = await Deno.lstat(join(launcherRoot, "var/run/kubevirt/hotplug-disks/blk"));
    assert.ok(node.isBlockDevice, "a block device node in the launcher's hotplug directory");
    assert.equal(node.rdev, (await Deno.lstat(join(podDir, HOTPLUG, "blk", "pvc-uid"))).rdev);
    assert.equal(node.uid, 107);
    assert.match(await Deno.readTextFile(join(cgroup, "devices.list")), /^b 7:250 rwm$/m);
    assert.ok(
      !Deno.readTextFileSync("/proc/self/mountinfo").includes(dir),
      "no mount in the node's namespace",
    );

    // A second pass, and a restarted handler, change nothing.
    await mounts.mount(both, launcher.pid);
    const again = new HotplugMounts(join(dir, "records"), podsDir);
    await again.mount(both, launcher.pid);

    // Both volumes leave the spec: unmounted, the node removed, the device shut out.
    const none = { ...both, spec: { ...both.spec, volumes: [] } } as VirtualMachineInstance;
    await again.unplug(none);
    assert.deepEqual([...await again.mounted(uid)], []);
    assert.deepEqual(
      [...Deno.readDirSync(join(launcherRoot, "var/run/kubevirt/hotplug-disks"))],
      [],
      "nothing left in the launcher's hotplug directory",
    );
    assert.deepEqual(
      [...Deno.readDirSync(dumpClaim)].map((e) => e.name).sort(),
      ["vm1-dump-new.memory.dump", "vm1-dump-old.memory.dump"],
      "the dumps stay on the claim",
    );
    assert.doesNotMatch(await Deno.readTextFile(join(cgroup, "devices.list")), /^b 7:250/m);
    assert.deepEqual([...Deno.readDirSync(join(dir, "records"))], [], "the record is gone");
  } finally {
    for (const c of [pod, launcher]) {
      try {
        c.kill("SIGKILL");
      } catch { /* gone */ }
      await c.status;
    }
    await Deno.remove(cgroup).catch(() => {});
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("hotplug (KubeVirt mode): a disk.img linked out of the claim resolves inside the pod's root", async () => {
  // The link is followed within the attachment pod's root, never to the node's own file.
  const kubevirt = await buildKubevirtPeers();
  const dir = await Deno.makeTempDir({ prefix: "virtnode-hotplug-" });
  const podsDir = join(dir, "pods");
  const podUid = crypto.randomUUID();
  const podDir = join(podsDir, podUid);
  const podRoot = join(dir, "pod");
  const claim = join(dir, "claim");
  const launcherRoot = join(dir, "launcher");
  const victim = join(dir, "victim");
  await Deno.writeTextFile(victim, "the node's file\n");
  await Deno.mkdir(join(podDir, HOTPLUG), { recursive: true });
  for (const d of ["usr/bin", "path", "data", join(dir.slice(1))]) {
    await Deno.mkdir(join(podRoot, d), { recursive: true });
  }
  // The same absolute path inside the pod's root holds the pod's own file.
  await Deno.writeTextFile(join(podRoot, victim.slice(1)), "the pod's own file\n");
  await Deno.copyFile(join(kubevirt, "container-disk"), join(podRoot, "usr/bin/container-disk"));
  await Deno.chmod(join(podRoot, "usr/bin/container-disk"), 0o755);
  await Deno.mkdir(claim);
  await Deno.symlink(victim, join(claim, "disk.img"));
  for (const d of ["bin", "var/run/kubevirt/hotplug-disks"]) {
    await Deno.mkdir(join(launcherRoot, d), { recursive: true });
  }
  await Deno.copyFile("/bin/busybox", join(launcherRoot, "bin/busybox"));
  const pod = rooted(podRoot, [[join(podDir, HOTPLUG), "path"], [claim, "data"]], [
    "/usr/bin/container-disk",
    "--copy-path",
    "/path/hp",
  ], true);
  const launcher = rooted(launcherRoot, [], ["/bin/busybox", "sleep", "600"]);
  try {
    await waitFor(
      "the attachment pod's socket",
      () => Deno.stat(join(podDir, HOTPLUG, "hp.sock")).then(() => true, () => false),
      10_000,
    );
    const uid = crypto.randomUUID();
    const mounts = new HotplugMounts(join(dir, "records"), podsDir);
    await mounts.mount(vmi(uid, podUid, [{ name: "data" }]), launcher.pid);
    const seen = await inNs(
      launcher.pid,
      "/bin/busybox",
      "cat",
      "/var/run/kubevirt/hotplug-disks/data.img",
    );
    assert.equal(seen.text, "the pod's own file\n");
    const victimStat = await Deno.stat(victim);
    assert.equal(await Deno.readTextFile(victim), "the node's file\n");
    assert.equal(victimStat.uid, 0, "the node's file keeps its owner");
    await mounts.unmountAll(uid);
  } finally {
    for (const c of [pod, launcher]) {
      try {
        c.kill("SIGKILL");
      } catch { /* gone */ }
      await c.status;
    }
    await Deno.remove(dir, { recursive: true });
  }
});

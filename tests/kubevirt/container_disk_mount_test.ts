/**
 * KubeVirt mode's containerDisk hand-over with KubeVirt's own `container-disk` server (built
 * from the v1.7.0 module): a "container" with its own root serving `disk_0.sock` into a pod's
 * `container-disks` volume, and a "launcher" with its own root and mount namespace, as a
 * launcher pod has them. The handler's mounter binds the container's disk read-only into
 * the launcher's namespace only, a restarted one unmounts it from its record, and symlinks
 * planted in the container's root, the launcher's root or the pod's directory never make it
 * mount or write outside them.
 */
import { buildKubevirtPeers } from "../harness/kubevirt/peers.ts";
import assert from "node:assert/strict";
import { join } from "node:path";
import { writeFileBeneath } from "../../ffi/mod.ts";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { ContainerDiskMounts } from "../../mod/handler/testing.ts";
import { waitFor } from "../helpers/handler_process.ts";

const VOLUME = "volumes/kubernetes.io~empty-dir/container-disks";

function vmi(uid: string, path?: string): VirtualMachineInstance {
  return {
    metadata: { name: "vm1", namespace: "default", uid },
    spec: {
      domain: { devices: {} },
      volumes: [
        { name: "cloudinit", cloudInitNoCloud: { userData: "#cloud-config" } },
        { name: "boot", containerDisk: { image: "example/disk:1", ...(path ? { path } : {}) } },
      ],
    },
  } as unknown as VirtualMachineInstance;
}

/** Starts a process with its own mount namespace and `root` as its root; gives its PID. */
function rooted(
  root: string,
  binds: [string, string][],
  program: string[],
): Deno.ChildProcess {
  const q = (s: string) => `'${s.replaceAll("'", `'\\''`)}'`;
  const script = [
    "set -e",
    `mount --bind ${q(root)} ${q(root)}`,
    ...binds.map(([from, to]) => `mount --bind ${q(from)} ${q(join(root, to))}`),
    `exec chroot ${q(root)} ${program.map(q).join(" ")}`,
  ].join("\n");
  return new Deno.Command("unshare", {
    args: ["--mount", "--propagation", "private", "bash", "-c", script],
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).spawn();
}

/** The PID of `child`'s exec'd program (unshare forks nothing: the PID is the same). */
function pidOf(child: Deno.ChildProcess): number {
  return child.pid;
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

interface World {
  dir: string;
  podDir: string;
  container: Deno.ChildProcess;
  launcher: Deno.ChildProcess;
  launcherRoot: string;
  containerRoot: string;
}

async function world(
  uid: string,
  plant: (w: { containerRoot: string; launcherRoot: string; podDir: string }) => Promise<void> =
    async () => {},
  fn: (w: World) => Promise<void>,
) {
  const kubevirt = await buildKubevirtPeers();
  const dir = await Deno.makeTempDir({ prefix: "virtnode-cdmount-" });
  const podDir = join(dir, "pods", crypto.randomUUID());
  const containerRoot = join(dir, "container");
  const launcherRoot = join(dir, "launcher");
  const shared = `/var/run/kubevirt-ephemeral-disks/container-disk-data/${uid}`;
  await Deno.mkdir(join(podDir, VOLUME), { recursive: true });
  for (const d of ["usr/bin", "disk", "etc", shared.slice(1)]) {
    await Deno.mkdir(join(containerRoot, d), { recursive: true });
  }
  await Deno.copyFile(
    join(kubevirt, "container-disk"),
    join(containerRoot, "usr/bin/container-disk"),
  );
  await Deno.chmod(join(containerRoot, "usr/bin/container-disk"), 0o755);
  await Deno.writeTextFile(join(containerRoot, "disk/disk.img"), "the container's disk\n");
  await Deno.writeTextFile(join(containerRoot, "etc/hostname"), "the container's hostname\n");
  for (const d of ["bin", "var/run/kubevirt/container-disks", "etc"]) {
    await Deno.mkdir(join(launcherRoot, d), { recursive: true });
  }
  await Deno.copyFile("/bin/busybox", join(launcherRoot, "bin/busybox"));
  await plant({ containerRoot, launcherRoot, podDir });
  const container = rooted(containerRoot, [[join(podDir, VOLUME), shared]], [
    "/usr/bin/container-disk",
    "--copy-path",
    `${shared}/disk_1`,
  ]);
  const launcher = rooted(launcherRoot, [], ["/bin/busybox", "sleep", "600"]);
  try {
    await waitFor(
      "the container-disk socket",
      async () =>
        await Deno.stat(join(podDir, VOLUME, "disk_1.sock")).then(() => true, () => false),
      10_000,
    );
    await fn({ dir, podDir, container, launcher, launcherRoot, containerRoot });
  } finally {
    for (const c of [container, launcher]) {
      try {
        c.kill("SIGKILL");
      } catch { /* gone */ }
      await c.status;
    }
    await Deno.remove(dir, { recursive: true });
  }
}

function hostMountsUnder(dir: string): string[] {
  return Deno.readTextFileSync("/proc/self/mountinfo").split("\n").filter((l) => l.includes(dir));
}

Deno.test("containerDisk (KubeVirt mode): the disk is bound read-only into the launcher's namespace only", async () => {
  // The /disk file comes from KubeVirt's container-disk server;
  // a restarted handler unmounts it and ends the server.
  const uid = crypto.randomUUID();
  await world(uid, undefined, async ({ dir, podDir, container, launcher }) => {
    const mounts = new ContainerDiskMounts(join(dir, "records"));
    assert.equal(await mounts.mount(vmi(uid), podDir, pidOf(launcher)), "mounted");
    const seen = await inNs(
      pidOf(launcher),
      "/bin/busybox",
      "cat",
      "/var/run/kubevirt/container-disks/disk_1.img",
    );
    assert.equal(seen.text, "the container's disk\n");
    const write = await inNs(
      pidOf(launcher),
      "/bin/busybox",
      "sh",
      "-c",
      "echo x >> /var/run/kubevirt/container-disks/disk_1.img",
    );
    assert.ok(!write.ok && /Read-only/.test(write.text), `read-only: ${write.text}`);
    assert.deepEqual(hostMountsUnder(dir), [], "no mount in the node's namespace");
    assert.equal(
      await mounts.mount(vmi(uid), podDir, pidOf(launcher)),
      "mounted",
      "a second pass changes nothing",
    );

    // A restarted handler knows the mount from its record alone.
    await new ContainerDiskMounts(join(dir, "records")).unmount(uid);
    const after = await inNs(
      pidOf(launcher),
      "/bin/busybox",
      "cat",
      "/var/run/kubevirt/container-disks/disk_1.img",
    );
    assert.equal(after.text, "", "unmounted: the empty target is left");
    const status = await Promise.race([
      container.status,
      new Promise<undefined>((r) => setTimeout(() => r(undefined), 5_000)),
    ]);
    assert.ok(status, "the container-disk server exits once its socket is gone");
    assert.deepEqual([...Deno.readDirSync(join(dir, "records"))], [], "the record is gone");
  });
});

Deno.test("containerDisk (KubeVirt mode): planted symlinks never lead a mount or a write out of a root", async () => {
  // Links are planted in both the container's root and the launcher's
  // root; neither a mount nor a write beneath a pod escapes them.
  const uid = crypto.randomUUID();
  const hostHostname = await Deno.readTextFile("/etc/hostname");
  await world(uid, async ({ containerRoot, launcherRoot }) => {
    // The image's disk points at /etc/hostname; the launcher's disk folder at /etc.
    await Deno.remove(join(containerRoot, "disk/disk.img"));
    await Deno.symlink("/etc/hostname", join(containerRoot, "disk/disk.img"));
    await Deno.remove(join(launcherRoot, "var/run/kubevirt/container-disks"));
    await Deno.symlink("/etc", join(launcherRoot, "var/run/kubevirt/container-disks"));
  }, async ({ dir, podDir, launcher, launcherRoot }) => {
    const mounts = new ContainerDiskMounts(join(dir, "records"));
    assert.equal(await mounts.mount(vmi(uid), podDir, pidOf(launcher)), "mounted");
    // Both links were followed inside their own roots: the container's hostname file, bound
    // into the launcher root's /etc, nothing of the node's.
    const seen = await inNs(pidOf(launcher), "/bin/busybox", "cat", "/etc/disk_1.img");
    assert.equal(seen.text, "the container's hostname\n");
    assert.ok(
      await Deno.stat(join(launcherRoot, "etc/disk_1.img")),
      "the target was made in the launcher's root",
    );
    assert.equal(
      await Deno.stat("/etc/disk_1.img").catch(() => undefined),
      undefined,
      "nothing in the node's /etc",
    );
    assert.equal(await Deno.readTextFile("/etc/hostname"), hostHostname);
    assert.deepEqual(hostMountsUnder(dir), []);
    await mounts.unmount(uid);

    // A write into the pod (the bridge binding's DHCP facts) replaces a planted link, never follows it.
    const victim = join(dir, "victim");
    await Deno.writeTextFile(victim, "untouched\n");
    const privateDir = join(podDir, "volumes/kubernetes.io~empty-dir/private");
    await Deno.mkdir(privateDir, { recursive: true });
    await Deno.symlink(victim, join(privateDir, "vif-cache-eth0.json"));
    writeFileBeneath(privateDir, "vif-cache-eth0.json", "{}", { mode: 0o604 });
    assert.equal(await Deno.readTextFile(victim), "untouched\n");
    assert.ok((await Deno.lstat(join(privateDir, "vif-cache-eth0.json"))).isFile);
  });
});

Deno.test("containerDisk (KubeVirt mode): an image with two files in /disk is refused naming the volume", async () => {
  // Nothing is mounted.
  const uid = crypto.randomUUID();
  await world(uid, async ({ containerRoot }) => {
    await Deno.writeTextFile(join(containerRoot, "disk/second.img"), "x");
  }, async ({ dir, podDir, launcher }) => {
    const mounts = new ContainerDiskMounts(join(dir, "records"));
    await assert.rejects(
      mounts.mount(vmi(uid), podDir, pidOf(launcher)),
      /Cannot mount containerDisk "boot" of VMI "default\/vm1": more than one file found in folder \/disk/,
    );
    const seen = await inNs(
      pidOf(launcher),
      "/bin/busybox",
      "ls",
      "/var/run/kubevirt/container-disks",
    );
    assert.equal(seen.text.trim(), "");
  });
});

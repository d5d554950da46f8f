/**
 * The handler writes a `downwardMetrics` volume's vhostmd disk inside a launcher's root,
 * which the launcher (and a guest that escaped QEMU) controls: whatever is planted at the
 * disk's name — a link to a node file, a FIFO, a directory — is refused before anything is
 * opened for writing, and the node's file is left as it was. The real disk is written in
 * place.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { openDirectoryInRoot, openRegularFileBeneath } from "../../ffi/mod.ts";

const DIR = "/var/run/kubevirt-private/downwardapi-disks";

Deno.test("the vhostmd disk is opened inside the launcher's root, never through a planted link or FIFO", async () => {
  const base = await Deno.makeTempDir({ prefix: "virtnode-vhostmd-sec-" });
  const root = join(base, "launcher-root");
  const inside = join(root, DIR);
  await Deno.mkdir(inside, { recursive: true });
  const nodeFile = join(base, "node-secret");
  await Deno.writeTextFile(nodeFile, "the node's own file\n");
  const write = (name: string) => {
    const dir = openDirectoryInRoot(root, DIR);
    try {
      const file = openRegularFileBeneath(dir.path, name);
      try {
        file.writeSync(new TextEncoder().encode("mvbd"));
      } finally {
        file.close();
      }
    } finally {
      dir.release();
    }
  };
  try {
    // Links to the node's file: absolute, relative out of the root, and to /proc.
    await Deno.symlink(nodeFile, join(inside, "abs"));
    await Deno.symlink("../../../../../node-secret", join(inside, "rel"));
    await Deno.symlink("/proc/self/root/etc/hostname", join(inside, "proc"));
    for (const name of ["abs", "rel", "proc"]) {
      assert.throws(() => write(name), /Cannot open|ELOOP|Too many levels/, name);
    }
    const fifo = await new Deno.Command("mkfifo", { args: [join(inside, "fifo")] }).output();
    assert.ok(fifo.success, "mkfifo");
    assert.throws(() => write("fifo"), /not a regular file/);
    await Deno.mkdir(join(inside, "dir"));
    assert.throws(() => write("dir"), /not a regular file/);
    assert.throws(() => write("../escape"), /Invalid file name/);
    assert.equal(await Deno.readTextFile(nodeFile), "the node's own file\n", "left as it was");
    // A link on the way to the folder resolves inside the root, as the launcher sees it.
    await Deno.rename(join(root, "var/run"), join(root, "var/run-real"));
    await Deno.symlink("/var/run-real", join(root, "var/run"));
    await Deno.writeTextFile(
      join(root, "var/run-real/kubevirt-private/downwardapi-disks/vhostmd0"),
      "....rest",
    );
    write("vhostmd0");
    assert.equal(
      await Deno.readTextFile(
        join(root, "var/run-real/kubevirt-private/downwardapi-disks/vhostmd0"),
      ),
      "mvbdrest",
      "written in place, not replaced or truncated",
    );
  } finally {
    await Deno.remove(base, { recursive: true });
  }
});

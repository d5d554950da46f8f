/**
 * `bindContainerFile` (a containerDisk's image bound into its launcher) finds the
 * container's root where its file system is mounted on the node, from `mountinfo`, and opens
 * that path. The kernel prints no symlink in it, but one can be there when the path is
 * opened: planted after the read, or under a mount made over a part of the path, which
 * `mountinfo` still lists under its old path. That path is opened with no symlink followed.
 *
 * The stand-ins, each a process in a private mount namespace:
 * - the node: a tmpfs (the container's root file system, with `disk/disk.img` reading
 *   "good") mounted at `<dir>/a/b`; for the planted case a tmpfs then mounted over `<dir>/a`
 *   holds a symlink `b -> <dir>/evil`, where `disk/disk.img` reads "evil";
 * - the container-disk server: `sleep` chrooted into that tmpfs (the host's `/usr` bound in
 *   for it to run), so its root mount is the tmpfs;
 * - the launcher: a tmpfs on `<dir>/target`, where the file is bound.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { bindContainerFileInChild, ErrnoError, runInMountNamespace } from "../../ffi/mod.ts";

/** Starts `sh -c script <dir>` in a private mount namespace; resolves once it printed `ready`. */
async function holder(dir: string, script: string) {
  const child = new Deno.Command("unshare", {
    args: ["--mount", "--propagation", "private", "sh", "-c", script, "sh", dir],
    stdin: "null",
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  const line = (await reader.read()).value?.trim();
  return {
    pid: child.pid,
    line,
    async stop() {
      child.kill("SIGKILL");
      await reader.cancel();
      await child.status;
    },
  };
}

/** The node, the container and the launcher; `plant` lays the symlink. Ends them after `fn`. */
async function withStandIns(
  plant: boolean,
  fn: (pids: { node: number; container: number; launcher: number }, dir: string) => Promise<void>,
) {
  const dir = await Deno.makeTempDir({ prefix: "vn-ctrbind-" });
  await Deno.mkdir(join(dir, "a/b"), { recursive: true });
  await Deno.mkdir(join(dir, "evil/disk"), { recursive: true });
  await Deno.mkdir(join(dir, "target"));
  await Deno.writeTextFile(join(dir, "evil/disk/disk.img"), "evil");
  const node = await holder(
    dir,
    `set -e
D="$1"
mount -t tmpfs vn-ctr-root "$D/a/b"
mkdir "$D/a/b/disk"; echo good > "$D/a/b/disk/disk.img"
unshare --mount --propagation private sh -c '
  for d in usr bin lib lib64; do mkdir -p "$1/a/b/$d"; mount --bind "/$d" "$1/a/b/$d"; done
  exec chroot "$1/a/b" /usr/bin/sleep 120' sh "$D" </dev/null >/dev/null &
echo $! > "$D/container.pid"
while [ "$(readlink /proc/$!/root)" = "/" ]; do sleep 0.05; done
${plant ? `mount -t tmpfs vn-over "$D/a"; ln -s "$D/evil" "$D/a/b"` : ""}
echo ready
exec sleep 120`,
  );
  const launcher = await holder(
    dir,
    `mount -t tmpfs vn-launcher "$1/target" && echo ready && exec sleep 120`,
  );
  const container = Number(await Deno.readTextFile(join(dir, "container.pid")).catch(() => "0"));
  try {
    assert.equal(node.line, "ready");
    assert.equal(launcher.line, "ready");
    await fn({ node: node.pid, container, launcher: launcher.pid }, dir);
  } finally {
    if (container > 0) {
      try {
        Deno.kill(container, "SIGKILL");
      } catch { /* ended */ }
    }
    await node.stop();
    await launcher.stop();
    await Deno.remove(dir, { recursive: true });
  }
}

function bind(pids: { node: number; container: number; launcher: number }, dir: string) {
  return bindContainerFileInChild({
    containerPid: pids.container,
    sourcePath: "/disk/disk.img",
    targetPid: pids.launcher,
    targetDir: join(dir, "target"),
    targetName: "disk.img",
    readonly: true,
    hostPid: pids.node,
  });
}

async function launcherSees(launcher: number, path: string): Promise<string | undefined> {
  try {
    const [text] = await runInMountNamespace(launcher, [{ op: "readTextFile", path }]);
    return text ?? undefined;
  } catch {
    return undefined;
  }
}

Deno.test("bindContainerFile() binds the container's file from where the node mounts its root", async () => {
  await withStandIns(false, async (pids, dir) => {
    assert.equal(await bind(pids, dir), true);
    assert.equal(await launcherSees(pids.launcher, join(dir, "target/disk.img")), "good\n");
  });
});

Deno.test("bindContainerFile() refuses a symlink planted on the path mountinfo gives for the container's root", async () => {
  await withStandIns(true, async (pids, dir) => {
    await assert.rejects(bind(pids, dir), (e: unknown) => {
      assert.ok(e instanceof ErrnoError, String(e));
      assert.equal(e.code, "ELOOP");
      assert.match(
        e.message,
        new RegExp(`^Cannot open the root of process ${pids.container} at "${dir}/a/b" without`),
      );
      return true;
    });
    assert.equal(await launcherSees(pids.launcher, join(dir, "target/disk.img")), undefined);
  });
});

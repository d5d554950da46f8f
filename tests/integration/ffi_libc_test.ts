/**
 * libc through FFI, in throwaway mount namespaces (`unshare --mount --propagation
 * private`) and temp dirs. Needs root.
 */

import assert from "node:assert/strict";
import {
  chownBeneath,
  close,
  connectUnix,
  ErrnoError,
  mountNamespaceOf,
  openBeneath,
  openDirectoryInRoot,
  openRoot,
  peerCredentials,
  runInMountNamespace,
} from "../../ffi/mod.ts";

/** A process sleeping in a fresh private mount namespace, with a tmpfs on `dir`. */
async function namespaceHolder(dir: string) {
  const child = new Deno.Command("unshare", {
    args: [
      "--mount",
      "--propagation",
      "private",
      "sh",
      "-c",
      `mount -t tmpfs vn-ffi-test ${dir} && echo private > ${dir}/marker && echo ready && exec sleep 60`,
    ],
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  const { value } = await reader.read();
  assert.equal(value?.trim(), "ready");
  return {
    pid: child.pid,
    async stop() {
      child.kill("SIGKILL");
      await reader.cancel();
      await child.status;
    },
  };
}

function mountedAt(mountinfo: string, dir: string): boolean {
  return mountinfo.split("\n").some((line) => line.split(" ")[4] === dir);
}

Deno.test("entering another process's mount namespace shows its mounts and leaves ours alone", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vn-ffi-ns-" });
  const holder = await namespaceHolder(dir);
  try {
    const before = mountNamespaceOf("self");
    const [mountinfo, marker] = await runInMountNamespace(holder.pid, [
      { op: "mountinfo" },
      { op: "readTextFile", path: `${dir}/marker` },
    ]);
    assert.ok(mountedAt(mountinfo!, dir), "the holder's tmpfs is visible inside");
    assert.equal(marker!.trim(), "private");
    assert.equal(mountNamespaceOf("self"), before, "our mount namespace is unchanged");
    assert.equal(mountNamespaceOf("thread-self"), before);
    assert.notEqual(mountNamespaceOf(holder.pid), before);
    assert.ok(!mountedAt(await Deno.readTextFile("/proc/self/mountinfo"), dir));
    await assert.rejects(Deno.stat(`${dir}/marker`), Deno.errors.NotFound);
  } finally {
    await holder.stop();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a failing action in another namespace comes back as a typed errno error", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vn-ffi-nserr-" });
  const holder = await namespaceHolder(dir);
  try {
    await assert.rejects(
      runInMountNamespace(holder.pid, [
        { op: "unmountFile", dir: `${dir}/marker`, name: "x" },
      ]),
      (e: unknown) => {
        assert.ok(e instanceof ErrnoError);
        assert.equal(e.code, "ENOTDIR");
        assert.match(e.message, /^Cannot open ".*\/marker" beneath its root: ENOTDIR: /);
        return true;
      },
    );
  } finally {
    await holder.stop();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("chownBeneath() refuses to follow a symlink out of the root", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vn-ffi-beneath-" });
  try {
    const root = `${dir}/root`;
    const outside = `${dir}/outside`;
    await Deno.mkdir(`${root}/sub`, { recursive: true });
    await Deno.writeTextFile(outside, "secret");
    await Deno.writeTextFile(`${root}/sub/file`, "mine");
    await Deno.symlink(outside, `${root}/escape`);

    chownBeneath(root, "sub/file", 4242, 4242);
    assert.equal((await Deno.stat(`${root}/sub/file`)).uid, 4242);

    assert.throws(() => chownBeneath(root, "escape", 4242, 4242), (e: unknown) => {
      assert.ok(e instanceof ErrnoError);
      assert.equal(e.code, "ELOOP");
      assert.match(e.message, /^Cannot open "escape" beneath its root: ELOOP: /);
      return true;
    });
    assert.equal((await Deno.stat(outside)).uid, 0, "the outside file keeps its owner");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("openBeneath() refuses .. past the root with EXDEV and opens paths inside", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vn-ffi-openat2-" });
  try {
    await Deno.mkdir(`${dir}/root/a`, { recursive: true });
    await Deno.writeTextFile(`${dir}/secret`, "x");
    const rootFd = openRoot(`${dir}/root`);
    try {
      close(openBeneath(rootFd, "a"));
      close(openBeneath(rootFd, "a/../a"));
      assert.throws(() => openBeneath(rootFd, "../secret"), (e: unknown) => {
        assert.ok(e instanceof ErrnoError);
        assert.equal(e.code, "EXDEV");
        return true;
      });
      assert.throws(() => openBeneath(rootFd, `${dir}/secret`), (e: unknown) => {
        assert.ok(e instanceof ErrnoError);
        assert.equal(e.code, "EXDEV", "absolute paths leave the root too");
        return true;
      });
      assert.throws(() => openBeneath(rootFd, "missing"), (e: unknown) => {
        assert.ok(e instanceof ErrnoError);
        assert.equal(e.code, "ENOENT");
        return true;
      });
    } finally {
      close(rootFd);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("peerCredentials() returns the PID of the process at the other end", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vn-ffi-peer-" });
  const path = `${dir}/sock`;
  const server = new Deno.Command("python3", {
    args: [
      "-c",
      `import socket,sys
s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(1)
print("ready", flush=True)
c,_=s.accept(); c.recv(1)`,
      path,
    ],
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const reader = server.stdout.pipeThrough(new TextDecoderStream()).getReader();
  try {
    assert.equal((await reader.read()).value?.trim(), "ready");
    const fd = await connectUnix(path);
    try {
      const cred = peerCredentials(fd);
      assert.equal(cred.pid, server.pid);
      assert.equal(cred.uid, Deno.uid());
    } finally {
      close(fd);
    }
    assert.equal((await server.status).success, true);
  } finally {
    await reader.cancel();
    try {
      server.kill("SIGKILL");
    } catch {
      // Already exited.
    }
    await server.status;
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("connecting to a missing socket gives ENOENT with the path", async () => {
  await assert.rejects(connectUnix("/nonexistent/vn.sock"), (e: unknown) => {
    assert.ok(e instanceof ErrnoError);
    assert.equal(e.code, "ENOENT");
    assert.equal(e.errno, 2);
    assert.match(e.message, /^Cannot connect to "\/nonexistent\/vn\.sock": ENOENT: /);
    return true;
  });
});

Deno.test("openDirectoryInRoot() follows a pod's links as the pod sees them and never out of its root", async () => {
  const dir = await Deno.makeTempDir({ prefix: "virtnode-inroot-" });
  const outside = await Deno.makeTempDir({ prefix: "virtnode-outside-" });
  try {
    const root = `${dir}/root`;
    await Deno.mkdir(`${root}/run/kubevirt`, { recursive: true });
    await Deno.mkdir(`${root}/var`, { recursive: true });
    // A container's /var/run -> /run: absolute, so it means the root's /run.
    await Deno.symlink("/run", `${root}/var/run`);
    const share = openDirectoryInRoot(root, "var/run/kubevirt");
    try {
      await Deno.writeTextFile(`${share.path}/made-here`, "x");
    } finally {
      share.release();
    }
    assert.equal(await Deno.readTextFile(`${root}/run/kubevirt/made-here`), "x");

    // A pod that points its share directory at the host: absolute and `..` links both
    // stay inside the root, so the host directory is never reached.
    await Deno.remove(`${root}/run/kubevirt`, { recursive: true });
    await Deno.symlink(outside, `${root}/run/kubevirt`);
    assert.throws(() => openDirectoryInRoot(root, "var/run/kubevirt"), ErrnoError);
    await Deno.remove(`${root}/run/kubevirt`);
    await Deno.symlink(`../../../../../../..${outside}`, `${root}/run/kubevirt`);
    assert.throws(() => openDirectoryInRoot(root, "var/run/kubevirt"), ErrnoError);
    assert.deepEqual([...Deno.readDirSync(outside)], [], "nothing reached the outside directory");
    // /proc/<pid>/root magic links are not followed either.
    await Deno.remove(`${root}/run/kubevirt`);
    await Deno.symlink("/proc/self/root/tmp", `${root}/run/kubevirt`);
    assert.throws(() => openDirectoryInRoot(root, "var/run/kubevirt"), ErrnoError);
  } finally {
    await Deno.remove(dir, { recursive: true });
    await Deno.remove(outside, { recursive: true });
  }
});

import assert from "node:assert/strict";
import { join } from "node:path";
import { GhostRecordError, GhostRecordStore } from "../../mod/handler/testing.ts";

const record = {
  name: "vm1",
  namespace: "default",
  socketFile: "/var/run/kubevirt/sockets/u-1/launcher-sock",
  uid: "u-1",
};

Deno.test("GhostRecordStore writes a 0600 file named by UID and reads it back after a restart", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const store = new GhostRecordStore(dir);
    await store.load();
    await store.add(record);
    const stat = await Deno.stat(join(dir, "u-1"));
    assert.equal(stat.mode! & 0o777, 0o600);
    assert.deepEqual(JSON.parse(await Deno.readTextFile(join(dir, "u-1"))), record);
    assert.deepEqual([...Deno.readDirSync(dir)].map((e) => e.name), ["u-1"]);

    const restarted = new GhostRecordStore(dir);
    assert.deepEqual(await restarted.load(), []);
    assert.deepEqual(restarted.list(), [record]);
    assert.equal(restarted.lastKnownUid("default/vm1"), "u-1");
    assert.equal(restarted.lastKnownUid("default/other"), undefined);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("GhostRecordStore sets aside corrupt and foreign files and keeps the good ones", async () => {
  const dir = await Deno.makeTempDir();
  try {
    await Deno.writeTextFile(join(dir, "u-1"), JSON.stringify(record));
    await Deno.writeTextFile(join(dir, "u-2"), '{"name": "vm2", "namesp');
    await Deno.writeTextFile(join(dir, "notes.txt"), "hello");
    await Deno.writeTextFile(join(dir, "u-3"), JSON.stringify({ ...record, uid: "u-4" }));
    await Deno.symlink("/etc/passwd", join(dir, "u-5"));
    await Deno.writeTextFile(join(dir, ".tmp-u-6-x"), "half");
    const store = new GhostRecordStore(dir);
    const aside = await store.load();
    assert.deepEqual(store.list(), [record]);
    const reasons = Object.fromEntries(aside.map((a) => [a.file.split("/").pop(), a.reason]));
    assert.match(reasons["u-2"], /unreadable/);
    assert.match(reasons["notes.txt"], /not a JSON object|unreadable/);
    assert.match(reasons["u-3"], /does not match uid/);
    assert.match(reasons["u-5"], /symbolic link/);
    const left = [...Deno.readDirSync(dir)].map((e) => e.name).sort();
    assert.deepEqual(left, [".set-aside", "u-1"]);
    assert.equal([...Deno.readDirSync(join(dir, ".set-aside"))].length, 4);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("GhostRecordStore refuses records whose UID could escape the directory", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const store = new GhostRecordStore(dir);
    await assert.rejects(store.add({ ...record, uid: "../../etc/x" }), GhostRecordError);
    await assert.rejects(store.add({ ...record, socketFile: "relative" }), /absolute/);
    assert.deepEqual([...Deno.readDirSync(dir)], []);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("GhostRecordStore.delete() removes the file and a second delete is fine", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const store = new GhostRecordStore(dir);
    await store.add(record);
    await store.add(record);
    await assert.rejects(store.add({ ...record, socketFile: "/other" }), /exists/);
    await store.delete("u-1");
    await store.delete("u-1");
    assert.deepEqual(store.list(), []);
    assert.deepEqual([...Deno.readDirSync(dir)], []);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

/**
 * A stand-in launcher: one process whose command line reads like a launcher's (nothing
 * is left behind when the test SIGKILLs it).
 */
function standInLauncher(uid: string): Deno.ChildProcess {
  return new Deno.Command("/usr/bin/python3", {
    args: ["-c", "import time; time.sleep(30)", "virtnode", "launcher", "--uid", uid],
    stdin: "null",
    stdout: "null",
    stderr: "null",
  }).spawn();
}

Deno.test("findLauncherByUid() finds a launcher process by the --uid on its command line", async () => {
  const { findLauncherByUid } = await import("../../mod/handler/testing.ts");
  const uid = `u-${crypto.randomUUID()}`;
  const child = standInLauncher(uid);
  try {
    let found: number | undefined;
    for (let i = 0; i < 50 && found === undefined; i++) {
      found = await findLauncherByUid(uid);
      if (found === undefined) await new Promise((r) => setTimeout(r, 20));
    }
    assert.equal(found, child.pid);
    assert.equal(await findLauncherByUid(`${uid}-other`), undefined);
  } finally {
    child.kill("SIGKILL");
    await child.status;
  }
});

Deno.test("LauncherSpawner.ensurePidFile() writes a /proc-found launcher's PID and start-time files once", async () => {
  const { LauncherSpawner } = await import("../../mod/handler/testing.ts");
  const { processStartTime } = await import("../../ffi/mod.ts");
  const dir = await Deno.makeTempDir();
  const uid = `u-${crypto.randomUUID()}`;
  // A launcher whose handler was killed before it wrote the files: a stand-in process
  // whose command line reads like a launcher's.
  const child = standInLauncher(uid);
  try {
    const spawner = new LauncherSpawner({
      stateDir: dir,
      command: () => ({ cmd: "false", args: [] }),
    });
    await Deno.mkdir(`${dir}/launchers`);
    const pidFile = `${dir}/launchers/${uid}.pid`;
    for (let i = 0; i < 50; i++) {
      await spawner.ensurePidFile(uid);
      if (await Deno.stat(pidFile).then(() => true, () => false)) break;
      await new Promise((r) => setTimeout(r, 20));
    }
    assert.equal((await Deno.readTextFile(pidFile)).trim(), String(child.pid));
    assert.equal(
      (await Deno.readTextFile(`${dir}/launchers/${uid}.start`)).trim(),
      processStartTime(child.pid),
    );
    // A PID file that exists is left as it is.
    await Deno.writeTextFile(pidFile, "12345\n");
    await spawner.ensurePidFile(uid);
    assert.equal(await Deno.readTextFile(pidFile), "12345\n");
    spawner.release();
  } finally {
    child.kill("SIGKILL");
    await child.status;
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("GhostRecordStore.findByKey() follows adds and deletes of records sharing a name", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const store = new GhostRecordStore(dir);
    await store.add(record);
    await store.add({ ...record, uid: "u-2", socketFile: "/run/s/u-2/launcher-sock" });
    await store.add({ ...record, name: "vm2", uid: "u-3", socketFile: "/run/s/u-3/sock" });
    assert.deepEqual(store.findByKey("default/vm1").map((r) => r.uid).sort(), ["u-1", "u-2"]);
    await store.delete("u-1");
    assert.deepEqual(store.findByKey("default/vm1").map((r) => r.uid), ["u-2"]);
    await store.delete("u-2");
    assert.deepEqual(store.findByKey("default/vm1"), []);
    assert.equal(store.lastKnownUid("default/vm2"), "u-3");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("GhostRecordStore: 50 writes at once (two fsyncs at a time) all land, no temporary file left", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const store = new GhostRecordStore(join(dir, "ghosts"));
    const uids = Array.from({ length: 50 }, (_, i) => `u-${i}`);
    await Promise.all(
      uids.map((uid, i) => store.add({ ...record, uid, name: `vm${i}`, socketFile: `/s/${uid}` })),
    );
    const names = [...Deno.readDirSync(join(dir, "ghosts"))].map((e) => e.name).sort();
    assert.deepEqual(names, [...uids].sort());
    const restarted = new GhostRecordStore(join(dir, "ghosts"));
    await restarted.load();
    assert.equal(restarted.list().length, 50);
    // A refused write (another socket for a known UID) leaves later writes working.
    await assert.rejects(store.add({ ...record, uid: "u-0", socketFile: "/other" }));
    await store.add({ ...record, uid: "u-50", name: "vm50", socketFile: "/s/u-50" });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("GhostRecordStore makes its directory again when it was removed after load", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const store = new GhostRecordStore(join(dir, "ghosts"));
    await store.load();
    await Deno.remove(join(dir, "ghosts"), { recursive: true });
    await store.add(record);
    assert.deepEqual(JSON.parse(await Deno.readTextFile(join(dir, "ghosts", "u-1"))), record);
    assert.equal((await Deno.stat(join(dir, "ghosts"))).mode! & 0o777, 0o700);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

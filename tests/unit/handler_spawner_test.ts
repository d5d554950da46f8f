import assert from "node:assert/strict";
import { LauncherSpawner, type LauncherSpawnerOptions } from "../../mod/handler/testing.ts";

Deno.test("LauncherSpawner lets only maxStarting launchers start at once and frees a slot when one is ready", async () => {
  const dir = await Deno.makeTempDir();
  const ready: string[] = [];
  const spawner = new LauncherSpawner({
    stateDir: `${dir}/state`,
    maxStarting: 2,
    // A stand-in launcher: its socket appears after a second, then it idles.
    command: (spec) => ({
      cmd: "sh",
      args: ["-c", `sleep 1; touch "${spec.socketDir}/launcher-sock"; exec sleep 30`, spec.uid],
    }),
    onReady: (uid) => ready.push(uid),
  });
  const spec = (uid: string) => ({
    namespace: "default",
    name: uid,
    uid,
    gracePeriodSeconds: 0,
    socketDir: `${dir}/sockets/${uid}`,
  });
  try {
    assert.equal(await spawner.everStarted("a"), false, "nothing was ever started for a");
    assert.equal(spawner.canStart(), true);
    await spawner.start(spec("a"));
    await spawner.start(spec("b"));
    assert.equal(spawner.canStart(), false, "two are starting");
    assert.equal(await spawner.everStarted("a"), true);
    // The slot is freed because a launcher became ready: its socket is there at that moment
    // (not a time: a loaded machine took 100 ms of the 200 it once waited to start the two).
    const sockets = () =>
      ["a", "b"].filter((uid) => {
        try {
          return Deno.statSync(`${spec(uid).socketDir}/launcher-sock`).isFile;
        } catch {
          return false;
        }
      });
    assert.deepEqual(sockets(), [], "neither launcher is ready yet");
    const readyAtFree = await new Promise<string[]>((resolve) => {
      spawner.onSlotFree(() => resolve(sockets()));
    });
    assert.ok(readyAtFree.length >= 1, "a slot was freed before any launcher was ready");
    assert.equal(spawner.canStart(), true);
    await new Promise((r) => setTimeout(r, 500));
    assert.deepEqual(ready.sort(), ["a", "b"]);
  } finally {
    await spawner.stop("a", 2_000);
    await spawner.stop("b", 2_000);
    await Deno.remove(dir, { recursive: true });
  }
});

/**
 * A process whose command line reads like the UID's launcher, `python3 -c <script> virtnode
 * launcher --uid <uid>` (or `argv` after the script); on SIGTERM it exits 0.
 */
async function standIn(uid: string, options: { argv?: string[]; runAs?: number } = {}) {
  // One process (no child to orphan when it is SIGKILLed) that exits 0 on SIGTERM.
  const script = "import signal, sys, time\n" +
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n" +
    "time.sleep(30)";
  const argv = [
    "/usr/bin/python3",
    "-c",
    script,
    ...options.argv ?? ["virtnode", "launcher", "--uid", uid],
  ];
  const [cmd, ...args] = options.runAs === undefined ? argv : [
    "setpriv",
    `--reuid=${options.runAs}`,
    `--regid=${options.runAs}`,
    "--clear-groups",
    ...argv,
  ];
  const child = new Deno.Command(cmd, { args, stdin: "null", stdout: "null", stderr: "null" })
    .spawn();
  await untilTrapped(child.pid);
  let exited = false;
  child.status.then(() => exited = true);
  return {
    pid: child.pid,
    child,
    exited: () => exited,
    async end() {
      if (!exited) child.kill("SIGTERM");
      await child.status;
    },
  };
}

/**
 * Until the process catches or ignores SIGTERM (`SigCgt`/`SigIgn` of /proc/<pid>/status):
 * then the stand-in has set its handler, after setpriv (if any) exec'd it.
 */
async function untilTrapped(pid: number): Promise<void> {
  const SIGTERM_BIT = 1n << 14n;
  for (let i = 0; i < 500; i++) {
    const status = await Deno.readTextFile(`/proc/${pid}/status`).catch(() => "");
    const mask = (name: string) =>
      BigInt(`0x${new RegExp(`^${name}:\\s*([0-9a-f]+)`, "m").exec(status)?.[1] ?? "0"}`);
    if (((mask("SigCgt") | mask("SigIgn")) & SIGTERM_BIT) !== 0n) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error(`Cannot start stand-in launcher ${pid}: it never trapped SIGTERM`);
}

/** Field 22 of /proc/<pid>/stat, counted from after the command name's last ")". */
function startTimeOf(pid: number): string {
  const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
  return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19];
}

function spawnerIn(dir: string, options: Partial<LauncherSpawnerOptions> = {}) {
  return new LauncherSpawner({
    stateDir: `${dir}/state`,
    command: () => ({ cmd: "false", args: [] }),
    ...options,
  });
}

async function writePidFile(dir: string, uid: string, text: string): Promise<void> {
  await Deno.mkdir(`${dir}/state/launchers`, { recursive: true });
  await Deno.writeTextFile(`${dir}/state/launchers/${uid}.pid`, text);
}

Deno.test("stop() signals nothing when the launcher died and its PID went to a look-alike started later", async () => {
  const dir = await Deno.makeTempDir();
  const uid = `u-${crypto.randomUUID()}`;
  const first = spawnerIn(dir, { command: () => ({ cmd: "sleep", args: ["30"] }) });
  await first.start({
    namespace: "default",
    name: "vm",
    uid,
    gracePeriodSeconds: 0,
    socketDir: `${dir}/s`,
  });
  const launchers = `${dir}/state/launchers`;
  const recorded = new Map<string, string>();
  for (const e of Deno.readDirSync(launchers)) {
    recorded.set(e.name, Deno.readTextFileSync(`${launchers}/${e.name}`));
  }
  const dead = await first.alivePid(uid);
  await first.stop(uid, 0);
  // Its PID went to a process with the same command line: the files, as the spawner wrote
  // them, now name that one. Only the start time tells them apart, counted in clock ticks
  // (1/100 s): a real PID reuse takes a wrap of the whole PID space, this one a pause.
  await new Promise((r) => setTimeout(r, 50));
  const other = await standIn(uid);
  try {
    for (const [name, text] of recorded) {
      const replaced = name.endsWith(".pid") ? text.replace(String(dead), String(other.pid)) : text;
      await Deno.writeTextFile(`${launchers}/${name}`, replaced);
    }
    const spawner = spawnerIn(dir);
    assert.equal(await spawner.alivePid(uid), undefined, "a process started later is not it");
    await spawner.stop(uid, 200);
    await new Promise((r) => setTimeout(r, 200));
    assert.equal(other.exited(), false, "stop() signalled a process that is not the launcher");
  } finally {
    await other.end();
    // The first "launcher" is a plain sleep the spawner will not recognise: end it here.
    try {
      if (Deno.readTextFileSync(`/proc/${dead}/cmdline`).startsWith("sleep\0")) {
        Deno.kill(dead!, "SIGKILL");
      }
    } catch { /* gone */ }
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("stop() signals nothing when a one-number PID file names a process that is no launcher", async () => {
  // The process's command line is not the launcher's.
  const dir = await Deno.makeTempDir();
  const uid = `u-${crypto.randomUUID()}`;
  // Carries the UID, but is no `launcher --uid <uid>`.
  const other = await standIn(uid, { argv: ["virtnode", "launcher-log", uid] });
  try {
    await writePidFile(dir, uid, `${other.pid}\n`);
    const spawner = spawnerIn(dir);
    assert.equal(await spawner.alivePid(uid), undefined);
    await spawner.stop(uid, 200);
    await new Promise((r) => setTimeout(r, 200));
    assert.equal(other.exited(), false, "stop() signalled a process that is not the launcher");
  } finally {
    await other.end();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test({
  name: "stop() signals nothing when the PID file names a launcher look-alike of another user",
  ignore: Deno.uid() !== 0, // only root starts a process as another user
  async fn() {
    const dir = await Deno.makeTempDir();
    const uid = `u-${crypto.randomUUID()}`;
    const other = await standIn(uid, { runAs: 65534 });
    try {
      // No start time to compare (as handlers before it wrote): the owner must decide.
      await writePidFile(dir, uid, `${other.pid}\n`);
      const spawner = spawnerIn(dir);
      assert.equal(await spawner.alivePid(uid), undefined, "not run by the handler's user");
      await spawner.stop(uid, 200);
      await new Promise((r) => setTimeout(r, 200));
      assert.equal(other.exited(), false, "stop() signalled another user's process");
    } finally {
      await other.end();
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test("A restarted handler finds a launcher by its PID file and stop() ends it", async () => {
  // The PID file may hold the launcher's start time or not.
  const dir = await Deno.makeTempDir();
  const uid = `u-${crypto.randomUUID()}`;
  const launcher = await standIn(uid);
  try {
    const spawner = spawnerIn(dir);
    await writePidFile(dir, uid, `${launcher.pid}\n`); // as handlers before start times wrote
    assert.equal(await spawner.alivePid(uid), launcher.pid);
    await Deno.writeTextFile(
      `${dir}/state/launchers/${uid}.start`,
      `${startTimeOf(launcher.pid)}\n`,
    );
    assert.equal(await spawner.alivePid(uid), launcher.pid);
    assert.equal(await spawner.everStarted(uid), true);
    await spawner.stop(uid, 5_000);
    // Exited: reaped, or a zombie until this test's Deno reaps it.
    const stat = await Deno.readTextFile(`/proc/${launcher.pid}/stat`).catch(() => ") Z");
    assert.equal(stat[stat.lastIndexOf(")") + 2], "Z", "stop() returns once the launcher is gone");
    assert.equal((await launcher.child.status).code, 0, "it stopped on SIGTERM (its trap)");
    assert.equal(await spawner.alivePid(uid), undefined);
  } finally {
    await launcher.end();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test('stop() SIGKILLs a launcher that ignores SIGTERM, though its command name holds ") "', async () => {
  // An earlier handler spawned it.
  const dir = await Deno.makeTempDir();
  const uid = `u-${crypto.randomUUID()}`;
  // The command name (field 2 of /proc/<pid>/stat) becomes "vn) 1 2 3" after exec: the
  // start time recorded at spawn time (name "sh") must still match.
  const bash = `${dir}/vn) 1 2 3`;
  await Deno.copyFile("/bin/bash", bash);
  await Deno.chmod(bash, 0o755);
  const exits: [string, number, string | null][] = [];
  const first = spawnerIn(dir, {
    command: () => ({
      cmd: bash,
      args: [
        "-c",
        "trap '' TERM; while :; do sleep 0.1; done",
        "virtnode",
        "launcher",
        "--uid",
        uid,
      ],
    }),
    onExit: (u, code, signal) => exits.push([u, code, signal]),
  });
  const spec = {
    namespace: "default",
    name: "vm",
    uid,
    gracePeriodSeconds: 0,
    socketDir: `${dir}/s`,
  };
  try {
    await first.start(spec);
    const pid = await first.alivePid(uid);
    assert.ok(pid !== undefined);
    const files = `${dir}/state/launchers/${uid}`;
    assert.equal((await Deno.readTextFile(`${files}.pid`)).trim(), String(pid), "one number");
    assert.match(await Deno.readTextFile(`${files}.start`), /^\d+\n$/, "the start time is kept");
    await untilTrapped(pid);
    const restarted = spawnerIn(dir);
    assert.equal(await restarted.alivePid(uid), pid, "found again after the handler's restart");
    const t = performance.now();
    await restarted.stop(uid, 300);
    assert.ok(performance.now() - t >= 300, "SIGTERM was given its time");
    assert.equal(await restarted.alivePid(uid), undefined);
    const left = [...Deno.readDirSync(`${dir}/state/launchers`)].map((e) => e.name).sort();
    assert.deepEqual(left, [`${uid}.log`], "PID and start files are removed, the log stays");
    for (let i = 0; exits.length === 0; i++) {
      assert.ok(i < 100, "the first handler never saw its launcher exit");
      await new Promise((r) => setTimeout(r, 20));
    }
    assert.deepEqual(exits, [[uid, 137, "SIGKILL"]]);
  } finally {
    await first.stop(uid, 0);
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("A restarted handler finds a launcher that has no PID file in /proc and writes its PID and start time", async () => {
  const dir = await Deno.makeTempDir();
  const uid = `u-${crypto.randomUUID()}`;
  const launcher = await standIn(uid);
  try {
    const spawner = spawnerIn(dir);
    await Deno.mkdir(`${dir}/state/launchers`, { recursive: true });
    assert.equal(await spawner.alivePid(uid), launcher.pid);
    assert.equal(
      (await Deno.readTextFile(`${dir}/state/launchers/${uid}.pid`)).trim(),
      String(launcher.pid),
    );
    assert.equal(
      (await Deno.readTextFile(`${dir}/state/launchers/${uid}.start`)).trim(),
      String(startTimeOf(launcher.pid)),
    );
  } finally {
    await launcher.end();
    await Deno.remove(dir, { recursive: true });
  }
});

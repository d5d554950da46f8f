/**
 * The handler finds a launcher (or a container-disk server, or an attachment pod) as the
 * process that listens on its socket, then acts on that PID: it opens `/proc/<pid>/root`
 * to make sockets, bind files and hand devices there. `SO_PEERCRED` gives the PID of the
 * process that called `listen(2)`, even after that process has exited and its PID went to
 * another one. A pod can arrange that: listen, hand the socket to a child, exit. The PID is
 * checked against a pidfd of the listener (`SO_PEERPIDFD`, Linux 6.5) where the kernel has
 * it, and to name a running process where it has not.
 *
 * The listeners here are Debian's python3: one that listens and stays, one that listens,
 * forks a child that keeps the socket, and exits; and for the PID taken over, a process
 * made to get the exited listener's PID (`/proc/sys/kernel/ns_last_pid`, as root).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { ErrnoError, listenerPid } from "../../ffi/mod.ts";

const PYTHON = "/usr/bin/python3";

/**
 * Runs `script` (python, with the socket path as its argument) and reads its first line;
 * the script and whatever it leaves running are ended after `fn`.
 */
async function withPython(
  script: string,
  fn: (path: string, firstLine: string, dir: string) => Promise<void>,
): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "vn-peer-" });
  const path = join(dir, "cmd.sock");
  const child = new Deno.Command(PYTHON, {
    args: ["-c", script, path],
    stdin: "null",
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  try {
    const line = (await reader.read()).value?.trim() ?? "";
    await fn(path, line, dir);
  } finally {
    try {
      child.kill("SIGKILL");
    } catch { /* exited already */ }
    await reader.cancel();
    await child.status;
    // The processes the scripts left running, by the PIDs they wrote down. A file read
    // before its write is empty, and Number("") is 0: kill(0) is this test's own process
    // group, which once ended a whole CI run. Only a whole PID above 1 is signalled.
    for (const name of ["holder.pid", "impostor.pid"]) {
      const text = await Deno.readTextFile(join(dir, name)).catch(() => "");
      const pid = /^\d+$/.test(text.trim()) ? Number(text.trim()) : 0;
      try {
        if (pid > 1) Deno.kill(pid, "SIGKILL");
      } catch { /* ended */ }
    }
    await Deno.remove(dir, { recursive: true });
  }
}

/**
 * Listens, forks a child that keeps the socket and exits; prints the listener's PID once
 * the child has written its own PID down whole (so cleanup always finds it).
 */
const LISTEN_AND_EXIT = `import os, socket, sys, time
path = sys.argv[1]
s = socket.socket(socket.AF_UNIX); s.bind(path); s.listen(8)
ready_r, ready_w = os.pipe()
if os.fork() == 0:
    devnull = os.open("/dev/null", os.O_WRONLY); os.dup2(devnull, 1); os.dup2(devnull, 2)
    pidfile = os.path.join(os.path.dirname(path), "holder.pid")
    with open(pidfile + ".tmp", "w") as f: f.write(str(os.getpid()))
    os.rename(pidfile + ".tmp", pidfile)
    os.write(ready_w, b"1")
    time.sleep(120); os._exit(0)
os.read(ready_r, 1)
print(os.getpid(), flush=True)
os._exit(0)`;

/** Waits until the process `pid` is gone (exited and reaped). */
async function gone(pid: number): Promise<void> {
  for (let i = 0; i < 100; i++) {
    try {
      await Deno.stat(`/proc/${pid}`);
    } catch {
      return;
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`Process ${pid} did not end`);
}

function exited(pid: number) {
  return (e: unknown) => {
    assert.ok(e instanceof ErrnoError, String(e));
    assert.equal(e.code, "ESRCH");
    assert.match(e.message, new RegExp(`process ${pid}, which listens, has exited`));
    return true;
  };
}

Deno.test("listenerPid() gives the PID of a listener that runs, with its pidfd or without", async () => {
  await withPython(
    `import os, socket, sys, time
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(8)
print(os.getpid(), flush=True)
time.sleep(120)`,
    async (path, line) => {
      assert.equal(await listenerPid(path), Number(line));
      assert.equal(await listenerPid(path, { pidfd: false }), Number(line));
    },
  );
});

Deno.test("listenerPid() refuses a listener whose listening process has exited, with its pidfd or without", async () => {
  await withPython(LISTEN_AND_EXIT, async (path, line) => {
    const pid = Number(line);
    await gone(pid);
    await assert.rejects(async () => await listenerPid(path), exited(pid));
    await assert.rejects(async () => await listenerPid(path, { pidfd: false }), exited(pid));
  });
});

Deno.test("listenerPid() refuses a PID another process took after the listener exited (SO_PEERPIDFD)", async () => {
  const release = Deno.osRelease().split(".").map(Number);
  assert.ok(
    release[0] > 6 || (release[0] === 6 && release[1] >= 5),
    `this test needs SO_PEERPIDFD (Linux 6.5); the kernel is ${Deno.osRelease()}`,
  );
  await withPython(LISTEN_AND_EXIT, async (path, line, dir) => {
    const pid = Number(line);
    await gone(pid);
    // A process made to get the freed PID: the next PID given out is ns_last_pid + 1.
    const taken = await new Deno.Command(PYTHON, {
      args: [
        "-c",
        `import os, sys, time
want = int(sys.argv[1])
for attempt in range(200):
    open("/proc/sys/kernel/ns_last_pid", "w").write(str(want - 1))
    pid = os.fork()
    if pid == 0:
        if os.getpid() == want:
            os.setsid()
            devnull = os.open("/dev/null", os.O_WRONLY); os.dup2(devnull, 1); os.dup2(devnull, 2)
            time.sleep(120)
        os._exit(0)
    if pid == want:
        open(sys.argv[2], "w").write(str(pid)); print("taken"); sys.exit(0)
    os.waitpid(pid, 0)
print("not taken")`,
        String(pid),
        join(dir, "impostor.pid"),
      ],
      stdin: "null",
      stdout: "piped",
      stderr: "inherit",
    }).output();
    assert.equal(new TextDecoder().decode(taken.stdout).trim(), "taken");
    await Deno.stat(`/proc/${pid}`); // another process has the listener's PID now
    await assert.rejects(async () => await listenerPid(path), exited(pid));
    // Without a pidfd (kernels before 6.5) the taken PID cannot be told from the listener's.
    assert.equal(await listenerPid(path, { pidfd: false }), pid);
  });
});

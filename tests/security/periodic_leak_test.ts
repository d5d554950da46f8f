/**
 * The handler's periodic loops hold nothing per round (issue 34, H3): each runs many
 * rounds under one long-lived signal whose abort listeners are counted, and the number of
 * live listeners must not grow with the rounds. A listener left behind each round keeps
 * its closure (and what that holds) until the handler stops: the TLS file watcher's, one
 * every 2 s per watched certificate, grew the heap by about 38 MB a day. The count is
 * exact where a heap reading would need a forced collection `deno test` does not offer.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { every, sleep } from "../../mod/lifecycle/mod.ts";
import { TlsMaterial } from "../../mod/rest/mod.ts";
import { GhostRecordStore } from "../../mod/handler/testing.ts";
import { PodlessLaunchers } from "../../mod/handler/testing.ts";
import { makeCertificates } from "../helpers/rest_client.ts";

/** A signal whose abort listeners are counted as they are added and taken off. */
function countedSignal() {
  const controller = new AbortController();
  const signal = controller.signal;
  const live = new Set<unknown>();
  let added = 0;
  let most = 0;
  const add = signal.addEventListener.bind(signal);
  const remove = signal.removeEventListener.bind(signal);
  signal.addEventListener = ((type: string, listener: EventListener, options?: unknown) => {
    if (type === "abort") {
      added++;
      live.add(listener);
      most = Math.max(most, live.size);
    }
    add(type, listener, options as AddEventListenerOptions);
  }) as typeof signal.addEventListener;
  signal.removeEventListener = ((type: string, listener: EventListener, options?: unknown) => {
    if (type === "abort") live.delete(listener);
    remove(type, listener, options as EventListenerOptions);
  }) as typeof signal.removeEventListener;
  return {
    signal,
    abort: () => controller.abort(),
    /** Listeners on the signal now. */
    live: () => live.size,
    /** Listeners ever added. */
    added: () => added,
    /** The most listeners the signal held at once. */
    most: () => most,
  };
}

async function until(done: () => boolean, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!done() && Date.now() < deadline) await sleep(5);
}

Deno.test("TlsMaterial.watch() holds one abort listener at most, however many times it has looked at the files", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vn-leak-tls-" });
  try {
    const certs = await makeCertificates(dir);
    // pollMs: a watch looks every 2 s unless told; rounds every millisecond show the same.
    const options = {
      certFile: join(certs.serverDir, "tls.crt"),
      keyFile: join(certs.serverDir, "tls.key"),
      caFile: certs.caFile,
      pollMs: 1,
    };
    const tls = new TlsMaterial(options);
    await tls.load();
    const counted = countedSignal();
    const watching = tls.watch(counted.signal);
    // Each round of the watch adds one listener: 200 rounds, or as many as 7 s allow.
    await until(() => counted.added() >= 200, 7_000);
    const rounds = counted.added();
    const live = counted.live();
    counted.abort();
    await watching;
    assert.ok(rounds >= 3, `the watch looked at the files ${rounds} times`);
    assert.ok(
      counted.most() <= 1,
      `after ${rounds} rounds the watch held ${counted.most()} abort listeners at once (${live} at the end)`,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("every() and sleep() leave no abort listener behind, round after round", async () => {
  const counted = countedSignal();
  let calls = 0;
  const loop = every(1, () => {
    calls++;
  }, counted.signal);
  await until(() => calls >= 300, 10_000);
  const duringEvery = counted.most();
  for (let i = 0; i < 1_000; i++) await sleep(0, counted.signal);
  const afterSleeps = counted.live();
  counted.abort();
  await loop;
  assert.ok(calls >= 300, `every() called its function ${calls} times`);
  assert.ok(duringEvery <= 1, `every() held ${duringEvery} abort listeners at once`);
  assert.ok(afterSleeps <= 1, `${afterSleeps} abort listeners after 1000 sleeps`);
});

/**
 * A stand-in for `virtnode launcher-host` (its command line carries the words the handler
 * looks for): it answers the handler's first `list` with no VMs, says so on its output (the
 * hosts' log), then ends, as a host that crashes right after each start does.
 */
const STAND_IN_HOST = `
const dir = Deno.args[Deno.args.indexOf("--dir") + 1];
setTimeout(() => Deno.exit(0), 30_000);
const listener = Deno.listen({ transport: "unix", path: dir + "/control.sock" });
const conn = await listener.accept();
const reader = conn.readable.pipeThrough(new TextDecoderStream()).getReader();
let text = "";
while (!text.includes("\\n")) {
  const { value, done } = await reader.read();
  if (done) Deno.exit(0);
  text += value;
}
const { id } = JSON.parse(text.slice(0, text.indexOf("\\n")));
await conn.write(new TextEncoder().encode(JSON.stringify({ id, ok: true, vms: [] }) + "\\n"));
console.log("answered");
Deno.exit(0);
`;

Deno.test("the pod-less supervisor leaves no abort listener behind for each launcher host it restarts", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vn-leak-host-" });
  const stateDir = join(dir, "state");
  const script = join(dir, "host.ts");
  await Deno.writeTextFile(script, STAND_IN_HOST);
  const ghosts = new GhostRecordStore(join(dir, "ghosts"));
  await ghosts.load();
  const counted = countedSignal();
  /** Live listeners each time a host is started: the previous host's round is over. */
  const atStart: number[] = [];
  const launchers = new PodlessLaunchers({
    ghosts,
    socketRoot: join(dir, "sockets"),
    stateDir,
    runRoot: join(dir, "run"),
    diskRoot: join(dir, "disks"),
    host: { libvirtUri: "test:///default", imageDir: dir },
    hostCommand: (o) => {
      atStart.push(counted.live());
      return {
        cmd: Deno.execPath(),
        args: [
          "run",
          "-A",
          "--no-check",
          script,
          "launcher-host",
          "--host-id",
          o.hostId,
          "--dir",
          o.dir,
        ],
      };
    },
    wake: () => {},
    exited: () => {},
    restartBackoffMs: 1,
  });
  const running = launchers.run(counted.signal);
  let answered = 0;
  try {
    await until(() => atStart.length >= 7, 60_000);
  } finally {
    counted.abort();
    await running;
    const pid = await launchers.hostPid();
    if (pid !== undefined) Deno.kill(pid, "SIGKILL");
    // Each host that answered the handler's list says so in the hosts' log.
    const log = await Deno.readTextFile(launchers.hostLog).catch(() => "");
    answered = log.split("\n").filter((line) => line === "answered").length;
    await Deno.remove(dir, { recursive: true });
  }
  assert.ok(answered >= 6, `the supervisor reached ${answered} hosts, not 6`);
  assert.ok(
    Math.max(...atStart) <= 1,
    `abort listeners live at each host start: ${atStart.join(", ")}`,
  );
});

/**
 * A launcher pod, or a claim's file system, must not be able to stop the handler's event
 * loop. Each case runs the handler's call in a child process beside a 10 ms ticker and
 * reports how long the call took, how often the ticker fired meanwhile and how it failed; a
 * child whose loop the call blocked never reports and is killed after a bound, so the test
 * ends either way:
 * - `listenerPid` (how the handler finds a launcher, a container-disk server or an
 *   attachment pod from its socket) on a unix listener that never accepts and whose backlog
 *   is full (`listen(fd, 0)` and one connection waiting);
 * - `prepareHostDisks` on a claim whose file system never answers: a FUSE mount on the
 *   claim's folder whose server (this test, holding `/dev/fuse`) never replies, so the first
 *   lookup in it waits as on a hung NFS mount, until the test ends the connection.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { close, listenerPid, O_CLOEXEC, O_RDWR, open } from "../../ffi/mod.ts";
import { withFullListener } from "../helpers/full_listener.ts";

const REPO = new URL("../../", import.meta.url);
const CONFIG = new URL("deno.json", REPO).pathname;
/** How long a child may run before the test kills it as blocked, ms. */
const BOUND_MS = 15_000;
/** The deadline the handler's call is given in each case, ms. */
const DEADLINE_MS = 1_000;

/** What a child reports about the call it made. */
interface Report {
  /** How long the call took, ms. */
  ms: number;
  /** How often the 10 ms ticker fired while it ran. */
  ticks: number;
  /** How it failed, if it did. */
  error?: { name: string; message: string; code?: string };
  /** What a warm-up call before it reported, if the child made one. */
  warmUp?: unknown;
}

/**
 * Runs `call` (an expression to await, `importsCode` before it) in a child Deno with a 10 ms
 * ticker and gives its report; undefined when the child did not report within
 * {@linkcode BOUND_MS} (its event loop blocked), after killing it.
 */
async function probe(importsCode: string, call: string): Promise<Report | undefined> {
  const code = `${importsCode}
let ticks = 0;
const ticker = setInterval(() => ticks++, 10);
const started = performance.now();
let error;
try {
  await ${call};
} catch (e) {
  error = { name: e.name, message: e.message, code: e.code };
}
clearInterval(ticker);
console.log(JSON.stringify({ ms: performance.now() - started, ticks, error, warmUp: globalThis.warmUp }));
Deno.exit(0);
`;
  const child = new Deno.Command(Deno.execPath(), {
    args: ["eval", "--no-check", "--config", CONFIG, code],
    cwd: REPO.pathname,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const timer = setTimeout(() => child.kill("SIGKILL"), BOUND_MS);
  try {
    const out = await child.output();
    const lines = new TextDecoder().decode(out.stdout).trim().split("\n");
    try {
      return JSON.parse(lines.at(-1) ?? "") as Report;
    } catch {
      if (out.signal === "SIGKILL") return undefined;
      throw new Error(`The child failed: ${new TextDecoder().decode(out.stderr)}`);
    }
  } finally {
    clearTimeout(timer);
  }
}

Deno.test("listenerPid() on a launcher no longer accepting fails in time; the event loop keeps running", async () => {
  // The call gives up within its deadline.
  await withFullListener(async (path) => {
    const report = await probe(
      `import { listenerPid } from ${JSON.stringify(new URL("ffi/mod.ts", REPO).href)};`,
      `listenerPid(${JSON.stringify(path)}, { timeoutMs: ${DEADLINE_MS} })`,
    );
    assert.ok(
      report,
      `listenerPid() on a full backlog blocked the event loop: no report within ${BOUND_MS} ms`,
    );
    assert.equal(report.error?.code, "ETIMEDOUT", JSON.stringify(report));
    assert.match(
      report.error.message,
      new RegExp(`^Cannot connect to "${path}" within ${DEADLINE_MS} ms: `),
    );
    assert.ok(report.ms >= DEADLINE_MS && report.ms < 3 * DEADLINE_MS, `took ${report.ms} ms`);
    // 10 ms ticks over a 1 s wait: a loop that ran gets close to 100, a blocked one none.
    assert.ok(report.ticks >= 30, `the ticker fired ${report.ticks} times in ${report.ms} ms`);
  });
});

Deno.test("listenerPid() still finds a listener with room in its backlog at once", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vn-listener-" });
  const listener = Deno.listen({ transport: "unix", path: join(dir, "cmd.sock") });
  try {
    assert.equal(await listenerPid(join(dir, "cmd.sock"), { timeoutMs: DEADLINE_MS }), Deno.pid);
  } finally {
    listener.close();
    await Deno.remove(dir, { recursive: true });
  }
});

/** A launcher root whose claim folder carries a FUSE mount nobody answers; ends with `fn`. */
async function withHungClaim(fn: (hung: string, healthy: string) => Promise<void>) {
  const libc = Deno.dlopen("libc.so.6", {
    mount: { parameters: ["buffer", "buffer", "buffer", "u64", "buffer"], result: "i32" },
    umount2: { parameters: ["buffer", "i32"], result: "i32" },
  });
  const cstr = (s: string) => new TextEncoder().encode(`${s}\0`);
  const base = await Deno.makeTempDir({ prefix: "vn-hung-claim-" });
  const claim = "var/run/kubevirt-private/vmi-disks/data";
  const [hung, healthy] = [join(base, "hung"), join(base, "healthy")];
  await Deno.mkdir(join(hung, claim), { recursive: true });
  await Deno.mkdir(join(healthy, claim), { recursive: true });
  const fuse = open("/dev/fuse", O_RDWR | O_CLOEXEC);
  let mounted = false;
  try {
    const options = `fd=${fuse},rootmode=40000,user_id=0,group_id=0`;
    const rc = libc.symbols.mount(
      cstr("vn-hung"),
      cstr(join(hung, claim)),
      cstr("fuse"),
      6n, // MS_NOSUID | MS_NODEV
      cstr(options),
    );
    assert.equal(rc, 0, "the FUSE mount is made");
    mounted = true;
    await fn(hung, healthy);
  } finally {
    // Ending the connection fails whatever still waits on the mount (ENOTCONN).
    close(fuse);
    if (mounted) libc.symbols.umount2(cstr(join(hung, claim)), 2 /* MNT_DETACH */);
    libc.close();
    await Deno.remove(base, { recursive: true });
  }
}

Deno.test("prepareHostDisks() on a hung claim fails with a timeout; the event loop keeps running", async () => {
  // The claim's file system never answers.
  await withHungClaim(async (hung, healthy) => {
    const vmi = {
      metadata: { name: "vm", namespace: "default", uid: "u" },
      spec: {
        domain: { devices: {} },
        volumes: [{ name: "data", persistentVolumeClaim: { claimName: "c" } }],
      },
      status: {
        volumeStatus: [{
          name: "data",
          target: "",
          persistentVolumeClaimInfo: {
            claimName: "c",
            volumeMode: "Filesystem",
            capacity: { storage: "16Mi" },
          },
        }],
      },
    };
    const storage = JSON.stringify(new URL("mod/storage/mod.ts", REPO).href);
    const report = await probe(
      `import { prepareHostDisks, replaceClaimsByHostDisks } from ${storage};
const vmi = replaceClaimsByHostDisks(${JSON.stringify(vmi)});
// The same call on a claim that answers: it works in the same deadline.
globalThis.warmUp = await prepareHostDisks(vmi, {
  root: ${JSON.stringify(healthy)}, runtimeUser: 0, timeoutMs: ${BOUND_MS},
});`,
      `prepareHostDisks(vmi, { root: ${
        JSON.stringify(hung)
      }, runtimeUser: 0, timeoutMs: ${DEADLINE_MS} })`,
    );
    assert.ok(
      report,
      `prepareHostDisks() on a hung claim blocked the event loop: no report within ${BOUND_MS} ms`,
    );
    assert.deepEqual(
      (report.warmUp as { created: string[] }).created,
      ["/var/run/kubevirt-private/vmi-disks/data/disk.img"],
    );
    assert.equal(report.error?.name, "CallTimeoutError", JSON.stringify(report));
    assert.match(
      report.error.message,
      new RegExp(
        `^Cannot prepare the host disks of "default/vm" in "${hung}": no answer within ${DEADLINE_MS} ms$`,
      ),
    );
    assert.ok(report.ms >= DEADLINE_MS && report.ms < 3 * DEADLINE_MS, `took ${report.ms} ms`);
    assert.ok(report.ticks >= 30, `the ticker fired ${report.ticks} times in ${report.ms} ms`);
  });
});

/**
 * Runs the test tiers (unit, security, integration, kubevirt, e2e, node, and beside them
 * soak, conformance and fresh) with `deno test` and prints one
 * plain summary line, `tests: N passed, N failed, N skipped`, that CI reads.
 * Skipped tests are listed loudly: a skip is never a pass. A tier fails when it ran no
 * test, ran past its timeout, or left a process or a test guest behind: every process a
 * tier starts carries `VIRTNODE_TEST_RUN=<tier>-<uuid>` in its environment, and whatever
 * still carries it when the tier ends (also on Ctrl-C, SIGTERM or a timeout) is listed,
 * SIGKILLed and counted as a failure.
 *
 * The soak tier (10-minute observations that mostly wait), the conformance tier and the
 * fresh tier (a Debian root in a chroot, which shares nothing with the others) start first
 * and run beside the others; their output is shown when they end.
 *
 * The conformance tier runs only when asked (`--conformance`, `--all`, or named): it does not
 * fit the test command's fresh-machine budget, and its latest results are committed.
 *
 * Usage: `deno run -A tests/run.ts [--conformance] [--all] [unit|security|...|conformance ...]`
 *
 * @module
 */
import { join } from "node:path";
import { type Cluster, startCluster } from "../deploy/cluster/cluster.ts";

// fresh: tests/fresh/check.sh installs the project into a debootstrapped Debian 12 root.
// kubevirt: KubeVirt's own artifacts (its CRDs, admission, handler-side clients) as peers.
const TIERS = [
  "unit",
  "security",
  "integration",
  "kubevirt",
  "e2e",
  "node",
  "conformance",
  "fresh",
  "soak",
] as const;
/**
 * Tiers that run beside the others, from the start, with a control plane of their own where
 * they need one, and whose output is shown when they end: those that mostly wait (long
 * observations) and the fresh tier, which works in a chroot of its own (2 minutes off the
 * fresh-machine run's path).
 */
const BESIDE: readonly Tier[] = ["soak", "conformance", "fresh"];
/** A tier beside the others that must have ended before the tier named here starts. */
const BESIDE_ENDS_BEFORE: Partial<Record<Tier, Tier>> = { conformance: "node" };
/** A test tier: a folder of `*_test.ts` files below `tests/`. */
export type Tier = typeof TIERS[number];

/** Counts read from one tier's JUnit report, and its failures (see {@linkcode judgeTier}). */
export interface TierResult {
  tier: Tier;
  passed: number;
  failed: string[];
  skipped: string[];
  seconds: number;
  /** Why each failed test failed (its assertion and stack, shortened), by test name. */
  reasons?: Record<string, string>;
  /** Where and why each failed test failed, in one line (see {@linkcode failureGist}). */
  gists?: Record<string, string>;
  /**
   * Test guests defined during the tier and still there at its end, while tiers ran beside
   * it: judged once those have ended too ({@linkcode confirmLeftDomains}).
   */
  domainsToConfirm?: string[];
}

const root = new URL("..", import.meta.url).pathname;

function testFiles(tier: Tier): string[] {
  const dir = join(root, "tests", tier);
  try {
    return [...Deno.readDirSync(dir)]
      .filter((e) => e.isFile && e.name.endsWith("_test.ts"))
      .map((e) => join(dir, e.name))
      .sort();
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return [];
    throw error;
  }
}

function unescapeXml(s: string): string {
  return s.replaceAll("&quot;", '"').replaceAll("&apos;", "'").replaceAll("&lt;", "<")
    .replaceAll("&gt;", ">").replaceAll("&amp;", "&");
}

/** Lines of a failure's text the summary repeats (CI may show only a run's last lines). */
export const REASON_LINES = 40;

/**
 * Reads passed, failed and skipped test names out of Deno's JUnit XML, and the text of
 * each failure (its first {@linkcode REASON_LINES} lines, colour codes removed), and the
 * seconds each file's tests took.
 */
export function parseJunit(
  xml: string,
): {
  passed: number;
  failed: string[];
  skipped: string[];
  reasons: Record<string, string>;
  gists: Record<string, string>;
  fileSeconds: Record<string, number>;
} {
  let passed = 0;
  const failed: string[] = [];
  const skipped: string[] = [];
  const reasons: Record<string, string> = {};
  const gists: Record<string, string> = {};
  const fileSeconds: Record<string, number> = {};
  const cases = xml.matchAll(
    /<testcase name="([^"]*)" classname="([^"]*)"([^>]*?)(\/>|>([\s\S]*?)<\/testcase>)/g,
  );
  for (const m of cases) {
    const file = unescapeXml(m[2]);
    const name = `${file}: ${unescapeXml(m[1])}`;
    const time = Number(/\btime="([\d.]+)"/.exec(m[3])?.[1] ?? 0);
    fileSeconds[file] = (fileSeconds[file] ?? 0) + time;
    const body = m[5] ?? "";
    if (/<failure|<error/.test(body)) {
      failed.push(name);
      const text = body.match(/<(failure|error)\b[^>]*>([\s\S]*?)<\/\1>/)?.[2] ?? "";
      // deno-lint-ignore no-control-regex
      const plain = unescapeXml(text).replace(/\x1b\[[0-9;]*m/g, "").trim().split("\n");
      reasons[name] = plain.slice(0, REASON_LINES).join("\n") +
        (plain.length > REASON_LINES ? `\n... (${plain.length - REASON_LINES} more lines)` : "");
      gists[name] = failureGist(plain.join("\n"));
    } else if (/<skipped/.test(body)) skipped.push(name);
    else passed++;
  }
  return { passed, failed, skipped, reasons, gists, fileSeconds };
}

/** The environment variable that marks every process one tier run starts. */
export const RUN_MARKER_VAR = "VIRTNODE_TEST_RUN";

/**
 * How long a tier may run before the runner ends it and everything it started. Generous:
 * on a 2-core machine integration takes about 8 minutes, security 2, e2e about 15 (local
 * mode's lifecycle tests alone 4.5) and fresh 2 when its root is cached (a first debootstrap
 * takes longer).
 */
export const TIER_TIMEOUT_MS: Record<Tier, number> = {
  unit: 10 * 60_000,
  security: 10 * 60_000,
  integration: 20 * 60_000,
  kubevirt: 15 * 60_000,
  e2e: 30 * 60_000,
  // About 15.5 minutes on a 2-core machine with its builds cached (the swap's journeys, two
  // nodes migrating, the static CPU manager's node), more on a fresh one (the node's
  // programs and images are built cold in this tier).
  node: 30 * 60_000,
  // KubeVirt's operator install, then the specs twice (virtnode, virt-handler): 15 minutes
  // in line on a fresh machine (4 of them the suite's cold build), longer beside the other
  // tiers, which share its two cores; the full set (VIRTNODE_CONFORMANCE=all) takes hours
  // and is run by hand. The migration yardstick's two nodes add about 4 minutes.
  conformance: 40 * 60_000,
  fresh: 20 * 60_000,
  // Two 10-minute soaks one after the other (the orphaned launcher host's, the handler's
  // with its 20 guests' start), guest tests that mostly wait (probes, access credentials,
  // port-forward, hot-plug), and two moved off the fresh-machine run's path (metrics of ten
  // guests, handler parity): about 35 minutes in all.
  soak: 45 * 60_000,
};

/** A process that still carries a tier's marker after the tier ended. */
export interface LeftProcess {
  pid: number;
  /** Its command line, arguments joined by spaces (shortened). */
  command: string;
}

// Machine daemons, shared by design: a test that finds no libvirtd starts one
// (tests/helpers/libvirtd.ts -> deploy/libvirtd.ts ensureLibvirtd), so libvirtd and the
// virtlogd it starts inherit that tier's marker, yet they are meant to outlive every tier.
// QEMU processes are libvirtd's children (their environment is libvirt's, not the test's);
// a guest a test leaves behind is caught by the domain check below instead.
const SHARED_DAEMONS = new Set(["libvirtd", "virtlogd", "virtlockd", "virtqemud"]);

function readProc(pid: string | number, file: string): string | undefined {
  try {
    return Deno.readTextFileSync(`/proc/${pid}/${file}`);
  } catch {
    return undefined; // exited meanwhile, or a kernel thread
  }
}

function isSharedDaemon(pid: string | number): boolean {
  if (SHARED_DAEMONS.has(readProc(pid, "comm")?.trim() ?? "")) return true;
  // The fourth field of stat is the parent PID; comm (field two) may hold spaces.
  const stat = readProc(pid, "stat");
  const ppid = stat?.slice(stat.lastIndexOf(")") + 2).split(" ")[1];
  return ppid !== undefined && SHARED_DAEMONS.has(readProc(ppid, "comm")?.trim() ?? "");
}

/**
 * The processes whose environment holds `VIRTNODE_TEST_RUN=<marker>`, from
 * `/proc/<pid>/environ`: every descendant of a tier inherits it, even one that left the
 * tier's session with setsid (launchers do, by design). This process, `exclude` and the
 * shared machine daemons are left out.
 */
export function findMarkedProcesses(marker: string, exclude: Iterable<number> = []): LeftProcess[] {
  const needle = `\0${RUN_MARKER_VAR}=${marker}\0`;
  const skip = new Set([Deno.pid, ...exclude]);
  const found: LeftProcess[] = [];
  for (const entry of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(entry.name) || skip.has(Number(entry.name))) continue;
    const environ = readProc(entry.name, "environ");
    if (!environ || !`\0${environ}\0`.includes(needle)) continue;
    if (isSharedDaemon(entry.name)) continue;
    const cmdline = readProc(entry.name, "cmdline") ?? "";
    const command = cmdline.replaceAll("\0", " ").trim();
    found.push({
      pid: Number(entry.name),
      command: command.length > 300 ? `${command.slice(0, 300)}...` : command,
    });
  }
  return found;
}

/**
 * SIGKILLs every process carrying the marker (see {@linkcode findMarkedProcesses}) until
 * none is left, and returns the ones it found. Repeats because a dying parent's child may
 * still be forking.
 */
export async function sweepMarkedProcesses(
  marker: string,
  exclude: Iterable<number> = [],
): Promise<LeftProcess[]> {
  const seen = new Map<number, LeftProcess>();
  for (let round = 0; round < 50; round++) {
    const left = findMarkedProcesses(marker, exclude);
    if (left.length === 0) break;
    for (const p of left) {
      if (!seen.has(p.pid)) seen.set(p.pid, p);
      try {
        Deno.kill(p.pid, "SIGKILL");
      } catch {
        // Gone meanwhile.
      }
    }
    // A killed process stays a zombie until its parent reaps it; a zombie's environ is
    // empty, so the next round does not count it.
    await new Promise((r) => setTimeout(r, 100));
  }
  return [...seen.values()];
}

/** The libvirt that tests' QEMU guests run under (deploy/libvirtd.ts QEMU_SYSTEM_URI). */
const QEMU_URI = "qemu:///system";

/** The names of every domain defined in libvirt at `uri`; none when it cannot be reached. */
export async function listDomains(uri = QEMU_URI): Promise<string[]> {
  try {
    const out = await new Deno.Command("virsh", {
      args: ["-c", uri, "list", "--all", "--name"],
      stdin: "null",
      stdout: "piped",
      stderr: "null",
      signal: AbortSignal.timeout(15_000),
    }).output();
    if (!out.success) return [];
    return new TextDecoder().decode(out.stdout).split("\n").map((l) => l.trim()).filter(Boolean);
  } catch {
    return []; // no virsh, or libvirtd hangs
  }
}

/**
 * The domains of `after` that were not in `before` and are named the way tests name
 * guests: `uniqueGuestName` (`vn-test-<pid>-...`) or a VMI's `<namespace>_<name>`.
 */
export function leftDomains(before: string[], after: string[]): string[] {
  const had = new Set(before);
  return after.filter((d) => !had.has(d) && (/^vn-test-/.test(d) || /^[a-z0-9-]+_./.test(d)));
}

/** What {@linkcode judgeTier} decides from. */
export interface TierOutcome {
  files: number;
  passed: number;
  failed: string[];
  skipped: string[];
  /** The exit code of `deno test`. */
  code: number;
  /** Set when the tier was ended early: why (a timeout, a signal). */
  endedBecause?: string;
  /** Processes still carrying the tier's marker when it ended. */
  leftProcesses: LeftProcess[];
  /** Test guests defined in libvirt during the tier and still there. */
  leftDomains: string[];
}

/**
 * The failures of one tier run: its failed tests, plus one line for each way a tier can
 * fail without a failed test: no test files, no test run, an early end, a nonzero exit,
 * processes or guests left behind.
 */
export function judgeTier(tier: string, o: TierOutcome): string[] {
  const failed = [...o.failed];
  if (o.files === 0) failed.push(`${tier}: no test files (a tier that runs nothing fails)`);
  else if (o.endedBecause) failed.push(`${tier}: ended early: ${o.endedBecause}`);
  else if (o.passed + o.failed.length === 0) {
    failed.push(`${tier}: its ${o.files} test files ran 0 tests (a tier that runs nothing fails)`);
  } else if (o.code !== 0 && o.failed.length === 0) {
    failed.push(`${tier}: deno test exited with code ${o.code} (see output above)`);
  }
  if (o.leftProcesses.length > 0) {
    failed.push(
      `${tier}: left ${o.leftProcesses.length} processes running (killed now): ` +
        o.leftProcesses.map((p) => `${p.pid} "${p.command}"`).join(", "),
    );
  }
  if (o.leftDomains.length > 0) {
    failed.push(
      `${tier}: left ${o.leftDomains.length} libvirt domains defined in ${QEMU_URI}: ` +
        o.leftDomains.map((d) => `"${d}"`).join(", "),
    );
  }
  return failed;
}

/** Options of {@linkcode runTier}. */
export interface RunTierOptions {
  /** The test files; the tier's `tests/<tier>/*_test.ts` unless told. */
  files?: string[];
  /** {@linkcode TIER_TIMEOUT_MS} of the tier unless told. */
  timeoutMs?: number;
  /** Ends the tier (and sweeps what it started) when aborted, e.g. on Ctrl-C. */
  signal?: AbortSignal;
  /** Check libvirt for test guests left behind (the default). */
  checkDomains?: boolean;
  /**
   * Tiers run beside this one: a guest left at its end may be one of theirs, still running,
   * so it is returned to confirm later ({@linkcode TierResult.domainsToConfirm}), not judged.
   */
  confirmDomainsLater?: boolean;
  /** Output of `deno test`; inherited unless told. */
  output?: "inherit" | "null";
  /** Writes the output of `deno test` to this file instead (a tier that runs beside others). */
  logFile?: string;
}

/**
 * Runs one tier with `deno test`, every process it starts marked with a fresh
 * `VIRTNODE_TEST_RUN`; when it ends (by itself, by its timeout, or by `signal`) kills
 * whatever still carries the marker, and fails the tier for it.
 */
export async function runTier(
  tier: Tier,
  env: Record<string, string>,
  options: RunTierOptions = {},
): Promise<TierResult> {
  const files = options.files ?? testFiles(tier);
  if (files.length === 0) {
    console.log(`\n=== ${tier}: no test files`);
    const outcome = { files: 0, passed: 0, failed: [], skipped: [], code: 0 };
    return {
      tier,
      passed: 0,
      failed: judgeTier(tier, { ...outcome, leftProcesses: [], leftDomains: [] }),
      skipped: [],
      seconds: 0,
    };
  }
  console.log(`\n=== ${tier}: ${files.length} test files`);
  const marker = `${tier}-${crypto.randomUUID()}`;
  const checkDomains = options.checkDomains ?? tier !== "unit";
  const domainsBefore = checkDomains ? await listDomains() : [];
  const junit = await Deno.makeTempFile({ prefix: `virtnode-${tier}-`, suffix: ".xml" });
  const args = ["test", "-A", `--junit-path=${junit}`];
  if (tier === "unit") args.push("--parallel");
  const started = performance.now();
  const log = options.logFile
    ? await Deno.open(options.logFile, { create: true, write: true, truncate: true })
    : undefined;
  const child = new Deno.Command(Deno.execPath(), {
    args: [...args, ...files],
    cwd: root,
    env: { ...env, [RUN_MARKER_VAR]: marker },
    stdin: "null",
    stdout: log ? "piped" : options.output ?? "inherit",
    stderr: log ? "piped" : options.output ?? "inherit",
  }).spawn();
  const logged = log
    ? Promise.all([child.stdout, child.stderr].map(async (stream) => {
      for await (const chunk of stream) await log.write(chunk);
    })).finally(() => log.close())
    : Promise.resolve();
  const timeoutMs = options.timeoutMs ??
    (tier === "conformance" && Deno.env.get("VIRTNODE_CONFORMANCE") === "all"
      ? 8 * 3600_000
      : TIER_TIMEOUT_MS[tier]);
  let endedBecause: string | undefined;
  let endEarly!: (why: string) => void;
  const ended = new Promise<void>((resolve) => {
    endEarly = (why) => {
      endedBecause ??= why;
      resolve();
    };
  });
  const timer = setTimeout(() => endEarly(`timed out after ${timeoutMs / 1000} s`), timeoutMs);
  const onAbort = () => endEarly(`interrupted (${options.signal?.reason ?? "aborted"})`);
  options.signal?.addEventListener("abort", onAbort);
  if (options.signal?.aborted) onAbort();
  const status = await Promise.race([child.status, ended.then(() => undefined)]);
  clearTimeout(timer);
  options.signal?.removeEventListener("abort", onAbort);
  if (!status) console.log(`\n=== ${tier}: ${endedBecause}: ending it and what it started`);
  // deno test itself carries the marker: after an early end the sweep ends it too.
  const leftProcesses = await sweepMarkedProcesses(marker);
  const code = (await child.status).code;
  await logged;
  const seconds = (performance.now() - started) / 1000;
  let xml = "";
  try {
    xml = await Deno.readTextFile(junit);
  } catch {
    // No report: the run died before writing one; judged below.
  }
  await Deno.remove(junit).catch(() => {});
  const parsed = parseJunit(xml);
  // A killed tier's deno test is not among the processes it left.
  const left = leftProcesses.filter((p) => p.pid !== child.pid);
  const domains = checkDomains ? leftDomains(domainsBefore, await listDomains()) : [];
  const slowest = Object.entries(parsed.fileSeconds).sort((a, b) => b[1] - a[1]).slice(0, 8);
  if (slowest.length > 0) {
    console.log(
      `\n=== ${tier} took ${seconds.toFixed(0)} s; its slowest files: ` +
        slowest.map(([f, t]) => `${f.replace(/^.*\//, "")} ${t.toFixed(0)} s`).join(", "),
    );
  }
  for (const p of left) console.log(`!!! ${tier} left process ${p.pid}: ${p.command}`);
  for (const d of domains) console.log(`!!! ${tier} left libvirt domain "${d}"`);
  const later = options.confirmDomainsLater === true;
  const failed = judgeTier(tier, {
    files: files.length,
    ...parsed,
    code,
    endedBecause,
    leftProcesses: left,
    leftDomains: later ? [] : domains,
  });
  return {
    tier,
    passed: parsed.passed,
    failed,
    skipped: parsed.skipped,
    seconds,
    reasons: parsed.reasons,
    gists: parsed.gists,
    ...(later && domains.length > 0 ? { domainsToConfirm: domains } : {}),
  };
}

/**
 * Fails each result whose guests to confirm are still defined (`defined`, once the tiers
 * beside it have ended and removed theirs): left behind by that tier, or by one beside it.
 */
export function confirmLeftDomains(results: TierResult[], defined: readonly string[]): void {
  const now = new Set(defined);
  for (const r of results) {
    const still = (r.domainsToConfirm ?? []).filter((d) => now.has(d));
    if (still.length === 0) continue;
    r.failed.push(
      `${r.tier}: left ${still.length} libvirt domains defined in ${QEMU_URI} (still there ` +
        `once the tiers beside it ended; left by it or by one of them): ` +
        still.map((d) => `"${d}"`).join(", "),
    );
  }
}

/**
 * One line that says where and why a test failed, from its failure text: the text's first
 * line (cut at 160 characters) and the first place in a test file its stack names. The
 * run's last line lists it beside the test's name, for a CI log that keeps only its tail.
 */
export function failureGist(reason: string): string {
  const first = reason.split("\n").find((l) => l.trim() !== "")?.trim() ?? "";
  const short = first.length > 160 ? `${first.slice(0, 160)}…` : first;
  const at = /\bat (?:.*\()?file:\/\/\S*?\/(tests\/[^\s():]+:\d+:\d+)/.exec(reason)?.[1];
  return at ? `${short} (${at})` : short;
}

/**
 * Every failure of a run: its tiers' failures, plus one when no tier ran a test (a run
 * that tested nothing does not pass) and one when a signal ended it.
 */
export function runFailures(results: TierResult[], interruptedBy?: string): string[] {
  const failed = results.flatMap((r) => r.failed);
  if (results.every((r) => r.passed + r.failed.length === 0)) failed.push("no tier ran any test");
  if (interruptedBy) failed.push(`interrupted by ${interruptedBy}`);
  return failed;
}

/**
 * Tiers a run without named tiers leaves out unless `--conformance` (or `--all`) asks for
 * them: they do not fit the fresh-machine budget of the test command (CI's 90 minutes,
 * setup's cold builds included). Their latest results are committed with their date and
 * commit (see {@linkcode NOT_RUN_NOTE}).
 */
export const ON_REQUEST: readonly Tier[] = ["conformance"];

/** What a run that left the on-request tiers out says about them. */
export const NOT_RUN_NOTE =
  "conformance: not run (25 minutes of a node with virt-operator, twice, beside the rest: over " +
  "the test command's budget); run it with `deno task test:conformance` or `deno task test " +
  "--conformance`; its latest results, with their dates and commits: docs/conformance.md";

/** The tiers a run's arguments ask for, in order; throws naming an unknown one. */
export function askedTiers(args: readonly string[]): Tier[] {
  const flags = new Set(args.filter((a) => a.startsWith("--")));
  const named = args.filter((a) => !a.startsWith("--"));
  for (const t of named) {
    if (!(TIERS as readonly string[]).includes(t)) {
      throw new Error(`Unknown test tier ${JSON.stringify(t)}: allowed: ${TIERS.join(", ")}`);
    }
  }
  for (const f of flags) {
    if (f !== "--all" && f !== "--conformance") {
      throw new Error(`Unknown flag ${f}: allowed: --conformance, --all`);
    }
  }
  if (named.length > 0) return named as Tier[];
  const withOnRequest = flags.has("--conformance") || flags.has("--all");
  return TIERS.filter((t) => withOnRequest || !ON_REQUEST.includes(t));
}

async function main(): Promise<number> {
  // `--all`: the conformance tier runs every spec that fits one node, not CI's subset.
  if (Deno.args.includes("--all")) Deno.env.set("VIRTNODE_CONFORMANCE", "all");
  let asked: Tier[];
  try {
    asked = askedTiers(Deno.args);
  } catch (error) {
    console.error((error as Error).message);
    return 2;
  }
  const results: TierResult[] = [];
  // Ctrl-C or SIGTERM ends the running tier and sweeps what it started before the shared
  // control plane stops; no further tier starts.
  const interrupt = new AbortController();
  const onSignal = (signal: Deno.Signal) => () => {
    if (!interrupt.signal.aborted) console.log(`\n=== ${signal}: stopping`);
    interrupt.abort(signal);
  };
  const onSigint = onSignal("SIGINT");
  const onSigterm = onSignal("SIGTERM");
  Deno.addSignalListener("SIGINT", onSigint);
  Deno.addSignalListener("SIGTERM", onSigterm);
  // One control plane for the tiers that talk to an apiserver; tests that must stop
  // it or need an empty store start their own. It is started here, outside any tier, so
  // it carries no tier's marker and no tier's sweep ends it.
  let cluster: Cluster | undefined;
  const env: Record<string, string> = {};
  // Beside others only: a tier asked for alone (e.g. `deno task test:conformance`) runs in
  // the foreground, its output as it comes.
  const besideTiers = (asked as Tier[]).some((t) => !BESIDE.includes(t))
    ? (asked as Tier[]).filter((t) => BESIDE.includes(t))
    : [];
  const beside = besideTiers.map((tier) => {
    const logFile = Deno.makeTempFileSync({ prefix: `virtnode-${tier}-`, suffix: ".log" });
    console.log(`\n=== ${tier}: runs beside the other tiers; its output: ${logFile}`);
    const result = runTier(tier, {}, { signal: interrupt.signal, checkDomains: false, logFile });
    return { tier, logFile, result };
  });
  try {
    for (const tier of (asked as Tier[]).filter((t) => !besideTiers.includes(t))) {
      if (interrupt.signal.aborted) break;
      const first = beside.filter((b) => BESIDE_ENDS_BEFORE[b.tier] === tier);
      if (first.length > 0) {
        console.log(`\n=== ${tier} waits for ${first.map((b) => b.tier).join(", ")} to end`);
        await Promise.all(first.map((b) => b.result));
      }
      if (tier !== "unit" && tier !== "fresh" && !cluster && testFiles(tier).length > 0) {
        console.log(
          "\n=== starting the shared test control plane (kube-apiserver + etcd, KubeVirt's CRDs and admission)",
        );
        cluster = await startCluster({ stopOnSignals: false, admission: true });
        env.VIRTNODE_TEST_KUBECONFIG = cluster.kubeconfigPath;
        env.VIRTNODE_TEST_HANDLER_KUBECONFIG = cluster.handlerKubeconfigPath;
        console.log(`kubeconfig: ${cluster.kubeconfigPath}`);
      }
      results.push(
        await runTier(tier, env, {
          signal: interrupt.signal,
          confirmDomainsLater: besideTiers.length > 0,
        }),
      );
    }
    for (const b of beside) {
      const result = await b.result;
      console.log(`\n=== ${b.tier} (ran beside the other tiers)`);
      console.log(await Deno.readTextFile(b.logFile));
      await Deno.remove(b.logFile).catch(() => {});
      results.push(result);
    }
    // A guest a tier left while guests of the tiers beside it ran: judged now they are done.
    if (results.some((r) => r.domainsToConfirm)) confirmLeftDomains(results, await listDomains());
  } finally {
    await cluster?.stop();
    Deno.removeSignalListener("SIGINT", onSigint);
    Deno.removeSignalListener("SIGTERM", onSigterm);
  }
  const passed = results.reduce((n, r) => n + r.passed, 0);
  const failed = runFailures(
    results,
    interrupt.signal.aborted ? interrupt.signal.reason : undefined,
  );
  const skipped = results.flatMap((r) => r.skipped);
  console.log("\n=== summary");
  for (const r of results) {
    console.log(
      `${r.tier}: ${r.passed} passed, ${r.failed.length} failed, ${r.skipped.length} skipped ` +
        `in ${r.seconds.toFixed(1)} s`,
    );
  }
  if (ON_REQUEST.some((t) => !asked.includes(t))) console.log(`\n${NOT_RUN_NOTE}`);
  if (skipped.length > 0) {
    console.log(`\n!!! ${skipped.length} TESTS WERE SKIPPED (not counted as passing):`);
    for (const s of skipped) console.log(`!!!   ${s}`);
  }
  // The failures' texts again, last: a CI log that keeps only its tail still says why.
  for (const r of results) {
    for (const [name, why] of Object.entries(r.reasons ?? {})) {
      console.log(`\n--- why "${name}" failed:\n${why}`);
    }
  }
  if (failed.length > 0) {
    console.log(`\nFAILED:`);
    const gists = Object.assign({}, ...results.map((r) => r.gists ?? {}));
    for (const f of failed) console.log(gists[f] ? `  ${f}\n      ${gists[f]}` : `  ${f}`);
  }
  console.log(`\ntests: ${passed} passed, ${failed.length} failed, ${skipped.length} skipped`);
  if (interrupt.signal.aborted) return interrupt.signal.reason === "SIGTERM" ? 143 : 130;
  return failed.length > 0 ? 1 : 0;
}

if (import.meta.main) Deno.exit(await main());

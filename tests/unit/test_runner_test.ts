/**
 * The test runner's hygiene rules (tests/run.ts): a tier that leaves a process behind,
 * runs past its timeout, is interrupted or runs no test fails, and what it left is killed.
 * The tiers here are small fixture files run through the real `runTier`.
 */
import assert from "node:assert/strict";
import {
  askedTiers,
  confirmLeftDomains,
  failureGist,
  findMarkedProcesses,
  judgeTier,
  leftDomains,
  parseJunit,
  RUN_MARKER_VAR,
  runFailures,
  runTier,
  type RunTierOptions,
  sweepMarkedProcesses,
  type TierOutcome,
} from "../run.ts";

const FIXTURES = new URL("./_runner_fixtures/", import.meta.url).pathname;

function alive(pid: number): boolean {
  try {
    // A zombie is dead: it waits only for its parent to read its status.
    return !/^State:\s+Z/m.test(Deno.readTextFileSync(`/proc/${pid}/status`));
  } catch {
    return false;
  }
}

async function readPid(pidFile: string): Promise<number | undefined> {
  const text = (await Deno.readTextFile(pidFile)).trim();
  return text ? Number(text) : undefined;
}

/**
 * Runs fixture files as a tier; returns its result and the PID the fixture left, if any.
 * With `onLeftPid`, calls it once the fixture has started its process.
 */
async function runFixture(
  files: string[],
  options: RunTierOptions = {},
  onLeftPid?: () => void,
) {
  const pidFile = await Deno.makeTempFile({ prefix: "virtnode-runner-test-" });
  let done = false;
  try {
    const watch = (async () => {
      while (!done && onLeftPid) {
        if (await readPid(pidFile)) return onLeftPid();
        await new Promise((r) => setTimeout(r, 50));
      }
    })();
    const result = await runTier("unit", { RUNNER_FIXTURE_PID_FILE: pidFile }, {
      files: files.map((f) => FIXTURES + f),
      checkDomains: false,
      output: "null",
      ...options,
    });
    done = true;
    await watch;
    return { result, leftPid: await readPid(pidFile) };
  } finally {
    await Deno.remove(pidFile);
  }
}

Deno.test("runTier() fails a tier that leaves a setsid process behind, names it and kills it", async () => {
  const { result, leftPid } = await runFixture(["leaves_process.ts"]);
  assert.ok(leftPid, "the fixture started its process");
  assert.equal(result.passed, 1);
  assert.equal(result.failed.length, 1, result.failed.join("\n"));
  assert.match(result.failed[0], new RegExp(`left 1 processes .*${leftPid} "sleep 600"`));
  assert.equal(alive(leftPid), false, "the left process was killed");
});

Deno.test("runTier() carries why a test failed, for the summary to repeat", async () => {
  const { result } = await runFixture(["fails.ts"]);
  assert.equal(result.failed.length, 1);
  const name = result.failed[0];
  assert.match(name, /fails\.ts: fixture: fails <on purpose>$/);
  const why = result.reasons?.[name] ?? "";
  assert.match(why, /first line "quoted"\nsecond line/);
  assert.match(why, /Caused by: Error: the cause/);
  assert.match(
    result.gists?.[name] ?? "",
    /^Error: first line "quoted" \(tests\/unit\/_runner_fixtures\/fails\.ts:8:9\)$/,
  );
  // deno-lint-ignore no-control-regex
  assert.doesNotMatch(why, /\x1b|&quot;|&lt;/, "no colour codes or XML escapes");
});

Deno.test("runTier() passes a clean tier", async () => {
  const { result } = await runFixture(["passes.ts"]);
  assert.deepEqual(result.failed, []);
  assert.equal(result.passed, 1);
});

Deno.test("runTier() fails a tier whose test files ran 0 tests", async () => {
  const { result } = await runFixture(["no_tests.ts"]);
  assert.equal(result.passed, 0);
  assert.deepEqual(result.failed, [
    "unit: its 1 test files ran 0 tests (a tier that runs nothing fails)",
  ]);
});

Deno.test("runTier() ends a tier at its timeout and kills what it started", async () => {
  const started = performance.now();
  // Long enough for deno test to start the fixture on a loaded machine.
  const { result, leftPid } = await runFixture(["hangs.ts"], { timeoutMs: 10_000 });
  assert.ok(performance.now() - started < 40_000, "the tier was ended, not waited for");
  assert.ok(leftPid, "the fixture started its process");
  assert.equal(alive(leftPid), false, "the hanging test's process was killed");
  assert.ok(
    result.failed.includes("unit: ended early: timed out after 10 s"),
    result.failed.join(),
  );
  assert.ok(result.failed.some((f) => f.includes(`${leftPid} "sleep 600"`)), result.failed.join());
});

Deno.test("runTier() ends a tier on Ctrl-C (its abort signal) and kills what it started", async () => {
  const ctrlC = new AbortController();
  // Abort once the fixture's process is up, as a user would press Ctrl-C mid-test.
  const { result, leftPid } = await runFixture(
    ["hangs.ts"],
    { signal: ctrlC.signal },
    () => ctrlC.abort("SIGINT"),
  );
  assert.ok(leftPid, "the fixture started its process");
  assert.equal(alive(leftPid), false, "the interrupted test's process was killed");
  assert.ok(
    result.failed.includes("unit: ended early: interrupted (SIGINT)"),
    result.failed.join(),
  );
});

Deno.test("sweepMarkedProcesses() kills a marked process in its own session, not a shared daemon", async () => {
  // An unmarked process is left alone too.
  const marker = `unit-test-${crypto.randomUUID()}`;
  // A copy of sleep named like a machine daemon tests may start (libvirtd is excluded).
  const dir = await Deno.makeTempDir({ prefix: "virtnode-sweep-" });
  await Deno.copyFile("/bin/sleep", `${dir}/virtlogd`);
  await Deno.chmod(`${dir}/virtlogd`, 0o755);
  const spawn = (cmd: string, env: Record<string, string>) =>
    new Deno.Command("setsid", {
      args: [cmd, "600"],
      env,
      stdin: "null",
      stdout: "null",
      stderr: "null",
    }).spawn();
  const marked = spawn("sleep", { [RUN_MARKER_VAR]: marker });
  const daemon = spawn(`${dir}/virtlogd`, { [RUN_MARKER_VAR]: marker });
  const other = spawn("sleep", { [RUN_MARKER_VAR]: `${marker}-other` });
  try {
    await new Promise((r) => setTimeout(r, 300)); // setsid execs sleep: wait for the exec
    assert.deepEqual(findMarkedProcesses(marker).map((p) => p.pid), [marked.pid]);
    const swept = await sweepMarkedProcesses(marker);
    assert.deepEqual(swept, [{ pid: marked.pid, command: "sleep 600" }]);
    assert.equal((await marked.status).signal, "SIGKILL");
    assert.deepEqual(findMarkedProcesses(marker), []);
    assert.ok(alive(daemon.pid), "the shared daemon was left alone");
    assert.ok(alive(other.pid), "another run's process was left alone");
  } finally {
    for (const c of [marked, daemon, other]) {
      try {
        c.kill("SIGKILL");
      } catch { /* gone */ }
      await c.status;
    }
    await Deno.remove(dir, { recursive: true });
  }
});

const clean: TierOutcome = {
  files: 3,
  passed: 5,
  failed: [],
  skipped: [],
  code: 0,
  leftProcesses: [],
  leftDomains: [],
};

Deno.test("judgeTier() passes a clean tier and fails one with no test files, no tests or an early end", () => {
  assert.deepEqual(judgeTier("e2e", clean), []);
  assert.deepEqual(judgeTier("e2e", { ...clean, files: 0, passed: 0 }), [
    "e2e: no test files (a tier that runs nothing fails)",
  ]);
  assert.deepEqual(judgeTier("e2e", { ...clean, passed: 0, skipped: ["a", "b"] }), [
    "e2e: its 3 test files ran 0 tests (a tier that runs nothing fails)",
  ]);
  assert.deepEqual(judgeTier("e2e", { ...clean, code: 1 }), [
    "e2e: deno test exited with code 1 (see output above)",
  ]);
  assert.deepEqual(judgeTier("e2e", { ...clean, code: 137, endedBecause: "timed out after 9 s" }), [
    "e2e: ended early: timed out after 9 s",
  ]);
});

Deno.test("judgeTier() fails a tier that left a process or a libvirt domain", () => {
  assert.deepEqual(
    judgeTier("integration", {
      ...clean,
      leftProcesses: [{ pid: 42, command: "deno run main.ts launcher --uid u1" }],
      leftDomains: ["default_vm-1"],
    }),
    [
      'integration: left 1 processes running (killed now): 42 "deno run main.ts launcher --uid u1"',
      'integration: left 1 libvirt domains defined in qemu:///system: "default_vm-1"',
    ],
  );
});

Deno.test("leftDomains() names the new domains named like test guests", () => {
  assert.deepEqual(
    leftDomains(
      ["default_old", "vn-test-1-1-aaaa", "my-server"],
      ["default_old", "vn-test-1-1-aaaa", "my-server", "vn-test-7-2-bbbb", "ns-1_vm-x", "desk"],
    ),
    ["vn-test-7-2-bbbb", "ns-1_vm-x"],
  );
});

Deno.test("confirmLeftDomains() fails a tier only for guests still there once the tiers beside it end", () => {
  // Guests of a soak beside the security tier were defined during it and gone by the end.
  const security = {
    tier: "security" as const,
    passed: 3,
    failed: [],
    skipped: [],
    seconds: 1,
    domainsToConfirm: ["soakh-1_vm0", "sec-2_vm"],
  };
  const e2e = { ...security, tier: "e2e" as const, failed: [], domainsToConfirm: ["soakh-1_vm1"] };
  confirmLeftDomains([security, e2e], ["default_old", "sec-2_vm"]);
  assert.deepEqual(e2e.failed, []);
  assert.deepEqual(security.failed, [
    "security: left 1 libvirt domains defined in qemu:///system (still there once the tiers " +
    'beside it ended; left by it or by one of them): "sec-2_vm"',
  ]);
});

Deno.test("runFailures() fails a run in which no tier ran a test, and an interrupted one", () => {
  const empty = { tier: "unit" as const, passed: 0, failed: [], skipped: ["s"], seconds: 1 };
  assert.deepEqual(runFailures([empty]), ["no tier ran any test"]);
  assert.deepEqual(runFailures([]), ["no tier ran any test"]);
  assert.deepEqual(runFailures([{ ...empty, passed: 1 }]), []);
  assert.deepEqual(runFailures([{ ...empty, passed: 1 }], "SIGINT"), ["interrupted by SIGINT"]);
});

Deno.test("failureGist() gives a failure's first line and the test file's line its stack names", () => {
  const long = "x".repeat(300);
  const reason = [
    "",
    `AssertionError: ${long}`,
    ...Array.from({ length: 80 }, (_, i) => `output line ${i}`),
    "    at assertOk (ext:deno_node/assert.ts:10:3)",
    "    at file:///work/main/tests/e2e/local_mode_test.ts:112:12",
    "    at eventLoopTick (ext:core/01_core.js:179:7)",
  ].join("\n");
  const gist = failureGist(reason);
  assert.match(gist, /^AssertionError: x{144}… \(tests\/e2e\/local_mode_test\.ts:112:12\)$/);
  assert.equal(failureGist("Error: plain"), "Error: plain");
});

Deno.test("parseJunit() adds up the seconds of each file's tests", () => {
  const xml = `<testsuites><testsuite name="a_test.ts">
    <testcase name="one" classname="tests/e2e/a_test.ts" time="1.500" line="1" col="1">
    </testcase>
    <testcase name="two" classname="tests/e2e/a_test.ts" time="2.250" line="9" col="1"/>
    <testcase name="three" classname="tests/e2e/b_test.ts" time="4.000" line="1" col="1">
      <failure message="x">Error: x</failure>
    </testcase></testsuite></testsuites>`;
  const parsed = parseJunit(xml);
  assert.deepEqual(parsed.fileSeconds, { "tests/e2e/a_test.ts": 3.75, "tests/e2e/b_test.ts": 4 });
  assert.equal(parsed.passed, 2);
  assert.deepEqual(parsed.failed, ["tests/e2e/b_test.ts: three"]);
});

Deno.test("askedTiers() leaves the conformance tier out unless asked, and refuses unknown names", () => {
  const all = askedTiers([]);
  assert.ok(!all.includes("conformance"), all.join(","));
  assert.ok(all.includes("unit") && all.includes("node") && all.includes("fresh"));
  assert.ok(askedTiers(["--conformance"]).includes("conformance"));
  assert.ok(askedTiers(["--all"]).includes("conformance"));
  assert.deepEqual(askedTiers(["conformance"]), ["conformance"]);
  assert.deepEqual(askedTiers(["unit", "e2e"]), ["unit", "e2e"]);
  assert.throws(() => askedTiers(["nope"]), /Unknown test tier "nope"/);
  assert.throws(() => askedTiers(["--fast"]), /Unknown flag --fast/);
});

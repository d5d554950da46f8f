/**
 * A test file for tests/unit/test_runner_test.ts: it leaves a process in its own session
 * (PID to `RUNNER_FIXTURE_PID_FILE`) and then never finishes, like a test stuck waiting.
 *
 * @module
 */
Deno.test("hangs after starting a setsid process", async () => {
  const pidFile = Deno.env.get("RUNNER_FIXTURE_PID_FILE")!;
  await new Deno.Command("sh", {
    args: ["-c", 'setsid sleep 600 >/dev/null 2>&1 </dev/null & echo $! >"$1"', "sh", pidFile],
  }).output();
  await new Promise((r) => setTimeout(r, 600_000));
});

/**
 * A test file for tests/unit/test_runner_test.ts: it passes, but leaves a process in its
 * own session behind, as a test stopped early leaves a launcher. The process's PID goes to
 * the file named by `RUNNER_FIXTURE_PID_FILE`.
 *
 * @module
 */
Deno.test("leaves a setsid process behind", async () => {
  const pidFile = Deno.env.get("RUNNER_FIXTURE_PID_FILE")!;
  await new Deno.Command("sh", {
    args: ["-c", 'setsid sleep 600 >/dev/null 2>&1 </dev/null & echo $! >"$1"', "sh", pidFile],
  }).output();
});

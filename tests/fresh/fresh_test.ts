/**
 * The fresh-machine tier: `tests/fresh/check.sh` installs the project with
 * `deploy/setup.sh` into a freshly debootstrapped Debian 12 root and checks that
 * every program the tests and local mode call is there afterwards.
 *
 * @module
 */
import assert from "node:assert/strict";

const CHECK = new URL("./check.sh", import.meta.url).pathname;

Deno.test("deploy/setup.sh gives a fresh Debian 12 root every program the tests and local mode call", async () => {
  // Inherited stdio: the check prints each step and its timings as it goes.
  const { code } = await new Deno.Command("bash", {
    args: [CHECK],
    stdin: "null",
    stdout: "inherit",
    stderr: "inherit",
  }).output();
  assert.equal(code, 0, `tests/fresh/check.sh exited with code ${code} (see its output above)`);
});

/**
 * A test file for tests/unit/test_runner_test.ts: one test that passes and starts nothing.
 *
 * @module
 */
Deno.test("passes", () => {});

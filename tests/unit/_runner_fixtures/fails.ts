/**
 * A test file for tests/unit/test_runner_test.ts: one test that fails with a two-line
 * message and a cause.
 *
 * @module
 */
Deno.test("fixture: fails <on purpose>", () => {
  throw new Error('first line "quoted"\nsecond line', { cause: new Error("the cause") });
});

/**
 * A test file for tests/unit/test_runner_test.ts that declares no test: a tier of such
 * files runs nothing and must fail.
 *
 * @module
 */
export const NOTHING = "here";

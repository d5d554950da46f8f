/**
 * The lifecycle every long-running part of virtnode shares: `run(signal)`, `every`,
 * `sleep`, and ordered stop of groups under one abort signal; and `removeIfPresent`, the
 * one rule for cleaning up a path that may already be gone.
 *
 * @module
 */
export * from "./lifecycle.ts";
export * from "./files.ts";
export * from "./concurrency.ts";

/**
 * The lifecycle every long-running part of virtnode shares: `run(signal)`, `every`,
 * `sleep`, and ordered stop of groups under one abort signal.
 *
 * @module
 */
export * from "./lifecycle.ts";

/**
 * What the tests reach below pod-less mode's face: the launcher host's client, the
 * spawner, the scheduler's placement rules and the prober.
 *
 * @module
 */
export { type HostExit, LauncherHostClient } from "./host_client.ts";
export { scheduledStatus, wantsNode } from "./scheduler.ts";
export { podlessStandIn } from "./launchers.ts";
export { PodlessProber, type ProbeLauncher, runProbe } from "./prober.ts";
export { findLauncherByUid, LauncherSpawner, type LauncherSpawnerOptions } from "./spawner.ts";

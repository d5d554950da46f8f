/**
 * What the tests reach below pod-less mode's face: the launcher host's client, the
 * spawner, the scheduler's placement rules, the prober, and the VM controller's decisions
 * (its memory dump requests' among them).
 *
 * @module
 */
export { type HostExit, LauncherHostClient } from "./host_client.ts";
export { scheduledStatus, wantsNode } from "./scheduler.ts";
export { podlessStandIn } from "./launchers.ts";
export { PodlessProber, type ProbeLauncher, runProbe } from "./prober.ts";
export { findLauncherByUid, LauncherSpawner, type LauncherSpawnerOptions } from "./spawner.ts";
export { ownsVm } from "./vms.ts";
export { memoryDumpActions, nextMemoryDumpRequest } from "./memory_dump.ts";
export { liveUpdate, liveUpdateMemoryRefusal } from "./live_update.ts";
export {
  decideVm,
  firmwareUuid,
  printableStatus,
  runStrategyOf,
  type VmAction,
  vmiFromVm,
  vmStatus,
  type VmStatusInput,
  type VmSyncError,
} from "./vm_status.ts";

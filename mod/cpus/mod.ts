/**
 * Host CPUs as a VM's threads use them: placing a running QEMU's threads the way
 * virt-handler does for dedicated and realtime CPUs, in both modes (the launcher host's
 * launchers pod-less, the handler beside KubeVirt's launcher).
 *
 * @module
 */
export {
  findQemuPid,
  placeQemuThreads,
  QemuLocator,
  type ThreadCalls,
  type ThreadPlacement,
  type ThreadPlan,
} from "./threads.ts";
export { realtimeMask, RealtimeMaskError } from "./mask.ts";

/**
 * What the tests reach below KubeVirt mode's face: the mounts, the notify pipes and the
 * device rules and the locked-memory limits each have tests of their own.
 *
 * @module
 */
export { ContainerDiskMounts } from "./container_disk_mounts.ts";
export { claimLauncherDevices } from "./device_ownership.ts";
export { deviceCgroupOf, HotplugMountError, HotplugMounts } from "./hotplug_mounts.ts";
export { deviceFilterProgram, LAUNCHER_DEVICE_RULES, setDeviceRules } from "./device_cgroup_v2.ts";
export { MAX_PIPE_CONNECTIONS, NotifyPipes } from "./notify_pipes.ts";
export {
  adjustQemuMemlock,
  adjustVirtqemudMemlock,
  needsLockedMemory,
  parseProcStat,
  qemuMemlockBytes,
  virtqemudMemlockBytes,
} from "./memlock.ts";

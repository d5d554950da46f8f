/**
 * The launcher role (`virtnode launcher`): one per VMI. It serves KubeVirt's cmd gRPC API
 * on `<socket dir>/launcher-sock`, turns the VMI into a libvirt domain through the
 * converter and `ffi/`, and streams the domain's events to the handler's notify socket.
 *
 * @example
 * ```ts
 * import { parseLauncherArgs, runLauncher } from "./mod/launcher/mod.ts";
 * Deno.exit(await runLauncher(parseLauncherArgs(Deno.args)));
 * ```
 *
 * @module
 */

export {
  formatLauncherArgs,
  LAUNCHER_USAGE,
  LauncherArgsError,
  type LauncherOptions,
  parseLauncherArgs,
} from "./args/mod.ts";
export {
  EXIT_DOMAIN_FAILED,
  EXIT_START_FAILED,
  type LauncherRuntime,
  runLauncher,
} from "./launcher.ts";
export {
  type CmdBackend,
  CmdServer,
  CmdServerError,
  type CmdServerOptions,
  launcherInitSocketPath,
  launcherSocketPath,
} from "./cmd_server.ts";
export { type PrepareOptions } from "./converter.ts";
export {
  EXIT_HOST_START_FAILED,
  LauncherHost,
  type LauncherHostRuntime,
  runLauncherHost,
} from "./host.ts";
export {
  checkHostedVmSpec,
  type HostedVmSpec,
  HostedVmSpecError,
  type HostedVmStatus,
  type LauncherHostOptions,
  readLines,
} from "./host_protocol/mod.ts";
export { type InstanceEnd, LauncherInstance, type LauncherInstanceOptions } from "./instance.ts";
export {
  EventForwarder,
  type EventSink,
  type ForwardedDomain,
  NO_SINK,
  updatesDomain,
} from "./event_forwarder.ts";
export { type IsoTool } from "./iso.ts";
export { ConnectionKeeper } from "./connection_keeper.ts";
export { CpuPool } from "./cpu_pool.ts";
export {
  type ConverterSettings,
  DomainManager,
  type DomainManagerOptions,
  LauncherCommandError,
  parseVmiJson,
  type VmiRef,
} from "./domain_manager.ts";
export type { QemuUser } from "./qemu_user.ts";
export {
  type InvolvedObject,
  isTransientNotifyError,
  type K8sEventType,
  NotifyClient,
  NotifyError,
  type NotifyTimeouts,
} from "./notify_client.ts";
export { deviceAliases, type NetDevCounters, parseNetDev } from "./domain_stats.ts";

/**
 * The launcher host's control protocol, shared by the host and the handler.
 *
 * @module
 */

export {
  checkHostedVmSpec,
  type HostedVmSpec,
  HostedVmSpecError,
  type HostedVmStatus,
  type LauncherHostOptions,
  readLines,
  UID,
  writeAll,
} from "./protocol.ts";

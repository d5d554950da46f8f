/**
 * The command line of `virtnode launcher`, parsed and written. Kept apart from the
 * launcher itself so that the handler, which writes launcher command lines, loads
 * none of the launcher's code.
 *
 * @module
 */
export {
  formatLauncherArgs,
  LAUNCHER_USAGE,
  LauncherArgsError,
  type LauncherOptions,
  parseLauncherArgs,
} from "./args.ts";

/**
 * A tiny entry point that runs the launcher as its own process, as `virtnode launcher`
 * will: `deno run -A tests/helpers/launcher_entry.ts --namespace ... --name ...`.
 * Exits 64 on a bad argument, else with the launcher's exit code.
 *
 * @module
 */

import { LauncherArgsError, parseLauncherArgs, runLauncher } from "../../mod/launcher/mod.ts";
import { setupLogging } from "../../mod/log/mod.ts";

setupLogging({ level: "info", format: "json", component: "virt-launcher" });
try {
  Deno.exit(await runLauncher(parseLauncherArgs(Deno.args)));
} catch (error) {
  if (error instanceof LauncherArgsError) {
    console.error(`virtnode launcher: ${error.message}`);
    Deno.exit(64);
  }
  throw error;
}

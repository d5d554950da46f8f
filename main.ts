/**
 * virtnode: a KubeVirt-compatible node agent in one binary.
 *
 * This file is the composition root: it parses the command line and the
 * configuration, sets up logging, and wires the modules under `mod/` and `ffi/`
 * for each subcommand. No other file knows every module, and heavy modules
 * (the Kubernetes client, libvirt) are loaded only by the subcommands that use
 * them, which keeps each role's memory small.
 *
 * @module
 */
import { Command, CommanderError, Option } from "commander";
import denoJson from "./deno.json" with { type: "json" };
import {
  type Config,
  ConfigError,
  parseConfig,
  type RawConfig,
  SETTINGS,
} from "./mod/config/mod.ts";
import { getLogger, setupLogging } from "./mod/log/mod.ts";

/** virtnode's own version, from deno.json. */
export const VERSION: string = denoJson.version;

/** Exit code for a bad flag or configuration value. */
const EXIT_USAGE = 2;

/** Reads and validates the configuration of a subcommand; exits 2 on a bad value. */
function loadConfig(command: Command, component: string): Config {
  const opts = command.optsWithGlobals() as RawConfig;
  let config: Config;
  try {
    config = parseConfig(opts);
  } catch (error) {
    if (error instanceof ConfigError) {
      console.error(`virtnode: ${error.message}`);
      Deno.exit(EXIT_USAGE);
    }
    throw error;
  }
  setupLogging({ level: config.logLevel, format: config.logFormat, component });
  return config;
}

function dotted(v: { major: number; minor: number; release: number }): string {
  return `${v.major}.${v.minor}.${v.release}`;
}

/** libvirt's library version, read through its built-in test driver (no daemon needed). */
async function libvirtVersion(): Promise<string> {
  const { openLibvirt } = await import("./ffi/mod.ts");
  const conn = await openLibvirt("test:///default", { events: false, workers: 1 });
  try {
    return dotted(await conn.getLibVersion());
  } finally {
    await conn.close();
  }
}

async function openLibvirtProbe(uri: string): Promise<string> {
  const { openLibvirt } = await import("./ffi/mod.ts");
  const conn = await openLibvirt(uri, { events: false, workers: 1 });
  try {
    return `connected, hypervisor version ${dotted(await conn.getHypervisorVersion())}`;
  } finally {
    await conn.close();
  }
}

async function apiserverVersion(kubeconfig: string | undefined): Promise<string> {
  const { loadKubeClient } = await import("./mod/kube/mod.ts");
  const client = await loadKubeClient({ kubeconfigPath: kubeconfig, timeoutMs: 5_000 });
  try {
    const v = await client.request<{ gitVersion: string }>("GET", "/version");
    return `Kubernetes ${v.gitVersion}`;
  } finally {
    client.close();
  }
}

function buildProgram(): Command {
  const program = new Command("virtnode")
    .description(
      "KubeVirt-compatible node agent: runs VirtualMachineInstances on this node through libvirt",
    )
    .version(VERSION, "-V, --version", "print virtnode's version")
    .showHelpAfterError("(run 'virtnode --help' for usage)")
    .exitOverride();
  for (const s of SETTINGS) {
    program.addOption(
      new Option(`${s.flag} <value>`, `${s.description} (env: ${s.env})`),
    );
  }

  program.command("version")
    .description("print virtnode's, Deno's, V8's and libvirt's versions")
    .action(async () => {
      const lines = [
        `virtnode ${VERSION}`,
        `deno ${Deno.version.deno}`,
        `v8 ${Deno.version.v8}`,
        `typescript ${Deno.version.typescript}`,
      ];
      try {
        lines.push(`libvirt ${await libvirtVersion()}`);
      } catch (error) {
        lines.push(`libvirt unavailable: ${error instanceof Error ? error.message : error}`);
      }
      console.log(lines.join("\n"));
    });

  program.command("check")
    .description("preflight: libvirt, KVM, apiserver and directories, each PASS/WARN/FAIL")
    .action(async (_opts, command: Command) => {
      const config = loadConfig(command, "virtnode-check");
      const { runPreflight, formatReport } = await import("./mod/preflight/mod.ts");
      const results = await runPreflight(config, {
        libvirtVersion,
        openLibvirt: openLibvirtProbe,
        apiserverVersion,
      });
      console.log(formatReport(results));
      const failed = results.filter((r) => r.verdict === "FAIL").length;
      if (failed > 0) {
        console.log(`\n${failed} check(s) failed`);
        Deno.exit(1);
      }
    });

  return program;
}

/** Runs the CLI with the given arguments (without the program name). */
export async function main(args: string[]): Promise<void> {
  const program = buildProgram();
  try {
    await program.parseAsync(args, { from: "user" });
  } catch (error) {
    if (error instanceof CommanderError) {
      Deno.exit(error.exitCode === 0 ? 0 : EXIT_USAGE);
    }
    getLogger().fatal("virtnode failed: {error}", { error });
    console.error(`virtnode: ${error instanceof Error ? error.message : error}`);
    Deno.exit(1);
  }
}

if (import.meta.main) await main(Deno.args);

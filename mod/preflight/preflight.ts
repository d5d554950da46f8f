/**
 * The preflight checks and their report; the folder's face is `mod.ts`.
 *
 * @module
 */
import type { Config } from "../config/mod.ts";
import { child, children, parseXml, path } from "../xml/mod.ts";

/** The outcome of one check. */
export type Verdict = "PASS" | "WARN" | "FAIL";

/** One line of the preflight report. */
export interface CheckResult {
  /** What was checked, e.g. `libvirt connection`. */
  name: string;
  /** PASS, WARN or FAIL. */
  verdict: Verdict;
  /** Why: what was found, or the error. */
  detail: string;
}

/** What the preflight needs from the rest of the agent. */
export interface PreflightProbes {
  /** Loads libvirt and returns its library version, e.g. `9.0.0`. */
  libvirtVersion(): Promise<string>;
  /** Opens the URI and returns the hypervisor's name and version; closes it again. */
  openLibvirt(uri: string): Promise<string>;
  /** Reaches the apiserver with the configured kubeconfig; returns its version string. */
  apiserverVersion(kubeconfig: string | undefined): Promise<string>;
  /** Opens the URI and returns the host's capabilities XML (`virConnectGetCapabilities`). */
  capabilities(uri: string): Promise<string>;
}

/** Options of {@linkcode runPreflight}. */
export interface PreflightOptions {
  /**
   * Local mode (`deno task start`): its libvirtd runs QEMU without a security driver, so a
   * missing one is a WARN there, not a FAIL.
   */
  local?: boolean;
}

/** The name of the security driver's line in the report. */
export const SECURITY_DRIVER_CHECK = "libvirt security driver";
/**
 * libvirt's security drivers that give each QEMU a label of its own (sVirt), so that one
 * guest's QEMU cannot open another's files. DAC alone runs every QEMU as the same user.
 */
export const CONFINING_SECURITY_MODELS: readonly string[] = ["selinux", "apparmor"];

/** The security models of a libvirt capabilities document (`<host><secmodel><model>`). */
export function securityModels(capabilitiesXml: string): string[] {
  const host = path(parseXml(capabilitiesXml), "host");
  return children(host, "secmodel").map((m) => child(m, "model")?.text.trim() ?? "")
    .filter((m) => m !== "");
}

/**
 * PASS when libvirt at `uri` runs QEMU under a confining security driver (SELinux or
 * AppArmor); else FAIL naming the fix, or in local mode WARN saying what that means.
 */
export function checkSecurityDriver(
  uri: string,
  models: string[],
  options: PreflightOptions = {},
): CheckResult {
  const name = SECURITY_DRIVER_CHECK;
  const confining = models.filter((m) => CONFINING_SECURITY_MODELS.includes(m));
  if (confining.length > 0) {
    return {
      name,
      verdict: "PASS",
      detail: `${uri} labels each QEMU apart with "${confining[0]}"`,
    };
  }
  const found = models.length > 0
    ? `security model(s) ${models.map((m) => `"${m}"`).join(", ")}`
    : "no security model (no <secmodel> in its capabilities)";
  const risk = "every guest's QEMU runs unconfined, as one user, so a guest that escapes " +
    "QEMU can open every other guest's disks";
  if (options.local) {
    return {
      name,
      verdict: "WARN",
      detail: `local mode: ${uri} has ${found}: ${risk}; run only guests you trust`,
    };
  }
  return {
    name,
    verdict: "FAIL",
    detail: `${uri} has ${found}: ${risk}; set security_driver = "selinux" or "apparmor" ` +
      "in /etc/libvirt/qemu.conf (with that LSM enabled on the host) and restart libvirtd",
  };
}

function describe(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  const cause = error.cause instanceof Error ? `: ${error.cause.message}` : "";
  return error.message + (error.message.endsWith(cause.slice(2)) ? "" : cause);
}

async function attempt(
  name: string,
  run: () => Promise<string>,
  onError: Verdict = "FAIL",
): Promise<CheckResult> {
  try {
    return { name, verdict: "PASS", detail: await run() };
  } catch (error) {
    return { name, verdict: onError, detail: describe(error) };
  }
}

/** Checks that a directory exists (or can be created) and that a file can be written in it. */
export async function checkWritableDir(name: string, dir: string): Promise<CheckResult> {
  return await attempt(name, async () => {
    await Deno.mkdir(dir, { recursive: true, mode: 0o700 });
    const probe = await Deno.makeTempFile({ dir, prefix: ".virtnode-check-" });
    await Deno.remove(probe);
    return `${dir} is writable`;
  });
}

/** Reports whether `/dev/kvm` can be opened; software emulation (TCG) is a warning. */
export async function checkKvm(path = "/dev/kvm"): Promise<CheckResult> {
  try {
    const f = await Deno.open(path, { read: true, write: true });
    f.close();
    return { name: "kvm", verdict: "PASS", detail: `${path} is usable: hardware virtualization` };
  } catch (error) {
    const why = error instanceof Deno.errors.NotFound ? "missing" : describe(error);
    return {
      name: "kvm",
      verdict: "WARN",
      detail: `${path} ${why}: guests run under software emulation (domain type "qemu")`,
    };
  }
}

/** Runs every check in order and returns their results. */
export async function runPreflight(
  config: Config,
  probes: PreflightProbes,
  options: PreflightOptions = {},
): Promise<CheckResult[]> {
  const results: CheckResult[] = [];
  results.push(
    await attempt("libvirt library", async () => {
      return `libvirt.so.0 loaded, version ${await probes.libvirtVersion()}`;
    }),
  );
  results.push(
    await attempt(
      "libvirt connection",
      async () => `${config.libvirtUri}: ${await probes.openLibvirt(config.libvirtUri)}`,
    ),
  );
  try {
    const models = securityModels(await probes.capabilities(config.libvirtUri));
    results.push(checkSecurityDriver(config.libvirtUri, models, options));
  } catch (error) {
    results.push({
      name: SECURITY_DRIVER_CHECK,
      verdict: "FAIL",
      detail: `Cannot read the capabilities of ${config.libvirtUri}: ${describe(error)}`,
    });
  }
  results.push(await checkKvm());
  results.push(
    await attempt("apiserver", async () => {
      const where = config.kubeconfig ?? "in-cluster service account";
      return `reached with ${where}: ${await probes.apiserverVersion(config.kubeconfig)}`;
    }),
  );
  results.push(await checkWritableDir("state directory", config.stateDir));
  results.push(await checkWritableDir("run directory", config.runDir));
  return results;
}

/** Formats results as aligned lines, `PASS  name  detail`. */
export function formatReport(results: CheckResult[]): string {
  const width = Math.max(...results.map((r) => r.name.length));
  return results.map((r) => `${r.verdict.padEnd(4)}  ${r.name.padEnd(width)}  ${r.detail}`)
    .join("\n");
}

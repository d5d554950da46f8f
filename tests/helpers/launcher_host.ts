/**
 * Runs `virtnode launcher-host` (from `main.ts`) as its own process for the tests, and
 * talks to it through the handler's own control client.
 *
 * @module
 */

import { LauncherHostClient } from "../../mod/handler/testing.ts";
import type { HostExit } from "../../mod/handler/testing.ts";
import type { HostedVmSpec } from "../../mod/launcher/mod.ts";
import { waitFor } from "./handler_process.ts";
import { GUEST_CPU_FEATURES } from "../harness/guest_cpu.ts";

const MAIN = new URL("../../main.ts", import.meta.url).pathname;

/** A running launcher host process. */
export interface HostProcess {
  /** The host's directory. */
  dir: string;
  /** The control socket. */
  controlSocket: string;
  /** The process. */
  child: Deno.ChildProcess;
  /** Its output so far. */
  log(): Promise<string>;
  /** A control connection; `exits` collects the launchers the host reports ended. */
  connect(exits?: HostExit[]): Promise<LauncherHostClient>;
  /** Sends a signal and waits for the exit. */
  kill(signal?: Deno.Signal): Promise<Deno.CommandStatus>;
}

/** Options of {@linkcode startHostProcess}. */
export interface HostProcessOptions {
  /** The host's directory (kept across restarts). */
  dir: string;
  /** libvirt URI. */
  libvirtUri: string;
  /** The handler's notify socket. */
  notifySocket?: string;
  /** Where the output goes (appended). */
  logFile: string;
  /** The host disk root (`--host-disk-root`); none unless told. */
  hostDiskRoot?: string;
}

/** Starts a launcher host and waits for its control socket. */
export async function startHostProcess(o: HostProcessOptions): Promise<HostProcess> {
  const controlSocket = `${o.dir}/control.sock`;
  await Deno.remove(controlSocket).catch(() => {});
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      "--v8-flags=--lite-mode",
      MAIN,
      "--log-format",
      "json",
      "--log-level",
      "debug",
      "--libvirt-uri",
      o.libvirtUri,
      "launcher-host",
      "--host-id",
      `test-${crypto.randomUUID().slice(0, 8)}`,
      "--dir",
      o.dir,
      "--image-dir",
      `${o.dir}/images`,
      ...(o.notifySocket ? ["--notify-socket", o.notifySocket] : []),
      ...(o.hostDiskRoot ? ["--host-disk-root", o.hostDiskRoot] : []),
    ],
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const pump = async (stream: ReadableStream<Uint8Array>) => {
    for await (const chunk of stream) await Deno.writeFile(o.logFile, chunk, { append: true });
  };
  pump(child.stdout);
  pump(child.stderr);
  let exited = false;
  child.status.then(() => exited = true);
  const log = () => Deno.readTextFile(o.logFile).catch(() => "");
  await waitFor(
    "the launcher host's control socket",
    async () => {
      if (exited) throw new Error(`launcher host exited early; log:\n${await log()}`);
      return await Deno.lstat(controlSocket).then(() => true, () => false);
    },
    60_000,
    20,
  );
  return {
    dir: o.dir,
    controlSocket,
    child,
    log,
    connect: (exits = []) => LauncherHostClient.connect(controlSocket, (e) => exits.push(e)),
    async kill(signal: Deno.Signal = "SIGTERM") {
      try {
        child.kill(signal);
      } catch { /* gone already */ }
      return await child.status;
    },
  };
}

/** A spec for a VMI served by a host whose directories live below `dir`. */
export function hostedSpec(dir: string, name: string, uid = crypto.randomUUID()): HostedVmSpec {
  return {
    namespace: "default",
    name,
    uid,
    gracePeriodSeconds: 0,
    socketDir: `${dir}/sockets/${uid}`,
    runDir: `${dir}/run/${uid}`,
    diskDir: `${dir}/disks/${uid}`,
  };
}

/**
 * A VMI for a spec of {@linkcode hostedSpec}: 64 MiB, no grace period, `devices` as given
 * (`spec` extras replace whole fields, e.g. a `domain` the converter refuses).
 */
export function hostedVmi(
  spec: HostedVmSpec,
  options: { devices?: Record<string, unknown>; spec?: Record<string, unknown> } = {},
) {
  return {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachineInstance",
    metadata: { name: spec.name, namespace: spec.namespace, uid: spec.uid },
    spec: {
      terminationGracePeriodSeconds: 0,
      domain: {
        cpu: { features: GUEST_CPU_FEATURES },
        memory: { guest: "64Mi" },
        devices: options.devices ?? {},
      },
      ...options.spec,
    },
  };
}

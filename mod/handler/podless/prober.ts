/**
 * The kubelet's part for a pod-less node's VMI probes. In KubeVirt mode virt-controller
 * renders a VMI's `readinessProbe` and `livenessProbe` into its launcher pod (an `exec` or
 * `guestAgentPing` probe as KubeVirt's virt-probe, which calls the launcher's `Exec` or
 * `GuestPing`), the kubelet runs them, and the VMI's `Ready` condition follows the pod's;
 * a liveness probe that fails ends the pod and with it the VMI. Pod-less, nothing runs
 * them, so this does, with the kubelet's timing: the first probe after
 * `initialDelaySeconds`, one every `periodSeconds`, a result after `successThreshold`
 * passes or `failureThreshold` failures in a row.
 *
 * `guestAgentPing` and `exec` go to the VMI's launcher; `tcpSocket` and `httpGet` to the
 * VMI's pod address (or the probe's `host`), from the node, as the kubelet's do.
 *
 * @module
 */
import * as net from "node:net";
import * as nodeHttp from "node:http";
import * as https from "node:https";
import type { Probe, VirtualMachineInstance } from "../../api/mod.ts";
import { vmiKey } from "../../api/mod.ts";
import { domainNameOf } from "../../domain/mod.ts";
import { errorText } from "../../../ffi/mod.ts";
import { getLogger } from "../../log/mod.ts";

const log = getLogger("handler", "prober");

/** The kubelet's defaults for a probe's timing, in seconds and counts. */
const DEFAULTS = {
  initialDelaySeconds: 0,
  timeoutSeconds: 1,
  periodSeconds: 10,
  successThreshold: 1,
  failureThreshold: 3,
};

/** What a readiness probe says of a VMI now. */
export interface Readiness {
  /** Whether the VMI is ready. */
  ready: boolean;
  /** Why not, for its `Ready` condition; empty when ready. */
  message: string;
}

/** The launcher calls the probes make (the handler's cmd client to the VMI's launcher). */
export interface ProbeLauncher {
  /** The guest agent answered `guest-ping` within the time. */
  guestPing(domainName: string, timeoutSeconds: number): Promise<void>;
  /** The command ran in the guest; its exit code. */
  exec(
    domainName: string,
    command: string,
    args: readonly string[],
    timeoutSeconds: number,
  ): Promise<{ exitCode: number }>;
}

/** What the prober needs of the handler. */
export interface ProberOptions {
  /** The VMI's launcher, when it has one now. */
  launcher(uid: string): ProbeLauncher | undefined;
  /** A readiness verdict changed: the VMI's status is to be written again. */
  wake(key: string): void;
  /**
   * The liveness probe failed `failureThreshold` times in a row: the VMI is to end, as its
   * pod would. Called once per guest run.
   */
  unhealthy(vmi: VirtualMachineInstance, message: string): void;
}

/** One probe of one running VMI, with its count of passes or failures in a row. */
class ProbeLoop {
  readonly #timing: typeof DEFAULTS;
  readonly #run: () => Promise<void>;
  readonly #verdict: (passed: boolean, detail: string) => void;
  #timer?: ReturnType<typeof setTimeout>;
  #interval?: ReturnType<typeof setInterval>;
  #running = false;
  #passes = 0;
  #failures = 0;
  #stopped = false;

  /**
   * Runs `run` after the probe's initial delay and then every period; calls `verdict`
   * after each pass once enough passed in a row, and after each failure once enough
   * failed in a row (with the last failure's reason).
   */
  constructor(
    probe: Probe,
    run: () => Promise<void>,
    verdict: (passed: boolean, detail: string) => void,
  ) {
    this.#timing = timing(probe);
    this.#run = run;
    this.#verdict = verdict;
    const tick = () => void this.#tick();
    this.#timer = setTimeout(() => {
      if (this.#stopped) return;
      tick();
      this.#interval = setInterval(tick, this.#timing.periodSeconds * 1000);
    }, this.#timing.initialDelaySeconds * 1000);
  }

  async #tick(): Promise<void> {
    // One probe at a time: a slow one is not started over (the kubelet's worker waits).
    if (this.#running || this.#stopped) return;
    this.#running = true;
    try {
      await this.#run();
      this.#failures = 0;
      this.#passes++;
      if (!this.#stopped && this.#passes >= this.#timing.successThreshold) {
        this.#verdict(true, "");
      }
    } catch (error) {
      this.#passes = 0;
      this.#failures++;
      if (!this.#stopped && this.#failures >= this.#timing.failureThreshold) {
        this.#verdict(false, errorText(error));
      }
    } finally {
      this.#running = false;
    }
  }

  /** Stops it; a probe under way finishes without a verdict. */
  stop(): void {
    this.#stopped = true;
    clearTimeout(this.#timer);
    clearInterval(this.#interval);
  }
}

/** A probe's timing with the kubelet's defaults and floors. */
function timing(probe: Probe): typeof DEFAULTS {
  const pick = (value: number | undefined, fallback: number, floor: number) =>
    typeof value === "number" && Number.isFinite(value) && value > 0
      ? Math.max(floor, Math.trunc(value))
      : fallback;
  return {
    initialDelaySeconds: pick(probe.initialDelaySeconds, 0, 0),
    timeoutSeconds: pick(probe.timeoutSeconds, DEFAULTS.timeoutSeconds, 1),
    periodSeconds: pick(probe.periodSeconds, DEFAULTS.periodSeconds, 1),
    successThreshold: pick(probe.successThreshold, DEFAULTS.successThreshold, 1),
    failureThreshold: pick(probe.failureThreshold, DEFAULTS.failureThreshold, 1),
  };
}

/** A port of a probe as a number; a named port cannot be resolved without a pod. */
function portOf(port: number | string): number {
  const n = typeof port === "number" ? port : /^\d+$/.test(port) ? Number(port) : NaN;
  if (!Number.isInteger(n) || n < 1 || n > 65535) {
    throw new Error(`port "${port}" is not a port number (named ports need a pod)`);
  }
  return n;
}

/** Brackets an IPv6 address for a URL or connect. */
function hostOf(address: string): string {
  return address.includes(":") ? `[${address}]` : address;
}

/**
 * Runs one probe once; resolves when it passes, throws an error whose text says why it
 * did not (the `Ready` condition's message).
 */
export async function runProbe(
  probe: Probe,
  target: { domainName: string; address?: string; launcher?: ProbeLauncher },
): Promise<void> {
  const { timeoutSeconds } = timing(probe);
  if (probe.guestAgentPing) {
    if (!target.launcher) throw new Error("the VMI has no launcher to ask its guest agent");
    await target.launcher.guestPing(target.domainName, timeoutSeconds);
    return;
  }
  if (probe.exec) {
    const [command, ...args] = probe.exec.command ?? [];
    if (!command) throw new Error("the exec probe has no command");
    if (!target.launcher) throw new Error("the VMI has no launcher to run its command");
    const { exitCode } = await target.launcher.exec(
      target.domainName,
      command,
      args,
      timeoutSeconds,
    );
    if (exitCode !== 0) throw new Error(`command "${command}" exited with code ${exitCode}`);
    return;
  }
  const remote = probe.tcpSocket ?? probe.httpGet;
  if (!remote) throw new Error("the probe names no handler (exec, httpGet, tcpSocket, ping)");
  const hostname = remote.host || target.address;
  if (!hostname) throw new Error("the VMI has no address on the pod network yet");
  const port = portOf(remote.port);
  const timeoutMs = timeoutSeconds * 1000;
  if (probe.tcpSocket) {
    await new Promise<void>((resolve, reject) => {
      const socket = net.connect({ host: hostname, port, timeout: timeoutMs });
      const fail = (why: string) => {
        socket.destroy();
        reject(new Error(`dial tcp ${hostOf(hostname)}:${port}: ${why}`));
      };
      socket.once("connect", () => {
        socket.destroy();
        resolve();
      });
      socket.once("timeout", () => fail("i/o timeout"));
      socket.once("error", (error) => fail(errorText(error)));
    });
    return;
  }
  const http = probe.httpGet!;
  const secure = (http.scheme ?? "HTTP").toUpperCase() === "HTTPS";
  const path = http.path ? (http.path.startsWith("/") ? http.path : `/${http.path}`) : "/";
  const url = `${secure ? "https" : "http"}://${hostOf(hostname)}:${port}${path}`;
  const headers: Record<string, string> = { "User-Agent": "kube-probe/virtnode" };
  for (const h of http.httpHeaders ?? []) headers[h.name] = h.value;
  const status = await new Promise<number>((resolve, reject) => {
    // As the kubelet's: a probed server's certificate is not checked, redirects not followed,
    // and the whole request has the probe's time (a server that trickles bytes does not
    // hold it open); once the status line is in, the connection goes (the body is unread).
    const request = (secure ? https : nodeHttp).request(url, {
      method: "GET",
      headers,
      ...(secure ? { rejectUnauthorized: false } : {}),
    }, (response) => {
      clearTimeout(deadline);
      resolve(response.statusCode ?? 0);
      request.destroy();
    });
    const deadline = setTimeout(() => {
      request.destroy();
      reject(new Error(`Get "${url}": context deadline exceeded`));
    }, timeoutMs);
    request.once("error", (error) => {
      clearTimeout(deadline);
      reject(new Error(`Get "${url}": ${errorText(error)}`));
    });
    request.end();
  });
  if (status < 200 || status >= 400) {
    throw new Error(`HTTP probe failed with statuscode: ${status}`);
  }
}

/** The probes of one VMI's guest run, and what its readiness probe says. */
interface Tracked {
  vmi: VirtualMachineInstance;
  /** The probes' spec as JSON, to notice a change. */
  spec: string;
  address?: string;
  readiness?: Readiness;
  loops: ProbeLoop[];
  unhealthySaid: boolean;
}

/** Runs the probes of this node's running VMIs (see the module's doc). */
export class PodlessProber {
  readonly #o: ProberOptions;
  readonly #tracked = new Map<string, Tracked>();

  /** Creates the prober; nothing runs before {@linkcode observe}. */
  constructor(options: ProberOptions) {
    this.#o = options;
  }

  /**
   * Called at each sync of a VMI: while its guest runs, its probes run (started at its
   * first sync as running, restarted when they change); once it stops, they stop. Returns
   * what its readiness probe says, or `undefined` when it has none.
   */
  observe(
    vmi: VirtualMachineInstance,
    guest: { running: boolean; address?: string },
  ): Readiness | undefined {
    const uid = vmi.metadata.uid!;
    const { readinessProbe, livenessProbe } = vmi.spec;
    if (!guest.running || (!readinessProbe && !livenessProbe)) {
      this.forget(uid);
      return readinessProbe ? notYet("the guest is not running") : undefined;
    }
    const spec = JSON.stringify([readinessProbe ?? null, livenessProbe ?? null]);
    let tracked = this.#tracked.get(uid);
    if (tracked && tracked.spec !== spec) {
      this.forget(uid);
      tracked = undefined;
    }
    if (!tracked) {
      tracked = this.#start(vmi, spec, guest.address);
      this.#tracked.set(uid, tracked);
    }
    tracked.vmi = vmi;
    tracked.address = guest.address;
    return tracked.readiness;
  }

  /** Stops the probes of the VMI `uid`. */
  forget(uid: string): void {
    const tracked = this.#tracked.get(uid);
    if (!tracked) return;
    for (const loop of tracked.loops) loop.stop();
    this.#tracked.delete(uid);
  }

  /** Stops every probe. */
  stop(): void {
    for (const uid of [...this.#tracked.keys()]) this.forget(uid);
  }

  #start(vmi: VirtualMachineInstance, spec: string, address?: string): Tracked {
    const uid = vmi.metadata.uid!;
    const key = vmiKey(vmi.metadata);
    const tracked: Tracked = {
      vmi,
      spec,
      address,
      loops: [],
      unhealthySaid: false,
      readiness: vmi.spec.readinessProbe
        ? notYet("the readiness probe has not passed yet")
        : undefined,
    };
    const target = () => ({
      domainName: domainNameOf(vmi.metadata.namespace!, vmi.metadata.name!),
      address: tracked.address,
      launcher: this.#o.launcher(uid),
    });
    const readinessProbe = vmi.spec.readinessProbe;
    if (readinessProbe) {
      tracked.loops.push(
        new ProbeLoop(readinessProbe, () => runProbe(readinessProbe, target()), (passed, why) => {
          const next: Readiness = passed
            ? { ready: true, message: "" }
            : { ready: false, message: `Readiness probe failed: ${why}` };
          const was = tracked.readiness;
          tracked.readiness = next;
          if (was?.ready !== next.ready || was.message !== next.message) {
            log.info("Readiness of {key}: {ready}", { key, ready: next.ready, why });
            this.#o.wake(key);
          }
        }),
      );
    }
    const livenessProbe = vmi.spec.livenessProbe;
    if (livenessProbe) {
      tracked.loops.push(
        new ProbeLoop(livenessProbe, () => runProbe(livenessProbe, target()), (passed, why) => {
          if (passed || tracked.unhealthySaid) return;
          tracked.unhealthySaid = true;
          log.warn("Liveness probe of {key} failed: {why}", { key, why });
          this.#o.unhealthy(tracked.vmi, `Liveness probe failed: ${why}`);
        }),
      );
    }
    return tracked;
  }
}

function notYet(message: string): Readiness {
  return { ready: false, message };
}

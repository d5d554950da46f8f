/**
 * The test control plane's and test node's server processes (deploy/cluster/cluster.ts,
 * tests/harness/node/node.ts): started with their output in a log file, waited for until
 * ready (failing early with the log's tail when one exits), and stopped with SIGTERM,
 * then SIGKILL after a grace period.
 *
 * @module
 */
import { sleep } from "../../mod/lifecycle/mod.ts";
import { errorText } from "../../ffi/mod.ts";

/** How long a server gets between SIGTERM and SIGKILL. */
export const STOP_GRACE_MS = 10_000;

/** Raised when a server of the test control plane or node cannot be built, started or reached. */
export class ClusterError extends Error {
  /** Creates the error; `cause` carries the underlying failure. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "ClusterError";
  }
}

/** A child process with its log file and the promise that drains its output. */
export interface Managed {
  name: string;
  child: Deno.ChildProcess;
  logPath: string;
  drained: Promise<void>;
}

let setprivAvailable: Promise<boolean> | undefined;

function hasSetpriv(): Promise<boolean> {
  setprivAvailable ??= new Deno.Command("setpriv", {
    args: ["--pdeathsig", "SIGKILL", "--", "true"],
    stdin: "null",
    stdout: "null",
    stderr: "null",
  }).output().then((output) => output.success, () => false);
  return setprivAvailable;
}

/** Starts `binary` with its output appended to `logPath`. */
export async function spawnManaged(
  name: string,
  binary: string,
  args: string[],
  options: { logPath: string; cwd?: string; env?: Record<string, string> },
): Promise<Managed> {
  // setpriv makes the kernel kill the child when we die, even by SIGKILL; setsid gives it
  // a session of its own, so a terminal's Ctrl-C (SIGINT to the whole foreground process
  // group) does not stop it before whoever started it is done with it (local mode deletes
  // its VMIs through it first). Both exec, so the pid we signal is the server's own.
  const [command, commandArgs] = await hasSetpriv()
    ? ["setsid", ["setpriv", "--pdeathsig", "SIGKILL", "--", binary, ...args]]
    : [binary, args];
  let child: Deno.ChildProcess;
  try {
    child = new Deno.Command(command, {
      args: commandArgs,
      cwd: options.cwd,
      env: options.env,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
  } catch (error) {
    throw new ClusterError(`Cannot start ${name}: ${message(error)}`, { cause: error });
  }
  const log = await Deno.open(options.logPath, { append: true, create: true });
  // Chunk by chunk as it comes, so a running server's log can be read (Deno's
  // `FsFile.writable` held a piped stream's output until the process ended).
  const copy = async (stream: ReadableStream<Uint8Array>) => {
    for await (const chunk of stream) {
      for (let done = 0; done < chunk.length;) done += await log.write(chunk.subarray(done));
    }
  };
  const drained = Promise.all([copy(child.stdout), copy(child.stderr)])
    .finally(() => log.close()).then(() => {});
  return { name, child, logPath: options.logPath, drained };
}

/** Polls `ready` until it returns true; fails early when the process exits. */
export async function waitUntil(
  managed: Managed,
  timeoutMs: number,
  ready: () => Promise<boolean>,
): Promise<void> {
  let exited: Deno.CommandStatus | undefined;
  managed.child.status.then((status) => exited = status);
  const deadline = Date.now() + timeoutMs;
  let lastError: unknown;
  while (Date.now() < deadline) {
    if (exited) {
      throw new ClusterError(
        `Cannot start ${managed.name}: it exited with code ${exited.code}: ${await logTail(
          managed.logPath,
        )}`,
      );
    }
    try {
      if (await ready()) return;
    } catch (error) {
      lastError = error;
    }
    await sleep(100);
  }
  throw new ClusterError(
    `Cannot start ${managed.name}: not ready after ${timeoutMs} ms: ${await logTail(
      managed.logPath,
    )}`,
    { cause: lastError },
  );
}

/** SIGTERM, then SIGKILL after a grace period; waits for exit and the log to drain. */
export async function terminate(managed: Managed): Promise<void> {
  const { child } = managed;
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    child.kill("SIGTERM");
    const killed = new Promise<void>((resolve) => {
      timer = setTimeout(() => {
        try {
          child.kill("SIGKILL");
        } catch {
          // Exited just now.
        }
        resolve();
      }, STOP_GRACE_MS);
    });
    await Promise.race([child.status, killed]);
  } catch {
    // Already exited: kill() throws on a reaped child.
  } finally {
    await child.status;
    clearTimeout(timer);
    await managed.drained;
  }
}

/** The lowest port `freePorts` hands out (below it sit well-known and registered services). */
const PORT_FLOOR = 10_000;
/** The first port of Kubernetes' default NodePort range. */
const NODE_PORT_LOW = 30_000;

/**
 * The first port of the kernel's ephemeral range, which outgoing connections draw their
 * local ports from: a port chosen inside it can be taken by any connect() between the
 * choice and the server's bind (CI lost kube-controller-manager's port that way).
 */
function ephemeralLow(): number {
  try {
    const low = Number(
      Deno.readTextFileSync("/proc/sys/net/ipv4/ip_local_port_range").split(/\s+/)[0],
    );
    if (Number.isInteger(low) && low > PORT_FLOOR + 1000) return low;
  } catch {
    // No procfs: Linux's default range.
  }
  return 32768;
}

/** Whether nothing is bound to `port` on any address; the probe's socket closes at once. */
function bindable(port: number): boolean {
  try {
    Deno.listen({ hostname: "0.0.0.0", port }).close();
    return true;
  } catch (error) {
    if (error instanceof Deno.errors.AddrInUse) return false;
    throw error;
  }
}

/**
 * Distinct ports that nothing listens on, drawn at random from 10000 up to the kernel's
 * ephemeral range and Kubernetes' NodePort range, so that no outgoing connection takes one
 * before its server binds it; the random draw keeps test tiers running side by side apart.
 */
export function freePorts(count: number): number[] {
  const low = PORT_FLOOR;
  // Below the kernel's ephemeral range and below Kubernetes' NodePort range (30000-32767),
  // whose ports kube-proxy's rules send elsewhere on a test node's address.
  const high = Math.min(ephemeralLow(), NODE_PORT_LOW) - 1;
  const chosen = new Set<number>();
  for (let tries = 0; chosen.size < count; tries++) {
    if (tries > 1000) throw new ClusterError(`no free port between ${low} and ${high}`);
    const port = low + Math.floor(Math.random() * (high - low + 1));
    if (!chosen.has(port) && bindable(port)) chosen.add(port);
  }
  return [...chosen];
}

/** The last lines of a server's log, for an error message. */
export async function logTail(logPath: string): Promise<string> {
  const text = await Deno.readTextFile(logPath).catch(() => "");
  const tail = text.trimEnd().split("\n").slice(-15).join("\n");
  return tail ? `last log lines of "${logPath}":\n${tail}` : `no log in "${logPath}"`;
}

function message(error: unknown): string {
  return errorText(error);
}

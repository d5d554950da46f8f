/**
 * `virtnode handler --podless` as a process of the benchmark, timed from the
 * instant it is spawned: to `/readyz` answering 200 (polled every 10 ms) and to
 * its "Handler ready" log line. Output goes to a log file and is read line by
 * line while it runs.
 *
 * @module
 */
import { freePort, handlerArgs, launcherPids } from "../helpers/handler_process.ts";
import { BenchTimeoutError, sleep } from "./_util.ts";

/** What the handler's "Handler ready" line says, and when it was read. */
export interface ReadyLine {
  /** `performance.now()` when the line was read. */
  at: number;
  vmis: number;
  adopted: number;
  startupMs: number;
}

/** Options of {@linkcode spawnHandler}. */
export interface SpawnHandlerOptions {
  kubeconfig: string;
  nodeName: string;
  libvirtUri: string;
  /** Reuse this directory (a restart); a fresh temporary one otherwise. */
  dir?: string;
  /** `--log-level` of the handler and its launchers. */
  logLevel: string;
  /** Bound of the wait for `/readyz`. */
  readyTimeoutMs: number;
}

/** A handler process started by the benchmark. */
export interface BenchHandler {
  pid: number;
  dir: string;
  stateDir: string;
  runDir: string;
  logFile: string;
  /** `performance.now()` just before the spawn. */
  spawnedAt: number;
  /** `performance.now()` of the first `/readyz` 200. */
  readyAt: number;
  /** Resolves with the "Handler ready" line (rejects if the process exits first). */
  readyLine: Promise<ReadyLine>;
  /** Sends a signal and waits (bounded) for the exit; SIGKILL when the bound passes. */
  kill(signal: Deno.Signal, timeoutMs?: number): Promise<void>;
  /** The PIDs of the live launchers this handler's state directory names. */
  launcherPids(): number[];
}

/** Starts the handler and returns once `/readyz` answers 200. */
export async function spawnHandler(opts: SpawnHandlerOptions): Promise<BenchHandler> {
  // A short prefix: socket paths below the directory must stay under 108 bytes.
  const dir = opts.dir ?? await Deno.makeTempDir({ prefix: "vnb-" });
  const stateDir = `${dir}/state`;
  const runDir = `${dir}/run`;
  const port = freePort();
  const logFile = `${dir}/handler.log`;
  const log = await Deno.open(logFile, { append: true, create: true, write: true });
  const spawnedAt = performance.now();
  const child = new Deno.Command(Deno.execPath(), {
    // Measure the handler as it is deployed: the V8 flags of every virtnode process.
    args: handlerArgs({ ...opts, dir, port }),
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let exited: Deno.CommandStatus | undefined;
  const status = child.status.then((s) => (exited = s));

  let onReady!: (line: ReadyLine) => void;
  let onNoReady!: (error: Error) => void;
  const readyLine = new Promise<ReadyLine>((resolve, reject) => {
    onReady = resolve;
    onNoReady = reject;
  });
  readyLine.catch(() => {});
  const encoder = new TextEncoder();
  const pump = async (stream: ReadableStream<Uint8Array>) => {
    let buffer = "";
    for await (const text of stream.pipeThrough(new TextDecoderStream())) {
      await log.write(encoder.encode(text));
      buffer += text;
      let nl: number;
      while ((nl = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, nl);
        buffer = buffer.slice(nl + 1);
        if (line.includes('"Handler ready')) {
          const at = performance.now();
          try {
            const rec = JSON.parse(line) as Record<string, unknown>;
            onReady({
              at,
              vmis: Number(rec.vmis),
              adopted: Number(rec.adopted),
              startupMs: Number(rec.startupMs),
            });
          } catch {
            onReady({ at, vmis: NaN, adopted: NaN, startupMs: NaN });
          }
        }
      }
    }
  };
  const pumped = Promise.all([pump(child.stdout), pump(child.stderr)])
    .catch(() => {})
    .finally(() => {
      log.close();
      onNoReady(new Error(`Handler exited before its "Handler ready" line; log "${logFile}"`));
    });

  const health = `http://127.0.0.1:${port}`;
  const kill = async (signal: Deno.Signal, timeoutMs = 30_000) => {
    try {
      child.kill(signal);
    } catch { /* already gone */ }
    const bounded = await Promise.race([
      status.then(() => true),
      sleep(timeoutMs).then(() => false),
    ]);
    if (!bounded) {
      try {
        child.kill("SIGKILL");
      } catch { /* gone meanwhile */ }
      await status;
    }
    await Promise.race([pumped, sleep(2_000)]);
  };

  const deadline = performance.now() + opts.readyTimeoutMs;
  let readyAt: number | undefined;
  while (readyAt === undefined) {
    if (exited) {
      await Promise.race([pumped, sleep(2_000)]);
      const tail = (await Deno.readTextFile(logFile).catch(() => "")).slice(-3000);
      throw new Error(
        `Cannot start the handler: it exited with code ${exited.code}; log:\n${tail}`,
      );
    }
    if (performance.now() > deadline) {
      await kill("SIGKILL");
      throw new BenchTimeoutError(
        `Cannot start the handler: /readyz not 200 after ${opts.readyTimeoutMs} ms; log "${logFile}"`,
      );
    }
    try {
      const r = await fetch(`${health}/readyz`, { signal: AbortSignal.timeout(2_000) });
      await r.body?.cancel();
      if (r.status === 200) readyAt = performance.now();
    } catch {
      // Not listening yet.
    }
    if (readyAt === undefined) await sleep(10);
  }

  return {
    pid: child.pid,
    dir,
    stateDir,
    runDir,
    logFile,
    spawnedAt,
    readyAt,
    readyLine,
    kill,
    launcherPids: () => launcherPids(stateDir),
  };
}

export { killLaunchers, launcherPids } from "../helpers/handler_process.ts";

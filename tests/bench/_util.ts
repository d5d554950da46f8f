/**
 * Small helpers of the benchmark: statistics, bounded waits and /proc readers.
 *
 * @module
 */

/** Summary statistics of a sample, milliseconds or any unit. */
export interface Summary {
  n: number;
  min: number;
  p50: number;
  p99: number;
  max: number;
  mean: number;
}

/** Nearest-rank percentile (`q` in 0..1) of numbers; NaN for an empty list. */
export function percentile(values: number[], q: number): number {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const rank = Math.max(1, Math.ceil(q * sorted.length));
  return sorted[rank - 1];
}

/** min, p50, p99, max and mean of `values` (p99 is the maximum below 100 samples). */
export function summarize(values: number[]): Summary {
  const n = values.length;
  return {
    n,
    min: n ? Math.min(...values) : NaN,
    p50: percentile(values, 0.5),
    p99: percentile(values, 0.99),
    max: n ? Math.max(...values) : NaN,
    mean: n ? values.reduce((a, b) => a + b, 0) / n : NaN,
  };
}

/** Resolves after `ms`, or rejects at once when `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** Raised when a bounded wait of the benchmark runs out of time. */
export class BenchTimeoutError extends Error {
  /** Creates the error; `cause` carries the last failure seen while waiting. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "BenchTimeoutError";
  }
}

/** Polls `fn` every `intervalMs` until it returns a truthy value; throws after `timeoutMs`. */
export async function pollUntil<T>(
  what: string,
  fn: () => Promise<T | undefined | false | null> | T | undefined | false | null,
  options: { timeoutMs: number; intervalMs?: number; signal?: AbortSignal },
): Promise<T> {
  const deadline = performance.now() + options.timeoutMs;
  let last: unknown;
  for (;;) {
    options.signal?.throwIfAborted();
    try {
      const v = await fn();
      if (v) return v as T;
    } catch (error) {
      last = error;
    }
    if (performance.now() > deadline) {
      throw new BenchTimeoutError(`Timed out after ${options.timeoutMs} ms waiting for ${what}`, {
        cause: last,
      });
    }
    await sleep(options.intervalMs ?? 100, options.signal);
  }
}

/** Runs `fn` over `items` with at most `limit` calls in flight; results keep the input order. */
export async function mapLimit<T, R>(
  items: readonly T[],
  limit: number,
  fn: (item: T, index: number) => Promise<R>,
): Promise<R[]> {
  const out = new Array<R>(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i], i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return out;
}

/** Memory of one process from /proc, bytes; undefined when the process is gone. */
export interface ProcMemory {
  rss: number;
  pss?: number;
}

/** Reads a process's RSS (status) and PSS (smaps_rollup, when readable). */
export function procMemory(pid: number): ProcMemory | undefined {
  let status: string;
  try {
    status = Deno.readTextFileSync(`/proc/${pid}/status`);
  } catch {
    return undefined;
  }
  const rss = /^VmRSS:\s+(\d+) kB/m.exec(status);
  if (!rss) return undefined;
  let pss: number | undefined;
  try {
    const rollup = Deno.readTextFileSync(`/proc/${pid}/smaps_rollup`);
    const m = /^Pss:\s+(\d+) kB/m.exec(rollup);
    if (m) pss = Number(m[1]) * 1024;
  } catch {
    // smaps_rollup needs a newer kernel or more privilege; RSS is still good.
  }
  return { rss: Number(rss[1]) * 1024, pss };
}

/** utime+stime of a process in clock ticks (fields 14 and 15 of /proc/<pid>/stat). */
export function procCpuTicks(pid: number): number | undefined {
  let stat: string;
  try {
    stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
  } catch {
    return undefined;
  }
  // The command name (field 2) may hold spaces; fields after its closing parenthesis are plain.
  const rest = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return Number(rest[11]) + Number(rest[12]);
}

/** PIDs of processes whose command line has `name` as its program and `within` in an argument. */
export function pidsOf(name: string, within: string): number[] {
  const pids: number[] = [];
  for (const e of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(e.name)) continue;
    try {
      const args = Deno.readTextFileSync(`/proc/${e.name}/cmdline`).split("\0");
      if (args[0]?.endsWith(`/${name}`) && args.some((a) => a.includes(within))) {
        pids.push(Number(e.name));
      }
    } catch { /* exited meanwhile */ }
  }
  return pids;
}

/** Busy clock ticks of the whole machine (all CPUs: user, nice, system, irq, softirq). */
export function machineBusyTicks(): number {
  const cpu = Deno.readTextFileSync("/proc/stat").split("\n")[0].split(/\s+/).slice(1).map(
    Number,
  );
  return cpu[0] + cpu[1] + cpu[2] + cpu[5] + cpu[6];
}

let clockTicks: number | undefined;

/** The kernel's clock ticks per second (`getconf CLK_TCK`, 100 on Linux almost always). */
export function clockTicksPerSecond(): number {
  if (clockTicks !== undefined) return clockTicks;
  try {
    const out = new Deno.Command("getconf", { args: ["CLK_TCK"], stdout: "piped" }).outputSync();
    const n = Number(new TextDecoder().decode(out.stdout).trim());
    clockTicks = Number.isInteger(n) && n > 0 ? n : 100;
  } catch {
    clockTicks = 100;
  }
  return clockTicks;
}

/** MemAvailable of /proc/meminfo, bytes (Infinity when unreadable). */
export function memAvailable(): number {
  try {
    const m = /^MemAvailable:\s+(\d+) kB/m.exec(Deno.readTextFileSync("/proc/meminfo"));
    return m ? Number(m[1]) * 1024 : Infinity;
  } catch {
    return Infinity;
  }
}

/** Mebibytes of a byte count, one decimal. */
export function mib(bytes: number): number {
  return Math.round(bytes / 1024 / 1024 * 10) / 10;
}

/** A unique, DNS-label-safe suffix. */
export function suffix(): string {
  return crypto.randomUUID().slice(0, 8);
}

/** RSS (mean, max), PSS and CPU of a process over `seconds` of sampling every second. */
export async function sampleProcess(pid: number, seconds: number) {
  const hz = clockTicksPerSecond();
  const ticks0 = procCpuTicks(pid);
  const t0 = performance.now();
  const rss: number[] = [];
  const pss: number[] = [];
  for (let i = 0; i < seconds; i++) {
    await sleep(1_000);
    const m = procMemory(pid);
    if (!m) throw new Error(`Cannot sample process ${pid}: it is gone`);
    rss.push(m.rss);
    if (m.pss !== undefined) pss.push(m.pss);
  }
  const ticks1 = procCpuTicks(pid);
  const wallS = (performance.now() - t0) / 1000;
  const cpuPercent = ticks0 === undefined || ticks1 === undefined
    ? NaN
    : (ticks1 - ticks0) / hz / wallS * 100;
  return {
    rssMean: rss.reduce((a, b) => a + b, 0) / rss.length,
    rssMax: Math.max(...rss),
    pssMean: pss.length ? pss.reduce((a, b) => a + b, 0) / pss.length : undefined,
    cpuPercent,
    seconds: wallS,
  };
}

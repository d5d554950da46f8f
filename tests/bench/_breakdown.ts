/**
 * Where a create -> Running goes: the handler's and the launcher's own log lines
 * (JSON, millisecond timestamps) split each run into segments, so the report can
 * say which part is far above its floor.
 *
 * @module
 */
import { hostLogOf } from "../helpers/handler_process.ts";
import { summarize, type Summary } from "./_util.ts";

/** One timed create -> Running, wall-clock milliseconds since the epoch. */
export interface RunMarks {
  uid: string;
  /** Just before the create request. */
  createdAt: number;
  /** When the benchmark's watch saw Running. */
  runningSeenAt: number;
  /** The launcher's "Launcher ready" line, read from its log while it ran. */
  launcherReadyAt?: number;
}

/** Medians (and p99) of the segments of many runs, ms. */
export interface Breakdown {
  /** create request -> handler's "Started launcher" (or "Asking the launcher host") line. */
  toLauncherSpawn: Summary;
  /** That line -> the launcher's "Launcher ready" line. */
  launcherStart: Summary;
  /** "Launcher ready" -> handler's "VMI phase changed ... to Running" line. */
  toRunningWritten: Summary;
  /** That line -> the benchmark's watch saw Running. */
  toWatch: Summary;
}

/** The wall-clock time of the first JSON log line of `text` for which `match` holds. */
export function firstLogTime(
  text: string,
  match: (rec: Record<string, unknown>) => boolean,
): number | undefined {
  for (const line of text.split("\n")) {
    if (!line.startsWith("{")) continue;
    let rec: Record<string, unknown>;
    try {
      rec = JSON.parse(line);
    } catch {
      continue;
    }
    if (match(rec)) return Date.parse(String(rec.timestamp));
  }
  return undefined;
}

/**
 * The log a UID's launcher writes to: its own file (a launcher process), or the launcher
 * host's (`host-*.log`, every pod-less VMI's), whose lines carry the UID.
 */
function launcherLog(stateDir: string, uid: string): string {
  const dir = `${stateDir}/launchers`;
  try {
    return Deno.readTextFileSync(`${dir}/${uid}.log`);
  } catch {
    // A launcher host's log, then.
  }
  try {
    return Deno.readTextFileSync(hostLogOf(stateDir));
  } catch {
    return ""; // no log yet
  }
}

/** The launcher's "Launcher ready" time from its log, if written yet. */
export function launcherReadyAt(stateDir: string, uid: string): number | undefined {
  return firstLogTime(
    launcherLog(stateDir, uid),
    (r) => r.msg === "Launcher ready" && (r.uid === undefined || r.uid === uid),
  );
}

/** Splits runs into segments with the handler's log; runs missing a line are left out. */
export function breakdown(handlerLog: string, runs: RunMarks[]): Breakdown {
  const spawn: number[] = [];
  const start: number[] = [];
  const written: number[] = [];
  const watch: number[] = [];
  // One pass over the log: the first matching line per UID.
  const started = new Map<string, number>();
  const running = new Map<string, number>();
  for (const line of handlerLog.split("\n")) {
    if (!line.startsWith("{")) continue;
    // A launcher process is started, or the launcher host is asked to serve the VMI.
    const isStart = line.includes('"Started launcher') ||
      line.includes('"Asking the launcher host to serve');
    const isRunning = line.includes('"to":"Running"');
    if (!isStart && !isRunning) continue;
    let rec: Record<string, unknown>;
    try {
      rec = JSON.parse(line);
    } catch {
      continue;
    }
    const uid = String(rec.uid);
    const at = Date.parse(String(rec.timestamp));
    if (isStart && !started.has(uid)) started.set(uid, at);
    if (isRunning && !running.has(uid)) running.set(uid, at);
  }
  for (const r of runs) {
    const s = started.get(r.uid);
    const w = running.get(r.uid);
    if (s === undefined || w === undefined || r.launcherReadyAt === undefined) continue;
    spawn.push(s - r.createdAt);
    start.push(r.launcherReadyAt - s);
    written.push(w - r.launcherReadyAt);
    watch.push(r.runningSeenAt - w);
  }
  return {
    toLauncherSpawn: summarize(spawn),
    launcherStart: summarize(start),
    toRunningWritten: summarize(written),
    toWatch: summarize(watch),
  };
}

/** One timed domain event sample, wall-clock ms since the epoch. */
export interface EventMarks {
  uid: string;
  /** The domain status the event leads to: "Paused" or "Running". */
  status: string;
  /** Just before the cmd call. */
  sentAt: number;
  /** When the benchmark's watch saw the VMI's condition change. */
  seenAt: number;
}

/** Medians (and p99) of the segments of domain event samples, ms. */
export interface EventBreakdown {
  /** cmd call sent -> the launcher's "Domain event" line (libvirt event read, domain read). */
  toLauncherEvent: Summary;
  /** That line -> the watch saw the status (notify, handler sync, status write, watch). */
  toWatch: Summary;
}

/** Splits domain event samples with the launchers' "Domain event" log lines. */
export function eventBreakdown(stateDir: string, samples: EventMarks[]): EventBreakdown {
  const lines = new Map<string, { at: number; status: string }[]>();
  for (const uid of new Set(samples.map((s) => s.uid))) {
    const text = launcherLog(stateDir, uid);
    const list: { at: number; status: string }[] = [];
    for (const line of text.split("\n")) {
      if (!line.includes('"Domain event"') || !line.includes(uid)) continue;
      try {
        const rec = JSON.parse(line) as Record<string, unknown>;
        list.push({ at: Date.parse(String(rec.timestamp)), status: String(rec.status) });
      } catch {
        // Not JSON.
      }
    }
    lines.set(uid, list);
  }
  const toEvent: number[] = [];
  const toWatch: number[] = [];
  for (const s of samples) {
    // Log timestamps have millisecond resolution: allow the line to read 1 ms early.
    const hit = lines.get(s.uid)?.find((l) =>
      l.at >= Math.floor(s.sentAt) - 1 && l.status === s.status
    );
    if (!hit || hit.at > s.seenAt + 1) continue;
    toEvent.push(hit.at - s.sentAt);
    toWatch.push(s.seenAt - hit.at);
  }
  return { toLauncherEvent: summarize(toEvent), toWatch: summarize(toWatch) };
}

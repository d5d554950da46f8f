/**
 * What local mode's screen shows of the VMIs: a row each (name, phase, pod IP, node, age,
 * Ready), and a line of what the handler did last (its newest Event).
 *
 * @module
 */
import type { VirtualMachineInstance } from "../mod/api/mod.ts";

/** A VMI as the table and the messages name it: with its namespace unless "default". */
export function shownName(vmi: { metadata: { namespace?: string; name: string } }): string {
  const { namespace, name } = vmi.metadata;
  return namespace && namespace !== "default" ? `${namespace}/${name}` : name;
}

/** A time since `from` as kubectl shows ages: 42s, 7m, 3h, 2d. */
export function age(from: string | null | undefined, now = Date.now()): string {
  const then = from ? Date.parse(from) : NaN;
  if (Number.isNaN(then)) return "-";
  const s = Math.max(0, Math.floor((now - then) / 1000));
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.floor(s / 60)}m`;
  if (s < 172_800) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86_400)}d`;
}

/** An Event of the cluster, as far as the last-action line reads it. */
export interface ClusterEvent {
  reason?: string;
  message?: string;
  type?: string;
  lastTimestamp?: string;
  eventTime?: string;
  firstTimestamp?: string;
  source?: { component?: string; host?: string };
  involvedObject?: { namespace?: string; name?: string };
}

/** The line of what the handler did last: its newest Event, and how long ago. */
export function lastActionLine(events: ClusterEvent[], now = Date.now()): string {
  const when = (e: ClusterEvent) => e.lastTimestamp ?? e.eventTime ?? e.firstTimestamp ?? "";
  const newest = events
    .filter((e) => e.source?.component === "virt-handler")
    .sort((a, b) => Date.parse(when(b)) - Date.parse(when(a)))[0];
  if (!newest) return "handler: no Event yet";
  const about = newest.involvedObject?.name
    ? ` (${shownName({ metadata: newest.involvedObject as { namespace?: string; name: string } })})`
    : "";
  return `handler, ${age(when(newest), now)} ago: ${newest.reason}: ${newest.message}${about}`;
}

/** The VMIs' table: name, phase, pod IP, node, age and Ready, a sync error after its row. */
export function vmiRows(
  vmis: VirtualMachineInstance[],
  stale: boolean,
  now = Date.now(),
): string[] {
  const row = (cells: string[]) =>
    [
      cells[0].padEnd(16),
      cells[1].padEnd(16),
      cells[2].padEnd(15),
      cells[3].padEnd(16),
      cells[4].padEnd(5),
      cells[5],
    ].join(" ");
  const rows = [row(["NAME", "PHASE", "IP", "NODE", "AGE", "READY"])];
  for (const v of vmis) {
    const ready = v.status?.conditions?.find((c) => c.type === "Ready");
    const sync = v.status?.conditions?.find((c) => c.type === "Synchronized");
    rows.push(
      row([
        shownName(v),
        (v.status?.phase ?? "Pending") + (stale ? " (stale)" : ""),
        v.status?.interfaces?.[0]?.ipAddress ?? "-",
        v.status?.nodeName ?? "-",
        age(v.metadata.creationTimestamp, now),
        ready?.status ?? "-",
      ]) + (sync?.status === "False" ? `  sync error: ${sync.message}` : ""),
    );
  }
  return rows;
}

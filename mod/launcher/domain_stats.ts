/**
 * libvirt's typed domain statistics (`virConnectGetAllDomainStats`) in the shape of
 * KubeVirt's launcher `DomainStats` JSON (Go field names, a `...Set` flag beside each
 * value). Private to `mod/launcher`.
 *
 * @module
 */

import type { DomainStats } from "../../ffi/mod.ts";

type Params = DomainStats["params"];
type Json = Record<string, unknown>;

function num(value: unknown): number | undefined {
  if (typeof value === "number") return value;
  if (typeof value === "bigint") return Number(value);
  return undefined;
}

/** Copies `params[prefix + key]` into `out[Field]` with `out[Field + "Set"]`. */
function fill(out: Json, params: Params, prefix: string, fields: Record<string, string>): Json {
  for (const [key, field] of Object.entries(fields)) {
    const raw = params[prefix + key];
    const value = typeof raw === "string" ? raw : num(raw);
    out[`${field}Set`] = value !== undefined;
    out[field] = value ?? (typeof raw === "string" ? "" : 0);
  }
  return out;
}

function count(params: Params, key: string): number {
  return num(params[key]) ?? 0;
}

/**
 * The VMI names of a domain's disks and interfaces by their target device (`vda`, the
 * tap's name), from the `ua-<name>` aliases the converter gives them.
 */
export function deviceAliases(xml: string): Map<string, string> {
  const aliases = new Map<string, string>();
  for (const m of xml.matchAll(/<(disk|interface)\b[\s\S]*?<\/\1>/g)) {
    const target = /<target dev='([^']+)'/.exec(m[0])?.[1];
    const alias = /<alias name='ua-([^']+)'/.exec(m[0])?.[1];
    if (target && alias) aliases.set(target, alias);
  }
  return aliases;
}

/**
 * The statistics of one domain as KubeVirt's `DomainStats` JSON value; `aliases` names
 * drives and interfaces by their VMI names ({@linkcode deviceAliases}).
 */
export function domainStatsToKubevirt(
  stats: DomainStats,
  aliases: ReadonlyMap<string, string> = new Map(),
): Json {
  const p = stats.params;
  const cpu = fill({}, p, "cpu.", { time: "Time", user: "User", system: "System" });
  const memory = fill({}, p, "balloon.", {
    unused: "Unused",
    available: "Available",
    current: "ActualBalloon",
    rss: "RSS",
    swap_in: "SwapIn",
    swap_out: "SwapOut",
    major_fault: "MajorFault",
    minor_fault: "MinorFault",
    usable: "Usable",
    disk_caches: "Cached",
  });
  const totalMemory = num(p["balloon.maximum"]);
  memory.TotalSet = totalMemory !== undefined;
  memory.Total = totalMemory ?? 0;
  const vcpus = [];
  for (let i = 0; i < count(p, "vcpu.current"); i++) {
    vcpus.push(fill({}, p, `vcpu.${i}.`, {
      state: "State",
      time: "Time",
      wait: "Wait",
      delay: "Delay",
    }));
  }
  const nets = [];
  for (let i = 0; i < count(p, "net.count"); i++) {
    const name = p[`net.${i}.name`];
    const alias = typeof name === "string" ? aliases.get(name) : undefined;
    nets.push(fill({ Alias: alias ?? "", AliasSet: alias !== undefined }, p, `net.${i}.`, {
      name: "Name",
      "rx.bytes": "RxBytes",
      "rx.pkts": "RxPkts",
      "rx.errs": "RxErrs",
      "rx.drop": "RxDrop",
      "tx.bytes": "TxBytes",
      "tx.pkts": "TxPkts",
      "tx.errs": "TxErrs",
      "tx.drop": "TxDrop",
    }));
  }
  const blocks = [];
  for (let i = 0; i < count(p, "block.count"); i++) {
    const name = p[`block.${i}.name`];
    const alias = typeof name === "string" ? aliases.get(name) : undefined;
    blocks.push(fill({ Alias: alias ?? "" }, p, `block.${i}.`, {
      name: "Name",
      backingIndex: "BackingIndex",
      path: "Path",
      "rd.reqs": "RdReqs",
      "rd.bytes": "RdBytes",
      "rd.times": "RdTimes",
      "wr.reqs": "WrReqs",
      "wr.bytes": "WrBytes",
      "wr.times": "WrTimes",
      "fl.reqs": "FlReqs",
      "fl.times": "FlTimes",
      errors: "Errors",
      allocation: "Allocation",
      capacity: "Capacity",
      physical: "Physical",
    }));
  }
  return {
    Name: stats.name,
    UUID: stats.uuid,
    Cpu: cpu,
    Memory: memory,
    MigrateDomainJobInfo: null,
    NrVirtCpu: count(p, "vcpu.current"),
    Vcpu: vcpus,
    Net: nets,
    Block: blocks,
    CPUMapSet: false,
    CPUMap: null,
    DirtyRate: null,
    Load: null,
  };
}

/** One interface's counters in `/proc/net/dev`, from the interface's side. */
export interface NetDevCounters {
  /** Bytes received. */
  rxBytes: number;
  /** Packets received. */
  rxPackets: number;
  /** Receive errors. */
  rxErrors: number;
  /** Received packets dropped. */
  rxDropped: number;
  /** Bytes sent. */
  txBytes: number;
  /** Packets sent. */
  txPackets: number;
  /** Transmit errors. */
  txErrors: number;
  /** Packets to send dropped. */
  txDropped: number;
}

/** `/proc/net/dev` by interface name. */
export function parseNetDev(text: string): Map<string, NetDevCounters> {
  const out = new Map<string, NetDevCounters>();
  for (const line of text.split("\n").slice(2)) {
    const colon = line.indexOf(":");
    if (colon < 0) continue;
    const f = line.slice(colon + 1).trim().split(/\s+/).map(Number);
    if (f.length < 12 || f.some((n) => !Number.isFinite(n))) continue;
    out.set(line.slice(0, colon).trim(), {
      rxBytes: f[0],
      rxPackets: f[1],
      rxErrors: f[2],
      rxDropped: f[3],
      txBytes: f[8],
      txPackets: f[9],
      txErrors: f[10],
      txDropped: f[11],
    });
  }
  return out;
}

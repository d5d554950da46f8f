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

/** The statistics of one domain as KubeVirt's `DomainStats` JSON value. */
export function domainStatsToKubevirt(stats: DomainStats): Json {
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
    nets.push(fill({}, p, `net.${i}.`, {
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
    blocks.push(fill({ Alias: "" }, p, `block.${i}.`, {
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
    Vcpu: vcpus,
    Net: nets,
    Block: blocks,
    CPUMapSet: false,
    CPUMap: null,
    DirtyRate: null,
    Load: null,
  };
}

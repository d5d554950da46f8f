/**
 * The host CPUs a pod-less node gives VMIs with `dedicatedCpuPlacement`, in place of the
 * kubelet's static CPU manager: each such VMI gets CPUs of its own, one per enabled vCPU
 * plus one for its emulator thread with `isolateEmulatorThread` (the count KubeVirt's
 * virt-controller asks its pod's CPU request for), and no other dedicated VMI gets them
 * until it is stopped.
 *
 * The pool is the CPUs its process may run on (`Cpus_allowed_list`), so an operator who
 * keeps CPUs for the node's own work starts the handler with a narrower affinity. The
 * truth survives restarts in the domains themselves: a launcher host that adopts running
 * VMs takes back the CPUs their definitions pin ({@linkcode pinnedCpusOfDomainXml}).
 *
 * Which CPUs: the lowest free ones, whole cores first where the host has thread siblings
 * (a guest vCPU then does not share a core with another VMI's), the emulator's last.
 *
 * @module
 */
import type { VirtualMachineInstance } from "../api/mod.ts";
import { parseCpuList } from "../domain/mod.ts";
import { cpuTopology } from "./converter_xml.ts";

/** Thrown when a VMI's dedicated CPUs cannot be had. */
export class DedicatedCpusError extends Error {
  /** Creates the error with the message the VMI's condition shows. */
  constructor(message: string) {
    super(message);
    this.name = "DedicatedCpusError";
  }
}

/**
 * How many host CPUs a VMI takes for its own: its enabled vCPUs, plus one for the emulator
 * thread when it is isolated; undefined when its CPUs are not dedicated.
 */
export function dedicatedCpuCount(vmi: VirtualMachineInstance): number | undefined {
  const cpu = vmi.spec.domain.cpu;
  if (cpu?.dedicatedCpuPlacement !== true) return undefined;
  const t = cpuTopology(vmi);
  return t.sockets * t.cores * t.threads + (cpu.isolateEmulatorThread === true ? 1 : 0);
}

/** The CPUs this process may run on (`Cpus_allowed_list` of `/proc/self/status`). */
export function ownCpus(statusText = Deno.readTextFileSync("/proc/self/status")): number[] {
  const line = /^Cpus_allowed_list:\s*(\S+)\s*$/m.exec(statusText)?.[1];
  if (line === undefined) throw new Error("no Cpus_allowed_list in the process status");
  return parseCpuList(line);
}

/** The thread siblings of each CPU (`/sys/devices/system/cpu/cpuN/topology/thread_siblings_list`). */
export function threadSiblings(cpus: readonly number[], sysRoot = "/sys"): Map<number, number[]> {
  const out = new Map<number, number[]>();
  for (const cpu of cpus) {
    try {
      out.set(
        cpu,
        parseCpuList(
          Deno.readTextFileSync(
            `${sysRoot}/devices/system/cpu/cpu${cpu}/topology/thread_siblings_list`,
          ),
        ),
      );
    } catch {
      out.set(cpu, [cpu]);
    }
  }
  return out;
}

/**
 * The host CPUs a domain's definition pins (`<vcpupin cpuset>` and `<emulatorpin cpuset>`
 * under `<cputune>`), ascending; empty when it pins none.
 */
export function pinnedCpusOfDomainXml(xml: string): number[] {
  const cputune = /<cputune>([\s\S]*?)<\/cputune>/.exec(xml)?.[1];
  if (!cputune) return [];
  const out = new Set<number>();
  for (const m of cputune.matchAll(/<(?:vcpupin|emulatorpin)\b[^>]*\bcpuset=['"]([^'"]+)['"]/g)) {
    for (const cpu of parseCpuList(m[1])) out.add(cpu);
  }
  return [...out].sort((a, b) => a - b);
}

/** See the module doc. */
export class CpuPool {
  readonly #cpus: readonly number[];
  readonly #siblings: Map<number, number[]>;
  readonly #owners = new Map<string, number[]>();

  /** A pool of `cpus`; `siblings` groups them into cores (each CPU alone unless told). */
  constructor(cpus: readonly number[], siblings?: Map<number, number[]>) {
    this.#cpus = [...new Set(cpus)].sort((a, b) => a - b);
    this.#siblings = siblings ?? new Map(this.#cpus.map((c) => [c, [c]]));
  }

  /** The pool of this process's CPUs, grouped by the host's thread siblings. */
  static ofThisProcess(): CpuPool {
    const cpus = ownCpus();
    return new CpuPool(cpus, threadSiblings(cpus));
  }

  /** Every CPU of the pool. */
  get cpus(): readonly number[] {
    return this.#cpus;
  }

  /** The CPUs nobody holds, ascending. */
  free(): number[] {
    const held = new Set([...this.#owners.values()].flat());
    return this.#cpus.filter((c) => !held.has(c));
  }

  /** What `owner` holds, if anything. */
  held(owner: string): readonly number[] | undefined {
    return this.#owners.get(owner);
  }

  /**
   * `count` CPUs for `owner`: the ones it holds when it holds that many already, else free
   * ones (whole free cores first). Throws {@linkcode DedicatedCpusError} when too few are free.
   */
  claim(owner: string, count: number): number[] {
    const had = this.#owners.get(owner);
    if (had && had.length === count) return [...had];
    if (had) this.#owners.delete(owner);
    const free = this.free();
    if (free.length < count) {
      if (had) this.#owners.set(owner, had);
      throw this.#tooFew(`${count}`, count, free.length);
    }
    const chosen = this.#choose(free, count);
    this.#owners.set(owner, chosen);
    return [...chosen];
  }

  /**
   * `count` more CPUs for `owner`, beside the ones it holds (a running VMI's plugged vCPUs:
   * its pinned CPUs stay as they are), whole free cores first; returns only the new ones.
   * Throws {@linkcode DedicatedCpusError} when too few are free, and then holds nothing more.
   */
  grow(owner: string, count: number): number[] {
    if (count <= 0) return [];
    const free = this.free();
    if (free.length < count) throw this.#tooFew(`${count} more`, count, free.length);
    const chosen = this.#choose(free, count);
    this.#owners.set(owner, [...this.#owners.get(owner) ?? [], ...chosen].sort((a, b) => a - b));
    return chosen;
  }

  #tooFew(what: string, count: number, free: number): DedicatedCpusError {
    return new DedicatedCpusError(
      `dedicated CPU placement needs ${what} CPU${count === 1 ? "" : "s"} of this node's own; ` +
        `${free} of its ${this.#cpus.length} (${this.#cpus.join(",")}) are not ` +
        `dedicated to other VMIs`,
    );
  }

  /** `count` of the `free` CPUs, whole free cores first, ascending. */
  #choose(free: readonly number[], count: number): number[] {
    const freeSet = new Set(free);
    const wholeCores: number[] = [];
    const rest: number[] = [];
    for (const cpu of free) {
      const core = this.#siblings.get(cpu) ?? [cpu];
      (core.every((c) => freeSet.has(c) || !this.#cpus.includes(c)) ? wholeCores : rest).push(cpu);
    }
    return [...wholeCores, ...rest].slice(0, count).sort((a, b) => a - b);
  }

  /** Records that `owner` holds `cpus` (a running domain adopted); CPUs outside the pool too. */
  hold(owner: string, cpus: readonly number[]): void {
    if (cpus.length > 0) this.#owners.set(owner, [...cpus].sort((a, b) => a - b));
  }

  /** Gives `owner`'s CPUs back. */
  release(owner: string): void {
    this.#owners.delete(owner);
  }
}

/**
 * Scenario 11: what the guest agent costs the node. `guests` test guests (each with QEMU's
 * guest agent) run idle on a pod-less QEMU node; the handler's and the launcher host's CPU
 * is sampled while every agent is connected (the launcher polls each agent at KubeVirt's
 * intervals and the handler writes what changes), then again on the same guests after each
 * guest's agent was stopped from inside (through the agent itself, with virsh, past
 * virtnode). The second sample is the floor: the same guests, the same load, no agent.
 * The guests' own QEMU CPU is measured too; it says how many such guests fit this machine.
 *
 * @module
 */
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { guestVmi, installTestGuest } from "../helpers/guest.ts";
import { createVmi } from "../helpers/handler_process.ts";
import { virsh } from "../helpers/libvirtd.ts";
import type { KubeClient } from "../../mod/kube/mod.ts";
import type { BenchHandler } from "./_handler.ts";
import type { Row } from "./_report.ts";
import { clockTicksPerSecond, mapLimit, procCpuTicks, procMemory, sleep } from "./_util.ts";
import type { VmiWatch } from "./_watch.ts";

/** What scenario 11 needs from the run. */
export interface AgentBenchOptions {
  client: KubeClient;
  watch: VmiWatch;
  namespace: string;
  prefix: string;
  /** Test guests to run. */
  guests: number;
  /** Seconds of each CPU sample. */
  seconds: number;
  /** Starts a pod-less handler of `node` on libvirt `uri`. */
  startHandler(node: string): Promise<BenchHandler>;
  log(line: string): void;
}

/** What scenario 11 measured, per guest: % of one core. */
export interface AgentBench {
  guests: number;
  seconds: number;
  /** Handler + launcher host, agents connected. */
  withAgents: number;
  /** Handler + launcher host, the same guests with their agents stopped. */
  withoutAgents: number;
  /** Each guest's QEMU, idle, agent connected (mean). */
  qemu: number;
  /** Each guest's QEMU's resident memory, bytes (mean). */
  qemuRss: number;
}

function agentConnected(vmi: VirtualMachineInstance | undefined): boolean {
  return (vmi?.status?.conditions ?? []).some((c) =>
    c.type === "AgentConnected" && c.status === "True"
  );
}

async function qemuPid(namespace: string, name: string): Promise<number> {
  const file = `/var/run/libvirt/qemu/${namespace}_${name}.pid`;
  return Number((await Deno.readTextFile(file)).trim());
}

/** % of one core each of `pids` used over `seconds` (summed per group). */
async function cpuOver(groups: number[][], seconds: number): Promise<number[]> {
  const ticks = () => groups.map((g) => g.reduce((sum, p) => sum + (procCpuTicks(p) ?? 0), 0));
  const before = ticks();
  const t0 = performance.now();
  await sleep(seconds * 1000);
  const after = ticks();
  const elapsed = (performance.now() - t0) / 1000;
  const hz = clockTicksPerSecond();
  return after.map((t, i) => ((t - before[i]) / hz / elapsed) * 100);
}

/** Runs scenario 11; its rows, notes and figures. */
export async function agentBench(
  o: AgentBenchOptions,
): Promise<{ rows: Row[]; notes: string[]; json: AgentBench }> {
  const node = `${o.prefix}-agent-node`;
  const h = await o.startHandler(node);
  await installTestGuest(`${h.stateDir}/images`);
  const names = Array.from({ length: o.guests }, (_, i) => `${o.prefix}-ag-${i}`);
  const connected = names.map((name) =>
    o.watch.waitFor(
      `VMI ${name} AgentConnected`,
      (e) => e.type !== "DELETED" && e.object.metadata.name === name && agentConnected(e.object),
      120_000 + 30_000 * o.guests,
    )
  );
  const t0 = performance.now();
  // Two at a time: software emulation boots each guest on these two cores.
  await mapLimit(names, 2, async (name) => {
    await createVmi(o.client, guestVmi(name, node, { namespace: o.namespace, binding: "none" }));
  });
  await Promise.all(connected);
  o.log(
    `scenario 11: ${o.guests} agents connected after ${
      ((performance.now() - t0) / 1000).toFixed(0)
    } s`,
  );
  // Past the boot: the agents' first rounds (OS info, users, filesystems) are done.
  await sleep(15_000);
  const agentPids = [h.pid, ...h.launcherPids()];
  const qemuPids = await Promise.all(names.map((n) => qemuPid(o.namespace, n)));
  const [withAgents, qemu] = await cpuOver([agentPids, qemuPids], o.seconds);
  const qemuRss = qemuPids.reduce((sum, p) => sum + (procMemory(p)?.rss ?? 0), 0) / o.guests;

  // Each guest's agent stopped from inside the guest, through the agent (virsh).
  const stopped = names.map((name) =>
    o.watch.waitFor(
      `VMI ${name} AgentConnected gone`,
      (e) => e.type !== "DELETED" && e.object.metadata.name === name && !agentConnected(e.object),
      120_000,
    )
  );
  await mapLimit(names, 4, async (name) => {
    await virsh(
      "qemu-agent-command",
      `${o.namespace}_${name}`,
      JSON.stringify({
        execute: "guest-exec",
        arguments: { path: "/bin/sh", arg: ["-c", "kill $(cat /run/qemu-ga.pid)"] },
      }),
    );
  });
  await Promise.all(stopped);
  await sleep(10_000);
  const [withoutAgents] = await cpuOver([agentPids], o.seconds);

  const json: AgentBench = {
    guests: o.guests,
    seconds: o.seconds,
    withAgents: withAgents / o.guests,
    withoutAgents: withoutAgents / o.guests,
    qemu: qemu / o.guests,
    qemuRss,
  };
  const rows: Row[] = [{
    scenario: 11,
    metric: `guest agents: handler + launcher host CPU per idle VM, agent connected (${o.guests})`,
    value: json.withAgents,
    unit: "% core",
    floor: json.withoutAgents,
    floorNote: "the same guests, their agents stopped",
  }, {
    scenario: 11,
    metric: `guest agents: the same at 200 VMs, from the per-VM figure (${o.guests} run)`,
    value: json.withAgents * 200,
    unit: "% core",
    floor: json.withoutAgents * 200,
    floorNote: "the same, agents stopped",
  }];
  const memTotal = Number(/MemTotal:\s+(\d+)/.exec(Deno.readTextFileSync("/proc/meminfo"))?.[1]) *
    1024;
  const gb = (bytes: number) => (bytes / 1e9).toFixed(1);
  const notes = [
    `guest agents: ${o.guests} test guests (128 MiB each) idle for ${o.seconds} s with their ` +
    `agents connected; each guest's QEMU took ${json.qemu.toFixed(2)} % core and ` +
    `${(qemuRss / 1e6).toFixed(0)} MB resident, so 200 would hold ${gb(qemuRss * 200)} GB ` +
    `(and could touch ${gb(200 * 128 * 2 ** 20)} GB of guest memory) of this machine's ` +
    `${gb(memTotal)} GB: the 200 row is the per-VM figure times 200, not a run of 200`,
  ];
  return { rows, notes, json };
}

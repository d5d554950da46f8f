/**
 * Launchers whose handler is gone: a handler is SIGKILLed in the middle of a burst of
 * VMIs, and its launchers are then watched for a while (10 minutes unless
 * VIRTNODE_SOAK_MS says otherwise). None may spin (each stays under 1 % of a core), none
 * may grow (RSS flat), and each exits within its grace period plus 5 s on SIGTERM.
 *
 * Runs in the soak tier, beside the others: it mostly waits.
 */
import assert from "node:assert/strict";
import { useCluster } from "../../deploy/cluster/cluster.ts";
import {
  createVmi,
  killLaunchers,
  kubeClient,
  launcherPids,
  pidAlive,
  startHandlerProcess,
  testVmi,
  waitFor,
} from "../helpers/handler_process.ts";

const SOAK_MS = Number(Deno.env.get("VIRTNODE_SOAK_MS") ?? 10 * 60_000);
const SAMPLE_MS = Math.min(10_000, Math.max(1_000, SOAK_MS / 20));
/** Memory is compared from here on: start-up and the handler's loss settle first. */
const SETTLE_MS = Math.min(60_000, SOAK_MS / 5);
const COUNT = 12;
const GRACE_SECONDS = 2;
const CLOCK_TICKS = 100; // USER_HZ on Linux

interface Sample {
  atMs: number;
  cpuTicks: number;
  rssKiB: number;
}

function sample(pid: number): Sample | undefined {
  try {
    const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
    // Fields after the command name (which may hold spaces) start at ") ".
    const fields = stat.slice(stat.lastIndexOf(") ") + 2).split(" ");
    const cpuTicks = Number(fields[11]) + Number(fields[12]); // utime + stime
    const status = Deno.readTextFileSync(`/proc/${pid}/status`);
    const rssKiB = Number(/VmRSS:\s+(\d+) kB/.exec(status)?.[1] ?? NaN);
    return { atMs: performance.now(), cpuTicks, rssKiB };
  } catch {
    return undefined;
  }
}

Deno.test("launchers whose handler died mid-burst stay idle and small, and exit promptly on SIGTERM", async () => {
  const cluster = await useCluster();
  const client = await kubeClient(cluster.kubeconfigPath);
  const node = `soak-${crypto.randomUUID().slice(0, 8)}`;
  const h = await startHandlerProcess({
    kubeconfig: cluster.handlerKubeconfigPath,
    nodeName: node,
    libvirtUri: "test:///default",
  });
  let pids: number[] = [];
  try {
    const creating = Promise.all(
      Array.from(
        { length: COUNT },
        (_, i) => createVmi(client, testVmi(`soak-${i}`, node, { grace: GRACE_SECONDS })),
      ),
    );
    // Mid-burst: some launchers are up, others are still starting.
    await waitFor("a few launchers", () => launcherPids(h.stateDir).length >= COUNT / 3, 120_000);
    await h.kill("SIGKILL");
    await creating;
    await new Promise((r) => setTimeout(r, 2_000)); // launchers spawned just before the kill
    pids = launcherPids(h.stateDir);
    assert.ok(pids.length >= COUNT / 3, `launchers left: ${pids.length}`);
    console.log(`  ${pids.length} launchers orphaned; watching them for ${SOAK_MS / 1000} s`);

    const samples = new Map<number, Sample[]>(pids.map((p) => [p, []]));
    const started = performance.now();
    while (performance.now() - started < SOAK_MS) {
      for (const pid of pids) {
        const s = sample(pid);
        if (s) samples.get(pid)!.push(s);
      }
      await new Promise((r) => setTimeout(r, SAMPLE_MS));
    }

    const report: string[] = [];
    for (const pid of pids) {
      assert.ok(pidAlive(pid), `launcher ${pid} is still there (its guest runs)`);
      const all = samples.get(pid)!;
      const settled = all.filter((s) => s.atMs - started >= SETTLE_MS);
      assert.ok(settled.length >= 2, `enough samples of ${pid}`);
      const first = settled[0];
      const last = settled[settled.length - 1];
      const cpuShare = (last.cpuTicks - first.cpuTicks) / CLOCK_TICKS /
        ((last.atMs - first.atMs) / 1000);
      const growthMiB = (Math.max(...settled.map((s) => s.rssKiB)) - first.rssKiB) / 1024;
      report.push(
        `${pid}: ${(cpuShare * 100).toFixed(2)} % of a core, RSS ${
          (first.rssKiB / 1024).toFixed(0)
        } MiB, +${growthMiB.toFixed(1)} MiB`,
      );
      assert.ok(cpuShare < 0.01, `launcher ${pid} used ${(cpuShare * 100).toFixed(2)} % of a core`);
      assert.ok(growthMiB < 8, `launcher ${pid} grew by ${growthMiB.toFixed(1)} MiB`);
    }
    console.log(`  ${report.join("\n  ")}`);

    const exits = await Promise.all(pids.map(async (pid) => {
      const t0 = performance.now();
      Deno.kill(pid, "SIGTERM");
      await waitFor(
        `launcher ${pid} to exit`,
        () => !pidAlive(pid),
        (GRACE_SECONDS + 30) * 1000,
        50,
      );
      return (performance.now() - t0) / 1000;
    }));
    const slowest = Math.max(...exits);
    console.log(`  SIGTERM -> exit: slowest ${slowest.toFixed(1)} s (grace ${GRACE_SECONDS} s)`);
    assert.ok(slowest <= GRACE_SECONDS + 5, `a launcher took ${slowest.toFixed(1)} s to exit`);
  } finally {
    // Also the launchers spawned as the handler died, before it wrote their PID files.
    killLaunchers(h.stateDir);
    client.close();
    await Deno.remove(h.dir, { recursive: true }).catch(() => {});
    await cluster.stop();
  }
});

/**
 * A launcher host whose handler is gone: a handler is SIGKILLed in the middle of a burst
 * of VMIs, and its launcher host is then watched for a while (10 minutes unless
 * VIRTNODE_SOAK_MS says otherwise). It may not spin (under 1 % of a core) nor grow (RSS
 * flat), it keeps serving every VMI it took, and it exits within 5 s on SIGTERM (guests
 * stay: a host's end never stops one).
 *
 * Runs in the soak tier, beside the others: it mostly waits.
 */
import assert from "node:assert/strict";
import { useCluster } from "../../deploy/cluster/cluster.ts";
import { TestCmdClient } from "../helpers/cmd_client.ts";
import {
  createVmi,
  hostedUids,
  hostPid,
  killLaunchers,
  kubeClient,
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

Deno.test("an orphaned launcher host stays idle and small, keeps serving, and exits promptly on SIGTERM", async () => {
  // Its handler died in the middle of a burst of VMIs.
  const cluster = await useCluster();
  const client = await kubeClient(cluster.kubeconfigPath);
  const node = `soak-${crypto.randomUUID().slice(0, 8)}`;
  const h = await startHandlerProcess({
    kubeconfig: cluster.handlerKubeconfigPath,
    nodeName: node,
    libvirtUri: "test:///default",
  });
  try {
    const creating = Promise.all(
      Array.from(
        { length: COUNT },
        (_, i) => createVmi(client, testVmi(`soak-${i}`, node, { grace: GRACE_SECONDS })),
      ),
    );
    // Mid-burst: some launchers are served, others are still to come.
    await waitFor("a few launchers", () => hostedUids(h.stateDir).length >= COUNT / 3, 120_000);
    const pid = hostPid(h.stateDir)!;
    await h.kill("SIGKILL");
    await creating;
    const served = hostedUids(h.stateDir);
    assert.ok(served.length >= COUNT / 3, `launchers left: ${served.length}`);
    console.log(
      `  launcher host ${pid} with ${served.length} launchers orphaned; watching it for ${
        SOAK_MS / 1000
      } s`,
    );

    const samples: Sample[] = [];
    const started = performance.now();
    while (performance.now() - started < SOAK_MS) {
      const s = sample(pid);
      if (s) samples.push(s);
      await new Promise((r) => setTimeout(r, SAMPLE_MS));
    }

    assert.ok(pidAlive(pid), `launcher host ${pid} is still there (its guests run)`);
    const settled = samples.filter((s) => s.atMs - started >= SETTLE_MS);
    assert.ok(settled.length >= 2, "enough samples");
    const first = settled[0];
    const last = settled[settled.length - 1];
    const cpuShare = (last.cpuTicks - first.cpuTicks) / CLOCK_TICKS /
      ((last.atMs - first.atMs) / 1000);
    const growthMiB = (Math.max(...settled.map((s) => s.rssKiB)) - first.rssKiB) / 1024;
    console.log(
      `  ${pid}: ${(cpuShare * 100).toFixed(2)} % of a core, RSS ${
        (first.rssKiB / 1024).toFixed(0)
      } MiB, +${growthMiB.toFixed(1)} MiB`,
    );
    assert.ok(cpuShare < 0.01, `the launcher host used ${(cpuShare * 100).toFixed(2)} % of a core`);
    assert.ok(growthMiB < 8, `the launcher host grew by ${growthMiB.toFixed(1)} MiB`);
    for (const uid of served) {
      const cmd = new TestCmdClient(`${h.runDir}/sockets/${uid}/launcher-sock`, 10_000);
      try {
        assert.equal((await cmd.getDomain()).response?.success, true, `${uid} still served`);
      } finally {
        cmd.close();
      }
    }

    const t0 = performance.now();
    Deno.kill(pid, "SIGTERM");
    await waitFor("the launcher host to exit", () => !pidAlive(pid), 30_000, 50);
    const exitS = (performance.now() - t0) / 1000;
    console.log(`  SIGTERM -> exit: ${exitS.toFixed(1)} s`);
    assert.ok(exitS <= 5, `the launcher host took ${exitS.toFixed(1)} s to exit`);
  } finally {
    // Also the launchers spawned as the handler died, before it wrote their PID files.
    killLaunchers(h.stateDir);
    client.close();
    await Deno.remove(h.dir, { recursive: true }).catch(() => {});
    await cluster.stop();
  }
});

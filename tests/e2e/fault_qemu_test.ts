/**
 * Faults under real QEMU guests: libvirtd restarts under a running launcher host. The
 * guests (QEMU processes) outlive libvirtd; the host must reconnect, keep reporting the
 * right state, and never take the outage for the guest stopping.
 */
import assert from "node:assert/strict";
import { useCluster } from "../../deploy/cluster/cluster.ts";
import { ensureLibvirtd, virsh } from "../helpers/libvirtd.ts";
import { TestCmdClient } from "../helpers/cmd_client.ts";
import { decodeDomainJson } from "../../mod/domain/mod.ts";
import {
  createVmi,
  deleteVmi,
  eventsFor,
  getVmi,
  hostLogOf,
  hostPid,
  killLaunchers,
  kubeClient,
  pidAlive,
  startHandlerProcess,
  testVmi,
  waitFor,
  waitForPhase,
} from "../helpers/handler_process.ts";

const grpcTest = { sanitizeOps: false, sanitizeResources: false };
const VMIS = 2;

async function libvirtdPid(): Promise<number | undefined> {
  const out = await new Deno.Command("pgrep", { args: ["-x", "libvirtd"], stdout: "piped" })
    .output();
  const pid = Number(new TextDecoder().decode(out.stdout).trim().split("\n")[0]);
  return Number.isInteger(pid) && pid > 0 ? pid : undefined;
}

async function qemuPid(domain: string): Promise<number> {
  return Number((await Deno.readTextFile(`/var/run/libvirt/qemu/${domain}.pid`)).trim());
}

Deno.test(
  "fault+QEMU: launchers reconnect to a restarted libvirtd and their VMIs stay Running",
  grpcTest,
  async () => {
    // libvirtd restarts under running launchers; each reconnects and no guest stops.
    const uri = await ensureLibvirtd();
    const cluster = await useCluster();
    const client = await kubeClient(cluster.kubeconfigPath);
    const id = crypto.randomUUID().slice(0, 8);
    const ns = `fault-${id}`;
    await client.request("POST", "/api/v1/namespaces", { metadata: { name: ns } });
    const node = `fault-qemu-${id}`;
    const h = await startHandlerProcess({
      kubeconfig: cluster.handlerKubeconfigPath,
      nodeName: node,
      libvirtUri: uri,
    });
    const names = Array.from({ length: VMIS }, (_, i) => `vm-${i}`);
    const uids = new Map<string, string>();
    const clients: TestCmdClient[] = [];
    let ok = false;
    try {
      for (const n of names) {
        uids.set(n, (await createVmi(client, testVmi(n, node, { namespace: ns }))).metadata.uid!);
      }
      for (const n of names) await waitForPhase(client, ns, n, "Running", 120_000);
      const qemuPids = new Map<string, number>();
      for (const n of names) qemuPids.set(n, await qemuPid(`${ns}_${n}`));
      const host = hostPid(h.stateDir)!;
      assert.ok(host, "a launcher host runs");
      const hostLog = hostLogOf(h.stateDir);

      // Restart libvirtd the way an upgrade would: SIGTERM, wait for it to go, start again.
      const oldPid = await libvirtdPid();
      assert.ok(oldPid, "libvirtd runs");
      const t0 = performance.now();
      Deno.kill(oldPid, "SIGTERM");
      await waitFor("libvirtd to exit", () => !pidAlive(oldPid), 30_000, 50);
      const downAt = performance.now();
      // Stay down until the launcher host has tried (and failed) to reconnect.
      await waitFor(
        "the launcher host to fail a reconnect attempt",
        async () => (await Deno.readTextFile(hostLog)).includes("Reconnect attempt 1 failed"),
        30_000,
        50,
      );
      await ensureLibvirtd();
      const upAt = performance.now();
      const newPid = await libvirtdPid();
      assert.ok(newPid && newPid !== oldPid, "a new libvirtd runs");

      // The host says so in its log, and the reconnect time is printed.
      const reconnectMs: number[] = [];
      const line = await waitFor(
        "the launcher host to reconnect",
        async () => {
          const text = await Deno.readTextFile(hostLog);
          return text.split("\n").find((l) => l.includes("Reconnected to libvirt"));
        },
        30_000,
        100,
      );
      reconnectMs.push(Number(/"downMs":(\d+)/.exec(line)?.[1] ?? NaN));
      const text = await Deno.readTextFile(hostLog);
      assert.match(text, /Lost the libvirt connection/);
      assert.doesNotMatch(text, /stopped without being asked/);
      const reconnectedAt = performance.now();

      assert.ok(pidAlive(host), "the launcher host still runs");
      for (const n of names) {
        assert.equal(await qemuPid(`${ns}_${n}`), qemuPids.get(n), `QEMU of ${n} unchanged`);
        assert.ok(pidAlive(qemuPids.get(n)!), `QEMU of ${n} alive`);
        const cmd = new TestCmdClient(`${h.runDir}/sockets/${uids.get(n)}/launcher-sock`, 10_000);
        clients.push(cmd);
        const res = await cmd.getDomain();
        assert.equal(res.response?.success, true, res.response?.message ?? "");
        assert.equal(decodeDomainJson(res.domain).status.status, "Running");
      }

      // Events flow again on the new connection: a pause shows up on the VMI.
      const paused = `${ns}_${names[0]}`;
      const pauseAt = performance.now();
      await virsh("suspend", paused);
      await waitFor("the Paused condition after the restart", async () => {
        const v = await getVmi(client, ns, names[0]);
        return v?.status?.conditions?.find((c) => c.type === "Paused" && c.status === "True");
      }, 30_000);
      const pauseSeenMs = Math.round(performance.now() - pauseAt);
      await virsh("resume", paused);
      await waitFor("the Paused condition to go", async () => {
        const v = await getVmi(client, ns, names[0]);
        return v && !v.status?.conditions?.some((c) => c.type === "Paused");
      }, 30_000);

      // Status stayed right throughout: still Running, never Failed, no Stopped warning.
      for (const n of names) {
        const v = await getVmi(client, ns, n);
        assert.equal(v!.status!.phase, "Running", `${n} is Running`);
        assert.ok(
          !v!.status!.phaseTransitionTimestamps!.some((p) => p.phase === "Failed"),
          `${n} never Failed`,
        );
        const warnings = (await eventsFor(client, ns, n)).filter((e) => e.type === "Warning");
        assert.deepEqual(warnings, [], `no Warning events on ${n}`);
      }
      const r = await fetch(`${h.health}/healthz`);
      assert.equal(r.status, 200, "the handler is alive");
      await r.body?.cancel();
      console.log(
        `libvirtd restart: SIGTERM->exit ${Math.round(downAt - t0)} ms, down ${
          Math.round(upAt - downAt)
        } ms, the launcher host of ${VMIS} VMIs reconnected ${
          Math.round(reconnectedAt - upAt)
        } ms after libvirtd was back (host-measured outage ${
          reconnectMs.join(", ")
        } ms), Paused condition seen ${pauseSeenMs} ms after a pause`,
      );
      ok = true;
    } finally {
      for (const c of clients) c.close();
      if (!ok) {
        console.error(`handler log:\n${(await Deno.readTextFile(h.logFile)).slice(-6000)}`);
        const text = await Deno.readTextFile(hostLogOf(h.stateDir)).catch(() => "");
        console.error(`launcher host log:\n${text.slice(-3000)}`);
      }
      for (const n of names) await deleteVmi(client, ns, n);
      await waitFor("ghost records to be cleaned up", () => {
        try {
          return [...Deno.readDirSync(`${h.stateDir}/ghost-records`)].filter((e) => e.isFile)
            .length === 0;
        } catch {
          return true;
        }
      }, 60_000).catch((e) => console.error(e.message));
      await h.kill("SIGTERM");
      // The launcher host is ended; guests that were not stopped (a failed test) go below.
      killLaunchers(h.stateDir);
      for (const n of names) await virsh("destroy", `${ns}_${n}`).catch(() => {});
      for (const n of names) await virsh("undefine", `${ns}_${n}`).catch(() => {});
      await client.request("DELETE", `/api/v1/namespaces/${ns}`).catch(() => {});
      client.close();
      await Deno.remove(h.dir, { recursive: true }).catch(() => {});
      await cluster.stop();
    }
  },
);

/**
 * The launcher host with real QEMU guests under libvirtd: a SIGKILLed host leaves every
 * QEMU process running and the restarted host takes them back; a guest whose libvirt
 * calls hang (its QEMU stopped, so its monitor never answers) holds up no other VMI.
 *
 * @module
 */

import assert from "node:assert/strict";
import { decodeDomainJson } from "../../mod/domain/mod.ts";
import type { LauncherHostClient } from "../../mod/handler/launcher_host_client.ts";
import type { HostedVmSpec } from "../../mod/launcher/mod.ts";
import { TestCmdClient } from "../helpers/cmd_client.ts";
import { ensureLibvirtd, QEMU_SYSTEM_URI } from "../helpers/libvirtd.ts";
import {
  hostedSpec,
  hostedVmi,
  type HostProcess,
  startHostProcess,
} from "../helpers/launcher_host.ts";
import { pidAlive, waitFor } from "../helpers/handler_process.ts";
import { startNotifyServer, type TestNotifyServer } from "../helpers/notify_server.ts";

const grpcTest = { sanitizeOps: false, sanitizeResources: false };

/** No pod network here: a guest without an interface. */
const vmiOf = (spec: HostedVmSpec) =>
  hostedVmi(spec, { devices: { autoattachPodInterface: false } });

async function qemuPid(spec: HostedVmSpec): Promise<number> {
  const file = `/var/run/libvirt/qemu/${spec.namespace}_${spec.name}.pid`;
  return Number((await Deno.readTextFile(file)).trim());
}

interface Harness {
  dir: string;
  notify: TestNotifyServer;
  host: HostProcess;
  control: LauncherHostClient;
  specs: HostedVmSpec[];
}

/** Starts a QEMU guest through the host; resolves with ms from start request to Running. */
async function runGuest(h: Harness, spec: HostedVmSpec): Promise<number> {
  h.specs.push(spec);
  const t0 = performance.now();
  const status = await h.control.start(spec);
  const client = new TestCmdClient(status.socket, 60_000);
  try {
    const res = await client.vmiCall("SyncVirtualMachine", vmiOf(spec));
    assert.equal(res.success, true, res.message);
    await h.notify.waitForDomainEvent(
      (e) => e.domain?.metadata?.uid === spec.uid && e.domain.status.status === "Running",
      60_000,
    );
    return performance.now() - t0;
  } finally {
    client.close();
  }
}

/** The middle of three guests' create -> Running, one after the other (ms). */
async function medianOfThree(h: Harness, name: string): Promise<number> {
  const ms: number[] = [];
  for (let i = 0; i < 3; i++) ms.push(await runGuest(h, hostedSpec(h.dir, `${name}-${i}`)));
  return ms.sort((a, b) => a - b)[1];
}

async function withHost(name: string, fn: (h: Harness) => Promise<void>): Promise<void> {
  await ensureLibvirtd();
  const dir = await Deno.makeTempDir({ prefix: `vn-${name}` });
  const notify = await startNotifyServer();
  const options = {
    dir: `${dir}/host`,
    libvirtUri: QEMU_SYSTEM_URI,
    notifySocket: notify.socketPath,
    logFile: `${dir}/host.log`,
  };
  let h: Harness | undefined;
  let host: HostProcess | undefined;
  let ok = false;
  try {
    host = await startHostProcess(options);
    h = { dir, notify, host, control: await host.connect(), specs: [] };
    await fn(h);
    ok = true;
  } finally {
    if (h) {
      if (!ok || Deno.env.get("SHOW_HOST_LOG")) {
        console.error(`launcher host log:\n${(await h.host.log()).slice(-20000)}`);
      }
      // Graceful stops (grace period 0: destroy) remove every guest this test started.
      for (const spec of h.specs) {
        await h.control.stop(spec.uid, 30_000).catch((e) => console.error(e.message));
      }
      await h.control.close();
      host = h.host; // the test may have started another
    }
    await host?.kill("SIGTERM");
    await notify.close();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
}

Deno.test(
  "launcher host (QEMU): SIGKILLed under 3 running guests, it leaves every QEMU running and the restarted host takes them back",
  grpcTest,
  async () => {
    await withHost("hostkill", async (h) => {
      const specs = [0, 1, 2].map((i) => hostedSpec(h.dir, `hk${i}-${Deno.pid}`));
      for (const spec of specs) await runGuest(h, spec);
      const pids = await Promise.all(specs.map(qemuPid));
      await h.control.close();
      assert.equal((await h.host.kill("SIGKILL")).signal, "SIGKILL");
      // Deliberate: the guests must outlive the host for a while, not only for an instant.
      await new Promise((r) => setTimeout(r, 1_000));
      for (const pid of pids) assert.ok(pidAlive(pid), `QEMU ${pid} outlives the host`);
      const eventsBefore = h.notify.domainEvents.length;
      h.host = await startHostProcess({
        dir: h.host.dir,
        libvirtUri: QEMU_SYSTEM_URI,
        notifySocket: h.notify.socketPath,
        logFile: `${h.dir}/host.log`,
      });
      h.control = await h.host.connect();
      const listed = await h.control.list();
      assert.deepEqual(listed.map((v) => v.state), ["ready", "ready", "ready"]);
      for (const [i, spec] of specs.entries()) {
        assert.equal(await qemuPid(spec), pids[i], "the same QEMU process");
        const client = new TestCmdClient(`${spec.socketDir}/launcher-sock`);
        try {
          const res = await client.getDomain();
          assert.equal(decodeDomainJson(res.domain).status.status, "Running");
        } finally {
          client.close();
        }
      }
      await waitFor(
        "each guest reported again",
        () => h.notify.domainEvents.length >= eventsBefore + 3,
      );
      assert.ok(
        h.notify.domainEvents.slice(eventsBefore).every((e) =>
          e.domain?.status.status === "Running"
        ),
        h.notify.statuses().slice(eventsBefore).join(", "),
      );
    });
  },
);

Deno.test(
  "launcher host (QEMU): a guest whose libvirt calls hang (QEMU stopped) holds up no other VMI's create -> Running",
  grpcTest,
  async () => {
    await withHost("hang", async (h) => {
      const stuck = hostedSpec(h.dir, `hang-a-${Deno.pid}`);
      await runGuest(h, stuck);
      const baselineMs = await medianOfThree(h, `hang-c-${Deno.pid}`);
      const pid = await qemuPid(stuck);
      Deno.kill(pid, "SIGSTOP");
      let hungSettled = false;
      const client = new TestCmdClient(`${stuck.socketDir}/launcher-sock`, 120_000);
      try {
        // QEMU never answers the monitor's "stop": the pause hangs in libvirt.
        const hung = client.vmiCall("PauseVirtualMachine", vmiOf(stuck)).finally(() =>
          hungSettled = true
        );
        hung.catch(() => {});
        // Deliberate: the pause must be in libvirt (holding a call worker) before B starts.
        await new Promise((r) => setTimeout(r, 500));
        assert.equal(hungSettled, false, "the stopped guest's pause hangs");
        const otherMs = await medianOfThree(h, `hang-b-${Deno.pid}`);
        assert.equal(hungSettled, false, "B ran while A's call still hung");
        const said = `create -> Running with a hung call on another VMI: ${
          Math.round(otherMs)
        } ms (before the hang: ${Math.round(baselineMs)} ms; medians of 3)`;
        console.log(said);
        // Not a speed bound (the bench measures speed): a call or event of B held behind
        // A's hung call waited for the libvirt connection's next keepalive (5 s) when the
        // workers shared one, so B took over 5 s more. Half of that separates the two
        // outcomes; a tighter margin failed on a loaded CI machine (+238 ms, no bug).
        assert.ok(otherMs <= baselineMs + 2_500, said);
        Deno.kill(pid, "SIGCONT");
        await hung.catch(() => {});
      } finally {
        try {
          Deno.kill(pid, "SIGCONT");
        } catch { /* gone */ }
        client.close();
      }
    });
  },
);

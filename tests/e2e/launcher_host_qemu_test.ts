/**
 * The launcher host with real QEMU guests under libvirtd: a SIGKILLed host leaves every
 * QEMU process running and the restarted host takes them back; a guest whose libvirt
 * calls hang (its QEMU stopped, so its monitor never answers) holds up no other VMI; a
 * VirtualMachineMemoryDump writes the guest's memory as an ELF core, reported in the
 * domain's metadata as KubeVirt's launcher reports it.
 *
 * @module
 */

import assert from "node:assert/strict";
import { decodeDomainJson } from "../../mod/domain/mod.ts";
import type { LauncherHostClient } from "../../mod/handler/testing.ts";
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

async function withHost(name: string, fn: (h: Harness) => Promise<void>): Promise<void> {
  await ensureLibvirtd();
  const dir = await Deno.makeTempDir({ prefix: `vn-${name}` });
  const notify = await startNotifyServer();
  const options = {
    dir: `${dir}/host`,
    libvirtUri: QEMU_SYSTEM_URI,
    notifySocket: notify.socketPath,
    logFile: `${dir}/host.log`,
    hostDiskRoot: `${dir}/hostdisks`,
  };
  await Deno.mkdir(`${dir}/hostdisks/default/dump`, { recursive: true });
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
  "launcher host (QEMU): SIGKILLed under 3 guests, it leaves QEMU running and takes them back",
  grpcTest,
  async () => {
    // Every QEMU process outlives the killed host, and the host started again adopts all three.
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
  "launcher host (QEMU): a guest whose libvirt calls hang holds up no other VMI",
  grpcTest,
  async () => {
    // Stopping one guest's QEMU makes its libvirt calls hang; other
    // VMIs still go from create to Running no more than 100 ms slower.
    await withHost("hang", async (h) => {
      const stuck = hostedSpec(h.dir, `hang-a-${Deno.pid}`);
      await runGuest(h, stuck);
      const pid = await qemuPid(stuck);
      const client = new TestCmdClient(`${stuck.socketDir}/launcher-sock`, 120_000);
      /** One guest's create -> Running, its guest stopped again afterwards. */
      const timedGuest = async (name: string) => {
        const spec = hostedSpec(h.dir, name);
        const ms = await runGuest(h, spec);
        await h.control.stop(spec.uid, 30_000);
        h.specs.splice(h.specs.indexOf(spec), 1);
        return ms;
      };
      // Pairs, each a guest started with A answering and one started while A's call hangs,
      // back to back: a pair's difference is the hang's cost, whatever load the machine had
      // then (a loaded CI machine moved medians of separate runs by 240 ms).
      const pairs: { before: number; hung: number }[] = [];
      let paused = false;
      try {
        for (let i = 0; i < 5; i++) {
          const before = await timedGuest(`hang-c${i}-${Deno.pid}`);
          Deno.kill(pid, "SIGSTOP");
          let settled = false;
          // QEMU never answers the monitor: the pause (or, the next time, the resume)
          // hangs in libvirt, holding a call worker and its connection.
          const call: Promise<{ success: boolean; message: string }> = client.vmiCall(
            paused ? "UnpauseVirtualMachine" : "PauseVirtualMachine",
            vmiOf(stuck),
          ).finally(() => settled = true);
          call.catch(() => {});
          let hung: number;
          try {
            // Deliberate: the call must be in libvirt, holding its worker, before B starts.
            await new Promise((r) => setTimeout(r, 500));
            assert.equal(settled, false, "the stopped guest's call hangs");
            hung = await timedGuest(`hang-b${i}-${Deno.pid}`);
            assert.equal(settled, false, "B ran while A's call still hung");
          } finally {
            Deno.kill(pid, "SIGCONT");
          }
          const res = await call;
          assert.equal(res.success, true, res.message);
          paused = !paused;
          pairs.push({ before, hung });
        }
      } finally {
        try {
          Deno.kill(pid, "SIGCONT");
        } catch { /* gone */ }
        client.close();
      }
      const costs = pairs.map((p) => p.hung - p.before).sort((a, b) => a - b);
      const said =
        `create -> Running while another guest's call hangs, minus the same just before: ${
          costs.map((c) => Math.round(c)).join(", ")
        } ms (pairs: ${
          pairs.map((p) => `${Math.round(p.before)}/${Math.round(p.hung)}`).join(" ")
        })`;
      console.log(said);
      // The issue's bound, on the middle pair. Before each call worker had its own libvirt
      // connection, B's calls queued behind A's waited for the 5 s keepalive; before a
      // stuck worker got a replacement at once, B's waited for a worker to start.
      assert.ok(costs[2] <= 100, said);
    });
  },
);

/** The domain's MemoryDump metadata, as the launcher reports it in GetDomain. */
async function memoryDumpOf(spec: HostedVmSpec) {
  const client = new TestCmdClient(`${spec.socketDir}/launcher-sock`);
  try {
    return decodeDomainJson((await client.getDomain()).domain).spec.metadata.kubevirt.memoryDump;
  } finally {
    client.close();
  }
}

/** VirtualMachineMemoryDump of `spec`'s guest to `dumpPath`. */
async function memoryDump(spec: HostedVmSpec, dumpPath: string) {
  const client = new TestCmdClient(`${spec.socketDir}/launcher-sock`, 60_000);
  try {
    return await client.call<{ success: boolean; message: string }>("VirtualMachineMemoryDump", {
      vmi: { vmiJson: new TextEncoder().encode(JSON.stringify(vmiOf(spec))) },
      dumpPath,
    });
  } finally {
    client.close();
  }
}

Deno.test(
  "launcher host (QEMU): VirtualMachineMemoryDump writes the guest's memory as an ELF core",
  grpcTest,
  async () => {
    // As KubeVirt's launcher: in the background, once per file, earlier dumps removed, the
    // result in the domain's MemoryDump metadata; only inside the namespace's folder of the
    // host disk root, links resolved.
    await withHost("memdump", async (h) => {
      const spec = hostedSpec(h.dir, `md-${Deno.pid}`);
      await runGuest(h, spec);
      const folder = `${h.dir}/hostdisks/default/dump`;
      await Deno.writeTextFile(`${folder}/vm-old.memory.dump`, "an earlier dump");
      await Deno.writeTextFile(`${folder}/keep.txt`, "not a dump");
      const first = `${folder}/md-20261206-000001.memory.dump`;
      const asked = await memoryDump(spec, first);
      assert.deepEqual(asked, { success: true, message: "" });
      const done = await waitFor(
        "the dump to complete",
        async () => {
          const m = await memoryDumpOf(spec);
          return m?.completed ? m : undefined;
        },
        120_000,
        200,
      );
      assert.equal(done.fileName, "md-20261206-000001.memory.dump");
      assert.ok(!done.failed, done.failureReason ?? "");
      assert.match(done.startTimestamp ?? "", /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
      assert.ok((done.endTimestamp ?? "") >= (done.startTimestamp ?? ""));
      // An ELF core holding the guest's 64 MiB.
      const header = await new Deno.Command("readelf", { args: ["-h", first], stdout: "piped" })
        .output();
      assert.match(new TextDecoder().decode(header.stdout), /Type:\s+CORE \(Core file\)/);
      assert.ok((await Deno.stat(first)).size >= 64 * 1024 * 1024, "the guest's memory is in it");
      assert.deepEqual(
        [...Deno.readDirSync(folder)].map((e) => e.name).sort(),
        ["keep.txt", "md-20261206-000001.memory.dump"],
        "the earlier dump is removed, nothing else",
      );

      // The same file again: nothing happens (KubeVirt's handler asks on every sync).
      const mtime = (await Deno.stat(first)).mtime?.getTime();
      assert.equal((await memoryDump(spec, first)).success, true);
      await new Promise((r) => setTimeout(r, 1_000));
      assert.deepEqual(await memoryDumpOf(spec), done);
      assert.equal((await Deno.stat(first)).mtime?.getTime(), mtime);

      // Outside the namespace's folder, or out of it through a link: refused, nothing written.
      const outside = await memoryDump(spec, `${h.dir}/md-elsewhere.memory.dump`);
      assert.equal(outside.success, false);
      assert.match(outside.message, /is outside ".*\/hostdisks"/);
      await Deno.symlink(h.dir, `${folder}/out`);
      const linked = await memoryDump(spec, `${folder}/out/md-linked.memory.dump`);
      assert.equal(linked.success, false);
      assert.match(linked.message, /resolves to/);
      const other = await memoryDump(spec, `${h.dir}/hostdisks/other/md.memory.dump`);
      assert.equal(other.success, false);
      assert.match(other.message, /not beneath ".*\/hostdisks\/default"/);
      assert.deepEqual(
        [...Deno.readDirSync(h.dir)].filter((e) => e.name.includes("memory.dump")),
        [],
      );
    });
  },
);

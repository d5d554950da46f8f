/**
 * The handler with real QEMU guests under a real libvirtd (KVM where the machine
 * has it, software emulation otherwise), real launchers and a real apiserver.
 */
import assert from "node:assert/strict";
import { useCluster } from "../../deploy/cluster/cluster.ts";
import { ensureLibvirtd, virsh } from "../helpers/libvirtd.ts";
import {
  createVmi,
  deleteVmi,
  eventsFor,
  getVmi,
  killLaunchers,
  kubeClient,
  pidAlive,
  startHandlerProcess,
  testVmi,
  waitFor,
  waitForPhase,
} from "../helpers/handler_process.ts";

async function withQemuHandler(
  fn: (ctx: {
    ns: string;
    node: string;
    client: Awaited<ReturnType<typeof kubeClient>>;
    stateDir: string;
    logFile: string;
  }) => Promise<void>,
) {
  const uri = await ensureLibvirtd();
  const cluster = await useCluster();
  const client = await kubeClient(cluster.kubeconfigPath);
  const id = crypto.randomUUID().slice(0, 8);
  const ns = `qemu-${id}`;
  await client.request("POST", "/api/v1/namespaces", { metadata: { name: ns } });
  const node = `qemu-node-${id}`;
  const h = await startHandlerProcess({
    kubeconfig: cluster.handlerKubeconfigPath,
    nodeName: node,
    libvirtUri: uri,
  });
  let ok = false;
  try {
    await fn({ ns, node, client, stateDir: h.stateDir, logFile: h.logFile });
    ok = true;
  } finally {
    if (!ok) console.error(`handler log:\n${(await Deno.readTextFile(h.logFile)).slice(-6000)}`);
    // Delete what is left and let the handler clean up before it stops.
    const list = await client.request<{ items: { metadata: { name: string } }[] }>(
      "GET",
      `/apis/kubevirt.io/v1/namespaces/${ns}/virtualmachineinstances`,
    );
    for (const v of list.items) await deleteVmi(client, ns, v.metadata.name);
    await waitFor("ghost records to be cleaned up", () => {
      try {
        return [...Deno.readDirSync(`${h.stateDir}/ghost-records`)].filter((e) => e.isFile)
          .length === 0;
      } catch {
        return true;
      }
    }, 60_000).catch((e) => console.error(e.message));
    await h.kill("SIGTERM");
    killLaunchers(h.stateDir); // the launcher host outlives its handler by design
    await client.request("DELETE", `/api/v1/namespaces/${ns}`).catch(() => {});
    client.close();
    await Deno.remove(h.dir, { recursive: true }).catch(() => {});
    await cluster.stop();
  }
}

Deno.test("handler+QEMU: a guest paused with virsh gets Paused=True (PausedByUser), removed on resume", async () => {
  await withQemuHandler(async ({ ns, node, client }) => {
    const name = "paused";
    await createVmi(client, testVmi(name, node, { namespace: ns }));
    await waitForPhase(client, ns, name, "Running", 90_000);
    await virsh("suspend", `${ns}_${name}`);
    const cond = await waitFor("the Paused condition", async () => {
      const v = await getVmi(client, ns, name);
      return v?.status?.conditions?.find((c) => c.type === "Paused");
    });
    assert.equal(cond.status, "True");
    assert.equal(cond.reason, "PausedByUser");
    assert.equal((await getVmi(client, ns, name))!.status!.phase, "Running");
    await virsh("resume", `${ns}_${name}`);
    await waitFor("the Paused condition to go", async () => {
      const v = await getVmi(client, ns, name);
      return v && !v.status?.conditions?.some((c) => c.type === "Paused");
    });
  });
});

Deno.test("handler+QEMU: a guest whose QEMU is killed makes its VMI Failed and its domain is removed", async () => {
  await withQemuHandler(async ({ ns, node, client, stateDir }) => {
    const name = "crash";
    const vmi = await createVmi(client, testVmi(name, node, { namespace: ns }));
    await waitForPhase(client, ns, name, "Running", 90_000);
    const domain = `${ns}_${name}`;
    const pid = Number((await Deno.readTextFile(`/var/run/libvirt/qemu/${domain}.pid`)).trim());
    assert.ok(pidAlive(pid));
    Deno.kill(pid, "SIGKILL");
    const failed = await waitForPhase(client, ns, name, "Failed", 60_000);
    assert.equal(failed.metadata.uid, vmi.metadata.uid);
    const warn = (await eventsFor(client, ns, name)).filter((e) => e.type === "Warning");
    assert.ok(warn.length > 0, "a Warning event tells the user");
    await waitFor("the crashed domain to be removed from libvirt", async () => {
      const list = await virsh("list", "--all", "--name");
      return !list.split("\n").includes(domain);
    }, 60_000);
    // As KubeVirt's functional tests assert: a VMI in a final phase is not synced again,
    // so its dead launcher is never called and no SyncFailed follows the crash.
    await waitFor("the VMI's local state to be cleaned up", () => {
      try {
        return [...Deno.readDirSync(`${stateDir}/ghost-records`)]
          .filter((e) => e.name === vmi.metadata.uid).length === 0;
      } catch {
        return true;
      }
    }, 30_000);
    const syncFailed = (await eventsFor(client, ns, name)).filter((e) => e.reason === "SyncFailed");
    assert.deepEqual(syncFailed, [], "no SyncFailed after a crash");
  });
});

Deno.test("handler+QEMU: an ACPI-deaf guest's deletion resends ACPI and kills it at the grace period's end", async () => {
  // The guest ignores the ACPI power button; the handler presses it again
  // every 5 s until the grace period runs out, then kills the guest.
  await withQemuHandler(async ({ ns, node, client, logFile }) => {
    const name = "deaf";
    // No OS boots in this guest, so nothing answers the ACPI power button.
    await createVmi(client, testVmi(name, node, { namespace: ns, grace: 12 }));
    await waitForPhase(client, ns, name, "Running", 90_000);
    const domain = `${ns}_${name}`;
    const deleted = Date.now();
    await deleteVmi(client, ns, name);
    // Deliberate: the guest must still run 8 s into its 12 s grace period; nothing
    // announces "not killed yet", so the test waits and looks.
    await new Promise((r) => setTimeout(r, 8_000));
    assert.match(
      await virsh("domstate", domain),
      /running/,
      "still running inside the grace period",
    );
    await waitFor(
      "the domain to be gone",
      async () => {
        const list = await virsh("list", "--all", "--name");
        return !list.split("\n").includes(domain);
      },
      40_000,
      250,
    );
    const tookS = (Date.now() - deleted) / 1000;
    console.log(`  deleted -> domain gone: ${tookS.toFixed(1)} s (grace 12 s)`);
    assert.ok(tookS >= 12, `killed after the grace period, not before (${tookS} s)`);
    const acpi = (await Deno.readTextFile(logFile)).split("\n")
      .filter((l) => l.includes('"Sent ACPI shutdown"') && l.includes(`${ns}/${name}`))
      .map((l) => JSON.parse(l).elapsedMs as number);
    console.log(`  ACPI requests at ms: ${acpi.join(", ")}`);
    assert.equal(acpi.length, 3, "ACPI at 0, 5 and 10 s");
    assert.ok(acpi[1] >= 5_000 && acpi[2] >= 10_000);
    // virt-handler's Events: the graceful shutdown signaled once (not at every resend),
    // then the kill at the end of the grace period.
    const events = await eventsFor(client, ns, name);
    const ev = events.filter((e) => e.reason === "ShuttingDown");
    assert.equal(ev.length, 1);
    assert.equal(ev[0].count, 1, "the event is recorded once");
    assert.ok(events.some((e) => e.message === "VirtualMachineInstance stopping"));
  });
});

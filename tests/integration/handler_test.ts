/**
 * The handler against a real apiserver, its real launcher host process and libvirt's
 * test driver (in the host's process, or in libvirtd through `test+unix:///default`
 * where domains must outlive the host): the sync loop, status and events, deletion and
 * cleanup, failures, and restarts of the handler and of the launcher host.
 */
import assert from "node:assert/strict";
import { isDeepStrictEqual } from "node:util";
import { openLibvirt } from "../../ffi/mod.ts";
import type { KubeClient } from "../../mod/kube/mod.ts";
import { TestCmdClient } from "../helpers/cmd_client.ts";
import { ensureLibvirtd } from "../helpers/libvirtd.ts";
import {
  createVmi,
  deleteVmi,
  eventsFor,
  getVmi,
  hostedUids,
  hostPid,
  kubeClient,
  launcherStarts,
  pidAlive,
  releaseVmi,
  startHandlerProcess,
  testVmi,
  waitFor,
  waitForPhase,
  withHandler,
} from "../helpers/handler_process.ts";

const TEST_URI = "test:///default";
/** libvirtd's test driver: its domains outlive the launcher host, as QEMU guests do. */
const LIBVIRTD_TEST_URI = "test+unix:///default";

function suffix(): string {
  return crypto.randomUUID().slice(0, 8);
}

/** Removes domains from libvirtd's shared test driver (test cleanup). */
async function removeDomains(names: string[]): Promise<void> {
  const conn = await openLibvirt(LIBVIRTD_TEST_URI, { workers: 1 });
  try {
    for (const name of names) {
      const domain = await conn.lookupByName(`default_${name}`).catch(() => undefined);
      await domain?.destroy().catch(() => {});
      await domain?.undefine().catch(() => {});
    }
  } finally {
    await conn.close();
  }
}

/** Waits until the statuses of `names` stop changing (trailing writes after Running). */
async function settledStatuses(
  client: KubeClient,
  names: string[],
  before: Map<string, unknown>,
): Promise<void> {
  await waitFor(
    "the statuses to settle",
    async () => {
      let same = true;
      for (const n of names) {
        const status = (await getVmi(client, "default", n))!.status;
        if (!isDeepStrictEqual(status, before.get(n))) same = false;
        before.set(n, status);
      }
      return same;
    },
    30_000,
    500,
  );
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.lstat(path);
    return true;
  } catch {
    return false;
  }
}

Deno.test("handler: a VMI goes Running with status and events, and its deletion leaves nothing behind", async () => {
  // Deleting the VMI removes its domain, its launcher and its ghost record.
  await withHandler("create", async ({ h, node, client }) => {
    const name = `vm-${suffix()}`;
    const created = await createVmi(client, testVmi(name, node));
    const uid = created.metadata.uid!;
    const vmi = await waitForPhase(client, "default", name, "Running");
    const st = vmi.status!;
    assert.equal(st.nodeName, node);
    // Pending is virt-api's (its mutating webhook stamps it on create).
    assert.deepEqual(st.phaseTransitionTimestamps!.map((p) => p.phase), [
      "Pending",
      "Scheduled",
      "Running",
    ]);
    // Every time as Go's metav1.Time writes it, to the second: virt-controller's JSON patches
    // test the old values it read back into its types, and fail (422) on milliseconds.
    const times = [
      ...st.phaseTransitionTimestamps!.map((p) => p.phaseTransitionTimestamp),
      ...st.conditions!.flatMap((c) => [c.lastTransitionTime, c.lastProbeTime]),
    ].filter((t) => t !== null && t !== undefined);
    assert.ok(times.length >= 4, JSON.stringify(times));
    for (const t of times) assert.match(String(t), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    // As KubeVirt's handler reports it on a node without SELinux (virt-controller makes no
    // hotplug attachment pod without it).
    const selinux = await Deno.stat("/sys/fs/selinux/enforce").then(() => true, () => false);
    if (!selinux) assert.equal(st.selinuxContext, "none");
    const cond = Object.fromEntries(st.conditions!.map((c) => [c.type, c]));
    assert.equal(cond.Ready?.status, "True");
    // Never advertised. virt-api gives the VMI a host-model CPU, and libvirt's test driver
    // shows the labeller no host model: KubeVirt's reason for that comes first.
    assert.equal(vmi.spec.domain?.cpu?.model, "host-model");
    assert.equal(cond.LiveMigratable?.status, "False");
    assert.equal(cond.LiveMigratable?.reason, "CPUModeLiveMigratable");
    assert.match(cond.LiveMigratable?.message ?? "", /does not allow migration with host-model/);
    assert.equal(st.migrationMethod, "LiveMigration");
    assert.equal(cond.Synchronized, undefined, "no sync error");
    assert.deepEqual(
      vmi.metadata.finalizers,
      ["kubevirt.io/foregroundDeleteVirtualMachine"],
      "virt-api's finalizer, and none of virtnode's",
    );

    const ghost = `${h.stateDir}/ghost-records/${uid}`;
    assert.deepEqual(JSON.parse(await Deno.readTextFile(ghost)), {
      name,
      namespace: "default",
      socketFile: `${h.runDir}/sockets/${uid}/launcher-sock`,
      uid,
    });
    assert.equal((await Deno.stat(ghost)).mode! & 0o777, 0o600);
    assert.equal(
      (await Deno.stat(`${h.runDir}/sockets/${uid}/launcher-sock`)).mode! & 0o777,
      0o600,
    );
    const hosted = `${h.stateDir}/launcher-host/vms/${uid}.json`;
    assert.ok(await exists(hosted), "the launcher host serves the VMI");

    await waitFor("Created and Started events", async () => {
      const reasons = (await eventsFor(client, "default", name)).map((e) => e.reason);
      return reasons.includes("Created") && reasons.includes("Started");
    });

    await deleteVmi(client, "default", name);
    await waitFor("the launcher host to forget the VMI", async () => !(await exists(hosted)));
    await waitFor("the ghost record to be removed", async () => !(await exists(ghost)));
    assert.equal(await exists(`${h.runDir}/sockets/${uid}`), false, "socket dir removed");
    const reasons = (await eventsFor(client, "default", name)).map((e) => e.reason);
    assert.ok(reasons.includes("Deleted"), `events: ${reasons}`);
    await waitFor(
      "the VMI to be gone (the handler released the finalizer)",
      async () => (await getVmi(client, "default", name)) === undefined ? true : undefined,
    );
  });
});

Deno.test("handler: a guest destroyed behind its launcher ends its VMI and leaves the others untouched", async () => {
  await ensureLibvirtd();
  const a = `vm-a-${suffix()}`;
  const b = `vm-b-${suffix()}`;
  try {
    await withHandler("guestdies", async ({ h, node, client }) => {
      const va = await createVmi(client, testVmi(a, node));
      await createVmi(client, testVmi(b, node));
      await waitForPhase(client, "default", a, "Running");
      await waitForPhase(client, "default", b, "Running");
      const before = new Map<string, unknown>();
      await settledStatuses(client, [b], before);
      const host = hostPid(h.stateDir);
      const conn = await openLibvirt(LIBVIRTD_TEST_URI, { workers: 1 });
      try {
        await (await conn.lookupByName(`default_${a}`)).destroy();
      } finally {
        await conn.close();
      }
      // Shutoff/Destroyed with no grace period applied: Succeeded, as in KubeVirt's table.
      const ended = await waitForPhase(client, "default", a, "Succeeded", 40_000);
      assert.equal(ended.status!.phaseTransitionTimestamps!.at(-1)!.phase, "Succeeded");
      await waitFor(
        "the ended VMI's ghost record to be cleaned up",
        async () => !(await exists(`${h.stateDir}/ghost-records/${va.metadata.uid}`)),
      );
      const after = await getVmi(client, "default", b);
      assert.equal(after!.status!.phase, "Running");
      assert.deepEqual(after!.status, before.get(b), "the other VMI's status did not change");
      assert.equal(hostPid(h.stateDir), host, "the launcher host still runs");
      const warn = (await eventsFor(client, "default", a)).find((e) => e.type === "Warning");
      assert.equal(warn?.reason, "Stopped");
    }, { libvirtUri: LIBVIRTD_TEST_URI });
  } finally {
    await removeDomains([a, b]);
  }
});

Deno.test("handler: a launcher host SIGKILLed with 50 running VMIs is restarted and takes them all back", async () => {
  // No guest stops and no VMI's status changes while the host is gone and back.
  await ensureLibvirtd();
  const names = Array.from({ length: 50 }, (_, i) => `vm-${i}-${suffix()}`);
  try {
    await withHandler("hostkill", async ({ h, node, client }) => {
      for (const n of names) await createVmi(client, testVmi(n, node));
      const before = new Map<string, unknown>();
      for (const n of names) {
        before.set(n, (await waitForPhase(client, "default", n, "Running", 90_000)).status);
      }
      await settledStatuses(client, names, before);
      const conn = await openLibvirt(LIBVIRTD_TEST_URI, { workers: 1 });
      try {
        const idsOf = async () =>
          new Map((await conn.listAllDomains()).map((d) => [d.name, d.id] as [string, number]));
        const ids = await idsOf();
        const pid = hostPid(h.stateDir)!;
        assert.ok(pid, "a launcher host runs");
        const logBefore = (await Deno.readTextFile(h.logFile)).length;
        Deno.kill(pid, "SIGKILL");
        await waitFor("a new launcher host", () => {
          const now = hostPid(h.stateDir);
          return now !== undefined && now !== pid;
        }, 30_000);
        const hostLog = `${h.stateDir}/launchers/${
          [...Deno.readDirSync(`${h.stateDir}/launchers`)].find((e) =>
            e.name.startsWith("host-") && e.name.endsWith(".log")
          )!.name
        }`;
        await waitFor("the new host to take back all 50", async () => {
          const since = (await Deno.readTextFile(h.logFile)).slice(logBefore);
          return since.includes("Started launcher") &&
            (await Deno.readTextFile(hostLog)).includes('"adopted":50');
        }, 30_000);
        // Every VMI answers on its socket again.
        for (const uid of hostedUids(h.stateDir)) {
          const client = new TestCmdClient(`${h.runDir}/sockets/${uid}/launcher-sock`);
          try {
            const res = await client.getDomain();
            assert.ok(res.domain, `the launcher of ${uid} answers with its domain`);
          } finally {
            client.close();
          }
        }
        const idsAfter = await idsOf();
        for (const n of names) {
          assert.ok(ids.get(`default_${n}`)! > 0);
          assert.equal(idsAfter.get(`default_${n}`), ids.get(`default_${n}`), `${n} kept running`);
        }
        // Deliberate: a status change would follow the host's reports within a sync; no
        // event says "nothing changed", so the test gives the handler time to make one.
        await new Promise((r) => setTimeout(r, 2_000));
        for (const n of names) {
          const v = await getVmi(client, "default", n);
          assert.deepEqual(v!.status, before.get(n), `status of ${n} unchanged`);
        }
        assert.equal(hostedUids(h.stateDir).length, 50);
      } finally {
        await conn.close();
      }
    }, { libvirtUri: LIBVIRTD_TEST_URI });
  } finally {
    await removeDomains(names);
  }
});

Deno.test("handler: an invalid VMI gets Synchronized=False and a Warning event while others keep syncing", async () => {
  await withHandler("invalid", async ({ node, client, h }) => {
    const bad = `vm-bad-${suffix()}`;
    const good = `vm-good-${suffix()}`;
    await createVmi(
      client,
      // KubeVirt's admission accepts a TPM; the converter has none.
      testVmi(bad, node, { extra: { tpm: {} } }),
    );
    await createVmi(client, testVmi(good, node));
    const vmi = await waitFor("Synchronized=False on the invalid VMI", async () => {
      const v = await getVmi(client, "default", bad);
      const c = v?.status?.conditions?.find((c) => c.type === "Synchronized");
      return c?.status === "False" ? { v, c } : undefined;
    });
    assert.equal(vmi.c.reason, "Synchronizing with the Domain failed.");
    assert.match(vmi.c.message!, /spec\.domain\.devices\.tpm/);
    // Worded as KubeVirt's cmd client words a failed call, though pod-less mode's first sync
    // goes to the launcher host with its start request, not over the cmd socket.
    assert.match(vmi.c.message!, /server error\. command SyncVirtualMachine failed: /);
    await waitForPhase(client, "default", good, "Running");
    await waitFor("a SyncFailed warning naming the field", async () => {
      const ev = (await eventsFor(client, "default", bad)).find((e) => e.reason === "SyncFailed");
      return ev?.type === "Warning" && /tpm/.test(ev.message);
    });
    assert.equal(vmi.v!.status!.phase, "Scheduled", "an unsyncable VMI is not marked Running");
    const r = await fetch(`${h.health}/healthz`);
    assert.equal(r.status, 200, "the handler is alive");
    await r.body?.cancel();
    await deleteVmi(client, "default", bad);
    await deleteVmi(client, "default", good);
  });
});

Deno.test("handler: a VMI labelled for another node is never touched", async () => {
  await withHandler("othernode", async ({ node, client, h, kubeconfig }) => {
    const mine = `vm-mine-${suffix()}`;
    const theirs = `vm-theirs-${suffix()}`;
    const other = await createVmi(client, testVmi(theirs, `${node}-other`));
    await createVmi(client, testVmi(mine, node));
    await waitForPhase(client, "default", mine, "Running");
    const after = await getVmi(client, "default", theirs);
    assert.equal(after!.metadata.resourceVersion, other.metadata.resourceVersion);
    assert.equal(after!.metadata.labels?.["kubevirt.io/nodeName"], undefined, "not placed here");
    assert.equal(after!.status?.phase, "Pending", "only virt-api's Pending");
    assert.deepEqual(await eventsFor(client, "default", theirs), []);
    assert.equal(await exists(`${h.stateDir}/ghost-records/${other.metadata.uid}`), false);
    await deleteVmi(client, "default", theirs);
    await deleteVmi(client, "default", mine);
    // No node serves the other VMI: take virt-api's finalizer off as virt-controller would.
    const controller = await kubeClient(kubeconfig);
    try {
      await releaseVmi(controller, "default", theirs);
    } finally {
      controller.close();
    }
  });
});

Deno.test("handler: SIGKILLed with 20 running VMIs and restarted, it re-adopts every one", async () => {
  // No VMI is stopped or duplicated by the restart.
  await withHandler("restart", async ({ h, node, client, kubeconfig }) => {
    const names = Array.from({ length: 20 }, (_, i) => `vm-${i}-${suffix()}`);
    const uids = new Map<string, string>();
    for (const n of names) uids.set(n, (await createVmi(client, testVmi(n, node))).metadata.uid!);
    const before = new Map<string, unknown>();
    for (const n of names) {
      before.set(n, (await waitForPhase(client, "default", n, "Running", 90_000)).status);
    }
    // The reference picture is taken once the statuses stop changing (trailing writes after
    // Running), not after a guessed pause.
    await settledStatuses(client, names, before);
    const host = hostPid(h.stateDir)!;
    assert.ok(host, "a launcher host runs");

    await h.kill("SIGKILL");
    // Deliberate: the launcher host must outlive the handler for a while, not only for an
    // instant; no event says "still alive", so the test gives it time to die if it would.
    await new Promise((r) => setTimeout(r, 2_000));
    assert.ok(pidAlive(host), "the launcher host survives the handler");

    const logBefore = (await Deno.readTextFile(h.logFile)).length;
    const restarted = await startHandlerProcess({
      kubeconfig,
      nodeName: node,
      libvirtUri: TEST_URI,
      dir: h.dir,
    });
    try {
      // The restarted handler has synced every key once its log says so for every UID.
      await waitFor("the restarted handler to sync every VMI", async () => {
        const since = (await Deno.readTextFile(h.logFile)).slice(logBefore);
        return [...uids.values()].every((uid) =>
          since.split("\n").some((l) => l.includes('"msg":"Sync: ') && l.includes(uid))
        );
      });
      for (const n of names) {
        const v = await getVmi(client, "default", n);
        assert.deepEqual(v!.status, before.get(n), `status of ${n} unchanged`);
      }
      assert.equal(hostPid(h.stateDir), host, "the same launcher host serves them");
      // No second host was started: both handlers' logs name one start.
      const starts = await launcherStarts(h.logFile);
      assert.equal(starts.size, 1, "one launcher host was ever started");
      assert.deepEqual(hostedUids(h.stateDir).sort(), [...uids.values()].sort());
      const log = await Deno.readTextFile(h.logFile);
      assert.match(log, /"adopted":20/);
      for (const n of names) await deleteVmi(client, "default", n);
      await waitFor(
        "the launcher host to forget them",
        () => hostedUids(h.stateDir).length === 0,
        60_000,
      );
    } finally {
      await restarted.kill("SIGTERM");
    }
  });
});

Deno.test("handler: SIGTERM makes it not ready and exit 0, leaving VMs running", async () => {
  await withHandler("sigterm", async ({ h, node, client }) => {
    const name = `vm-${suffix()}`;
    await createVmi(client, testVmi(name, node));
    await waitForPhase(client, "default", name, "Running");
    const pid = hostPid(h.stateDir)!;
    const status = await h.kill("SIGTERM");
    assert.equal(status.code, 0);
    // Deliberate: the launcher host must keep running a while after the handler is gone; no
    // event says "still running", so the test gives it time to die if it would.
    await new Promise((r) => setTimeout(r, 2_000));
    assert.ok(pidAlive(pid), "the launcher host keeps running");
    assert.equal((await getVmi(client, "default", name))!.status!.phase, "Running");
    Deno.kill(pid, "SIGTERM");
    await deleteVmi(client, "default", name);
  });
});

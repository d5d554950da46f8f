/**
 * The handler against a real apiserver, real launcher processes and libvirt's
 * test driver (each launcher has its own hypervisor state): the sync loop,
 * status and events, deletion and cleanup, failures, and restarts.
 */
import assert from "node:assert/strict";
import { isDeepStrictEqual } from "node:util";
import {
  createVmi,
  deleteVmi,
  eventsFor,
  getVmi,
  type HandlerProcess,
  kubeClient,
  launcherProcesses,
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

function suffix(): string {
  return crypto.randomUUID().slice(0, 8);
}

async function launcherPid(h: HandlerProcess, uid: string): Promise<number> {
  return Number((await Deno.readTextFile(`${h.stateDir}/launchers/${uid}.pid`)).trim());
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.lstat(path);
    return true;
  } catch {
    return false;
  }
}

Deno.test("handler: a VMI goes Running with status and events, and deleting it removes domain, launcher and ghost record", async () => {
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
    const cond = Object.fromEntries(st.conditions!.map((c) => [c.type, c]));
    assert.equal(cond.Ready?.status, "True");
    // Live migration is not implemented: never advertised, with KubeVirt's generic reason.
    assert.equal(cond.LiveMigratable?.status, "False");
    assert.equal(cond.LiveMigratable?.reason, "NotMigratable");
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
    const pid = await launcherPid(h, uid);
    assert.ok(pidAlive(pid));

    await waitFor("Created and Started events", async () => {
      const reasons = (await eventsFor(client, "default", name)).map((e) => e.reason);
      return reasons.includes("Created") && reasons.includes("Started");
    });

    await deleteVmi(client, "default", name);
    await waitFor("the launcher to exit", () => !pidAlive(pid), 30_000);
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

Deno.test("handler: a killed launcher fails its VMI and leaves the others untouched", async () => {
  await withHandler("killlauncher", async ({ h, node, client }) => {
    const a = `vm-a-${suffix()}`;
    const b = `vm-b-${suffix()}`;
    const va = await createVmi(client, testVmi(a, node));
    const vb = await createVmi(client, testVmi(b, node));
    await waitForPhase(client, "default", a, "Running");
    const before = await waitForPhase(client, "default", b, "Running");
    const pidA = await launcherPid(h, va.metadata.uid!);
    const pidB = await launcherPid(h, vb.metadata.uid!);
    Deno.kill(pidA, "SIGKILL");
    const failed = await waitForPhase(client, "default", a, "Failed", 40_000);
    assert.equal(failed.status!.phaseTransitionTimestamps!.at(-1)!.phase, "Failed");
    await waitFor(
      "the failed VMI's ghost record to be cleaned up",
      async () => !(await exists(`${h.stateDir}/ghost-records/${va.metadata.uid}`)),
    );
    const after = await getVmi(client, "default", b);
    assert.equal(after!.status!.phase, "Running");
    assert.deepEqual(after!.status, before.status, "the other VMI's status did not change");
    assert.ok(pidAlive(pidB), "the other launcher still runs");
    const warn = (await eventsFor(client, "default", a)).find((e) => e.type === "Warning");
    assert.equal(warn?.reason, "Stopped");
  });
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

Deno.test("handler: SIGKILLed with 20 running VMIs and restarted, it re-adopts every VMI without stopping or duplicating one", async () => {
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
    const pids = new Map<string, number>();
    for (const n of names) pids.set(n, await launcherPid(h, uids.get(n)!));

    await h.kill("SIGKILL");
    // Deliberate: launchers must outlive the handler for a while, not only for an instant;
    // no event says "still alive", so the test gives them time to die if they would.
    await new Promise((r) => setTimeout(r, 2_000));
    for (const [n, pid] of pids) assert.ok(pidAlive(pid), `launcher of ${n} survives the handler`);

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
        assert.ok(pidAlive(pids.get(n)!), `launcher of ${n} still the same process`);
      }
      // No launcher was started twice: a second start overwrites the first one's PID file,
      // so count what cannot be overwritten: the starts both handlers logged and the
      // launcher processes carrying each UID.
      const starts = await launcherStarts(h.logFile);
      for (const [n, uid] of uids) {
        assert.equal(starts.get(uid), 1, `the launcher of ${n} was started once`);
        assert.deepEqual(launcherProcesses(uid), [pids.get(n)], `one launcher process for ${n}`);
      }
      assert.equal(starts.size, 20, "no other launcher was started");
      const log = await Deno.readTextFile(h.logFile);
      assert.match(log, /"adopted":20/);
      for (const n of names) await deleteVmi(client, "default", n);
      for (const [, pid] of pids) await waitFor("launchers to exit", () => !pidAlive(pid), 60_000);
    } finally {
      await restarted.kill("SIGTERM");
    }
  });
});

Deno.test("handler: SIGTERM makes it not ready and exit 0, leaving VMs running", async () => {
  await withHandler("sigterm", async ({ h, node, client }) => {
    const name = `vm-${suffix()}`;
    const vmi = await createVmi(client, testVmi(name, node));
    await waitForPhase(client, "default", name, "Running");
    const pid = await launcherPid(h, vmi.metadata.uid!);
    const status = await h.kill("SIGTERM");
    assert.equal(status.code, 0);
    // Deliberate: the launcher must keep running a while after the handler is gone; no
    // event says "still running", so the test gives it time to die if it would.
    await new Promise((r) => setTimeout(r, 2_000));
    assert.ok(pidAlive(pid), "the VM's launcher keeps running");
    assert.equal((await getVmi(client, "default", name))!.status!.phase, "Running");
    Deno.kill(pid, "SIGTERM");
    await deleteVmi(client, "default", name);
  });
});

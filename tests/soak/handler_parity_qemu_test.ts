/**
 * Where a pod-less handler with QEMU guests must do what KubeVirt's virt-handler does
 * (issue 35): the phase of a guest destroyed from outside, LiveMigratable across a handler
 * restart, a domain an earlier run left under a VMI's name, and the Events of a VMI deleted
 * before it ever started. Real libvirtd, real launcher host, real apiserver with KubeVirt's
 * admission.
 */
import assert from "node:assert/strict";
import { useCluster } from "../../deploy/cluster/cluster.ts";
import type { KubeClient } from "../../mod/kube/mod.ts";
import { jsonLines } from "../../mod/kube/mod.ts";
import type { VirtualMachineInstance, VmiCondition } from "../../mod/api/mod.ts";
import { ensureLibvirtd, tinyGuestXml, virsh } from "../helpers/libvirtd.ts";
import {
  createVmi,
  deleteVmi,
  eventsFor,
  getVmi,
  type HandlerProcess,
  killLaunchers,
  kubeClient,
  startHandlerProcess,
  testVmi,
  vmiPath,
  waitFor,
  waitForPhase,
} from "../helpers/handler_process.ts";

const CRASHED = "The VirtualMachineInstance crashed.";
const SHUT_DOWN = "The VirtualMachineInstance was shut down.";

async function domainExists(name: string): Promise<boolean> {
  return (await virsh("list", "--all", "--name")).split("\n").includes(name);
}

/** Destroys and undefines a domain this test defined itself, if it is still there. */
async function removeDomain(name: string): Promise<void> {
  if (!(await domainExists(name))) return;
  await virsh("destroy", name).catch(() => {});
  await virsh("undefine", name).catch(() => {});
}

/**
 * Defines and starts a small guest named `name`: with KubeVirt's metadata and `uid` it is
 * what a VMI of an earlier run left behind; without `uid` it is no KubeVirt domain at all.
 */
async function defineLeftover(name: string, uid?: string): Promise<void> {
  let xml = tinyGuestXml(name);
  if (uid) {
    xml = xml.replace(
      "<vcpu>",
      `<metadata><kubevirt xmlns="http://kubevirt.io"><uid>${uid}</uid>` +
        `<graceperiod><deletionGracePeriodSeconds>0</deletionGracePeriodSeconds>` +
        `</graceperiod></kubevirt></metadata>\n  <vcpu>`,
    );
  }
  const dir = await Deno.makeTempDir({ prefix: "virtnode-leftover-" });
  try {
    await Deno.writeTextFile(`${dir}/domain.xml`, xml);
    await virsh("define", `${dir}/domain.xml`);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
  await virsh("start", name);
}

interface Ctx {
  ns: string;
  node: string;
  client: KubeClient;
  kubeconfig: string;
  uri: string;
  h: HandlerProcess;
}

/**
 * Runs `fn` with a pod-less handler on the host's libvirtd for a node and namespace of its
 * own. Afterwards the VMIs are deleted and cleaned up by the handler (the one `fn` left in
 * `ctx.h`), the handler and its launcher host stop and their folders go.
 */
async function withQemuHandler(fn: (ctx: Ctx) => Promise<void>): Promise<void> {
  const uri = await ensureLibvirtd();
  const cluster = await useCluster();
  const client = await kubeClient(cluster.kubeconfigPath);
  const id = crypto.randomUUID().slice(0, 8);
  const ns = `parity-${id}`;
  await client.request("POST", "/api/v1/namespaces", { metadata: { name: ns } });
  const node = `parity-node-${id}`;
  const ctx: Ctx = {
    ns,
    node,
    client,
    kubeconfig: cluster.handlerKubeconfigPath,
    uri,
    h: await startHandlerProcess({
      kubeconfig: cluster.handlerKubeconfigPath,
      nodeName: node,
      libvirtUri: uri,
    }),
  };
  let ok = false;
  try {
    await fn(ctx);
    ok = true;
  } finally {
    const h = ctx.h;
    if (!ok) console.error(`handler log:\n${(await Deno.readTextFile(h.logFile)).slice(-8000)}`);
    const list = await client.request<{ items: VirtualMachineInstance[] }>("GET", vmiPath(ns));
    for (const v of list.items) await deleteVmi(client, ns, v.metadata.name);
    await waitFor("the VMIs to be gone", async () => {
      const left = await client.request<{ items: unknown[] }>("GET", vmiPath(ns));
      return left.items.length === 0;
    }, 60_000).catch((e) => console.error(e.message));
    await h.kill("SIGTERM");
    killLaunchers(h.stateDir); // the launcher host outlives its handler by design
    await client.request("DELETE", `/api/v1/namespaces/${ns}`).catch(() => {});
    client.close();
    await Deno.remove(h.dir, { recursive: true }).catch(() => {});
    await cluster.stop();
  }
}

function condition(vmi: VirtualMachineInstance | undefined, type: string) {
  return vmi?.status?.conditions?.find((c: VmiCondition) => c.type === type);
}

Deno.test("handler+QEMU: a guest destroyed with virsh makes its VMI Failed, as virt-handler does", async () => {
  // The guest has ACPI and a grace period, yet a destroy from outside is a failure, not a shutdown.
  await withQemuHandler(async ({ ns, node, client }) => {
    const name = "destroyed";
    const vmi = testVmi(name, node, { namespace: ns, grace: 30 });
    vmi.spec.domain.features = { acpi: {} };
    await createVmi(client, vmi);
    await waitForPhase(client, ns, name, "Running", 120_000);
    await virsh("destroy", `${ns}_${name}`);
    const final = await waitFor("the VMI to reach a final phase", async () => {
      const v = await getVmi(client, ns, name);
      const phase = v?.status?.phase;
      return phase === "Failed" || phase === "Succeeded" ? v : undefined;
    }, 60_000);
    assert.equal(final.status?.phase, "Failed");
    // The handler's phase Event (recorded after the status write) is virt-handler's for a
    // Failed VMI, not a shutdown's.
    const phaseEvents = await waitFor("the phase Event", async () => {
      const events = (await eventsFor(client, ns, name)).filter((e) =>
        e.message === CRASHED || e.message === SHUT_DOWN
      );
      return events.length > 0 ? events : undefined;
    });
    assert.deepEqual(phaseEvents.map((e) => [e.type, e.reason, e.message]), [
      ["Warning", "Stopped", CRASHED],
    ]);
  });
});

Deno.test("handler+QEMU: a handler restart keeps a running host-model VMI LiveMigratable", async () => {
  // The VMI's CPU is host-model; while the restarted handler's labeller
  // reads the host again, LiveMigratable must never turn False.
  await withQemuHandler(async (ctx) => {
    const { ns, node, client } = ctx;
    const name = "migratable";
    await createVmi(client, testVmi(name, node, { namespace: ns }));
    const running = await waitFor("the VMI Running and LiveMigratable", async () => {
      const v = await getVmi(client, ns, name);
      return v?.status?.phase === "Running" && condition(v, "LiveMigratable")?.status === "True"
        ? v
        : undefined;
    }, 120_000);
    assert.equal(running.spec.domain.cpu?.model, "host-model", "KubeVirt's default CPU model");

    // Every version of the VMI from here on, through the restart.
    const seen: VirtualMachineInstance[] = [];
    const watching = new AbortController();
    const body = await client.stream(vmiPath(ns), {
      query: {
        watch: true,
        resourceVersion: running.metadata.resourceVersion,
        fieldSelector: `metadata.name=${name}`,
      },
      signal: watching.signal,
    });
    const watch = (async () => {
      for await (const line of jsonLines(body, watching.signal)) {
        const event = JSON.parse(line) as { type: string; object: VirtualMachineInstance };
        if (event.type === "ADDED" || event.type === "MODIFIED") seen.push(event.object);
      }
    })().catch((error) => {
      if (!watching.signal.aborted) throw error;
    });
    try {
      await ctx.h.kill("SIGTERM");
      const restarted = Date.now();
      ctx.h = await startHandlerProcess({
        kubeconfig: ctx.kubeconfig,
        nodeName: node,
        libvirtUri: ctx.uri,
        dir: ctx.h.dir,
      });
      // The new handler's labeller reads the host in a child process within seconds of
      // its start; a minute covers it many times over, and the first False ends the wait.
      const falseSeen = () => seen.find((v) => condition(v, "LiveMigratable")?.status === "False");
      await waitFor(
        "a minute after the restart, or a LiveMigratable False",
        () => falseSeen() !== undefined || Date.now() - restarted > 60_000,
        70_000,
        200,
      );
      const flipped = falseSeen();
      assert.equal(
        flipped,
        undefined,
        `LiveMigratable went False after the restart: ${
          JSON.stringify(condition(flipped, "LiveMigratable"))
        }`,
      );
      const now = await getVmi(client, ns, name);
      assert.equal(now?.status?.phase, "Running");
      assert.equal(condition(now, "LiveMigratable")?.status, "True");
      // The minute watched covered the new handler's first read of the host.
      const read = (await Deno.readTextFile(ctx.h.logFile)).split("\n")
        .filter((l) => l.includes('"Host CPU model read')).map((l) => JSON.parse(l))
        .map((l: { timestamp: string }) => Date.parse(l.timestamp))
        .filter((at: number) => at >= restarted);
      assert.equal(read.length, 1, "the restarted handler's labeller read the host once");
      console.log(`  host CPU model read ${read[0] - restarted} ms after the restart began`);
    } finally {
      watching.abort();
      await watch;
    }
  });
});

Deno.test("handler+QEMU: a leftover domain of a gone VMI is removed and the new VMI of that name runs", async () => {
  // An earlier run left a domain under the VMI's name, belonging to a VMI that no longer exists.
  await withQemuHandler(async ({ ns, node, client }) => {
    const name = "reused";
    const domain = `${ns}_${name}`;
    const oldUid = crypto.randomUUID();
    try {
      await defineLeftover(domain, oldUid);
      const created = await createVmi(client, testVmi(name, node, { namespace: ns }));
      const running = await waitForPhase(client, ns, name, "Running", 120_000);
      assert.equal(running.metadata.uid, created.metadata.uid);
      const xml = await virsh("dumpxml", domain);
      assert.ok(xml.includes(created.metadata.uid!), "the domain is the new VMI's");
      assert.ok(!xml.includes(oldUid), "the earlier run's domain is gone");
    } finally {
      await removeDomain(domain);
    }
  });
});

Deno.test("handler+QEMU: a VMI whose name a foreign domain holds says why it cannot start", async () => {
  // Deleting that VMI later gets the Events virt-handler sends, and the handler does not crash.
  await withQemuHandler(async ({ ns, node, client }) => {
    const name = "taken";
    const domain = `${ns}_${name}`;
    try {
      await defineLeftover(domain);
      await createVmi(client, testVmi(name, node, { namespace: ns }));
      const refused = await waitFor("the VMI to say why it cannot start", async () => {
        const v = await getVmi(client, ns, name);
        return condition(v, "Synchronized")?.status === "False" ? v : undefined;
      }, 120_000);
      assert.equal(refused.status?.phase, "Scheduled");
      const why = condition(refused, "Synchronized")!.message ?? "";
      assert.match(why, new RegExp(`"${domain}"`), why);
      assert.match(why, /not a KubeVirt domain/, why);
      // The Event follows the status write that carries the condition.
      await waitFor(
        "a SyncFailed Warning saying the same",
        async () =>
          (await eventsFor(client, ns, name)).some((e) =>
            e.type === "Warning" && e.reason === "SyncFailed" && e.message === why
          ),
        30_000,
      );
      assert.match(await virsh("domstate", domain), /running/, "a foreign domain is left alone");

      await deleteVmi(client, ns, name);
      await waitFor("the VMI to be gone", async () => !(await getVmi(client, ns, name)), 60_000);
      const events = await waitFor("virt-handler's deletion Event", async () => {
        const all = await eventsFor(client, ns, name);
        return all.some((e) =>
            e.type === "Normal" && e.reason === "Deleted" && e.message === "Signaled Deletion"
          )
          ? all
          : undefined;
      });
      assert.deepEqual(
        events.filter((e) => e.message === CRASHED),
        [],
        "a VMI that never started did not crash",
      );
      assert.match(await virsh("domstate", domain), /running/, "a foreign domain is left alone");
    } finally {
      await removeDomain(domain);
    }
  });
});

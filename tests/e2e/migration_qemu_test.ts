/**
 * Live migration between two pod-less nodes, end to end: two handlers, each in a network
 * namespace of its own (joined by veth pairs to one bridge) and a mount namespace shared
 * with its own libvirtd, a real apiserver with KubeVirt's CRDs and admission, and the test
 * guest under QEMU on the pod network (masquerade). A VirtualMachineInstanceMigration,
 * driven through KubeVirt's phases by the source node's handler (pod-less mode plays
 * virt-controller's part), moves the running guest to the other node: same boot, its HTTP
 * server on the new node's pod IP, the VMI's node and label moved, nothing of it left on
 * the source. Then the faults, each ending with the guest running where it was and the
 * migration Failed with a reason: a source whose client certificate is another CA's, a
 * target handler killed while the migration runs, a target node that never gets ready, a
 * target node that never takes VMIs; and KubeVirt's admission refuses to migrate a VMI that
 * is not LiveMigratable. Last, a VMI with a dedicated CPU moves to a node where another VMI
 * holds that CPU and arrives pinned to a CPU of its own there.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { startCluster } from "../../deploy/cluster/cluster.ts";
import type { KubeClient } from "../../mod/kube/mod.ts";
import type { VirtualMachineInstanceMigration } from "../../mod/api/mod.ts";
import { guestVmi, httpGet, installTestGuest } from "../helpers/guest.ts";
import {
  createVmi,
  deleteVmi,
  getVmi,
  type HandlerProcess,
  hostedUids,
  hostLogOf,
  killLaunchers,
  kubeClient,
  startHandlerProcess,
  testVmi,
  waitFor,
  waitForPhase,
} from "../helpers/handler_process.ts";
import { type NodeHost, type NodeHosts, startNodeHosts } from "../helpers/migration.ts";
import { makeCertificates } from "../helpers/rest_client.ts";

/** A guest booting under software emulation takes its time on a busy 2-core machine. */
const BOOT_MS = 240_000;
const MIGRATION_MS = 180_000;

const vmimPath = (ns: string, name = "") =>
  `/apis/kubevirt.io/v1/namespaces/${ns}/virtualmachineinstancemigrations${name ? `/${name}` : ""}`;

async function createVmim(
  client: KubeClient,
  ns: string,
  name: string,
  vmiName: string,
  o: { node?: string; annotations?: Record<string, string> } = {},
): Promise<VirtualMachineInstanceMigration> {
  return await client.request<VirtualMachineInstanceMigration>("POST", vmimPath(ns), {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachineInstanceMigration",
    metadata: { name, namespace: ns, annotations: o.annotations },
    spec: {
      vmiName,
      ...(o.node ? { addedNodeSelector: { "kubernetes.io/hostname": o.node } } : {}),
    },
  });
}

async function vmimEnds(
  client: KubeClient,
  ns: string,
  name: string,
  ms = MIGRATION_MS,
): Promise<VirtualMachineInstanceMigration> {
  return await waitFor(
    `migration ${name} to end`,
    async () => {
      const m = await client.request<VirtualMachineInstanceMigration>("GET", vmimPath(ns, name));
      const phase = m.status?.phase;
      // Final, and virt-controller's finalizer off (the VMI's state copied in by then).
      return (phase === "Succeeded" || phase === "Failed") &&
          !(m.metadata.finalizers ?? []).includes("kubevirt.io/migrationJobFinalize")
        ? m
        : undefined;
    },
    ms,
    500,
  );
}

async function eventMessages(client: KubeClient, ns: string, uid: string): Promise<string[]> {
  const list = await client.request<{ items: { reason: string; message: string }[] }>(
    "GET",
    `/api/v1/namespaces/${ns}/events?fieldSelector=${
      encodeURIComponent(`involvedObject.uid=${uid}`)
    }`,
  );
  return list.items.map((e) => `${e.reason}: ${e.message}`);
}

/** The CPU the domain `name` on `node` pins its vCPU 0 to. */
async function vcpu0Pin(node: NodeHost, name: string): Promise<number> {
  const out = await new Deno.Command("virsh", {
    args: ["-c", node.libvirtd.uri, "dumpxml", name],
    stdout: "piped",
    stderr: "null",
  }).output();
  const pin = /<vcpupin vcpu='0' cpuset='(\d+)'\/>/.exec(new TextDecoder().decode(out.stdout));
  if (!pin) throw new Error(`${name} on ${node.name} has no pinned vCPU 0`);
  return Number(pin[1]);
}

async function domainsOf(node: NodeHost): Promise<string[]> {
  const out = await new Deno.Command("virsh", {
    args: ["-c", node.libvirtd.uri, "list", "--all", "--name"],
    stdout: "piped",
    stderr: "null",
  }).output();
  return new TextDecoder().decode(out.stdout).split("\n").map((l) => l.trim()).filter(Boolean);
}

/** The guest as its HTTP server tells it: this boot's ID and its uptime in seconds. */
async function guestBoot(ip: string): Promise<{ bootId: string; uptime: number } | undefined> {
  const bootId = (await httpGet(`http://${ip}/boot_id`))?.trim();
  const uptime = Number((await httpGet(`http://${ip}/cgi-bin/uptime`))?.trim());
  return bootId && Number.isFinite(uptime) ? { bootId, uptime } : undefined;
}

/**
 * The VMI's pod IP once it runs on `node`, other than `previous` (the source node's): the
 * handler that took the VMI over reports the new address a sync after the node, as
 * virt-handler does.
 */
async function podIp(
  client: KubeClient,
  ns: string,
  name: string,
  node: string,
  previous?: string,
) {
  const vmi = await waitFor(
    `${name}'s pod IP on ${node}`,
    async () => {
      const v = await getVmi(client, ns, name);
      const ip = v?.status?.interfaces?.[0]?.ipAddress;
      return v?.status?.nodeName === node && ip && ip !== previous ? v : undefined;
    },
    60_000,
    500,
  ).catch(async (error) => {
    const v = await getVmi(client, ns, name);
    throw new Error(
      `${error.message}; on ${v?.status?.nodeName} with ${JSON.stringify(v?.status?.interfaces)}`,
    );
  });
  return vmi.status!.interfaces![0].ipAddress!;
}

Deno.test("migration (QEMU, two pod-less nodes): a guest moves through the handlers' TLS proxy", async () => {
  // Both nodes live in network namespaces. Each failure (a wrong client certificate, the target
  // handler killed mid-migration, a target never ready, one never taking VMIs) fails the migration
  // with the guest still running on its source. A VMI that is not LiveMigratable is refused.
  const dir = await Deno.makeTempDir({ prefix: "virtnode-mig-" });
  const cluster = await startCluster({ admission: true, podNetwork: true });
  let hosts: NodeHosts | undefined;
  const handlers = new Map<string, HandlerProcess>();
  try {
    hosts = await startNodeHosts(2);
    const [a, b] = hosts.nodes;
    const certs = await makeCertificates(dir);
    const clientDir = async (name: string, pair: { cert: string; key: string }) => {
      const d = join(dir, name);
      await Deno.mkdir(d, { recursive: true });
      await Deno.writeTextFile(join(d, "tls.crt"), pair.cert);
      await Deno.writeTextFile(join(d, "tls.key"), pair.key);
      return d;
    };
    const goodClient = await clientDir("client-good", certs.client);
    const otherCaClient = await clientDir("client-other-ca", certs.otherCa);
    const client = await kubeClient(cluster.kubeconfigPath);
    const ns = `mig-${crypto.randomUUID().slice(0, 6)}`;
    await client.request("POST", "/api/v1/namespaces", { metadata: { name: ns } });
    for (const node of hosts.nodes) {
      await client.request("POST", "/api/v1/nodes", { metadata: { name: node.name } });
      await installTestGuest(join(dir, node.name, "state", "images"));
    }
    const start = async (node: NodeHost, certDir = goodClient) => {
      const h = await startHandlerProcess({
        kubeconfig: cluster.handlerKubeconfigPath,
        nodeName: node.name,
        libvirtUri: "qemu:///system",
        dir: join(dir, node.name),
        runDir: "/var/run/kubevirt",
        podNetwork: node.podNetwork,
        enter: node.enter,
        healthHost: node.address,
        // The abort scenario scrapes /metrics from outside the node.
        openMetrics: true,
        extraArgs: [
          "--server-cert-dir",
          certs.serverDir,
          "--client-cert-dir",
          certDir,
          "--client-ca-file",
          certs.caFile,
          "--migration-ip",
          node.address,
        ],
      });
      handlers.set(node.name, h);
      return h;
    };
    await start(a);
    await start(b);
    // Both nodes take VMIs once their heartbeats say so.
    for (const node of hosts.nodes) {
      await waitFor(
        `${node.name} to take VMIs`,
        async () => {
          const n = await client.request<{ metadata: { labels?: Record<string, string> } }>(
            "GET",
            `/api/v1/nodes/${node.name}`,
          );
          return n.metadata.labels?.["kubevirt.io/schedulable"] === "true";
        },
        60_000,
        500,
      );
    }

    // The guest on node a, its HTTP server on its pod IP there.
    const vmi = await createVmi(
      client,
      guestVmi("mig", a.name, { namespace: ns, binding: "masquerade" }),
    );
    const uid = vmi.metadata.uid!;
    /** A failed migration's target on node a is gone: label, domain, launcher. */
    const targetCleanedUp = (what: string) =>
      waitFor(
        `${what} to be cleaned up`,
        async () => {
          const v = await getVmi(client, ns, "mig");
          return v?.metadata.labels?.["kubevirt.io/migrationTargetNodeName"] === undefined &&
            (await domainsOf(a)).length === 0 &&
            !hostedUids(handlers.get(a.name)!.stateDir).includes(uid);
        },
        60_000,
        500,
      );
    const running = await waitForPhase(client, ns, "mig", "Running", 90_000);
    const live = running.status?.conditions?.find((c) => c.type === "LiveMigratable");
    assert.equal(live?.status, "True", JSON.stringify(live));
    assert.equal(running.status?.migrationTransport, "Unix");
    const ipA = await podIp(client, ns, "mig", a.name);
    const before = await waitFor(
      "the guest's HTTP server on node a",
      () => guestBoot(ipA),
      BOOT_MS,
      1_000,
    );

    // KubeVirt's admission refuses to migrate a VMI that is not LiveMigratable.
    await createVmi(client, guestVmi("fixed", a.name, { namespace: ns, binding: "bridge" }));
    await waitFor(
      "fixed's LiveMigratable=False",
      async () => {
        const v = await getVmi(client, ns, "fixed");
        return v?.status?.conditions?.find((c) =>
          c.type === "LiveMigratable" && c.status === "False"
        );
      },
      90_000,
      500,
    );
    await assert.rejects(
      createVmim(client, ns, "fixed-move", "fixed"),
      /Cannot migrate VMI, Reason: InterfaceNotLiveMigratable/,
    );
    await deleteVmi(client, ns, "fixed");

    // 1. The migration: a VMIM with no target named; pod-less mode takes the other node.
    const t0 = performance.now();
    await createVmim(client, ns, "move-1", "mig");
    const moved = await vmimEnds(client, ns, "move-1");
    assert.equal(moved.status?.phase, "Succeeded", JSON.stringify(moved.status));
    console.log(
      `  migrated a -> b in ${Math.round(performance.now() - t0)} ms (create to Succeeded)`,
    );
    const phases = moved.status!.phaseTransitionTimestamps!.map((t) => t.phase);
    assert.deepEqual(phases, [
      "Pending",
      "Scheduling",
      "Scheduled",
      "PreparingTarget",
      "TargetReady",
      "Running",
      "Succeeded",
    ]);
    assert.equal(moved.status?.migrationState?.completed, true);
    assert.equal(moved.status?.migrationState?.sourceNode, a.name);
    assert.equal(moved.status?.migrationState?.targetNode, b.name);
    const onB = await waitFor(
      "the VMI on node b, its target label gone",
      async () => {
        const v = await getVmi(client, ns, "mig");
        return v?.status?.nodeName === b.name &&
            v.metadata.labels?.["kubevirt.io/nodeName"] === b.name &&
            v.metadata.labels?.["kubevirt.io/migrationTargetNodeName"] === undefined
          ? v
          : undefined;
      },
      30_000,
      500,
    );
    assert.equal(onB.status?.phase, "Running");
    const state = onB.status!.migrationState!;
    assert.equal(state.completed, true);
    assert.ok(!state.failed);
    assert.equal(state.targetNodeAddress, b.address);
    assert.ok(state.startTimestamp && state.endTimestamp && state.targetNodeDomainReadyTimestamp);
    assert.equal(state.mode, "PreCopy");
    const ipB = await podIp(client, ns, "mig", b.name, ipA);
    const after = await waitFor(
      "the guest's HTTP server on node b",
      () => guestBoot(ipB),
      60_000,
      500,
    );
    assert.equal(after.bootId, before.bootId, "the same boot: the guest moved, it did not restart");
    assert.ok(after.uptime > before.uptime);
    await waitFor(
      "nothing of the guest left on node a",
      async () =>
        (await domainsOf(a)).length === 0 &&
        !hostedUids(handlers.get(a.name)!.stateDir).includes(uid),
      30_000,
      500,
    );
    assert.deepEqual(await domainsOf(b), [`${ns}_mig`]);
    const events = await eventMessages(client, ns, uid);
    assert.ok(
      events.includes("Migrating: VirtualMachineInstance is migrating."),
      events.join("\n"),
    );
    assert.ok(events.includes(`Migrated: The VirtualMachineInstance migrated to node ${b.name}.`));

    // 2. A source whose client certificate is another CA's: the target lets nothing in.
    await handlers.get(b.name)!.kill();
    await start(b, otherCaClient);
    await createVmim(client, ns, "move-2", "mig");
    const refused = await vmimEnds(client, ns, "move-2");
    assert.equal(refused.status?.phase, "Failed");
    assert.equal(refused.status?.migrationState?.failed, true);
    assert.ok(refused.status?.migrationState?.failureReason, "a reason");
    console.log(`  other CA's certificate: ${refused.status?.migrationState?.failureReason}`);
    const stillB = await guestBoot(ipB);
    assert.equal(stillB?.bootId, before.bootId, "the guest runs on where it was");
    assert.equal((await getVmi(client, ns, "mig"))?.status?.nodeName, b.name);
    await targetCleanedUp("node a's target");

    // 3. A migration slowed to 1 MiB/s (the KubeVirt CR's bandwidthPerMigration): its
    // progress is in the source handler's /metrics, and deleting its VMIM aborts it.
    await handlers.get(b.name)!.kill();
    await start(b);
    await setMigrationBandwidth(cluster.kubeconfigPath, "1Mi");
    const untilRunning = async (name: string) =>
      await waitFor(
        `${name} to run`,
        async () => {
          const m = await client.request<VirtualMachineInstanceMigration>(
            "GET",
            vmimPath(ns, name),
          );
          return m.status?.phase === "Running";
        },
        MIGRATION_MS,
        250,
      );
    await createVmim(client, ns, "move-abort", "mig");
    await untilRunning("move-abort");
    // libvirt reports bytes moved from the job's start but the transfer rate only once
    // QEMU has measured one (its counters update every 100 ms), so a scrape can carry the
    // first without the second; wait for one that has all of them.
    const progressFamilies = [
      "kubevirt_vmi_migration_data_total_bytes",
      "kubevirt_vmi_migration_data_remaining_bytes",
      "kubevirt_vmi_migration_memory_transfer_rate_bytes",
    ];
    let missing: string[] = [];
    await waitFor(
      "the migration's progress in the source's /metrics",
      async () => {
        const text = await httpGet(`${handlers.get(b.name)!.health}/metrics`, 10_000);
        if (
          !text?.match(
            /^kubevirt_vmi_migration_data_processed_bytes\{[^}]*name="mig"[^}]*\} [1-9]/m,
          )
        ) {
          missing = ["kubevirt_vmi_migration_data_processed_bytes"];
          return false;
        }
        missing = progressFamilies.filter((family) =>
          !new RegExp(`^${family}\\{[^}]*name="mig"`, "m").test(text)
        );
        return missing.length === 0;
      },
      30_000,
      500,
    ).catch((error) => {
      throw new Error(`${error}; missing from the last scrape: ${missing.join(", ")}`);
    });
    await client.request("DELETE", vmimPath(ns, "move-abort"));
    await waitFor(
      "the aborted migration's VMIM to go",
      async () => {
        try {
          await client.request("GET", vmimPath(ns, "move-abort"));
          return false;
        } catch (error) {
          return (error as { status?: number }).status === 404;
        }
      },
      MIGRATION_MS,
      500,
    );
    const aborted = (await getVmi(client, ns, "mig"))!.status!.migrationState!;
    assert.equal(aborted.abortRequested, true);
    assert.equal(aborted.abortStatus, "Succeeded");
    assert.equal(aborted.failed, true);
    assert.equal((await guestBoot(ipB))?.bootId, before.bootId, "the guest runs on node b");
    await targetCleanedUp("the aborted migration's target");

    // 4. The target's handler killed while the migration runs.
    await createVmim(client, ns, "move-3", "mig");
    await untilRunning("move-3");
    await handlers.get(a.name)!.kill("SIGKILL");
    const killed = await vmimEnds(client, ns, "move-3");
    assert.equal(killed.status?.phase, "Failed");
    console.log(`  target handler killed: ${killed.status?.migrationState?.failureReason}`);
    assert.equal((await guestBoot(ipB))?.bootId, before.bootId, "the guest runs on node b");
    await setMigrationBandwidth(cluster.kubeconfigPath, "0Mi");
    // Back up, node a's handler finishes the failed migration's target.
    await start(a);
    await targetCleanedUp("the killed target");

    // 5. A target node that takes VMIs but whose handler never gets ready for the migration.
    const ghost = `ghost-${crypto.randomUUID().slice(0, 6)}`;
    await client.request("POST", "/api/v1/nodes", {
      metadata: { name: ghost, labels: { "kubevirt.io/schedulable": "true" } },
    });
    await createVmim(client, ns, "move-4", "mig", {
      node: ghost,
      annotations: { "kubevirt.io/migrationPendingPodTimeoutSeconds": "5" },
    });
    const notReady = await vmimEnds(client, ns, "move-4", 60_000);
    assert.equal(notReady.status?.phase, "Failed");
    assert.match(
      notReady.status?.migrationState?.failureReason ?? "",
      /did not get ready within 5s/,
    );
    // 6. A target node that never takes VMIs.
    await createVmim(client, ns, "move-5", "mig", {
      node: "no-such-node",
      annotations: { "kubevirt.io/migrationUnschedulablePodTimeoutSeconds": "3" },
    });
    const unschedulable = await vmimEnds(client, ns, "move-5", 60_000);
    assert.equal(unschedulable.status?.phase, "Failed");
    assert.match(
      unschedulable.status?.migrationState?.failureReason ?? "",
      /"no-such-node" did not take VMIs within 3s/,
    );
    const last = (await getVmi(client, ns, "mig"))!;
    assert.equal(last.status?.phase, "Running");
    assert.equal(last.status?.nodeName, b.name);
    assert.equal((await guestBoot(ipB))?.bootId, before.bootId, "the guest ran on throughout");
    await client.request("DELETE", `/api/v1/nodes/${ghost}`);

    // 7. A VMI with a dedicated CPU moves to a node where another VMI holds the CPU it has:
    // the target's launcher host gives it one of its own there, the target reports it
    // (status.migrationState.targetCPUSet), and the source sends the domain pinned to it.
    const dedicated = (name: string, node: string) => {
      const v = testVmi(name, node, { namespace: ns });
      v.spec.domain.cpu = { ...v.spec.domain.cpu, dedicatedCpuPlacement: true };
      return v;
    };
    await createVmi(client, dedicated("holder", a.name));
    await createVmi(client, dedicated("pinned", b.name));
    await waitForPhase(client, ns, "holder", "Running", BOOT_MS);
    await waitForPhase(client, ns, "pinned", "Running", BOOT_MS);
    const held = await vcpu0Pin(a, `${ns}_holder`);
    const from = await vcpu0Pin(b, `${ns}_pinned`);
    assert.equal(held, from, "each node's pool gives its first VMI the same first CPU");
    await createVmim(client, ns, "move-pinned", "pinned");
    const pinnedMove = await vmimEnds(client, ns, "move-pinned");
    assert.equal(
      pinnedMove.status?.phase,
      "Succeeded",
      JSON.stringify(pinnedMove.status?.migrationState),
    );
    const to = await vcpu0Pin(a, `${ns}_pinned`);
    assert.notEqual(to, held, "the moved VMI's CPU is not the holder's");
    const pinnedVmi = await getVmi(client, ns, "pinned");
    assert.equal(pinnedVmi?.status?.nodeName, a.name);
    assert.deepEqual(pinnedVmi?.status?.migrationState?.targetCPUSet, [to]);
    await waitFor(
      "the moved VMI's domain on node b to go",
      async () => !(await domainsOf(b)).includes(`${ns}_pinned`),
      60_000,
      500,
    );
    console.log(`  dedicated CPU: ${from} on node b -> ${to} on node a (the holder's is ${held})`);
    for (const name of ["holder", "pinned"]) await deleteVmi(client, ns, name);
    for (const name of ["holder", "pinned"]) {
      await waitFor(`${name} to go`, async () => !(await getVmi(client, ns, name)), 90_000, 500);
    }

    // Deleting the VMI leaves nothing on either node, libvirt's log of its QEMU included,
    // rotated ones too (another guest's stays).
    const qemuLogs = join(b.libvirtd.logDir, "qemu");
    assert.ok(await Deno.stat(join(qemuLogs, `${ns}_mig.log`)), "libvirt logs the guest's QEMU");
    for (const rotated of [`${ns}_mig.log.1`, `${ns}_mig.log.2.gz`, `${ns}_other.log`]) {
      await Deno.writeTextFile(join(qemuLogs, rotated), "earlier\n");
    }
    await deleteVmi(client, ns, "mig");
    await waitFor("the VMI to go", async () => !(await getVmi(client, ns, "mig")), 90_000, 500);
    for (const node of hosts.nodes) {
      assert.deepEqual(await domainsOf(node), [], `no domain on ${node.name}`);
      assert.deepEqual(
        [...Deno.readDirSync(join(dir, node.name, "state", "ghost-records"))].map((e) => e.name),
        [],
        `no ghost record on ${node.name}`,
      );
    }
    assert.deepEqual(
      [...Deno.readDirSync(qemuLogs)].map((e) => e.name).filter((n) => n.startsWith(ns)),
      [`${ns}_other.log`],
      "the guest's QEMU logs are gone",
    );
  } catch (error) {
    // What each node's handler and launcher host said last: a stalled step shows there.
    for (const [name, h] of handlers) {
      const tail = async (file: string) =>
        (await Deno.readTextFile(file).catch(() => "")).split("\n").slice(-80).join("\n");
      console.error(`--- ${name}: handler log (tail)\n${await tail(h.logFile)}`);
      let hostLog = "";
      try {
        hostLog = hostLogOf(h.stateDir);
      } catch {
        // No launcher host started on this node.
      }
      if (hostLog) console.error(`--- ${name}: launcher host log (tail)\n${await tail(hostLog)}`);
    }
    throw error;
  } finally {
    for (const h of handlers.values()) {
      await h.kill();
      killLaunchers(h.stateDir);
    }
    await hosts?.stop();
    await cluster.stop();
    // VIRTNODE_TEST_KEEP=1 keeps the handlers' logs and state for a look.
    if (!Deno.env.get("VIRTNODE_TEST_KEEP")) {
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    } else console.log(`  kept ${dir}`);
  }
});

/** Sets the KubeVirt CR's `migrations.bandwidthPerMigration`, which pod-less migrations take. */
async function setMigrationBandwidth(kubeconfig: string, bandwidth: string): Promise<void> {
  const out = await new Deno.Command("kubectl", {
    args: [
      "--kubeconfig",
      kubeconfig,
      "patch",
      "kubevirt",
      "kubevirt",
      "-n",
      "kubevirt",
      "--type=merge",
      "-p",
      JSON.stringify({
        spec: { configuration: { migrations: { bandwidthPerMigration: bandwidth } } },
      }),
    ],
    stdout: "null",
    stderr: "piped",
  }).output();
  if (!out.success) throw new Error(new TextDecoder().decode(out.stderr));
}

/**
 * Pod-less mode's migration controller for a VMIM that KubeVirt's admission (running here)
 * let through because it came before the VMI said it cannot migrate: a VMIM for a VMI whose
 * `LiveMigratable` is False fails with admission's reason and an Event, and the VMI keeps
 * running where it is, untouched by any migration state. The handler runs with migration on
 * (server and client certificates) against libvirt's test driver.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import type { VirtualMachineInstanceMigration } from "../../mod/api/mod.ts";
import { useCluster } from "../../deploy/cluster/cluster.ts";
import {
  createVmi,
  deleteVmi,
  eventsFor,
  freePort,
  getVmi,
  type HandlerProcess,
  killLaunchers,
  kubeClient,
  startHandlerProcess,
  testVmi,
  waitFor,
  waitForPhase,
} from "../helpers/handler_process.ts";
import { makeCertificates, restServerArgs } from "../helpers/rest_client.ts";

Deno.test("pod-less migrations: a VMIM for a VMI that is not LiveMigratable fails; the VMI keeps running", async () => {
  // The failure carries admission's reason and an Event, and the VMI stays on its node.
  const cluster = await useCluster();
  const client = await kubeClient(cluster.kubeconfigPath);
  const dir = await Deno.makeTempDir({ prefix: "vn-refuse-" });
  let h: HandlerProcess | undefined;
  let ok = false;
  try {
    const id = crypto.randomUUID().slice(0, 8);
    const ns = `mig-refuse-${id}`;
    const node = `mig-refuse-node-${id}`;
    await client.request("POST", "/api/v1/namespaces", { metadata: { name: ns } });
    const certs = await makeCertificates(dir);
    const clientDir = join(dir, "client");
    await Deno.mkdir(clientDir);
    await Deno.writeTextFile(join(clientDir, "tls.crt"), certs.client.cert);
    await Deno.writeTextFile(join(clientDir, "tls.key"), certs.client.key);
    const path = `/apis/kubevirt.io/v1/namespaces/${ns}/virtualmachineinstancemigrations`;
    // A host-model CPU on a node that names no host model (no labeller) keeps the VMI from
    // migrating (CPUModeLiveMigratable). KubeVirt's admission refuses a VMIM once the VMI says
    // so; one made before the handler's first look gets through, as here: the VMI and its VMIM
    // exist before the handler starts.
    const vmi = testVmi("hostmodel", node, { namespace: ns });
    vmi.spec.domain.cpu = { ...vmi.spec.domain.cpu, model: "host-model" };
    await createVmi(client, vmi);
    await client.request("POST", path, {
      apiVersion: "kubevirt.io/v1",
      kind: "VirtualMachineInstanceMigration",
      metadata: { name: "move", namespace: ns },
      spec: { vmiName: "hostmodel" },
    });
    h = await startHandlerProcess({
      kubeconfig: cluster.handlerKubeconfigPath,
      nodeName: node,
      libvirtUri: "test:///default",
      dir,
      extraArgs: [
        ...restServerArgs(certs, freePort()),
        "--client-cert-dir",
        clientDir,
        "--migration-ip",
        "127.0.0.1",
        "--no-node-labeller",
      ],
    });
    const running = await waitForPhase(client, ns, "hostmodel", "Running");
    const live = running.status?.conditions?.find((c) => c.type === "LiveMigratable");
    assert.equal(live?.status, "False", JSON.stringify(running.status?.conditions));
    assert.equal(live?.reason, "CPUModeLiveMigratable");

    const failed = await waitFor(
      "the migration to fail",
      async () => {
        const m = await client.request<VirtualMachineInstanceMigration>("GET", `${path}/move`);
        return m.status?.phase === "Failed" && !(m.metadata.finalizers?.length) ? m : undefined;
      },
      30_000,
      250,
    );
    const reason = "Cannot migrate VMI, Reason: CPUModeLiveMigratable, " +
      `Message: the node "${node}" does not allow migration with host-model`;
    assert.equal(failed.status?.migrationState?.failureReason, reason);
    assert.equal(failed.status?.migrationState?.failed, true);
    assert.equal(failed.status?.migrationState?.targetNode, undefined, "no target was chosen");
    const events = await eventsFor(client, ns, "move");
    assert.ok(
      events.some((e) => e.reason === "FailedMigration" && e.message === reason),
      JSON.stringify(events),
    );

    // The VMI runs on where it was, with no migration state and no target label.
    const after = (await getVmi(client, ns, "hostmodel"))!;
    assert.equal(after.status?.phase, "Running");
    assert.equal(after.status?.nodeName, node);
    assert.equal(after.status?.migrationState, undefined);
    assert.equal(after.metadata.labels?.["kubevirt.io/migrationTargetNodeName"], undefined);

    await deleteVmi(client, ns, "hostmodel");
    ok = true;
  } finally {
    if (h) {
      if (!ok) console.error(`handler log:\n${(await Deno.readTextFile(h.logFile)).slice(-6000)}`);
      await h.kill("SIGTERM");
      killLaunchers(h.stateDir);
    }
    client.close();
    if (!Deno.env.get("KEEP_HANDLER_DIR")) {
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
    await cluster.stop();
  }
});

/**
 * The handler's TLS material follows its sources while it runs (pod-less, test driver):
 * a server certificate rotated on disk is what the REST server and the TLS health
 * endpoints present within seconds; a change of the `kubevirt-ca` ConfigMap's bundle
 * changes which client certificates get in, without a restart; and with `--health-tls`
 * alone (no REST server to share a watch with) a rotation is picked up too.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { useCluster } from "../../deploy/cluster/cluster.ts";
import {
  freePort,
  killLaunchers,
  kubeClient,
  startHandlerProcess,
  waitFor,
} from "../helpers/handler_process.ts";
import {
  makeCertificates,
  pemFingerprint,
  reissueServerCertificate,
  restRequest,
  servedFingerprint,
} from "../helpers/rest_client.ts";

/** The TLS files are looked at every 2 s; a loaded machine gets more. */
const RELOAD_MS = 20_000;

function healthPort(health: string): number {
  return Number(new URL(health).port);
}

Deno.test("REST and health TLS: rotated certificates and a changed kubevirt-ca take effect live", async () => {
  // A rotated server certificate is served on both ports; a changed kubevirt-ca ConfigMap changes
  // which clients get in; with --health-tls alone, the health port reloads its certificate too.
  const cluster = await useCluster();
  const client = await kubeClient(cluster.kubeconfigPath);
  const id = crypto.randomUUID().slice(0, 8);
  const ns = `resttls-${id}`;
  const node = `resttls-node-${id}`;
  await client.request("POST", "/api/v1/namespaces", { metadata: { name: ns } });
  const dir = await Deno.makeTempDir({ prefix: "vn-resttls-" });
  const certs = await makeCertificates(dir);
  const otherCa = await Deno.readTextFile(join(certs.dir, "other-ca.crt"));
  const cmPath = `/api/v1/namespaces/${ns}/configmaps`;
  await client.request("POST", cmPath, {
    metadata: { name: "kubevirt-ca" },
    data: { "ca-bundle": certs.ca },
  });
  const port = freePort();
  const rest = await startHandlerProcess({
    kubeconfig: cluster.handlerKubeconfigPath,
    nodeName: node,
    libvirtUri: "test:///default",
    dir,
    healthCa: certs.ca,
    extraArgs: [
      "--console-server-port",
      String(port),
      "--console-server-address",
      "127.0.0.1",
      "--server-cert-dir",
      certs.serverDir,
      "--ca-configmap",
      `${ns}/kubevirt-ca`,
      "--health-tls",
    ],
  });
  let healthOnly: Awaited<ReturnType<typeof startHandlerProcess>> | undefined;
  try {
    const unknown = `/v1/namespaces/${ns}/virtualmachineinstances/nothing/guestosinfo`;
    const asClient = { port, ca: certs.ca, client: certs.client };
    const asOther = { port, ca: certs.ca, client: certs.otherCa };
    await waitFor(
      "the REST server to let virt-api's certificate in",
      async () => (await restRequest(asClient, "GET", unknown)).status === 404,
    );
    const first = pemFingerprint(await Deno.readTextFile(join(certs.serverDir, "tls.crt")));
    assert.equal(await servedFingerprint(port, certs.client), first);
    assert.equal(await servedFingerprint(healthPort(rest.health)), first);
    assert.equal((await restRequest(asOther, "GET", unknown)).status, 0, "another CA's client");

    // Rotation on disk: both ports present the new certificate, and clients still get in.
    const next = pemFingerprint(await reissueServerCertificate(certs));
    assert.notEqual(next, first);
    await waitFor(
      "the new certificate on the REST and health ports",
      async () =>
        (await servedFingerprint(port, certs.client)) === next &&
        (await servedFingerprint(healthPort(rest.health))) === next,
      RELOAD_MS,
    );
    assert.equal((await restRequest(asClient, "GET", unknown)).status, 404);

    // The CA ConfigMap now trusts the other CA only: its client gets in, virt-api's is cut.
    const cm = await client.request<{ metadata: Record<string, unknown> }>(
      "GET",
      `${cmPath}/kubevirt-ca`,
    );
    await client.request("PUT", `${cmPath}/kubevirt-ca`, {
      metadata: cm.metadata,
      data: { "ca-bundle": otherCa },
    });
    await waitFor(
      "the other CA's client to get in",
      async () => (await restRequest(asOther, "GET", unknown)).status === 404,
      RELOAD_MS,
    );
    assert.equal((await restRequest(asClient, "GET", unknown)).status, 0, "the old CA's client");
    await rest.kill();
    killLaunchers(rest.stateDir);

    // --health-tls without a REST server: its own watch picks up a rotation.
    const healthDir = join(dir, "h"); // short: pod-less sockets go below it
    await Deno.mkdir(healthDir);
    healthOnly = await startHandlerProcess({
      kubeconfig: cluster.handlerKubeconfigPath,
      nodeName: `${node}-h`,
      libvirtUri: "test:///default",
      dir: healthDir,
      healthCa: certs.ca,
      extraArgs: ["--health-tls", "--server-cert-dir", certs.serverDir],
    });
    const health = healthPort(healthOnly.health);
    assert.equal(await servedFingerprint(health), next);
    const third = pemFingerprint(await reissueServerCertificate(certs));
    await waitFor(
      "the new certificate on the health port",
      async () => (await servedFingerprint(health)) === third,
      RELOAD_MS,
    );
  } finally {
    await rest.kill();
    killLaunchers(rest.stateDir);
    if (healthOnly) {
      await healthOnly.kill();
      killLaunchers(healthOnly.stateDir);
    }
    await client.request("DELETE", `/api/v1/namespaces/${ns}`).catch(() => {});
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    client.close();
    await cluster.stop();
  }
});

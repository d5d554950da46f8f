/**
 * The handler's REST server against a real apiserver, a pod-less handler process and
 * libvirt's test driver: mutual TLS refusals (no certificate, another CA's, an expired one,
 * another name's), KubeVirt's answers for unknown VMIs, wrong methods and bad WebSocket
 * upgrades, pause and unpause reaching the domain and the VMI's Paused condition, the guest
 * queries of a VMI without an agent, and a console socket replaced by a symlink out of the
 * VMI's directory that is never followed.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { useCluster } from "../../deploy/cluster/cluster.ts";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import {
  createVmi,
  deleteVmi,
  freePort,
  getVmi,
  killLaunchers,
  kubeClient,
  startHandlerProcess,
  testVmi,
  waitFor,
  waitForPhase,
} from "../helpers/handler_process.ts";
import {
  makeCertificates,
  openWebSocket,
  restRequest,
  restServerArgs,
  type RestTarget,
} from "../helpers/rest_client.ts";

function paused(vmi: VirtualMachineInstance | undefined): boolean {
  return (vmi?.status?.conditions ?? []).some((c) => c.type === "Paused" && c.status === "True");
}

function text(body: Uint8Array): string {
  return new TextDecoder().decode(body);
}

Deno.test("REST server (pod-less, test driver): mutual TLS, KubeVirt's errors, pause and console safety", async () => {
  // Every wrong client is refused; unknown VMIs, wrong methods and bad
  // upgrades get KubeVirt's answers; pause/unpause change the Paused
  // condition; a console symlink out of the VMI's directory is not followed.
  const cluster = await useCluster();
  const client = await kubeClient(cluster.kubeconfigPath);
  const id = crypto.randomUUID().slice(0, 8);
  const ns = `rest-${id}`;
  const node = `rest-node-${id}`;
  await client.request("POST", "/api/v1/namespaces", { metadata: { name: ns } });
  const dir = await Deno.makeTempDir({ prefix: "virtnode-rest-" });
  const certs = await makeCertificates(dir);
  const port = freePort();
  const h = await startHandlerProcess({
    kubeconfig: cluster.handlerKubeconfigPath,
    nodeName: node,
    libvirtUri: "test:///default",
    dir,
    extraArgs: restServerArgs(certs, port),
  });
  const outside = join(dir, "outside.sock");
  const listener = Deno.listen({ transport: "unix", path: outside });
  let outsideConnections = 0;
  (async () => {
    for await (const conn of listener) {
      outsideConnections++;
      conn.close();
    }
  })();
  try {
    const good: RestTarget = { port, ca: certs.ca, client: certs.client };
    const base = `/v1/namespaces/${ns}/virtualmachineinstances`;
    await waitFor("the REST server to listen", async () => {
      const r = await restRequest(good, "GET", `${base}/nothing/guestosinfo`);
      return r.status === 404;
    });

    await createVmi(client, testVmi("vm1", node, { namespace: ns }));
    const running = await waitForPhase(client, ns, "vm1", "Running");

    // Mutual TLS: every wrong client is cut before any answer.
    for (
      const [what, clientCert] of [
        ["no certificate", undefined],
        ["another CA's certificate", certs.otherCa],
        ["an expired certificate", certs.expired],
        ["another name's certificate", certs.wrongName],
      ] as const
    ) {
      const r = await restRequest(
        { port, ca: certs.ca, client: clientCert },
        "GET",
        `${base}/vm1/guestosinfo`,
      );
      assert.equal(r.status, 0, `${what}: got HTTP ${r.status} ${text(r.body)}`);
      const ws = await openWebSocket(
        { port, ca: certs.ca, client: clientCert },
        `${base}/vm1/console`,
      );
      assert.equal(ws.status, 0, `${what}: the console upgrade got ${ws.status}`);
      assert.equal(ws.received().length, 0);
    }

    // KubeVirt's answers.
    const unknown = await restRequest(good, "PUT", `${base}/nothing/pause`);
    assert.equal(unknown.status, 404);
    assert.match(text(unknown.body), new RegExp(`VMI ${ns}/nothing does not exist`));
    assert.equal((await restRequest(good, "GET", `${base}/vm1/pause`)).status, 405);
    assert.equal(
      (await restRequest(good, "GET", `/v1/namespaces/${ns}/pods/vm1/pause`)).status,
      404,
    );
    assert.equal((await restRequest(good, "GET", `${base}/vm1/console`)).status, 400);
    const noAgent = await restRequest(good, "GET", `${base}/vm1/guestosinfo`);
    assert.equal(noAgent.status, 409);
    assert.match(text(noAgent.body), /guest agent connected/);
    const noTimeout = await restRequest(good, "PUT", `${base}/vm1/freeze`, "{}");
    assert.equal(noTimeout.status, 400);
    assert.match(text(noTimeout.body), /Unfreeze timeout in freeze request is not set/);

    const noProtocol = await openWebSocket(good, `${base}/vm1/console`, []);
    assert.equal(noProtocol.status, 400);
    assert.match(noProtocol.refusal, /plain\.kubevirt\.io/);
    const unknownWs = await openWebSocket(good, `${base}/nothing/vnc`);
    assert.equal(unknownWs.status, 404);
    // The test driver makes no serial socket: a clear 400 naming it.
    const noSocket = await openWebSocket(good, `${base}/vm1/console`);
    assert.equal(noSocket.status, 400);
    assert.match(noSocket.refusal, /virt-serial0/);

    // A link planted where the serial socket goes, to a socket outside: not followed.
    const privateDir = join(h.runDir, "private", running.metadata.uid!);
    await Deno.mkdir(privateDir, { recursive: true });
    await Deno.symlink(outside, join(privateDir, "virt-serial0"));
    const planted = await openWebSocket(good, `${base}/vm1/console`);
    assert.equal(planted.status, 400);
    assert.match(planted.refusal, /virt-serial0/);
    assert.equal(outsideConnections, 0, "the handler connected through the symlink");

    // USB redirection: four ports, as QEMU listens on them for clientPassthrough; each
    // session takes the first free one and keeps it; a fifth is refused; a freed port is
    // taken again. A link in a port's place is not followed either.
    await Deno.symlink(outside, join(privateDir, "virt-usbredir-0"));
    const linkedPort = await openWebSocket(good, `${base}/vm1/usbredir`);
    assert.equal(linkedPort.status, 400);
    assert.match(linkedPort.refusal, /virt-usbredir-0/);
    assert.equal(outsideConnections, 0, "the handler connected through the symlink");
    await Deno.remove(join(privateDir, "virt-usbredir-0"));
    const accepted = [0, 0, 0, 0];
    const ports = accepted.map((_, slot) => {
      const port = Deno.listen({
        transport: "unix",
        path: join(privateDir, `virt-usbredir-${slot}`),
      });
      (async () => {
        for await (const conn of port) {
          accepted[slot]++;
          await conn.write(new TextEncoder().encode(`port ${slot}`));
        }
      })().catch(() => {});
      return port;
    });
    try {
      // Four at once: each gets a port of its own.
      const usb = await Promise.all(
        [0, 1, 2, 3].map(() => openWebSocket(good, `${base}/vm1/usbredir`)),
      );
      const got = await Promise.all(usb.map((s) => {
        assert.equal(s.status, 101, s.refusal);
        return s.waitFor((t) => /^port \d$/.test(t));
      }));
      assert.deepEqual([...got].sort(), ["port 0", "port 1", "port 2", "port 3"]);
      const fifth = await openWebSocket(good, `${base}/vm1/usbredir`);
      assert.equal(fifth.status, 503);
      assert.match(fifth.refusal, /All USB devices are in use/);
      await usb[got.indexOf("port 2")].close();
      const again = await waitFor("port 2 free again", async () => {
        const s = await openWebSocket(good, `${base}/vm1/usbredir`);
        return s.status === 101 ? s : undefined;
      });
      await again.waitFor((t) => t === "port 2");
      assert.deepEqual(accepted, [1, 1, 2, 1]);
      for (const s of [...usb, again]) await s.close();
    } finally {
      for (const port of ports) port.close();
    }

    // Pause and unpause reach the domain; the VMI's condition follows.
    const pause = await restRequest(good, "PUT", `${base}/vm1/pause`);
    assert.equal(pause.status, 202, text(pause.body));
    await waitFor("the Paused condition", async () => paused(await getVmi(client, ns, "vm1")));
    const unpause = await restRequest(good, "PUT", `${base}/vm1/unpause`);
    assert.equal(unpause.status, 202, text(unpause.body));
    await waitFor("the Paused condition to go", async () => {
      const vmi = await getVmi(client, ns, "vm1");
      return vmi?.status?.phase === "Running" && !paused(vmi);
    });

    // Freeze and unfreeze reach libvirt (the test driver freezes without an agent).
    const freeze = await restRequest(good, "PUT", `${base}/vm1/freeze`, `{"unfreezeTimeout":"5m"}`);
    assert.equal(freeze.status, 202, text(freeze.body));
    const unfreeze = await restRequest(good, "PUT", `${base}/vm1/unfreeze`);
    assert.equal(unfreeze.status, 202, text(unfreeze.body));

    await deleteVmi(client, ns, "vm1");
    await waitFor("vm1 to go", async () => !(await getVmi(client, ns, "vm1")));
    const gone = await restRequest(good, "PUT", `${base}/vm1/pause`);
    assert.equal(gone.status, 404);
  } catch (error) {
    console.error(await Deno.readTextFile(h.logFile).catch(() => ""));
    throw error;
  } finally {
    listener.close();
    await h.kill();
    killLaunchers(h.stateDir);
    await client.request("DELETE", `/api/v1/namespaces/${ns}`).catch(() => {});
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    client.close();
    await cluster.stop();
  }
});

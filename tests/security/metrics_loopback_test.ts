/**
 * `/metrics` names every VMI of the node and asks for no credential, so by default the
 * handler serves it to loopback clients only (issue 34, Low); `--metrics-address` opens it
 * where a ServiceMonitor scrapes it, as KubeVirt's virt-handler serves it on port 8443. The
 * probes, `/healthz` and `/readyz`, answer every client, as the kubelet probes the pod IP.
 */
import assert from "node:assert/strict";
import { useCluster } from "../../deploy/cluster/cluster.ts";
import {
  type HandlerProcess,
  killLaunchers,
  startHandlerProcess,
} from "../helpers/handler_process.ts";

/** An IPv4 address of this host that is not loopback, and how to let go of it. */
async function nonLoopbackAddress(): Promise<{ address: string; release: () => Promise<void> }> {
  const found = Deno.networkInterfaces().find((i) =>
    i.family === "IPv4" && !i.address.startsWith("127.")
  );
  if (found) return { address: found.address, release: () => Promise.resolve() };
  // A host with loopback only: a dummy link with a documentation address of its own.
  const link = `vn-m${crypto.randomUUID().slice(0, 6)}`;
  const ip = (...args: string[]) => new Deno.Command("ip", { args }).output();
  await ip("link", "add", link, "type", "dummy");
  await ip("addr", "add", "198.51.100.34/32", "dev", link);
  await ip("link", "set", link, "up");
  return {
    address: "198.51.100.34",
    release: async () => void await ip("link", "del", link),
  };
}

/** The status and body of a GET. */
async function get(url: string): Promise<{ status: number; body: string }> {
  const response = await fetch(url, { signal: AbortSignal.timeout(15_000) });
  return { status: response.status, body: await response.text() };
}

Deno.test("/metrics answers only on 127.0.0.1 by default; --metrics-address opens it elsewhere", async () => {
  // With default flags the probes still answer on the host's other addresses; /metrics does not.
  const cluster = await useCluster();
  const host = await nonLoopbackAddress();
  const dir = await Deno.makeTempDir({ prefix: "vn-metrics-" }); // short: pod-less sockets
  await Deno.mkdir(`${dir}/a`);
  await Deno.mkdir(`${dir}/b`);
  const handlers: HandlerProcess[] = [];
  // On every address, as the default --health-address is.
  const start = async (name: string, openMetrics: boolean) => {
    const handler = await startHandlerProcess({
      kubeconfig: cluster.handlerKubeconfigPath,
      nodeName: `metrics-${name}-${crypto.randomUUID().slice(0, 6)}`,
      libvirtUri: "test:///default",
      dir: `${dir}/${name}`,
      healthHost: "0.0.0.0",
      openMetrics,
    });
    handlers.push(handler);
    return handler;
  };
  try {
    // No --metrics-address.
    const closed = await start("a", false);
    const port = new URL(closed.health).port;
    const outside = `http://${host.address}:${port}`;
    const inside = `http://127.0.0.1:${port}`;
    assert.equal((await get(`${outside}/healthz`)).status, 200, "the probe on the host address");
    assert.equal((await get(`${outside}/readyz`)).status, 200, "the readiness probe there");
    const refused = await get(`${outside}/metrics`);
    assert.equal(refused.status, 403, `/metrics on ${host.address}: ${refused.body}`);
    assert.doesNotMatch(refused.body, /kubevirt_/);
    const local = await get(`${inside}/metrics`);
    assert.equal(local.status, 200);
    assert.match(local.body, /^# HELP kubevirt_/m);

    // A ServiceMonitor's node: /metrics on the health address, for every client.
    const open = await start("b", true);
    const scraped = await get(`http://${host.address}:${new URL(open.health).port}/metrics`);
    assert.equal(scraped.status, 200);
    assert.match(scraped.body, /^# HELP kubevirt_/m);
  } finally {
    for (const h of handlers) {
      await h.kill();
      killLaunchers(h.stateDir);
    }
    await host.release();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    await cluster.stop();
  }
});

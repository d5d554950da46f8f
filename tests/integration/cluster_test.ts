import assert from "node:assert/strict";
import { startCluster } from "../../deploy/cluster/cluster.ts";

/** Runs kubectl against the kubeconfig and returns its exit code and output. */
async function kubectl(kubeconfigPath: string, ...args: string[]) {
  const output = await new Deno.Command("kubectl", {
    args: ["--kubeconfig", kubeconfigPath, ...args],
    stdin: "null",
  }).output();
  const decoder = new TextDecoder();
  return {
    code: output.code,
    stdout: decoder.decode(output.stdout),
    stderr: decoder.decode(output.stderr),
  };
}

/** Pids of processes whose command line mentions `text`. */
async function pidsMentioning(text: string): Promise<number[]> {
  const pids: number[] = [];
  for await (const entry of Deno.readDir("/proc")) {
    if (!/^\d+$/.test(entry.name) || Number(entry.name) === Deno.pid) continue;
    const cmdline = await Deno.readTextFile(`/proc/${entry.name}/cmdline`).catch(() => "");
    if (cmdline.includes(text)) pids.push(Number(entry.name));
  }
  return pids;
}

async function readyz(server: string, token: string, caCert: string): Promise<number> {
  const client = Deno.createHttpClient({ caCerts: [caCert] });
  try {
    const response = await fetch(`${server}/readyz`, {
      client,
      headers: { authorization: `Bearer ${token}` },
    });
    await response.body?.cancel();
    return response.status;
  } catch {
    return 0;
  } finally {
    client.close();
  }
}

Deno.test("startCluster() serves kubectl, survives an apiserver restart and stops its processes", async () => {
  const started = performance.now();
  const cluster = await startCluster({ crdDir: false });
  console.log(`cluster ready in ${((performance.now() - started) / 1000).toFixed(1)} s`);
  let stopped = false;
  try {
    assert.equal((await pidsMentioning(cluster.dir)).length, 2, "etcd and kube-apiserver run");

    const ns = await kubectl(cluster.kubeconfigPath, "get", "ns", "default", "-o", "name");
    assert.equal(ns.code, 0, ns.stderr);
    assert.equal(ns.stdout.trim(), "namespace/default");

    const caCert = await Deno.readTextFile(`${cluster.dir}/certs/apiserver.crt`);
    assert.equal(await readyz(cluster.server, cluster.token, caCert), 200);

    await cluster.stopApiserver();
    assert.equal(await readyz(cluster.server, cluster.token, caCert), 0, "apiserver is down");
    assert.equal((await pidsMentioning(cluster.dir)).length, 1, "etcd still runs");

    const restarted = performance.now();
    await cluster.startApiserver();
    console.log(
      `apiserver ready again in ${((performance.now() - restarted) / 1000).toFixed(1)} s`,
    );
    assert.equal(await readyz(cluster.server, cluster.token, caCert), 200);
    const again = await kubectl(cluster.kubeconfigPath, "get", "ns", "default", "-o", "name");
    assert.equal(again.code, 0, again.stderr);

    await cluster.stop();
    stopped = true;
    assert.deepEqual(await pidsMentioning(cluster.dir), [], "no process outlives stop()");
    await assert.rejects(Deno.stat(cluster.dir), Deno.errors.NotFound);
  } finally {
    if (!stopped) await cluster.stop();
  }
});

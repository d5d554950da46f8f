/**
 * The apiserver rate limit virt-handler keeps (client-go's token bucket, with the KubeVirt
 * CR's `handlerConfiguration.restClient.rateLimiter`): `burst` requests at once, then `qps`
 * a second, one token per request.
 */
import assert from "node:assert/strict";
import { loadKubeClient, TokenBucket, usableRateLimit } from "../../mod/kube/mod.ts";

Deno.test("TokenBucket: burst at once, then one token per 1/qps seconds, reserved in order", () => {
  let now = 0;
  const bucket = new TokenBucket({ qps: 10, burst: 3 }, () => now);
  assert.deepEqual([bucket.reserve(), bucket.reserve(), bucket.reserve()], [0, 0, 0]);
  // The fourth waits 100 ms, the fifth 200 ms: each reservation counts.
  assert.equal(Math.round(bucket.reserve()), 100);
  assert.equal(Math.round(bucket.reserve()), 200);
  // A second later the bucket has refilled to its burst, no further.
  now = 1_500;
  assert.deepEqual([bucket.reserve(), bucket.reserve(), bucket.reserve()], [0, 0, 0]);
  assert.equal(Math.round(bucket.reserve()), 100);
});

Deno.test("usableRateLimit(): a bucket needs a positive rate and a burst of at least one", () => {
  assert.equal(usableRateLimit({ qps: 50, burst: 100 }), true);
  assert.equal(usableRateLimit({ qps: 0, burst: 100 }), false);
  assert.equal(usableRateLimit({ qps: 5, burst: 0 }), false);
  assert.equal(usableRateLimit({ qps: Number.NaN, burst: 1 }), false);
});

Deno.test("KubeClient.setRateLimit(): requests past the burst wait for the rate; none is limited without one", async () => {
  let served = 0;
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, () => {
    served++;
    return Response.json({ kind: "Status" });
  });
  const dir = await Deno.makeTempDir({ prefix: "virtnode-rate-" });
  try {
    await Deno.writeTextFile(
      `${dir}/kubeconfig`,
      [
        "apiVersion: v1",
        "kind: Config",
        "current-context: ctx",
        "clusters: [{name: c1, cluster: {server: 'http://127.0.0.1:" + server.addr.port + "'}}]",
        "users: [{name: u1, user: {token: abc}}]",
        "contexts: [{name: ctx, context: {cluster: c1, user: u1}}]",
      ].join("\n"),
    );
    const client = await loadKubeClient({ kubeconfigPath: `${dir}/kubeconfig` });
    try {
      // A rate so low that the third request cannot get a token while the test waits.
      client.setRateLimit({ qps: 0.01, burst: 2 });
      assert.deepEqual(client.rateLimit, { qps: 0.01, burst: 2 });
      await client.request("GET", "/version");
      await client.request("GET", "/version");
      await assert.rejects(
        client.request("GET", "/version", undefined, { signal: AbortSignal.timeout(300) }),
      );
      assert.equal(served, 2, "the third request waited for its token and never went out");
      assert.throws(() => client.setRateLimit({ qps: 0, burst: 2 }), /both must be positive/);
      client.setRateLimit(undefined);
      for (let i = 0; i < 5; i++) await client.request("GET", "/version");
      assert.equal(served, 7);
    } finally {
      client.close();
    }
  } finally {
    await server.shutdown();
    await Deno.remove(dir, { recursive: true });
  }
});

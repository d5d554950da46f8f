/**
 * The informer's waits are jittered (issue 34, Low): a 410 Gone relists after a short
 * random delay rather than at once, and the restart backoff takes a random part of each
 * step, so a fleet of handlers whose watches an apiserver restart ended together does not
 * list again in lockstep. A small local HTTP server plays the apiserver.
 */
import assert from "node:assert/strict";
import { Informer, KubeClient } from "../../mod/kube/mod.ts";

const PATH = "/apis/kubevirt.io/v1/virtualmachineinstances";

/** An apiserver whose LISTs answer `listStatus` and whose WATCHes answer 410 Gone. */
function fakeApiserver(listStatus = 200) {
  const lists = new Map<string, number[]>();
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, (req) => {
    const url = new URL(req.url);
    const json = (status: number, body: unknown) =>
      new Response(JSON.stringify(body), {
        status,
        headers: { "Content-Type": "application/json" },
      });
    if (url.searchParams.get("watch")) {
      return json(410, {
        kind: "Status",
        apiVersion: "v1",
        status: "Failure",
        reason: "Expired",
        message: "too old resource version: 1 (2)",
        code: 410,
      });
    }
    const who = url.searchParams.get("labelSelector") ?? "";
    lists.set(who, [...(lists.get(who) ?? []), performance.now()]);
    if (listStatus !== 200) {
      return json(listStatus, {
        kind: "Status",
        apiVersion: "v1",
        status: "Failure",
        reason: "InternalError",
        message: "etcd is restarting",
        code: listStatus,
      });
    }
    return json(200, {
      kind: "List",
      apiVersion: "v1",
      items: [],
      metadata: { resourceVersion: "2" },
    });
  });
  const client = new KubeClient({
    server: `http://127.0.0.1:${server.addr.port}`,
    source: "informer backoff test",
  });
  return { server, client, lists };
}

/** The gaps between the LISTs of one informer, ms. */
function gaps(times: number[]): number[] {
  return times.slice(1).map((t, i) => t - times[i]);
}

/** Runs `informers` until each has listed `count` times (or 20 s pass); then stops them. */
async function runUntilListed(
  informers: Informer[],
  lists: Map<string, number[]>,
  count: number,
): Promise<void> {
  const stop = new AbortController();
  const running = informers.map((i) => i.run(stop.signal));
  const deadline = Date.now() + 20_000;
  while (
    Date.now() < deadline &&
    informers.some((_, n) => (lists.get(`fleet=${n}`)?.length ?? 0) < count)
  ) {
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  stop.abort();
  await Promise.all(running);
}

Deno.test("after a 410 Gone the informer relists after a short random delay, not at once", async () => {
  // The delay falls between a tenth of a second and one second.
  const api = fakeApiserver();
  const draws = [0, 0.5, 0.999];
  // The jitter's random source, given: the delays it makes are known.
  const backoff = { initialMs: 200, random: () => draws.shift() ?? 0 };
  const informer = new Informer(api.client, { path: PATH, labelSelector: "fleet=0", backoff });
  try {
    await runUntilListed([informer], api.lists, 4);
    const measured = gaps(api.lists.get("fleet=0")!).slice(0, 3);
    assert.equal(measured.length, 3, "the informer relisted after each 410");
    // Each gap is a WATCH answered 410 on loopback, plus the delay: 100, 550 and 999 ms.
    for (const [i, expected] of [100, 550, 999].entries()) {
      assert.ok(
        measured[i] >= expected - 5 && measured[i] < expected + 400,
        `relist ${i + 1} came ${
          Math.round(measured[i])
        } ms after the list before, not ~${expected} ms`,
      );
    }
  } finally {
    await api.server.shutdown();
  }
});

Deno.test("twenty informers whose watches all get a 410 at once relist spread over the jitter's second", async () => {
  const api = fakeApiserver();
  const informers = Array.from(
    { length: 20 },
    (_, n) => new Informer(api.client, { path: PATH, labelSelector: `fleet=${n}` }),
  );
  try {
    await runUntilListed(informers, api.lists, 2);
    const first = informers.map((_, n) => gaps(api.lists.get(`fleet=${n}`)!)[0]);
    const spread = Math.max(...first) - Math.min(...first);
    console.log(
      `first relist after 410: ${Math.round(Math.min(...first))} to ${
        Math.round(Math.max(...first))
      } ms`,
    );
    assert.ok(Math.min(...first) >= 95, `an informer relisted ${Math.min(...first)} ms after`);
    // Uniform over 900 ms: twenty draws within 400 ms of each other is a 1-in-200,000 event.
    assert.ok(spread >= 400, `the relists came within ${Math.round(spread)} ms of each other`);
  } finally {
    await api.server.shutdown();
  }
});

Deno.test("the informer's restart backoff waits a random part of each step, from half to all of it", async () => {
  // Every LIST fails: each failure waits, and the delay doubles (up to maxMs).
  const api = fakeApiserver(500);
  const draws = [0, 0.999, 0, 0.999];
  const backoff = { initialMs: 600, maxMs: 600, random: () => draws.shift() ?? 0 };
  const informer = new Informer(api.client, { path: PATH, labelSelector: "fleet=0", backoff });
  try {
    await runUntilListed([informer], api.lists, 5);
    const measured = gaps(api.lists.get("fleet=0")!).slice(0, 4);
    for (const [i, expected] of [300, 600, 300, 600].entries()) {
      assert.ok(
        measured[i] >= expected - 5 && measured[i] < expected + 200,
        `retry ${i + 1} came ${Math.round(measured[i])} ms after the failure, not ~${expected} ms`,
      );
    }
  } finally {
    await api.server.shutdown();
  }
});

/**
 * A handler under its everyday load for a while (10 minutes unless VIRTNODE_SOAK_MS says
 * otherwise; `VIRTNODE_SOAK_MS=7200000` is the 2-hour run): one pod-less handler with 20
 * Running VMIs under QEMU, its REST server on mutual TLS, the migration's client
 * certificate configured, its CA bundle from the `kubevirt-ca` ConfigMap. While it runs:
 *
 * - REST requests as virt-api makes them: the guest queries, a screenshot, pause and
 *   unpause, an unknown VMI, a client of another CA (cut);
 * - console and VNC WebSocket sessions opened and closed (some clients vanish without a
 *   close frame), and an unknown VMI's upgrade refused;
 * - `/metrics` scraped, with every VMI's domain statistics;
 * - the server and the migration client certificates re-issued every 2 minutes and
 *   renamed over the old files, as a rotated Secret's files change, so both file watchers
 *   reload.
 *
 * The handler runs with `--inspect` on loopback: each sample is its V8 heap's live bytes
 * after a full collection, and its RSS from /proc. After a settle period the least-squares
 * slopes of both (MB = 10^6 bytes) are printed, and the test fails when either is above
 * its bound: 1 MB/hour in a run of an hour or more. A 10-minute run's fit spans 8 minutes,
 * too short for 1 MB/hour (see {@linkcode SHORT_HEAP_LIMIT} and {@linkcode SHORT_RSS_LIMIT}
 * for its bounds and why); it still catches a leak like issue 34's H3 (a TLS watcher's
 * abort listener every 2 s: about 3.8 MB/hour of heap with the two watchers here). Each
 * kind of round runs once for every VMI before the clock starts, so what the handler keeps
 * per VMI is there before the fit. It also fails when an answer is not KubeVirt's, a VMI
 * is no longer Running, or a rotation is not picked up by both watchers.
 *
 * QEMU, not libvirt's test driver: a console session needs the VMI's serial and VNC
 * sockets, which only QEMU makes, and a handler speaks to one libvirt. Guests without a
 * disk wait in their firmware (the twenty took 13 % of a core under software emulation).
 *
 * Runs in the soak tier, beside the others: it mostly waits.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { useCluster } from "../../deploy/cluster/cluster.ts";
import { every, sleep } from "../../mod/lifecycle/mod.ts";
import { runText } from "../helpers/command.ts";
import {
  createVmi,
  deleteVmi,
  freePort,
  getVmi,
  killLaunchers,
  kubeClient,
  pidAlive,
  startHandlerProcess,
  testVmi,
  waitFor,
  waitForPhase,
} from "../helpers/handler_process.ts";
import { ensureLibvirtd } from "../helpers/libvirtd.ts";
import {
  issueClientCertificate,
  makeCertificates,
  openWebSocket,
  pemFingerprint,
  reissueServerCertificate,
  restRequest,
  type RestTarget,
  servedFingerprint,
  type TestCertificates,
} from "../helpers/rest_client.ts";
import {
  type HeapProbe,
  openHeapProbe,
  slopeMbPerHour,
  type TimedValue,
} from "../helpers/v8_heap.ts";

const SOAK_MS = Number(Deno.env.get("VIRTNODE_SOAK_MS") ?? 10 * 60_000);
/** A run this long is the soak the issue asks for; shorter ones are CI's. */
const LONG_RUN = SOAK_MS >= 60 * 60_000;
const SAMPLE_MS = Math.min(30_000, Math.max(5_000, SOAK_MS / 40));
/** Slopes are fitted from here on: start-up, first sessions and first reloads settle first. */
const SETTLE_MS = Math.min(10 * 60_000, SOAK_MS / 5);
/** The bound of both slopes in a run of an hour or more, MB/hour. */
const LIMIT = 1;
/**
 * The heap's bound in a shorter run, MB/hour. Code the handler compiles on first use
 * (lazily, by V8) and its bounded caches still fill during the first ten minutes: a heap
 * snapshot diff over minutes 3 to 15 of a 15-minute run showed 110 KB, most of it feedback
 * vectors and bytecode, and no type that grew in step with the rounds. Five 10-minute runs
 * with H3 fixed measured 0.36 to 0.94 MB/hour; two on c1d8a68, with H3, 3.82 and 3.99.
 */
const SHORT_HEAP_LIMIT = 2;
/**
 * RSS's bound in a shorter run, MB/hour: RSS moves in steps of whole allocator chunks
 * (about 0.1 MB now and then), which over an 8-minute fit read as up to 2 MB/hour: five
 * 10-minute runs with H3 fixed measured 0.26 to 1.72 MB/hour, two on c1d8a68 3.05 and
 * 3.92. A short run catches H3 by its heap; the long run by both.
 */
const SHORT_RSS_LIMIT = 4;
const COUNT = 20;
const ROTATE_MS = 2 * 60_000;
const REST_MS = 10_000;
const CONSOLE_MS = 10_000;
const METRICS_MS = 15_000;
const PAUSE_MS = 60_000;
/** Twenty guests starting at once under software emulation on a busy 2-core machine. */
const START_MS = 6 * 60_000;
/** The TLS files are looked at every 2 s; a loaded machine gets more. */
const RELOAD_MS = 30_000;

interface Sample {
  atMs: number;
  heap: number;
  rss: number;
}

function rssBytes(pid: number): number {
  const status = Deno.readTextFileSync(`/proc/${pid}/status`);
  return Number(/^VmRSS:\s+(\d+) kB/m.exec(status)?.[1] ?? NaN) * 1024;
}

function fdCount(pid: number): number {
  return [...Deno.readDirSync(`/proc/${pid}/fd`)].length;
}

function text(body: Uint8Array): string {
  return new TextDecoder().decode(body);
}

/**
 * Issues a new migration client certificate of the test CA and renames it and its key
 * over the ones in `clientDir`, as a rotated Secret's files change.
 */
async function reissueClientCertificate(certs: TestCertificates, clientDir: string) {
  const next = await issueClientCertificate(certs);
  await Deno.rename(next.key, join(clientDir, "tls.key"));
  await Deno.rename(next.cert, join(clientDir, "tls.crt"));
}

/**
 * Destroys and undefines the guests whose names start with `prefix` (a VMI's domain is
 * `<namespace>_<name>`): the last resort of the cleanup, when the handler could not.
 */
async function destroyGuests(uri: string, prefix: string): Promise<void> {
  const virsh = (...args: string[]) => runText("virsh", "-c", uri, ...args);
  const names = (await virsh("list", "--all", "--name").catch(() => "")).split("\n")
    .map((l) => l.trim()).filter((n) => n.startsWith(prefix));
  for (const name of names) {
    console.error(`  guest ${name} outlived its VMI: destroying it`);
    await virsh("destroy", name).catch(() => {});
    await virsh("undefine", name).catch(() => {});
  }
}

Deno.test("a handler with 20 VMIs under REST, console, scrape and rotation load keeps heap and RSS flat", async () => {
  // REST on mutual TLS; console sessions, metric scrapes and certificate rotations run throughout.
  const uri = await ensureLibvirtd();
  const cluster = await useCluster();
  const client = await kubeClient(cluster.kubeconfigPath);
  const id = crypto.randomUUID().slice(0, 8);
  const ns = `soakh-${id}`;
  const node = `soakh-node-${id}`;
  await client.request("POST", "/api/v1/namespaces", { metadata: { name: ns } });
  const dir = await Deno.makeTempDir({ prefix: "vn-soakh-" });
  const certs = await makeCertificates(dir);
  const clientDir = join(dir, "client-certs");
  await Deno.mkdir(clientDir);
  await Deno.writeTextFile(join(clientDir, "tls.crt"), certs.client.cert);
  await Deno.writeTextFile(join(clientDir, "tls.key"), certs.client.key);
  await client.request("POST", `/api/v1/namespaces/${ns}/configmaps`, {
    metadata: { name: "kubevirt-ca" },
    data: { "ca-bundle": certs.ca },
  });
  const port = freePort();
  const inspectPort = freePort();
  const h = await startHandlerProcess({
    kubeconfig: cluster.handlerKubeconfigPath,
    nodeName: node,
    libvirtUri: uri,
    dir,
    denoFlags: [`--inspect=127.0.0.1:${inspectPort}`],
    extraArgs: [
      "--console-server-port",
      String(port),
      "--console-server-address",
      "127.0.0.1",
      "--server-cert-dir",
      certs.serverDir,
      "--ca-configmap",
      `${ns}/kubevirt-ca`,
      "--client-cert-dir",
      clientDir,
      "--migration-ip",
      "127.0.0.1",
    ],
  });
  const pid = h.child.pid;
  let exited = false;
  h.child.status.then(() => (exited = true));
  const stop = new AbortController();
  const loops: Promise<void>[] = [];
  let probe: HeapProbe | undefined;
  let ok = false;
  try {
    probe = await openHeapProbe(inspectPort);
    const good: RestTarget = { port, ca: certs.ca, client: certs.client };
    const base = `/v1/namespaces/${ns}/virtualmachineinstances`;
    await waitFor(
      "the REST server to let virt-api's certificate in",
      async () => (await restRequest(good, "GET", `${base}/nothing/guestosinfo`)).status === 404,
      60_000,
      500,
    );
    const names = Array.from({ length: COUNT }, (_, i) => `vm${i}`);
    for (const name of names) await createVmi(client, testVmi(name, node, { namespace: ns }));
    for (const name of names) await waitForPhase(client, ns, name, "Running", START_MS);
    console.log(`  ${COUNT} VMIs Running`);

    /** Answers that were not what KubeVirt's handler gives; the first few are kept. */
    const wrong: string[] = [];
    let wrongCount = 0;
    const expect = (what: string, got: number, want: number, detail = "") => {
      if (got === want) return;
      wrongCount++;
      if (wrong.length < 10) wrong.push(`${what}: HTTP ${got}, expected ${want} ${detail}`);
    };
    const failed = (what: string) => (error: unknown) => {
      wrongCount++;
      if (wrong.length < 10) wrong.push(`${what}: ${(error as Error).message ?? error}`);
    };
    const counts = { rest: 0, sessions: 0, scrapes: 0, rotations: 0, pauses: 0 };
    const scraped = { fewest: Infinity, most: 0 };
    const routes = ["guestosinfo", "userlist", "filesystemlist", "vnc/screenshot"];
    /** Every VMI's `route`, an unknown VMI, a client of another CA. */
    const restRound = async (route: string) => {
      for (const name of names) {
        const r = await restRequest(good, "GET", `${base}/${name}/${route}`);
        // No guest agent in a guest without a disk: KubeVirt's 409 for the queries.
        const want = route === "vnc/screenshot" ? 200 : 409;
        expect(`GET ${name}/${route}`, r.status, want, r.error ?? text(r.body).slice(0, 200));
        counts.rest++;
      }
      const unknown = await restRequest(good, "GET", `${base}/nothing/userlist`);
      expect("GET nothing/userlist", unknown.status, 404);
      const refused = await restRequest(
        { port, ca: certs.ca, client: certs.otherCa },
        "GET",
        `${base}/vm0/guestosinfo`,
      );
      expect("another CA's client", refused.status, 0);
      counts.rest += 2;
    };
    /** A console and a VNC session of `name`, closed or cut; an unknown VMI's refused. */
    const sessionRound = async (name: string, vanish: boolean) => {
      const serial = await openWebSocket(good, `${base}/${name}/console`);
      expect(`console of ${name}`, serial.status, 101, serial.refusal);
      if (serial.status === 101) {
        serial.send("\r\n");
        if (vanish) serial.destroy();
        else await serial.close();
      }
      const vnc = await openWebSocket(good, `${base}/${name}/vnc`);
      expect(`VNC of ${name}`, vnc.status, 101, vnc.refusal);
      if (vnc.status === 101) {
        await vnc.waitFor((t) => t.startsWith("RFB "), 15_000);
        if (vanish) vnc.destroy();
        else await vnc.close();
      }
      const unknown = await openWebSocket(good, `${base}/nothing/console`);
      expect("console of nothing", unknown.status, 404, unknown.refusal);
      counts.sessions += 3;
    };
    /** Pauses `some`, and 5 s later unpauses them (also when the soak ends meanwhile). */
    const pauseRound = async (some: string[], signal?: AbortSignal) => {
      for (const name of some) {
        const r = await restRequest(good, "PUT", `${base}/${name}/pause`);
        expect(`pause ${name}`, r.status, 202, r.error ?? text(r.body));
      }
      await sleep(5_000, signal);
      for (const name of some) {
        const r = await restRequest(good, "PUT", `${base}/${name}/unpause`);
        expect(`unpause ${name}`, r.status, 202, r.error ?? text(r.body));
        counts.pauses++;
      }
    };
    const scrape = async () => {
      const r = await fetch(`${h.health}/metrics`);
      const body = await r.text();
      expect("GET /metrics", r.status, 200);
      // A VMI whose launcher is slow to answer is left out of a scrape, by design: the
      // fewest seen is printed, and the statistics path must have served all of them once.
      const vmis = new Set(
        [...body.matchAll(/^kubevirt_vmi_memory_resident_bytes\{(?:[^}]*,)?name="([^"]+)"/gm)]
          .map((m) => m[1]),
      );
      scraped.fewest = Math.min(scraped.fewest, vmis.size);
      scraped.most = Math.max(scraped.most, vmis.size);
      counts.scrapes++;
    };

    // Each route, session kind and pause once for every VMI before the clock starts: what
    // the handler keeps per VMI and per kind of request (its Event recorder's cache, the
    // client's metrics series) is then there already, and does not read as growth in the
    // first minutes of a short run, while the rounds below reach each VMI only in turn.
    for (const route of routes) await restRound(route);
    for (const name of names) await sessionRound(name, false);
    await sessionRound(names[0], true);
    await pauseRound(names);
    await waitFor(
      "every VMI to be Running and not Paused",
      async () => {
        for (const name of names) {
          const vmi = await getVmi(client, ns, name);
          const paused = (vmi?.status?.conditions ?? []).some((c) =>
            c.type === "Paused" && c.status === "True"
          );
          if (vmi?.status?.phase !== "Running" || paused) return false;
        }
        return true;
      },
      60_000,
      1_000,
    );
    await scrape();
    assert.equal(wrongCount, 0, `${wrongCount} unexpected answers:\n${wrong.join("\n")}`);
    console.log(`  warmed up; soaking handler ${pid} for ${SOAK_MS / 1000} s`);

    const signal = stop.signal;
    let restRounds = 0;
    loops.push(every(REST_MS, () => restRound(routes[restRounds++ % routes.length]), signal, {
      onError: failed("REST round"),
    }));
    let sessions = 0;
    loops.push(every(
      CONSOLE_MS,
      () => {
        const n = sessions++;
        return sessionRound(names[n % COUNT], n % 4 === 3);
      },
      signal,
      { onError: failed("console round") },
    ));
    loops.push(every(METRICS_MS, scrape, signal, { onError: failed("scrape") }));
    let pauses = 0;
    loops.push(every(PAUSE_MS, (s) => pauseRound([names[pauses++ % COUNT]], s), signal, {
      immediate: false,
      onError: failed("pause round"),
    }));
    loops.push(every(
      ROTATE_MS,
      async () => {
        const served = pemFingerprint(await reissueServerCertificate(certs));
        await reissueClientCertificate(certs, clientDir);
        counts.rotations++;
        await waitFor(
          "the rotated server certificate on the REST port",
          async () => (await servedFingerprint(port, certs.client)) === served,
          RELOAD_MS,
          500,
        );
      },
      signal,
      { onError: failed("rotation") },
    ));

    const samples: Sample[] = [];
    const fds: number[] = [];
    const started = performance.now();
    await every(SAMPLE_MS, async () => {
      if (performance.now() - started >= SOAK_MS) return stop.abort();
      if (exited) throw new Error(`The handler exited during the soak; log: ${h.logFile}`);
      const heap = await probe!.usedAfterGc();
      samples.push({ atMs: performance.now() - started, heap, rss: rssBytes(pid) });
      fds.push(fdCount(pid));
    }, signal);
    await Promise.all(loops);

    const settled = samples.filter((s) => s.atMs >= SETTLE_MS);
    assert.ok(settled.length >= 10, `${settled.length} samples after the settle period`);
    const series = (key: "heap" | "rss"): TimedValue[] =>
      settled.map((s) => ({ atMs: s.atMs, value: s[key] }));
    const heapSlope = slopeMbPerHour(series("heap"));
    const rssSlope = slopeMbPerHour(series("rss"));
    const mb = (b: number) => (b / 1e6).toFixed(1);
    const first = settled[0];
    const last = settled[settled.length - 1];
    console.log(
      `  ${settled.length} samples over ${((last.atMs - first.atMs) / 60_000).toFixed(1)} min ` +
        `after ${SETTLE_MS / 60_000} min: heap ${mb(first.heap)} -> ${mb(last.heap)} MB, ` +
        `slope ${heapSlope.toFixed(2)} MB/h; RSS ${mb(first.rss)} -> ${mb(last.rss)} MB, ` +
        `slope ${rssSlope.toFixed(2)} MB/h; descriptors ${fds[0]} -> ${fds[fds.length - 1]}`,
    );
    // The series themselves, to judge a slope by eye: MB, two decimals.
    console.log(`  heap MB: ${settled.map((s) => (s.heap / 1e6).toFixed(2)).join(" ")}`);
    console.log(`  RSS MB: ${settled.map((s) => (s.rss / 1e6).toFixed(2)).join(" ")}`);
    console.log(
      `  ${counts.rest} REST requests, ${counts.sessions} WebSocket upgrades, ` +
        `${counts.scrapes} scrapes (${scraped.fewest}-${scraped.most} VMIs' statistics), ` +
        `${counts.pauses} pause/unpause, ` +
        `${counts.rotations} certificate rotations`,
    );

    assert.ok(!exited && pidAlive(pid), "the handler is still running");
    assert.equal(wrongCount, 0, `${wrongCount} unexpected answers:\n${wrong.join("\n")}`);
    assert.equal(scraped.most, COUNT, "a scrape with every VMI's statistics");
    for (const name of names) {
      const vmi = await getVmi(client, ns, name);
      assert.equal(vmi?.status?.phase, "Running", `${name} is ${vmi?.status?.phase}`);
    }
    // Both watchers reloaded each rotation: the REST server's and the migration client's.
    // The last rotation's wait saw the REST server's reload only: the other watcher's poll
    // (every 2 s) may come a moment after the loops stopped.
    const reloadCount = async () =>
      (await Deno.readTextFile(h.logFile)).match(/TLS material changed on disk/g)?.length ?? 0;
    await waitFor(
      "both watchers to reload the last rotation",
      async () => await reloadCount() >= 2 * counts.rotations,
      10_000,
      500,
    ).catch(() => {});
    const reloads = await reloadCount();
    assert.ok(
      reloads >= 2 * counts.rotations,
      `${reloads} reloads for ${counts.rotations} rotations of two certificates`,
    );
    assert.ok(counts.rotations >= 2, `${counts.rotations} rotations`);

    const heapLimit = LONG_RUN ? LIMIT : SHORT_HEAP_LIMIT;
    const rssLimit = LONG_RUN ? LIMIT : SHORT_RSS_LIMIT;
    assert.ok(
      heapSlope <= heapLimit,
      `the heap grew by ${heapSlope.toFixed(2)} MB/hour (bound ${heapLimit})`,
    );
    assert.ok(
      rssSlope <= rssLimit,
      `the RSS grew by ${rssSlope.toFixed(2)} MB/hour (bound ${rssLimit})`,
    );
    ok = true;
  } finally {
    stop.abort();
    await Promise.allSettled(loops);
    probe?.close();
    if (!ok) console.error(`handler log:\n${(await Deno.readTextFile(h.logFile)).slice(-6000)}`);
    // The handler stops the guests of deleted VMIs; then it goes.
    const list = await client.request<{ items: { metadata: { name: string } }[] }>(
      "GET",
      `/apis/kubevirt.io/v1/namespaces/${ns}/virtualmachineinstances`,
    ).catch(() => ({ items: [] }));
    for (const v of list.items) await deleteVmi(client, ns, v.metadata.name).catch(() => {});
    await waitFor(
      "the VMIs to be gone",
      async () => {
        const left = await client.request<{ items: unknown[] }>(
          "GET",
          `/apis/kubevirt.io/v1/namespaces/${ns}/virtualmachineinstances`,
        );
        return left.items.length === 0;
      },
      120_000,
      500,
    ).catch((e) => console.error(e.message));
    await h.kill("SIGTERM");
    killLaunchers(h.stateDir); // the launcher host outlives its handler by design
    await destroyGuests(uri, `${ns}_`);
    await client.request("DELETE", `/api/v1/namespaces/${ns}`).catch(() => {});
    client.close();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    await cluster.stop();
  }
});

/**
 * A certificate rotation caught half-way cannot take the handler's TLS server down
 * (issue 34, Low): with the new certificate on disk beside the old key, the REST server
 * goes on presenting the old pair (a server handed a mismatched pair fails every
 * handshake after, and `Deno.serve`, which the health server restarts with, refuses one),
 * and takes the new pair once the key follows. A listener that throws on a change does
 * not end the watch either.
 */
import assert from "node:assert/strict";
import { createPrivateKey, X509Certificate } from "node:crypto";
import { join } from "node:path";
import { sleep } from "../../mod/lifecycle/mod.ts";
import { RestServer, type TlsContext, TlsMaterial } from "../../mod/rest/mod.ts";
import { TLS_POLL_MS } from "../../mod/rest/testing.ts";
import {
  issueServerCertificate,
  makeCertificates,
  pemFingerprint,
  restRequest,
  servedFingerprint,
  type TestCertificates,
} from "../helpers/rest_client.ts";

/** How often the watch looks here; the default when the option is not known. */
const POLL_MS = 50;
/** Long enough for several rounds of the watch at either period. */
const SEVERAL_ROUNDS_MS = 2.5 * Math.max(POLL_MS, TLS_POLL_MS);

function material(certs: TestCertificates): TlsMaterial {
  // pollMs: the watch looks every 2 s unless told.
  const options = {
    certFile: join(certs.serverDir, "tls.crt"),
    keyFile: join(certs.serverDir, "tls.key"),
    caFile: certs.caFile,
    pollMs: POLL_MS,
  };
  return new TlsMaterial(options);
}

/** Whether a context's key is its certificate's. */
function matches(context: TlsContext): boolean {
  return new X509Certificate(context.cert).checkPrivateKey(createPrivateKey(context.key));
}

async function waitUntil(what: string, done: () => Promise<boolean>, timeoutMs: number) {
  const deadline = Date.now() + timeoutMs;
  while (!(await done())) {
    if (Date.now() > deadline) throw new Error(`Timed out waiting for ${what}`);
    await sleep(50);
  }
}

Deno.test("the REST server keeps its old certificate until the key on disk matches the new one", async () => {
  // Once the pair on disk matches, the new certificate is taken.
  const dir = await Deno.makeTempDir({ prefix: "vn-tls-race-" });
  const stop = new AbortController();
  const running: Promise<void>[] = [];
  try {
    const certs = await makeCertificates(dir);
    const tls = material(certs);
    await tls.load();
    const handedOn: TlsContext[] = [];
    tls.onChange((context) => handedOn.push(context));
    const server = new RestServer({
      hostname: "127.0.0.1",
      port: 0,
      tls,
      backend: {
        vmi: () => undefined,
        launcher: () => Promise.reject(new Error("no launcher in this test")),
        openSocket: () => Promise.reject(new Error("no socket in this test")),
        record: () => {},
      },
    });
    running.push(server.run(stop.signal), tls.watch(stop.signal));
    await server.listening();
    const port = server.port;
    const asClient = { port, ca: certs.ca, client: certs.client };
    const unknown = "/v1/namespaces/default/virtualmachineinstances/nothing/guestosinfo";
    const old = pemFingerprint(await Deno.readTextFile(join(certs.serverDir, "tls.crt")));
    assert.equal(await servedFingerprint(port, certs.client), old);

    // Half a rotation: the certificate is new, the key still the old one.
    const next = await issueServerCertificate(certs, "next");
    const nextFingerprint = pemFingerprint(await Deno.readTextFile(next.cert));
    await Deno.rename(next.cert, join(certs.serverDir, "tls.crt"));
    await sleep(SEVERAL_ROUNDS_MS);
    assert.equal(
      await servedFingerprint(port, certs.client),
      old,
      "the old certificate is served while the key does not match the new one",
    );
    assert.equal((await restRequest(asClient, "GET", unknown)).status, 404);

    // The key follows: the new pair is served.
    await Deno.rename(next.key, join(certs.serverDir, "tls.key"));
    await waitUntil(
      "the new certificate to be served",
      async () => (await servedFingerprint(port, certs.client)) === nextFingerprint,
      SEVERAL_ROUNDS_MS * 2,
    );
    assert.equal((await restRequest(asClient, "GET", unknown)).status, 404);
    assert.ok(handedOn.length >= 1, "the new pair was handed on");
    assert.ok(
      handedOn.every(matches),
      "no listener was handed a key that is not its certificate's",
    );
  } finally {
    stop.abort();
    await Promise.allSettled(running);
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a TLS listener that throws does not end the watch: later rotations still reach the others", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vn-tls-throw-" });
  const stop = new AbortController();
  try {
    const certs = await makeCertificates(dir);
    const tls = material(certs);
    await tls.load();
    tls.onChange(() => {
      throw new Error("a server refused the new material");
    });
    const seen: string[] = [];
    tls.onChange((context) => seen.push(pemFingerprint(context.cert)));
    let ended = "";
    const watching = tls.watch(stop.signal).then(
      () => ended = "resolved",
      (error) => ended = `rejected: ${error}`,
    );
    for (const name of ["second", "third"]) {
      const pair = await issueServerCertificate(certs, name);
      const fingerprint = pemFingerprint(await Deno.readTextFile(pair.cert));
      await Deno.rename(pair.key, join(certs.serverDir, "tls.key"));
      await Deno.rename(pair.cert, join(certs.serverDir, "tls.crt"));
      const deadline = Date.now() + SEVERAL_ROUNDS_MS * 2;
      while (!seen.includes(fingerprint) && ended === "" && Date.now() < deadline) {
        await sleep(20);
      }
      assert.equal(ended, "", "the watch is still running");
      assert.ok(seen.includes(fingerprint), `the ${name} certificate reached the other listener`);
    }
    stop.abort();
    await watching;
    assert.equal(ended, "resolved");
  } finally {
    stop.abort();
    await Deno.remove(dir, { recursive: true });
  }
});

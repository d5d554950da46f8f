import assert from "node:assert/strict";
import {
  jsonLines,
  KubeConfigError,
  KubeConnectionError,
  loadKubeClient,
  objectKey,
  resourcePath,
  splitKey,
} from "../../mod/kube/mod.ts";

async function withTempDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "virtnode-kube-test-" });
  try {
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

const kubeconfig = (server: string, user: string) =>
  [
    "apiVersion: v1",
    "kind: Config",
    "current-context: ctx",
    "clusters:",
    "- name: c1",
    "  cluster:",
    `    server: ${server}`,
    "users:",
    "- name: u1",
    "  user:",
    ...user.split("\n").map((l) => `    ${l}`),
    "contexts:",
    "- name: ctx",
    "  context: {cluster: c1, user: u1}",
    "",
  ].join("\n");

Deno.test("loadKubeClient names the path of a missing kubeconfig", async () => {
  await assert.rejects(
    loadKubeClient({ kubeconfigPath: "/nonexistent/kubeconfig" }),
    (err: unknown) => {
      assert.ok(err instanceof KubeConfigError);
      assert.equal(err.path, "/nonexistent/kubeconfig");
      assert.match(
        err.message,
        /^Cannot load kubeconfig "\/nonexistent\/kubeconfig": no such file$/,
      );
      return true;
    },
  );
});

Deno.test("loadKubeClient rejects invalid YAML and unknown contexts with the path", async () => {
  await withTempDir(async (dir) => {
    const bad = `${dir}/bad`;
    await Deno.writeTextFile(bad, "clusters: [\n  - : :\n");
    await assert.rejects(loadKubeClient({ kubeconfigPath: bad }), (err: unknown) => {
      assert.ok(err instanceof KubeConfigError);
      assert.match(err.message, new RegExp(`^Cannot load kubeconfig "${bad}": not valid YAML`));
      return true;
    });
    const good = `${dir}/config`;
    await Deno.writeTextFile(good, kubeconfig("https://127.0.0.1:1", "token: abc"));
    await assert.rejects(
      loadKubeClient({ kubeconfigPath: good, context: "nope" }),
      /Cannot load kubeconfig ".*": context "nope" not found/,
    );
    const noServer = `${dir}/noserver`;
    await Deno.writeTextFile(noServer, kubeconfig("", "token: abc"));
    await assert.rejects(
      loadKubeClient({ kubeconfigPath: noServer }),
      /cluster "c1" has no server/,
    );
  });
});

Deno.test("loadKubeClient reads token, files relative to the kubeconfig, and JSON kubeconfigs", async () => {
  await withTempDir(async (dir) => {
    const path = `${dir}/config`;
    await Deno.writeTextFile(path, kubeconfig("https://example.invalid:6443/", "token: abc"));
    const client = await loadKubeClient({ kubeconfigPath: path });
    assert.equal(client.server, "https://example.invalid:6443");
    assert.equal(client.source, path);
    client.close();
    await Deno.writeTextFile(
      `${dir}/config.json`,
      JSON.stringify({
        "current-context": "x",
        clusters: [{ name: "c", cluster: { server: "http://127.0.0.1:9" } }],
        users: [{ name: "u", user: { tokenFile: "token" } }],
        contexts: [{ name: "x", context: { cluster: "c", user: "u" } }],
      }),
    );
    const missingCa = `${dir}/ca`;
    await Deno.writeTextFile(
      `${dir}/config-ca`,
      kubeconfig("https://127.0.0.1:1", "token: abc").replace(
        "    server:",
        `    certificate-authority: ca\n    server:`,
      ),
    );
    await assert.rejects(
      loadKubeClient({ kubeconfigPath: `${dir}/config-ca` }),
      new RegExp(`cannot read "${missingCa}"`),
    );
    const json = await loadKubeClient({ kubeconfigPath: `${dir}/config.json` });
    assert.equal(json.server, "http://127.0.0.1:9");
    await assert.rejects(json.request("GET", "/api"), /Cannot read token file ".*\/token"/);
    json.close();
  });
});

Deno.test("an unreachable apiserver gives a KubeConnectionError naming the server", async () => {
  await withTempDir(async (dir) => {
    const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const port = listener.addr.port;
    listener.close(); // nothing listens there now
    const path = `${dir}/config`;
    await Deno.writeTextFile(path, kubeconfig(`http://127.0.0.1:${port}`, "token: abc"));
    const client = await loadKubeClient({ kubeconfigPath: path });
    await assert.rejects(client.request("GET", "/api/v1/nodes"), (err: unknown) => {
      assert.ok(err instanceof KubeConnectionError);
      assert.equal(err.timedOut, false);
      assert.match(
        err.message,
        new RegExp(`^Cannot GET /api/v1/nodes: cannot reach apiserver "http://127.0.0.1:${port}"`),
      );
      return true;
    });
    client.close();
  });
});

Deno.test("a request that gets no answer in time fails with a timeout error", async () => {
  await withTempDir(async (dir) => {
    const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const conns: Deno.Conn[] = [];
    const accepting = (async () => {
      for await (const conn of listener) conns.push(conn); // accept, never answer
    })();
    const path = `${dir}/config`;
    await Deno.writeTextFile(
      path,
      kubeconfig(`http://127.0.0.1:${listener.addr.port}`, "token: abc"),
    );
    const client = await loadKubeClient({ kubeconfigPath: path });
    await assert.rejects(
      client.request("GET", "/api", undefined, { timeoutMs: 100 }),
      (err: unknown) => {
        assert.ok(err instanceof KubeConnectionError);
        assert.equal(err.timedOut, true);
        assert.match(err.message, /did not answer within 100 ms/);
        return true;
      },
    );
    client.close();
    listener.close();
    for (const c of conns) c.close();
    await accepting;
  });
});

Deno.test("jsonLines splits a chunked stream into lines", async () => {
  const enc = new TextEncoder();
  const chunks = ['{"a":', '1}\n{"b"', ":2}\n\n", '{"c":3}'];
  const stream = new ReadableStream<Uint8Array>({
    start(c) {
      for (const ch of chunks) c.enqueue(enc.encode(ch));
      c.close();
    },
  });
  const lines: string[] = [];
  for await (const line of jsonLines(stream)) lines.push(line);
  assert.deepEqual(lines, ['{"a":1}', '{"b":2}', '{"c":3}']);
});

Deno.test("objectKey, splitKey and resourcePath build KubeVirt's keys and paths", () => {
  assert.equal(objectKey({ metadata: { namespace: "ns", name: "vm" } }), "ns/vm");
  assert.equal(objectKey({ metadata: { name: "node1" } }), "node1");
  assert.deepEqual(splitKey("ns/vm"), { namespace: "ns", name: "vm" });
  assert.deepEqual(splitKey("node1"), { namespace: "", name: "node1" });
  assert.equal(
    resourcePath({
      group: "kubevirt.io",
      version: "v1",
      plural: "virtualmachineinstances",
      namespace: "ns",
      name: "vm",
      subresource: "status",
    }),
    "/apis/kubevirt.io/v1/namespaces/ns/virtualmachineinstances/vm/status",
  );
  assert.equal(resourcePath({ version: "v1", plural: "nodes", name: "n1" }), "/api/v1/nodes/n1");
});

/**
 * `/healthz` answers as virt-handler's does: JSON with the apiserver's connectivity and
 * version, and `config-resource-version`, the KubeVirt CR's resourceVersion the handler has
 * seen. KubeVirt's functional suite changes the CR and then waits, pod by pod, until each
 * handler's `config-resource-version` has caught up (tests/libkubevirt/config/kvconfig.go).
 */
import assert from "node:assert/strict";
import { waitFor, withHandler } from "../helpers/handler_process.ts";

interface Healthz {
  apiserver: { connectivity: string; version?: { gitVersion?: string } };
  "config-resource-version": string;
}

Deno.test("/healthz answers virt-handler's JSON and follows the KubeVirt CR's resourceVersion", async () => {
  await withHandler("healthz", async ({ h, client }) => {
    const healthz = async (): Promise<Healthz> => {
      const r = await fetch(`${h.health}/healthz`);
      assert.equal(r.status, 200);
      assert.match(r.headers.get("content-type") ?? "", /application\/json/);
      return await r.json();
    };
    type Kubevirt = { metadata: { name: string; namespace: string; resourceVersion: string } };
    const crs = await client.request<{ items: Kubevirt[] }>(
      "GET",
      "/apis/kubevirt.io/v1/kubevirts",
    );
    assert.equal(crs.items.length, 1, "the test cluster has one KubeVirt CR");
    const cr = crs.items[0];
    const first = await waitFor(
      "the CR's version in /healthz",
      async () => {
        const body = await healthz();
        return body["config-resource-version"] === cr.metadata.resourceVersion ? body : undefined;
      },
    );
    assert.equal(first.apiserver.connectivity, "ok");
    assert.match(first.apiserver.version?.gitVersion ?? "", /^v1\.\d+/);

    // A change of the CR, as the suite's config updates make: /healthz catches up.
    const changed = await client.request<Kubevirt>(
      "PATCH",
      `/apis/kubevirt.io/v1/namespaces/${cr.metadata.namespace}/kubevirts/${cr.metadata.name}`,
      { metadata: { annotations: { "virtnode.test/healthz": crypto.randomUUID() } } },
      { contentType: "application/merge-patch+json" },
    );
    assert.notEqual(changed.metadata.resourceVersion, cr.metadata.resourceVersion);
    await waitFor("the changed CR's version in /healthz", async () => {
      const body = await healthz();
      return body["config-resource-version"] === changed.metadata.resourceVersion || undefined;
    });
  });
});

Deno.test("/healthz asked with a double slash, as KubeVirt's suite asks it, is redirected as Go would", async () => {
  // KubeVirt's suite asks for `https://host:port//healthz`. The answer is the redirect
  // to /healthz that Go's ServeMux gives, and a client following it gets the JSON.
  await withHandler("healthz-slashes", async ({ h }) => {
    const raw = await fetch(`${h.health}//healthz`, { redirect: "manual" });
    assert.equal(raw.status, 301);
    assert.equal(raw.headers.get("location"), "/healthz");
    await raw.body?.cancel();
    const followed = await fetch(`${h.health}//healthz`);
    assert.equal(followed.status, 200);
    const body = await followed.json() as Healthz;
    assert.equal(typeof body["config-resource-version"], "string");
    const dots = await fetch(`${h.health}/metrics/../readyz`, { redirect: "manual" });
    // fetch resolves dot segments itself; the server sees /readyz.
    assert.notEqual(dots.status, 404);
    await dots.body?.cancel();
  });
});

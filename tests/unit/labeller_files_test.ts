/**
 * Under virt-operator the handler's node has no libvirt of its own: KubeVirt's
 * node-labeller init container writes libvirt's documents into
 * /var/lib/kubevirt-node-labeller (capabilities.xml, virsh_domcapabilities.xml,
 * supported_features.xml) and the handler labels the node from them.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { computeNodeLabels, readCapabilityFiles } from "../../mod/node/mod.ts";

const FIXTURES = fileURLToPath(new URL("../fixtures/labeller/", import.meta.url));

/** A folder laid out as KubeVirt's script leaves it, from the fixtures of `host`. */
async function labellerDir(host: string, withBaseline = true): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "virtnode-labeller-files-" });
  const files: Record<string, string> = {
    "capabilities.xml": `${host}.capabilities.xml`,
    "virsh_domcapabilities.xml": `${host}.domcapabilities.xml`,
    ...(withBaseline ? { "supported_features.xml": `${host}.baseline.xml` } : {}),
  };
  for (const [name, fixture] of Object.entries(files)) {
    await Deno.copyFile(join(FIXTURES, fixture), join(dir, name));
  }
  return dir;
}

Deno.test("the labeller's inputs from KubeVirt's node-labeller files give the labels libvirt's answers give", async () => {
  for (const host of ["intel-skylake-server", "amd-epyc-rome"]) {
    const dir = await labellerDir(host);
    try {
      const gathered = await readCapabilityFiles(dir);
      assert.ok(gathered, `${host}: no documents read`);
      const { labels } = computeNodeLabels(gathered.info);
      const golden = JSON.parse(await Deno.readTextFile(join(FIXTURES, `${host}.labels.json`)));
      assert.deepEqual(labels, golden, host);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  }
});

Deno.test("a folder without capabilities.xml is no source: the handler asks libvirt", async () => {
  const dir = await Deno.makeTempDir({ prefix: "virtnode-labeller-files-" });
  try {
    assert.equal(await readCapabilityFiles(dir), undefined);
    assert.equal(await readCapabilityFiles(join(dir, "missing")), undefined);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("without supported_features.xml the node gets no host-model feature labels, and no error", async () => {
  const dir = await labellerDir("intel-skylake-server", false);
  try {
    const gathered = await readCapabilityFiles(dir);
    assert.ok(gathered);
    assert.deepEqual(gathered.info.supportedFeatures, []);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

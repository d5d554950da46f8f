import assert from "node:assert/strict";
import { join } from "node:path";
import { readCpuManagerEnabled, rfc3339 } from "../../mod/node/mod.ts";

Deno.test("rfc3339() writes seconds precision in UTC, as metav1.Time does", () => {
  assert.equal(rfc3339(new Date("2026-01-02T03:04:05.678Z")), "2026-01-02T03:04:05Z");
});

Deno.test("readCpuManagerEnabled() is true only for the static policy", async () => {
  const dir = await Deno.makeTempDir({ prefix: "virtnode-cpum-" });
  try {
    const file = join(dir, "cpu_manager_state");
    const missing = join(dir, "missing");
    assert.equal(await readCpuManagerEnabled([missing]), false);
    await Deno.writeTextFile(file, '{"policyName":"static","defaultCpuSet":"0-7","checksum":1}');
    assert.equal(await readCpuManagerEnabled([missing, file]), true);
    await Deno.writeTextFile(file, '{"policyName":"none","defaultCpuSet":"","checksum":2}');
    assert.equal(await readCpuManagerEnabled([file]), false);
    await Deno.writeTextFile(file, "{not json");
    assert.equal(await readCpuManagerEnabled([file]), false);
    await Deno.writeTextFile(file, "null");
    assert.equal(await readCpuManagerEnabled([file]), false);
    // A directory where the file should be is unreadable, not fatal.
    assert.equal(await readCpuManagerEnabled([dir]), false);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

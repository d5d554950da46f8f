/**
 * The node labeller on libvirt's test driver, which has no domain capabilities: the read
 * still succeeds (no retry can fix a call the driver lacks), with no CPU model labels.
 */

import assert from "node:assert/strict";
import { LIBVIRT_ERROR_CODES, LibvirtError, openLibvirt } from "../../ffi/mod.ts";
import { computeNodeLabels, gatherNodeLabelInfo } from "../../mod/node/mod.ts";

Deno.test("the labeller reads libvirt's test driver: host capabilities only, no domain capabilities", async () => {
  const conn = await openLibvirt("test:///default", { events: false, workers: 1 });
  try {
    // What the driver itself says, so this test notices if a libvirt update adds the call.
    const refused = await conn.getDomainCapabilities({ virttype: "qemu" }).then(
      () => undefined,
      (error) => error,
    );
    assert.ok(refused instanceof LibvirtError, String(refused));
    assert.equal(refused.code, LIBVIRT_ERROR_CODES.VIR_ERR_NO_SUPPORT);

    const gathered = await gatherNodeLabelInfo(conn, { virttype: "qemu" });
    assert.equal(gathered.domainCapabilities, undefined);
    assert.equal(gathered.info.domain.hostModel, undefined);
    assert.deepEqual(gathered.info.domain.customModels, []);
    const { labels, invalid } = computeNodeLabels(gathered.info);
    assert.deepEqual(invalid, []);
    assert.deepEqual(Object.keys(labels).filter((k) => k.startsWith("cpu-model.")), []);
  } finally {
    await conn.close();
  }
});

Deno.test("the labeller still fails on a domain capabilities error other than 'not supported'", async () => {
  const conn = await openLibvirt("test:///default", { events: false, workers: 1 });
  try {
    const source = {
      getCapabilities: () => conn.getCapabilities(),
      getDomainCapabilities: () => Promise.reject(new Error("connection reset")),
      baselineHypervisorCPU: () => Promise.reject(new Error("not reached")),
    };
    await assert.rejects(gatherNodeLabelInfo(source, { virttype: "qemu" }), /connection reset/);
  } finally {
    await conn.close();
  }
});

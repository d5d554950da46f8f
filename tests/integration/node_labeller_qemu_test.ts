/**
 * The node labeller on this machine's real QEMU driver: capabilities, domain
 * capabilities and the host-model baseline read through ffi/ from a running libvirtd.
 */

import assert from "node:assert/strict";
import { openLibvirt } from "../../ffi/mod.ts";
import {
  computeNodeLabels,
  DEFAULT_OBSOLETE_CPU_MODELS,
  gatherNodeLabelInfo,
} from "../../mod/node/mod.ts";
import { ensureLibvirtd } from "../helpers/libvirtd.ts";

const uri = await ensureLibvirtd();

Deno.test("the labeller reads this host's QEMU driver through ffi", async () => {
  const conn = await openLibvirt(uri, { events: false, workers: 1 });
  try {
    for (const virttype of ["qemu", undefined]) {
      const started = performance.now();
      const gathered = await gatherNodeLabelInfo(conn, virttype ? { virttype } : {});
      const ms = performance.now() - started;
      const { labels, invalid, obsoleteHostModel } = computeNodeLabels(gathered.info);
      const keys = Object.keys(labels);
      const count = (prefix: string) => keys.filter((k) => k.startsWith(prefix)).length;
      console.log(
        `  virttype ${gathered.info.domain.domain}: ${keys.length} labels in ${ms.toFixed(0)} ms` +
          ` (host model ${gathered.info.domain.hostModel?.name},` +
          ` ${count("cpu-model.node.kubevirt.io/")} models,` +
          ` ${count("cpu-feature.node.kubevirt.io/")} features,` +
          ` ${count("machine-type.node.kubevirt.io/")} machine types)`,
      );
      assert.deepEqual(invalid, []);
      const hostModel = gathered.info.domain.hostModel;
      assert.ok(hostModel, "QEMU reports a host-model CPU");
      assert.equal(labels[`host-model-cpu.node.kubevirt.io/${hostModel.name}`], "true");
      assert.equal(
        labels["node-labeller.kubevirt.io/obsolete-host-model"],
        obsoleteHostModel ? "true" : undefined,
      );
      assert.ok(count("cpu-feature.node.kubevirt.io/") > 10, "baseline features");
      // Under TCG QEMU emulates modern models; a nested KVM may offer only obsolete ones.
      if (virttype === "qemu") assert.ok(count("cpu-model.node.kubevirt.io/") > 0, "models");
      assert.equal(labels["machine-type.node.kubevirt.io/q35"], "true");
      assert.equal(labels["machine-type.node.kubevirt.io/pc"], "true");
      for (const model of DEFAULT_OBSOLETE_CPU_MODELS) {
        assert.equal(labels[`cpu-model.node.kubevirt.io/${model}`], undefined, model);
      }
      if (gathered.info.host.tsc) {
        assert.match(labels["cpu-timer.node.kubevirt.io/tsc-frequency"], /^\d+$/);
        assert.match(labels["cpu-timer.node.kubevirt.io/tsc-scalable"], /^(true|false)$/);
      }
      // Every usable model of the domain capabilities is labelled, none that is unusable.
      for (const model of gathered.info.domain.customModels) {
        if (DEFAULT_OBSOLETE_CPU_MODELS.includes(model.name)) continue;
        assert.equal(
          labels[`cpu-model.node.kubevirt.io/${model.name}`],
          model.usable === "no" ? undefined : "true",
          model.name,
        );
      }
    }
  } finally {
    await conn.close();
  }
});

import assert from "node:assert/strict";
import {
  DEFAULT_BACKOFF_MS,
  deviceIds,
  PERMANENT_DEVICES,
  pluginSocketName,
  preferredAllocation,
} from "../../mod/node/mod.ts";

Deno.test("device IDs and socket names are KubeVirt's", () => {
  assert.deepEqual(deviceIds("kvm", 3), ["kvm0", "kvm1", "kvm2"]);
  assert.equal(deviceIds("vhost-net", 1000).at(-1), "vhost-net999");
  assert.equal(pluginSocketName("vhost-net"), "kubevirt-vhost-net.sock");
  assert.deepEqual(
    PERMANENT_DEVICES.map((d) => [d.resourceName, d.path]),
    [
      ["devices.kubevirt.io/kvm", "/dev/kvm"],
      ["devices.kubevirt.io/tun", "/dev/net/tun"],
      ["devices.kubevirt.io/vhost-net", "/dev/vhost-net"],
    ],
  );
  assert.deepEqual(DEFAULT_BACKOFF_MS, [1_000, 2_000, 5_000, 10_000]);
});

Deno.test("preferredAllocation() takes must-include IDs first, then available ones", () => {
  const response = preferredAllocation({
    container_requests: [
      { available_deviceIDs: ["a", "b", "c"], must_include_deviceIDs: ["c"], allocation_size: 2 },
      { available_deviceIDs: ["a", "b"], must_include_deviceIDs: [], allocation_size: 5 },
    ],
  });
  assert.deepEqual(response.container_responses, [
    { deviceIDs: ["c", "a"] },
    { deviceIDs: ["a", "b"] },
  ]);
});

/**
 * A migration target's checks before it plugs vCPUs and memory (mod/handler/target_hotplug.ts),
 * against KubeVirt v1.7.0's own numbers: `services.GetMemoryOverhead` and the pod sizes
 * virt-controller gives a VM's target pod, and virt-handler's messages.
 */
import assert from "node:assert/strict";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { parseKubevirtConfiguration } from "../../mod/config/mod.ts";
import {
  bindingPluginsMemory,
  cpuHotplugRefusal,
  launcherMemoryOverhead,
  memoryHotplugRefusal,
  vcpuCount,
} from "../../mod/handler/testing.ts";

const MI = 1024 ** 2;

function vmi(spec: Record<string, unknown>, labels: Record<string, string> = {}) {
  return {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachineInstance",
    metadata: { name: "v", namespace: "default", uid: "u", labels },
    spec: { domain: { devices: {}, ...spec } },
  } as unknown as VirtualMachineInstance;
}

Deno.test("vcpuCount(): KubeVirt's product of the fields set, a missing one not counted", () => {
  assert.equal(vcpuCount({ sockets: 2, cores: 1, threads: 1 }), 2);
  assert.equal(vcpuCount({ sockets: 2, cores: 3 }), 6);
  assert.equal(vcpuCount({ threads: 2 }), 2);
  assert.equal(vcpuCount({}), 0);
});

Deno.test("launcherMemoryOverhead(): KubeVirt's overhead for a 1Gi guest, term by term", () => {
  const base = vmi({
    cpu: { sockets: 1, cores: 1, threads: 1 },
    resources: { requests: { memory: "1Gi" } },
  });
  // Page tables: ceil(1073741824 / 1000) * 1000 / 512 = 2097152 bytes; 220Mi of processes;
  // 8Mi per vCPU; 8Mi for the IO thread; 32Mi of video memory.
  const expected = 2097152 + 220 * MI + 8 * MI + 8 * MI + 32 * MI;
  assert.equal(launcherMemoryOverhead(base), expected);
  const noGraphics = vmi({
    cpu: { sockets: 2, cores: 1, threads: 1 },
    resources: { requests: { memory: "1Gi" } },
    devices: { autoattachGraphicsDevice: false },
  });
  assert.equal(launcherMemoryOverhead(noGraphics), expected - 32 * MI + 8 * MI);
  const probed = vmi({
    cpu: { sockets: 1 },
    resources: { requests: { memory: "1Gi" } },
  });
  (probed.spec as Record<string, unknown>).readinessProbe = { exec: { command: ["true"] } };
  assert.equal(launcherMemoryOverhead(probed), expected + 110 * MI);
  const dedicated = vmi({
    cpu: { sockets: 1, dedicatedCpuPlacement: true },
    resources: { requests: { memory: "1Gi" } },
  });
  assert.equal(launcherMemoryOverhead(dedicated), expected + 100 * MI);
  // The overhead ratio multiplies the whole, counted in kilobytes.
  const doubled = launcherMemoryOverhead(base, "2");
  assert.equal(doubled, expected + Math.ceil(expected / 1000) * 1000);
});

Deno.test("cpuHotplugRefusal(): only dedicated CPUs are bounded, by the pod's CPU limit label", () => {
  assert.equal(cpuHotplugRefusal(vmi({ cpu: { sockets: 4 } })), undefined);
  const dedicated = (labels: Record<string, string>) =>
    vmi({ cpu: { sockets: 2, cores: 1, threads: 1, dedicatedCpuPlacement: true } }, labels);
  assert.equal(cpuHotplugRefusal(dedicated({})), "cannot read CPU limit from VMI annotation");
  assert.equal(
    cpuHotplugRefusal(dedicated({ "kubevirt.io/vmi-pod-cpu-resource-limits": "x" })),
    'cannot parse CPU limit from VMI annotation: strconv.Atoi: parsing "x": invalid syntax',
  );
  assert.equal(
    cpuHotplugRefusal(dedicated({ "kubevirt.io/vmi-pod-cpu-resource-limits": "1" })),
    "number of requested VCPUS (2) exceeds the limit (1)",
  );
  assert.equal(
    cpuHotplugRefusal(dedicated({ "kubevirt.io/vmi-pod-cpu-resource-limits": "2" })),
    undefined,
  );
});

Deno.test("memoryHotplugRefusal(): the target pod's memory request must hold the guest and overheads", () => {
  const spec = {
    cpu: { sockets: 1, cores: 1, threads: 1 },
    memory: { guest: "1152Mi", maxGuest: "2Gi" },
    resources: { requests: { memory: "1152Mi" } },
    devices: { interfaces: [{ name: "default", binding: { name: "passt" } }] },
  };
  const needed = launcherMemoryOverhead(vmi(spec)) + 1152 * MI;
  const sized = (bytes: number) =>
    vmi(spec, { "kubevirt.io/vmi-pod-memory-resource-requests": String(bytes) });
  assert.equal(memoryHotplugRefusal(sized(needed), {}), undefined);
  assert.equal(
    memoryHotplugRefusal(sized(needed - 1), {}),
    `amount of requested guest memory (1152Mi) exceeds the launcher memory request (${needed - 1})`,
  );
  // A binding plugin's sidecar counts once, from the cluster's configuration.
  assert.equal(bindingPluginsMemory(sized(needed), { passt: "250Mi" }), 250 * MI);
  assert.match(memoryHotplugRefusal(sized(needed), { passt: "250Mi" })!, /exceeds/);
  assert.equal(memoryHotplugRefusal(sized(needed + 250 * MI), { passt: "250Mi" }), undefined);
  assert.match(
    memoryHotplugRefusal(vmi(spec), {})!,
    /^cannot parse Memory requests from VMI label: quantities must match/,
  );
});

Deno.test("the KubeVirt CR's binding plugins give their memory overheads (U11)", () => {
  const config = parseKubevirtConfiguration({
    network: {
      binding: {
        passt: { sidecarImage: "x", computeResourceOverhead: { requests: { memory: "250Mi" } } },
        plain: { sidecarImage: "y" },
      },
    },
  }, { resourceVersion: "1", nodeName: "n" });
  assert.deepEqual(config.bindingMemoryOverheads, { passt: "250Mi" });
  assert.deepEqual(
    parseKubevirtConfiguration({}, { resourceVersion: "1", nodeName: "n" }).bindingMemoryOverheads,
    {},
  );
});

import assert from "node:assert/strict";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { InvalidFieldError, virtioMemDevice } from "../../mod/launcher/testing.ts";

function vmi(memory: Record<string, string>, atBoot?: string): VirtualMachineInstance {
  return {
    metadata: { name: "vm", namespace: "ns" },
    spec: { domain: { memory, devices: {} } },
    ...(atBoot ? { status: { memory: { guestAtBoot: atBoot } } } : {}),
  } as VirtualMachineInstance;
}

const MiB = 1024 * 1024;

Deno.test("virtioMemDevice(): maxGuest less the boot memory in size, the growth requested, 2 MiB blocks", () => {
  const device = virtioMemDevice(vmi({ guest: "1536Mi", maxGuest: "4Gi" }, "1Gi"));
  assert.deepEqual(
    [device.size, device.requested, device.block],
    [3072 * MiB, 512 * MiB, 2 * MiB],
  );
  assert.equal(
    device.xml,
    `<memory model='virtio-mem'>
  <target>
    <size unit='b'>3221225472</size>
    <node>0</node>
    <block unit='b'>2097152</block>
    <requested unit='b'>536870912</requested>
  </target>
</memory>
`,
  );
  // Back at the boot memory: nothing requested; 1Gi huge pages take 1 GiB blocks.
  assert.equal(virtioMemDevice(vmi({ guest: "1Gi", maxGuest: "4Gi" }, "1Gi")).requested, 0);
  const huge = vmi({ guest: "2Gi", maxGuest: "4Gi" }, "1Gi");
  huge.spec.domain.memory!.hugepages = { pageSize: "1Gi" };
  assert.equal(virtioMemDevice(huge).block, 1024 * MiB);
});

Deno.test("virtioMemDevice() refuses, naming the field: no boot memory, no room, below boot, odd sizes", () => {
  const refused = (v: VirtualMachineInstance, field: string) =>
    assert.throws(
      () => virtioMemDevice(v),
      (e: unknown) => e instanceof InvalidFieldError && e.message.includes(field),
    );
  refused(vmi({ guest: "2Gi", maxGuest: "4Gi" }), "status.memory.guestAtBoot");
  refused(vmi({ guest: "1Gi" }, "1Gi"), "spec.domain.memory.maxGuest");
  refused(vmi({ guest: "1Gi", maxGuest: "1Gi" }, "1Gi"), "spec.domain.memory.maxGuest");
  refused(vmi({ guest: "5Gi", maxGuest: "4Gi" }, "1Gi"), "spec.domain.memory.guest");
  refused(vmi({ guest: "512Mi", maxGuest: "4Gi" }, "1Gi"), "spec.domain.memory.guest");
  refused(vmi({ guest: "1025Mi", maxGuest: "4Gi" }, "1Gi"), "spec.domain.memory.guest");
});

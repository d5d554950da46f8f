import assert from "node:assert/strict";
import {
  decodeDomainJson,
  DomainJsonError,
  encodeDomainJson,
  LifeCycle,
  newDomain,
  StateChangeReason,
} from "../../mod/domain/mod.ts";
import type { Domain } from "../../mod/domain/mod.ts";

/** What KubeVirt's virt-launcher sends: Go field names, encoding/json style. */
const KUBEVIRT_DOMAIN_JSON = JSON.stringify({
  kind: "Domain",
  apiVersion: "1.2.2",
  ObjectMeta: {
    name: "vm1",
    namespace: "default",
    uid: "5a3c0e1e-4a55-4f6b-9d7a-1f1f0c1b2c3d",
    creationTimestamp: null,
  },
  Spec: {
    XMLName: { Space: "", Local: "domain" },
    Type: "kvm",
    Name: "default_vm1",
    UUID: "0d2a2043-41c0-59c3-9b17-025022203668",
    Memory: { Value: 134217728, Unit: "b" },
    CurrentMemory: { Value: 131072, Unit: "KiB" },
    OS: {
      Type: { OS: "hvm", Arch: "x86_64", Machine: "pc-q35-rhel9.6.0" },
      ACPI: null,
      BootOrder: null,
      Kernel: "",
    },
    Metadata: {
      KubeVirt: {
        UID: "5a3c0e1e-4a55-4f6b-9d7a-1f1f0c1b2c3d",
        GracePeriod: { DeletionGracePeriodSeconds: 30, DeletionTimestamp: null },
        AccessCredential: { Succeeded: true, Message: "" },
        MemoryDump: {
          FileName: "vm1-dump-20261206-193000.memory.dump",
          StartTimestamp: "2026-12-06T19:30:01Z",
          EndTimestamp: "2026-12-06T19:30:04Z",
          Completed: true,
        },
      },
    },
    Features: { ACPI: {}, APIC: null },
    Devices: {
      Interfaces: [{
        Type: "user",
        MAC: { MAC: "02:00:00:00:00:01" },
        Model: { Type: "virtio" },
        Alias: { Name: "default", UserDefined: true },
      }],
      Disks: [{
        Device: "disk",
        Type: "file",
        Source: { File: "/var/run/kubevirt-ephemeral-disks/disk-data/rootdisk/disk.qcow2" },
        Target: { Bus: "virtio", Device: "vda" },
        Alias: { Name: "rootdisk", UserDefined: true },
      }],
      HostDevices: [{
        XMLName: { Space: "", Local: "" },
        Source: {
          Address: { Type: "", Domain: "0x0000", Bus: "0x65", Slot: "0x00", Function: "0x1" },
        },
        Type: "pci",
        BootOrder: null,
        Managed: "no",
        Mode: "",
        Model: "",
        Address: null,
        Alias: { Name: "sriov-fast", UserDefined: true },
      }],
      Channels: [{
        Type: "unix",
        Source: null,
        Target: { Name: "org.qemu.guest_agent.0", Type: "virtio", Port: 0, State: "connected" },
      }],
    },
  },
  Status: {
    Status: "Paused",
    Reason: "IOError",
    Interfaces: null,
    OSInfo: {
      Name: "Fedora Linux",
      KernelRelease: "",
      Version: "",
      PrettyName: "",
      VersionId: "39",
      KernelVersion: "",
      Machine: "",
      Id: "fedora",
    },
    FSFreezeStatus: { Status: "" },
    GuestPanicInfo: null,
    PanicCount: 0,
  },
});

Deno.test("decodeDomainJson() reads the JSON KubeVirt's launcher sends", () => {
  const domain = decodeDomainJson(KUBEVIRT_DOMAIN_JSON);
  assert.equal(domain.metadata.name, "vm1");
  assert.equal(domain.metadata.namespace, "default");
  assert.equal(domain.spec.name, "default_vm1");
  assert.equal(domain.spec.type, "kvm");
  assert.equal(domain.spec.metadata.kubevirt.uid, "5a3c0e1e-4a55-4f6b-9d7a-1f1f0c1b2c3d");
  assert.equal(domain.spec.metadata.kubevirt.gracePeriod?.deletionGracePeriodSeconds, 30);
  // The launcher's verdict on the access credentials (virt-handler's condition reads it).
  assert.deepEqual(domain.spec.metadata.kubevirt.accessCredential, { succeeded: true });
  // The launcher's record of its last memory dump (virt-handler's volume status reads it).
  assert.deepEqual(domain.spec.metadata.kubevirt.memoryDump, {
    fileName: "vm1-dump-20261206-193000.memory.dump",
    startTimestamp: "2026-12-06T19:30:01Z",
    endTimestamp: "2026-12-06T19:30:04Z",
    completed: true,
    failed: false,
  });
  assert.deepEqual(domain.spec.features, { acpi: true });
  assert.deepEqual(domain.spec.devices.interfaces[0], {
    type: "user",
    mac: "02:00:00:00:00:01",
    model: "virtio",
    alias: { name: "default", userDefined: true },
  });
  // An SR-IOV interface's VF, as KubeVirt's launcher passes it through.
  assert.deepEqual(domain.spec.devices.hostDevices, [{
    type: "pci",
    alias: { name: "sriov-fast", userDefined: true },
  }]);
  assert.equal(domain.spec.devices.disks[0].target.dev, "vda");
  assert.deepEqual(domain.spec.os, { machine: "pc-q35-rhel9.6.0" });
  assert.deepEqual(domain.spec.memory, { value: 134217728, unit: "b" });
  assert.deepEqual(domain.spec.currentMemory, { value: 131072, unit: "KiB" });
  assert.deepEqual(domain.spec.devices.channels, [{
    type: "unix",
    target: { name: "org.qemu.guest_agent.0", type: "virtio", state: "connected" },
  }]);
  assert.equal(domain.status.status, LifeCycle.Paused);
  assert.equal(domain.status.reason, StateChangeReason.PausedIOError);
  assert.deepEqual(domain.status.osInfo, { name: "Fedora Linux", versionId: "39", id: "fedora" });
});

Deno.test("encodeDomainJson() writes KubeVirt's field names and decodes back to the same domain", () => {
  const domain: Domain = newDomain(
    { namespace: "ns1", name: "vm2", uid: "u-1" },
    { status: LifeCycle.Shutoff, reason: StateChangeReason.Destroyed },
  );
  domain.spec.features = { acpi: true };
  domain.spec.metadata.kubevirt.gracePeriod = {
    deletionGracePeriodSeconds: 10,
    deletionTimestamp: "2024-01-01T00:00:00Z",
    markedForGracefulShutdown: true,
  };
  domain.spec.metadata.kubevirt.accessCredential = { succeeded: false, message: "no agent" };
  domain.status.interfaces = [{ mac: "02:00:00:00:00:02", ip: "10.0.2.15", ips: ["10.0.2.15"] }];
  domain.spec.os = { machine: "pc-q35-9.2" };
  domain.spec.memory = { value: 2097152, unit: "KiB" };
  domain.spec.currentMemory = { value: 1048576, unit: "KiB" };
  domain.spec.devices.channels = [
    {
      type: "unix",
      target: { name: "org.qemu.guest_agent.0", type: "virtio", state: "connected" },
    },
    { type: "pty", target: { type: "virtio" } },
    { type: "unix" },
  ];
  domain.spec.devices.hostDevices = [
    { type: "pci", alias: { name: "sriov-red", userDefined: true } },
    { type: "pci" },
  ];
  const text = encodeDomainJson(domain);
  const wire = JSON.parse(text);
  assert.deepEqual(wire.Spec.Devices.HostDevices[0], {
    Type: "pci",
    Alias: { Name: "sriov-red", UserDefined: true },
  });
  assert.equal(wire.kind, "Domain");
  assert.equal(wire.ObjectMeta.name, "vm2");
  assert.equal(wire.Spec.Name, "ns1_vm2");
  assert.deepEqual(wire.Spec.Features, { ACPI: {} });
  assert.equal(wire.Spec.Metadata.KubeVirt.GracePeriod.DeletionGracePeriodSeconds, 10);
  assert.deepEqual(wire.Status.Status, "Shutoff");
  assert.deepEqual(wire.Status.Reason, "Destroyed");
  assert.deepEqual(wire.Spec.OS.Type.Machine, "pc-q35-9.2");
  assert.deepEqual(wire.Spec.Memory, { Value: 2097152, Unit: "KiB" });
  assert.deepEqual(wire.Spec.CurrentMemory, { Value: 1048576, Unit: "KiB" });
  assert.deepEqual(wire.Spec.Devices.Channels[0], {
    Type: "unix",
    Target: { Name: "org.qemu.guest_agent.0", Type: "virtio", State: "connected" },
  });
  assert.deepEqual(decodeDomainJson(text), domain);
});

Deno.test("encodeDomainJson() writes Go's zero memory and OS when unset, which decode back to absent", () => {
  const domain = newDomain(
    { namespace: "ns1", name: "vm3", uid: "u-3" },
    { status: LifeCycle.Running, reason: StateChangeReason.Unknown },
  );
  const text = encodeDomainJson(domain);
  const wire = JSON.parse(text);
  assert.deepEqual(wire.Spec.Memory, { Value: 0, Unit: "" });
  assert.equal(wire.Spec.CurrentMemory, null);
  assert.deepEqual(wire.Spec.OS, { Type: { Machine: "" } });
  assert.deepEqual(wire.Spec.Devices.Channels, []);
  const back = decodeDomainJson(text);
  assert.deepEqual(back, domain);
  assert.equal("memory" in back.spec, false);
  assert.equal("os" in back.spec, false);
});

Deno.test("decodeDomainJson() tolerates absent memory, OS and channels", () => {
  const domain = decodeDomainJson(
    JSON.stringify({
      ObjectMeta: { name: "a", namespace: "b" },
      Spec: { OS: {}, CurrentMemory: null, Devices: { Channels: null } },
    }),
  );
  assert.equal(domain.spec.os, undefined);
  assert.equal(domain.spec.memory, undefined);
  assert.equal(domain.spec.currentMemory, undefined);
  assert.deepEqual(domain.spec.devices.channels, []);
});

Deno.test("decodeDomainJson() rejects memory, OS and channels of the wrong type", () => {
  const rows: [unknown, RegExp][] = [
    [{ Memory: { Value: "2Gi", Unit: "b" } }, /"Spec.Memory.Value" is not a non-negative integer/],
    [{ Memory: { Value: -1 } }, /"Spec.Memory.Value" is not a non-negative integer/],
    [{ Memory: { Value: 1.5 } }, /"Spec.Memory.Value" is not a non-negative integer/],
    [{ CurrentMemory: { Value: 1, Unit: 3 } }, /"Spec.CurrentMemory.Unit" is not a string/],
    [{ CurrentMemory: 5 }, /"Spec.CurrentMemory" is not an object/],
    [{ OS: { Type: { Machine: 1 } } }, /"Spec.OS.Type.Machine" is not a string/],
    [{ OS: { Type: "hvm" } }, /"Spec.OS.Type" is not an object/],
    [{ Devices: { Channels: {} } }, /"Spec.Devices.Channels" is not an array/],
    [{ Devices: { Channels: ["unix"] } }, /"Spec.Devices.Channels\[0\]" is not an object/],
    [
      { Devices: { Channels: [{ Type: "unix", Target: { State: true } }] } },
      /"Spec.Devices.Channels\[0\].Target.State" is not a string/,
    ],
  ];
  for (const [spec, error] of rows) {
    assert.throws(
      () =>
        decodeDomainJson(JSON.stringify({ ObjectMeta: { name: "a", namespace: "b" }, Spec: spec })),
      error,
    );
  }
});

Deno.test("decodeDomainJson() rejects malformed JSON with a clear error", () => {
  assert.throws(() => decodeDomainJson("{"), DomainJsonError);
  assert.throws(() => decodeDomainJson("[]"), /Cannot decode domain JSON: not an object/);
  assert.throws(
    () => decodeDomainJson(JSON.stringify({ ObjectMeta: { name: "a" } })),
    /"ObjectMeta.name" and "ObjectMeta.namespace" are required/,
  );
  assert.throws(
    () =>
      decodeDomainJson(
        JSON.stringify({
          ObjectMeta: { name: "a", namespace: "b" },
          Status: { Status: "Dancing" },
        }),
      ),
    /"Status.Status" has unknown value "Dancing"/,
  );
  assert.throws(
    () =>
      decodeDomainJson(
        JSON.stringify({ ObjectMeta: { name: "a", namespace: "b" }, Spec: { Devices: 3 } }),
      ),
    /"Spec.Devices" is not an object/,
  );
  assert.throws(
    () =>
      decodeDomainJson(
        JSON.stringify({
          ObjectMeta: { name: "a", namespace: "b" },
          Status: { FSFreezeStatus: { Status: 1 } },
        }),
      ),
    /"Status.FSFreezeStatus.Status" is not a string/,
  );
});

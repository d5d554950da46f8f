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
    Metadata: {
      KubeVirt: {
        UID: "5a3c0e1e-4a55-4f6b-9d7a-1f1f0c1b2c3d",
        GracePeriod: { DeletionGracePeriodSeconds: 30, DeletionTimestamp: null },
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
  assert.deepEqual(domain.spec.features, { acpi: true });
  assert.deepEqual(domain.spec.devices.interfaces[0], {
    type: "user",
    mac: "02:00:00:00:00:01",
    model: "virtio",
    alias: { name: "default", userDefined: true },
  });
  assert.equal(domain.spec.devices.disks[0].target.dev, "vda");
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
  domain.status.interfaces = [{ mac: "02:00:00:00:00:02", ip: "10.0.2.15", ips: ["10.0.2.15"] }];
  const text = encodeDomainJson(domain);
  const wire = JSON.parse(text);
  assert.equal(wire.kind, "Domain");
  assert.equal(wire.ObjectMeta.name, "vm2");
  assert.equal(wire.Spec.Name, "ns1_vm2");
  assert.deepEqual(wire.Spec.Features, { ACPI: {} });
  assert.equal(wire.Spec.Metadata.KubeVirt.GracePeriod.DeletionGracePeriodSeconds, 10);
  assert.deepEqual(wire.Status.Status, "Shutoff");
  assert.deepEqual(wire.Status.Reason, "Destroyed");
  assert.deepEqual(decodeDomainJson(text), domain);
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
});

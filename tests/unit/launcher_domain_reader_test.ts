import assert from "node:assert/strict";
import { domainFromXml, parseXml } from "../../mod/launcher/testing.ts";
import { decodeDomainJson, encodeDomainJson } from "../../mod/domain/mod.ts";

const XML = `<?xml version="1.0"?>
<domain type='qemu' id='3'>
  <name>default_vm1</name>
  <uuid>0b5c9a4e-1111-2222-3333-444455556666</uuid>
  <metadata>
    <kubevirt:kubevirt xmlns:kubevirt="http://kubevirt.io">
      <kubevirt:uid>uid-1</kubevirt:uid>
      <kubevirt:graceperiod>
        <kubevirt:deletionGracePeriodSeconds>30</kubevirt:deletionGracePeriodSeconds>
      </kubevirt:graceperiod>
    </kubevirt:kubevirt>
  </metadata>
  <memory unit='KiB'>2097152</memory>
  <currentMemory unit='KiB'>1048576</currentMemory>
  <os>
    <type arch='x86_64' machine='pc-q35-9.2'>hvm</type>
  </os>
  <!-- a comment -->
  <features><acpi/></features>
  <devices>
    <disk type='file' device='disk'>
      <source file='/var/run/disks/a&amp;b.qcow2'/>
      <target dev='vda' bus='virtio'/>
      <alias name='ua-rootdisk'/>
    </disk>
    <interface type='user'>
      <mac address='52:54:00:12:34:56'/>
      <model type='virtio'/>
      <alias name='net0'/>
    </interface>
    <channel type='unix'>
      <source mode='bind' path='/var/lib/libvirt/qemu/channel/target/domain-3-default_vm1/org.qemu.guest_agent.0'/>
      <target type='virtio' name='org.qemu.guest_agent.0' state='connected'/>
      <alias name='channel0'/>
      <address type='virtio-serial' controller='0' bus='0' port='1'/>
    </channel>
    <channel type='pty'>
      <target type='virtio'/>
    </channel>
  </devices>
</domain>`;

Deno.test("parseXml() reads elements, attributes, entities and skips comments", () => {
  const root = parseXml(XML);
  assert.equal(root.name, "domain");
  assert.equal(root.attrs.type, "qemu");
  assert.equal(
    root.children.map((c) => c.name).join(","),
    "name,uuid,metadata,memory,currentMemory,os,features,devices",
  );
  assert.throws(() => parseXml("<domain><name></domain>"), /Cannot read domain XML/);
});

Deno.test("domainFromXml() reads what the handler needs and round-trips KubeVirt's JSON", () => {
  const domain = domainFromXml({ namespace: "default", name: "vm1" }, XML, {
    status: "Running",
    reason: "Unknown",
  });
  assert.equal(domain.spec.type, "qemu");
  assert.equal(domain.spec.name, "default_vm1");
  assert.equal(domain.spec.uuid, "0b5c9a4e-1111-2222-3333-444455556666");
  assert.equal(domain.spec.metadata.kubevirt.uid, "uid-1");
  assert.equal(domain.metadata.uid, "uid-1");
  assert.equal(domain.spec.metadata.kubevirt.gracePeriod?.deletionGracePeriodSeconds, 30);
  assert.deepEqual(domain.spec.features, { acpi: true });
  assert.equal(domain.spec.devices.disks[0].source.file, "/var/run/disks/a&b.qcow2");
  assert.deepEqual(domain.spec.devices.disks[0].alias, { name: "rootdisk", userDefined: true });
  assert.equal(domain.spec.devices.interfaces[0].mac, "52:54:00:12:34:56");
  assert.deepEqual(domain.spec.os, { machine: "pc-q35-9.2" });
  assert.deepEqual(domain.spec.memory, { value: 2097152, unit: "KiB" });
  assert.deepEqual(domain.spec.currentMemory, { value: 1048576, unit: "KiB" });
  assert.deepEqual(domain.spec.devices.channels, [
    {
      type: "unix",
      target: { type: "virtio", name: "org.qemu.guest_agent.0", state: "connected" },
    },
    { type: "pty", target: { type: "virtio" } },
  ]);
  const back = decodeDomainJson(encodeDomainJson(domain));
  assert.equal(back.status.status, "Running");
  assert.equal(back.spec.devices.disks[0].target.dev, "vda");
  assert.deepEqual(back.spec.os, domain.spec.os);
  assert.deepEqual(back.spec.memory, domain.spec.memory);
  assert.deepEqual(back.spec.currentMemory, domain.spec.currentMemory);
  assert.deepEqual(back.spec.devices.channels, domain.spec.devices.channels);
});

Deno.test("domainFromXml() takes libvirt's KiB for memory without a unit and leaves absent parts out", () => {
  const state = { status: "Shutoff", reason: "Unknown" } as const;
  const domain = domainFromXml(
    { namespace: "default", name: "vm1" },
    "<domain type='kvm'><name>default_vm1</name><memory>1024</memory><devices/></domain>",
    state,
  );
  assert.deepEqual(domain.spec.memory, { value: 1024, unit: "KiB" });
  assert.equal(domain.spec.currentMemory, undefined);
  assert.equal(domain.spec.os, undefined);
  assert.deepEqual(domain.spec.devices.channels, []);
  assert.throws(
    () =>
      domainFromXml(
        { namespace: "default", name: "vm1" },
        "<domain type='kvm'><memory unit='KiB'>lots</memory></domain>",
        state,
      ),
    /Cannot read domain XML: <memory> has value "lots"/,
  );
});

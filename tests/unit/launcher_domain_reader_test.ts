import assert from "node:assert/strict";
import { domainFromXml, parseXml } from "../../mod/launcher/domain_manager.ts";
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
  </devices>
</domain>`;

Deno.test("parseXml() reads elements, attributes, entities and skips comments", () => {
  const root = parseXml(XML);
  assert.equal(root.name, "domain");
  assert.equal(root.attrs.type, "qemu");
  assert.equal(root.children.map((c) => c.name).join(","), "name,uuid,metadata,features,devices");
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
  const back = decodeDomainJson(encodeDomainJson(domain));
  assert.equal(back.status.status, "Running");
  assert.equal(back.spec.devices.disks[0].target.dev, "vda");
});

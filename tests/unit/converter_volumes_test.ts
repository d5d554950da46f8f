import assert from "node:assert/strict";
import * as path from "node:path";
import {
  containerDiskFileName,
  convertVmiToDomainXml,
  domainClusterOptions,
  generateDomainXml,
  hotplugDiskXml,
  InvalidFieldError,
  UnsupportedFieldError,
  validateVmi,
  VolumePreparationError,
} from "../../mod/launcher/testing.ts";
import type { ConvertOptions } from "../../mod/launcher/testing.ts";
import { createWorkspace, virtXmlValidate } from "./converter_workspace.ts";
import type { Workspace } from "./converter_workspace.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

function vmiWith(volume: Json, disk: Json = {}): Json {
  return {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachineInstance",
    metadata: { name: "vm1", namespace: "default", uid: "u1" },
    spec: {
      domain: {
        memory: { guest: "64Mi" },
        devices: { disks: [{ name: volume.name, ...disk }] },
      },
      volumes: [volume],
    },
  };
}

async function withWorkspace(fn: (ws: Workspace, options: ConvertOptions) => Promise<void>) {
  const ws = await createWorkspace();
  try {
    await fn(ws, ws.options("default", "vm1", "u1"));
  } finally {
    await ws.dispose();
  }
}

async function exists(file: string): Promise<boolean> {
  return await Deno.lstat(file).then(() => true, () => false);
}

async function run(...command: string[]): Promise<string> {
  const output = await new Deno.Command(command[0], {
    args: command.slice(1),
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.ok(output.success, new TextDecoder().decode(output.stderr));
  return new TextDecoder().decode(output.stdout);
}

function assertFieldError(
  error: unknown,
  type: typeof InvalidFieldError | typeof UnsupportedFieldError | typeof VolumePreparationError,
  fieldPath: string,
): true {
  assert.ok(error instanceof type, `got ${error}`);
  assert.equal(error.path, fieldPath);
  assert.ok(error.message.includes(`"${fieldPath}"`), error.message);
  return true;
}

Deno.test("prepareVolumes() refuses a hostDisk path with ..", async () => {
  await withWorkspace(async (ws, options) => {
    const vmi = vmiWith({
      name: "data",
      hostDisk: {
        path: `${ws.hostDiskRoot}/default/../escape.img`,
        type: "DiskOrCreate",
        capacity: "1Mi",
      },
    });
    await assert.rejects(
      convertVmiToDomainXml(vmi, options),
      (error) => assertFieldError(error, InvalidFieldError, "spec.volumes[0].hostDisk.path"),
    );
    assert.equal(await exists(path.join(ws.root, "escape.img")), false);
  });
});

Deno.test("prepareVolumes() refuses a hostDisk path outside the root", async () => {
  await withWorkspace(async (_ws, options) => {
    const vmi = vmiWith({ name: "data", hostDisk: { path: "/etc/passwd", type: "Disk" } });
    await assert.rejects(
      convertVmiToDomainXml(vmi, options),
      (error) => assertFieldError(error, InvalidFieldError, "spec.volumes[0].hostDisk.path"),
    );
  });
});

Deno.test("prepareVolumes() refuses a hostDisk under a symlinked directory that leads out", async () => {
  await withWorkspace(async (ws, options) => {
    const outside = path.join(ws.root, "outside");
    await Deno.mkdir(outside);
    await Deno.symlink(outside, path.join(ws.hostDiskRoot, "default", "link"));
    const vmi = vmiWith({
      name: "data",
      hostDisk: {
        path: `${ws.hostDiskRoot}/default/link/new/disk.img`,
        type: "DiskOrCreate",
        capacity: "1Mi",
      },
    });
    await assert.rejects(
      convertVmiToDomainXml(vmi, options),
      (error) => {
        assertFieldError(error, InvalidFieldError, "spec.volumes[0].hostDisk.path");
        assert.match((error as Error).message, /outside/);
        return true;
      },
    );
    assert.deepEqual([...Deno.readDirSync(outside)], []);
  });
});

Deno.test("prepareVolumes() refuses a hostDisk file that is a symlink out of the root", async () => {
  await withWorkspace(async (ws, options) => {
    const target = path.join(ws.root, "secret.img");
    await Deno.writeTextFile(target, "secret");
    await Deno.symlink(target, path.join(ws.hostDiskRoot, "default", "disk.img"));
    const vmi = vmiWith({
      name: "data",
      hostDisk: { path: `${ws.hostDiskRoot}/default/disk.img`, type: "Disk" },
    });
    await assert.rejects(
      convertVmiToDomainXml(vmi, options),
      (error) => assertFieldError(error, InvalidFieldError, "spec.volumes[0].hostDisk.path"),
    );
  });
});

Deno.test("prepareVolumes() refuses a dangling hostDisk symlink", async () => {
  await withWorkspace(async (ws, options) => {
    await Deno.symlink(
      path.join(ws.root, "nowhere.img"),
      path.join(ws.hostDiskRoot, "default", "d.img"),
    );
    const vmi = vmiWith({
      name: "data",
      hostDisk: { path: `${ws.hostDiskRoot}/default/d.img`, type: "DiskOrCreate", capacity: "1Mi" },
    });
    await assert.rejects(
      convertVmiToDomainXml(vmi, options),
      (error) => assertFieldError(error, InvalidFieldError, "spec.volumes[0].hostDisk.path"),
    );
    assert.equal(await exists(path.join(ws.root, "nowhere.img")), false);
  });
});

Deno.test("prepareVolumes() refuses a hostDisk in another namespace's folder, named or via a symlink", async () => {
  // Both folders sit in one host disk root.
  await withWorkspace(async (ws, options) => {
    const other = path.join(ws.hostDiskRoot, "other");
    await Deno.mkdir(other);
    await Deno.writeTextFile(path.join(other, "disk.img"), "other tenant's data");
    await Deno.symlink(other, path.join(ws.hostDiskRoot, "default", "to-other"));
    for (const named of [`${other}/disk.img`, `${ws.hostDiskRoot}/default/to-other/disk.img`]) {
      await assert.rejects(
        convertVmiToDomainXml(
          vmiWith({ name: "data", hostDisk: { path: named, type: "Disk" } }),
          options,
        ),
        (error) => {
          assertFieldError(error, InvalidFieldError, "spec.volumes[0].hostDisk.path");
          assert.ok(
            (error as Error).message.includes(
              `must stay inside "${ws.hostDiskRoot}/default/", the host disk root of namespace "default"`,
            ),
            (error as Error).message,
          );
          return true;
        },
      );
    }
    // A DiskOrCreate makes the namespace's folder when it is missing.
    await Deno.remove(path.join(ws.hostDiskRoot, "default"), { recursive: true });
    const file = `${ws.hostDiskRoot}/default/new.img`;
    await convertVmiToDomainXml(
      vmiWith({ name: "data", hostDisk: { path: file, type: "DiskOrCreate", capacity: "1Mi" } }),
      options,
    );
    assert.ok(await exists(file));
  });
});

Deno.test("prepareVolumes() refuses a relative hostDisk path", async () => {
  await withWorkspace(async (_ws, options) => {
    const vmi = vmiWith({ name: "data", hostDisk: { path: "disk.img", type: "Disk" } });
    await assert.rejects(
      convertVmiToDomainXml(vmi, options),
      (error) => assertFieldError(error, InvalidFieldError, "spec.volumes[0].hostDisk.path"),
    );
  });
});

Deno.test("prepareVolumes() refuses a missing hostDisk of type Disk", async () => {
  await withWorkspace(async (ws, options) => {
    const vmi = vmiWith({
      name: "data",
      hostDisk: { path: `${ws.hostDiskRoot}/default/missing.img`, type: "Disk" },
    });
    await assert.rejects(
      convertVmiToDomainXml(vmi, options),
      (error) => assertFieldError(error, InvalidFieldError, "spec.volumes[0].hostDisk.path"),
    );
  });
});

Deno.test("prepareVolumes() needs a capacity to create a DiskOrCreate hostDisk", async () => {
  await withWorkspace(async (ws, options) => {
    const vmi = vmiWith({
      name: "data",
      hostDisk: { path: `${ws.hostDiskRoot}/default/new.img`, type: "DiskOrCreate" },
    });
    await assert.rejects(
      convertVmiToDomainXml(vmi, options),
      (error) => assertFieldError(error, InvalidFieldError, "spec.volumes[0].hostDisk.capacity"),
    );
  });
});

Deno.test("prepareVolumes() creates a DiskOrCreate hostDisk sparse with its capacity", async () => {
  await withWorkspace(async (ws, options) => {
    const file = `${ws.hostDiskRoot}/default/a/b/new.img`;
    const vmi = vmiWith({
      name: "data",
      hostDisk: { path: file, type: "DiskOrCreate", capacity: "64Mi" },
    });
    const result = await convertVmiToDomainXml(vmi, options);
    const info = await Deno.stat(file);
    assert.equal(info.size, 64 * 1024 * 1024);
    assert.ok((info.blocks ?? 0) * 512 < 1024 * 1024, "not sparse");
    assert.deepEqual(result.volumes.data, { path: file, format: "raw" });
    assert.deepEqual(result.created, [], "host disks are not ephemeral");
  });
});

Deno.test("prepareVolumes() takes a block device node under the root as a raw block disk", async () => {
  await withWorkspace(async (ws, options) => {
    // A node with a loop device's numbers: converting it never opens the device behind it.
    const node = `${ws.hostDiskRoot}/default/blk0`;
    await run("mknod", node, "b", "7", "200");
    const vmi = vmiWith(
      { name: "data", hostDisk: { path: node, type: "Disk" } },
      { disk: { bus: "scsi" } },
    );
    const result = await convertVmiToDomainXml(vmi, options);
    assert.deepEqual(result.volumes.data, { path: node, format: "raw", block: true });
    assert.match(result.xml, /<disk type='block' device='disk'>/);
    assert.match(result.xml, new RegExp(`<source dev='${node}'/>`));
    const validation = await virtXmlValidate(result.xml);
    assert.ok(validation.ok, validation.output);
  });
});

Deno.test("hotplugDiskXml() gives a hotplugged disk the first device name of its bus the domain has free", () => {
  const vmi = validateVmi(vmiWith({ name: "hp", hostDisk: { path: "/h/hp", type: "Disk" } }, {
    disk: { bus: "scsi" },
  }));
  const first = hotplugDiskXml(
    vmi,
    "hp",
    { path: "/h/hp/disk.img", format: "raw" },
    new Set(["vda"]),
  );
  assert.equal(first.dev, "sda");
  assert.match(first.xml, /^<disk type='file' device='disk'>/);
  assert.match(first.xml, /<target dev='sda' bus='scsi'\/>/);
  assert.match(first.xml, /<alias name='ua-hp'\/>/);
  const next = hotplugDiskXml(
    vmi,
    "hp",
    { path: "/dev/x", format: "raw", block: true },
    new Set(["sda", "sdb"]),
  );
  assert.equal(next.dev, "sdc");
  assert.match(next.xml, /<source dev='\/dev\/x'\/>/);
  assert.throws(
    () => hotplugDiskXml(vmi, "other", { path: "/x", format: "raw" }, new Set()),
    InvalidFieldError,
  );
});

Deno.test("generateDomainXml() adds the SCSI controller for hotplugged disks unless disableHotplug", () => {
  // KubeVirt adds the same controller for hotplugged disks to attach to.
  const volumes = { scratch: { path: "/d.qcow2", format: "qcow2" as const } };
  const vmi = validateVmi(vmiWith({ name: "scratch", emptyDisk: { capacity: "1Mi" } }));
  const controller = /<controller type='scsi' index='0' model='virtio-scsi'\/>/;
  assert.match(generateDomainXml(vmi, { domainType: "qemu", runDir: "/run", volumes }), controller);
  vmi.spec.domain.devices.disableHotplug = true;
  assert.doesNotMatch(
    generateDomainXml(vmi, { domainType: "qemu", runDir: "/run", volumes }),
    controller,
  );
  vmi.spec.domain.devices.disks![0].disk = { bus: "scsi" };
  assert.match(generateDomainXml(vmi, { domainType: "qemu", runDir: "/run", volumes }), controller);
});

Deno.test("prepareVolumes() refuses hostDisk without a configured root", async () => {
  await withWorkspace(async (ws, options) => {
    const vmi = vmiWith({
      name: "data",
      hostDisk: { path: `${ws.hostDiskRoot}/default/shared.img`, type: "Disk" },
    });
    await assert.rejects(
      convertVmiToDomainXml(vmi, { ...options, hostDiskRoot: undefined }),
      (error) => assertFieldError(error, UnsupportedFieldError, "spec.volumes[0].hostDisk"),
    );
  });
});

Deno.test("prepareVolumes() names the image when a containerDisk image is missing", async () => {
  await withWorkspace(async (_ws, options) => {
    const vmi = vmiWith({ name: "root", containerDisk: { image: "quay.io/nope:1" } });
    await assert.rejects(
      convertVmiToDomainXml(vmi, options),
      (error) => {
        assertFieldError(error, VolumePreparationError, "spec.volumes[0].containerDisk.image");
        assert.match((error as Error).message, /no image for "quay.io\/nope:1"/);
        return true;
      },
    );
  });
});

Deno.test("prepareVolumes() refuses a containerDisk path that leaves the image directory", async () => {
  await withWorkspace(async (_ws, options) => {
    const vmi = vmiWith({
      name: "root",
      containerDisk: { image: "example.com/bundle:1", path: "/../../hostdisks/shared.img" },
    });
    await assert.rejects(
      convertVmiToDomainXml(vmi, options),
      (error) => assertFieldError(error, InvalidFieldError, "spec.volumes[0].containerDisk.path"),
    );
  });
});

Deno.test("containerDiskFileName() maps an image reference to a safe file name", () => {
  assert.equal(
    containerDiskFileName("quay.io/containerdisks/fedora:39"),
    "quay.io_containerdisks_fedora_39",
  );
  assert.equal(containerDiskFileName("a/b@sha256:00ff"), "a_b_sha256_00ff");
});

Deno.test("prepareVolumes() makes a qcow2 overlay over the local image and keeps it on a second run", async () => {
  await withWorkspace(async (ws, options) => {
    const vmi = vmiWith({
      name: "root",
      containerDisk: { image: "registry.example.com/cirros:latest" },
    });
    const first = await convertVmiToDomainXml(vmi, options);
    const overlay = first.volumes.root.path;
    assert.deepEqual(first.created, [overlay]);
    const info = JSON.parse(await run("qemu-img", "info", "--output=json", overlay));
    assert.equal(info.format, "qcow2");
    assert.equal(
      info["backing-filename"],
      path.join(ws.imageDir, "registry.example.com_cirros_latest.img"),
    );
    assert.equal(info["backing-filename-format"], "raw");
    const before = await Deno.stat(overlay);
    const second = await convertVmiToDomainXml(vmi, options);
    assert.deepEqual(second.created, []);
    assert.equal((await Deno.stat(overlay)).mtime?.getTime(), before.mtime?.getTime());
    assert.equal(second.xml, first.xml);
  });
});

Deno.test("prepareVolumes() makes an emptyDisk as a sparse qcow2 of its capacity", async () => {
  await withWorkspace(async (_ws, options) => {
    const vmi = vmiWith({ name: "scratch", emptyDisk: { capacity: "3Gi" } });
    const result = await convertVmiToDomainXml(vmi, options);
    const info = JSON.parse(
      await run("qemu-img", "info", "--output=json", result.volumes.scratch.path),
    );
    assert.equal(info.format, "qcow2");
    assert.equal(info["virtual-size"], 3 * 1024 ** 3);
  });
});

Deno.test("prepareVolumes() writes a NoCloud ISO labelled cidata with meta-data, user-data and network-config", async () => {
  await withWorkspace(async (_ws, options) => {
    const vmi = vmiWith(
      {
        name: "cloudinit",
        cloudInitNoCloud: {
          userDataBase64: btoa("#cloud-config\nhostname: h\n"),
          networkData: "version: 2\n",
        },
      },
      { cdrom: {} },
    );
    const result = await convertVmiToDomainXml(vmi, options);
    const iso = result.volumes.cloudinit.path;
    assert.match(await run("isoinfo", "-d", "-i", iso), /Volume id: cidata/);
    const read = (file: string) => run("isoinfo", "-R", "-i", iso, "-x", file);
    assert.equal(await read("/user-data"), "#cloud-config\nhostname: h\n");
    assert.equal(await read("/network-config"), "version: 2\n");
    assert.deepEqual(JSON.parse(await read("/meta-data")), {
      "instance-id": "vm1.default",
      "local-hostname": "vm1",
    });
    assert.match(result.xml, /<disk type='file' device='cdrom'>/);
  });
});

Deno.test("prepareVolumes() writes a ConfigDrive ISO labelled config-2 in the openstack layout", async () => {
  await withWorkspace(async (_ws, options) => {
    const vmi = vmiWith({ name: "cd", cloudInitConfigDrive: { userData: "#cloud-config\n" } });
    const result = await convertVmiToDomainXml(vmi, options);
    const iso = result.volumes.cd.path;
    assert.match(await run("isoinfo", "-d", "-i", iso), /Volume id: config-2/);
    const read = (file: string) => run("isoinfo", "-R", "-i", iso, "-x", file);
    assert.equal(await read("/openstack/latest/user_data"), "#cloud-config\n");
    assert.equal(
      JSON.parse(await read("/openstack/latest/meta_data.json")).instance_id,
      "vm1.default",
    );
  });
});

Deno.test("prepareVolumes() refuses cloud-init without data and malformed base64", async () => {
  await withWorkspace(async (_ws, options) => {
    await assert.rejects(
      convertVmiToDomainXml(vmiWith({ name: "ci", cloudInitNoCloud: {} }), options),
      (error) => assertFieldError(error, InvalidFieldError, "spec.volumes[0].cloudInitNoCloud"),
    );
    await assert.rejects(
      convertVmiToDomainXml(
        vmiWith({ name: "ci", cloudInitNoCloud: { userDataBase64: "%%%" } }),
        options,
      ),
      (error) =>
        assertFieldError(
          error,
          InvalidFieldError,
          "spec.volumes[0].cloudInitNoCloud.userDataBase64",
        ),
    );
  });
});

Deno.test("prepareVolumes() names the EFI field when OVMF is not installed", async () => {
  await withWorkspace(async (ws, options) => {
    const vmi = vmiWith({ name: "scratch", emptyDisk: { capacity: "1Mi" } });
    vmi.spec.domain.firmware = { bootloader: { efi: { secureBoot: false } } };
    await assert.rejects(
      convertVmiToDomainXml(vmi, { ...options, ovmfDir: ws.root }),
      (error) => {
        assertFieldError(error, UnsupportedFieldError, "spec.domain.firmware.bootloader.efi");
        assert.match((error as Error).message, /OVMF_CODE_4M.fd" is not installed/);
        return true;
      },
    );
  });
});

Deno.test("convertVmiToDomainXml() creates nothing for a VMI that fails validation", async () => {
  await withWorkspace(async (_ws, options) => {
    const vmi = vmiWith({ name: "scratch", emptyDisk: { capacity: "1Mi" } });
    vmi.spec.domain.devices.gpus = [{ name: "gpu" }];
    await assert.rejects(convertVmiToDomainXml(vmi, options), UnsupportedFieldError);
    assert.equal(await exists(options.diskDir), false);
  });
});

Deno.test("generateDomainXml() escapes text and attributes", async () => {
  const vmi = validateVmi(vmiWith({ name: "scratch", emptyDisk: { capacity: "1Mi" } }));
  vmi.metadata.uid = `u<1>&"'`;
  vmi.spec.domain.firmware = { serial: `SN <&> "quoted" 'single'` };
  const xml = generateDomainXml(vmi, {
    domainType: "kvm",
    runDir: "/run/a'b&c",
    volumes: { scratch: { path: "/disks/it's & <odd>.qcow2", format: "qcow2" } },
  });
  assert.match(xml, /<uid>u&lt;1&gt;&amp;&quot;&apos;<\/uid>/);
  assert.match(
    xml,
    /<entry name='serial'>SN &lt;&amp;&gt; &quot;quoted&quot; &apos;single&apos;<\/entry>/,
  );
  assert.match(xml, /file='\/disks\/it&apos;s &amp; &lt;odd&gt;.qcow2'/);
  assert.match(xml, /path='\/run\/a&apos;b&amp;c\/virt-serial0'/);
  assert.match(xml, /^<domain type='kvm'>/);
  const validation = await virtXmlValidate(xml);
  assert.ok(validation.ok, validation.output);
});

Deno.test("generateDomainXml() refuses control characters libvirt cannot parse", () => {
  const vmi = validateVmi(vmiWith({ name: "scratch", emptyDisk: { capacity: "1Mi" } }));
  vmi.spec.domain.firmware = { serial: "a\u0001b" };
  assert.throws(
    () =>
      generateDomainXml(vmi, {
        domainType: "qemu",
        runDir: "/run",
        volumes: { scratch: { path: "/d.qcow2", format: "qcow2" } },
      }),
    /control character/,
  );
});

Deno.test("generateDomainXml() follows the cluster settings the handler sends, as KubeVirt's launcher does", async () => {
  // Covered: SMBIOS system entries, the balloon statistics period, and
  // free page reporting decided as KubeVirt's launcher decides it.
  const volumes = { scratch: { path: "/d.qcow2", format: "qcow2" as const } };
  const vmi = validateVmi(vmiWith({ name: "scratch", emptyDisk: { capacity: "1Mi" } }));
  const cluster = domainClusterOptions({
    VirtualMachineSMBios: { manufacturer: "KubeVirt", product: "None", family: "Lab" },
    MemBalloonStatsPeriod: 0,
    clusterConfig: { FreePageReportingDisabled: false },
  })!;
  const flat = (x: string) => x.replace(/>\s+</g, "><");
  const xml = generateDomainXml(vmi, { domainType: "qemu", runDir: "/run", volumes, cluster });
  assert.match(
    flat(xml),
    /<sysinfo type='smbios'><system><entry name='manufacturer'>KubeVirt<\/entry><entry name='family'>Lab<\/entry><entry name='product'>None<\/entry><entry name='sku'><\/entry><entry name='version'><\/entry><\/system><\/sysinfo>/,
  );
  assert.match(xml, /<smbios mode='sysinfo'\/>/);
  // Period 0: no statistics; reporting on unless the cluster or the VMI says otherwise.
  assert.match(flat(xml), /<memballoon model='virtio' freePageReporting='on'\/>/);
  const validated = await virtXmlValidate(xml);
  assert.ok(validated.ok, validated.output);

  const disabled = domainClusterOptions({
    MemBalloonStatsPeriod: 7,
    clusterConfig: { FreePageReportingDisabled: true },
  })!;
  assert.match(
    flat(
      generateDomainXml(vmi, { domainType: "qemu", runDir: "/run", volumes, cluster: disabled }),
    ),
    /<memballoon model='virtio' freePageReporting='off'><stats period='7'\/><\/memballoon>/,
  );
  // A high-performance VMI (dedicated CPUs) never reports free pages, as in KubeVirt.
  const dedicated = structuredClone(vmi);
  dedicated.spec.domain.cpu = { ...dedicated.spec.domain.cpu, dedicatedCpuPlacement: true };
  assert.match(
    generateDomainXml(dedicated, {
      domainType: "qemu",
      runDir: "/run",
      volumes,
      cluster,
      dedicatedCpus: [3],
    }),
    /freePageReporting='off'/,
  );
  // Without the handler's settings (a launcher called directly), as before: period 10.
  assert.match(
    flat(generateDomainXml(vmi, { domainType: "qemu", runDir: "/run", volumes })),
    /<memballoon model='virtio'><stats period='10'\/><\/memballoon>/,
  );
});

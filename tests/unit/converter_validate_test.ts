import assert from "node:assert/strict";
import {
  checkVmiSemantics,
  ConversionError,
  InvalidFieldError,
  UnsupportedFieldError,
  validateVmi,
} from "../../mod/launcher/testing.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

function baseVmi(): Json {
  return {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachineInstance",
    metadata: { name: "vm1", namespace: "default", uid: "u1" },
    spec: {
      domain: {
        memory: { guest: "128Mi" },
        devices: {
          disks: [{ name: "rootdisk", disk: { bus: "virtio" } }],
          interfaces: [{ name: "default", slirp: {} }],
        },
      },
      networks: [{ name: "default", pod: {} }],
      volumes: [{ name: "rootdisk", containerDisk: { image: "quay.io/containerdisks/fedora:39" } }],
    },
  };
}

function check(vmi: Json): void {
  checkVmiSemantics(validateVmi(vmi));
}

/** Each case: a change to a valid VMI and the JSON path the error must name. */
const UNSUPPORTED: [string, (vmi: Json) => void][] = [
  [
    "spec.domain.devices.gpus",
    (v) => v.spec.domain.devices.gpus = [{ name: "g", deviceName: "x" }],
  ],
  ["spec.domain.devices.hostDevices", (v) => v.spec.domain.devices.hostDevices = []],
  ["spec.domain.devices.filesystems", (v) => v.spec.domain.devices.filesystems = []],
  ["spec.domain.devices.inputs", (v) => v.spec.domain.devices.inputs = []],
  ["spec.domain.devices.autoattachVSOCK", (v) => v.spec.domain.devices.autoattachVSOCK = true],
  ["spec.domain.devices.tpm", (v) => v.spec.domain.devices.tpm = {}],
  ["spec.domain.devices.blockMultiQueue", (v) => v.spec.domain.devices.blockMultiQueue = true],
  [
    "spec.domain.devices.disks[0].lun",
    (v) => v.spec.domain.devices.disks[0] = { name: "rootdisk", lun: {} },
  ],
  ["spec.domain.devices.disks[0].io", (v) => v.spec.domain.devices.disks[0].io = "native"],
  ["spec.domain.devices.disks[0].disk.bus", (v) => v.spec.domain.devices.disks[0].disk.bus = "usb"],
  [
    "spec.domain.devices.disks[0].disk.pciAddress",
    (v) => v.spec.domain.devices.disks[0].disk.pciAddress = "0000:81:01.0",
  ],
  ["spec.domain.devices.disks[0].cache", (v) => v.spec.domain.devices.disks[0].cache = "unsafe"],
  [
    "spec.domain.devices.disks[0].cdrom.bus",
    (v) => v.spec.domain.devices.disks[0] = { name: "rootdisk", cdrom: { bus: "virtio" } },
  ],
  [
    "spec.domain.devices.interfaces[0].sriov",
    (v) => v.spec.domain.devices.interfaces[0] = { name: "default", sriov: {} },
  ],
  [
    "spec.domain.devices.interfaces[0].binding",
    (v) => v.spec.domain.devices.interfaces[0] = { name: "default", binding: { name: "passt" } },
  ],
  [
    "spec.domain.devices.interfaces[0].passt",
    (v) => v.spec.domain.devices.interfaces[0] = { name: "default", passt: {} },
  ],
  [
    "spec.domain.devices.interfaces[0].macvtap",
    (v) => v.spec.domain.devices.interfaces[0] = { name: "default", macvtap: {} },
  ],
  [
    "spec.domain.devices.interfaces[0].state",
    (v) => v.spec.domain.devices.interfaces[0].state = "down",
  ],
  [
    "spec.domain.devices.interfaces[0].model",
    (v) => v.spec.domain.devices.interfaces[0].model = "vmxnet3",
  ],
  [
    "spec.domain.devices.watchdog.diag288",
    (v) => v.spec.domain.devices.watchdog = { name: "w", i6300esb: {}, diag288: {} },
  ],
  [
    "spec.domain.cpu.numa.guestMappingPassthrough.cells",
    (v) => v.spec.domain.cpu = { numa: { guestMappingPassthrough: { cells: 2 } } },
  ],
  ["spec.domain.cpu.realtime.priority", (v) => v.spec.domain.cpu = { realtime: { priority: 2 } }],
  ["spec.domain.features.kvm", (v) => v.spec.domain.features = { kvm: { hidden: true } }],
  ["spec.domain.features.hyperv.evmcs", (v) => v.spec.domain.features = { hyperv: { evmcs: {} } }],
  ["spec.domain.firmware.kernelBoot", (v) => v.spec.domain.firmware = { kernelBoot: {} }],
  [
    "spec.domain.firmware.bootloader.efi.persistent",
    (v) => v.spec.domain.firmware = { bootloader: { efi: { persistent: true } } },
  ],
  ["spec.domain.launchSecurity", (v) => v.spec.domain.launchSecurity = {}],
  ["spec.domain.ioThreadsPolicy", (v) => v.spec.domain.ioThreadsPolicy = "auto"],
  [
    "spec.volumes[0].persistentVolumeClaim",
    (v) => v.spec.volumes[0] = { name: "rootdisk", persistentVolumeClaim: { claimName: "c" } },
  ],
  [
    "spec.volumes[0].dataVolume",
    (v) => v.spec.volumes[0] = { name: "rootdisk", dataVolume: { name: "d" } },
  ],
  [
    "spec.volumes[0].configMap",
    (v) => v.spec.volumes[0] = { name: "rootdisk", configMap: { name: "c" } },
  ],
  [
    "spec.volumes[0].containerDisk.imagePullSecret",
    (v) => v.spec.volumes[0].containerDisk.imagePullSecret = "s",
  ],
  [
    "spec.volumes[0].cloudInitNoCloud.secretRef",
    (v) => v.spec.volumes[0] = { name: "rootdisk", cloudInitNoCloud: { secretRef: { name: "s" } } },
  ],
  [
    "spec.volumes[0].hostDisk.shared",
    (v) =>
      v.spec.volumes[0] = {
        name: "rootdisk",
        hostDisk: { path: "/x", type: "Disk", shared: true },
      },
  ],
  // Probes run beside the domain (prober.ts); a handler kind KubeVirt's VMIs lack is refused.
  ["spec.readinessProbe.grpc", (v) => v.spec.readinessProbe = { grpc: { port: 22 } }],
  // Access credentials reach the guest through its agent only, not through cloud-init.
  [
    "spec.accessCredentials[0].sshPublicKey.propagationMethod.noCloud",
    (v) =>
      v.spec.accessCredentials = [{
        sshPublicKey: {
          source: { secret: { secretName: "k" } },
          propagationMethod: { noCloud: {} },
        },
      }],
  ],
  ["spec.architecture", (v) => v.spec.architecture = "arm64"],
  ["apiVersion", (v) => v.apiVersion = "kubevirt.io/v1alpha3"],
];

for (const [path, change] of UNSUPPORTED) {
  Deno.test(`validateVmi() refuses unsupported field "${path}"`, () => {
    const vmi = baseVmi();
    change(vmi);
    assert.throws(() => check(vmi), (error: unknown) => {
      assert.ok(error instanceof UnsupportedFieldError, `got ${error}`);
      assert.equal(error.path, path);
      const prefix = `Cannot convert VMI "default/vm1": unsupported field "${path}"`;
      assert.ok(error.message.startsWith(prefix), error.message);
      // Every refusal says why, not only what.
      assert.match(error.message.slice(prefix.length), /^: \S.{10,}/, error.message);
      return true;
    });
  });
}

Deno.test("validateVmi() accepts the base VMI and scheduling-only fields", () => {
  const vmi = baseVmi();
  vmi.spec.affinity = { nodeAffinity: {} };
  vmi.spec.tolerations = [{ key: "k", operator: "Exists" }];
  vmi.spec.evictionStrategy = "LiveMigrate";
  vmi.spec.domain.resources = { requests: { memory: "128Mi", "devices.kubevirt.io/kvm": "1" } };
  vmi.status = { phase: "Running", anything: { goes: true } };
  check(vmi);
});

Deno.test("validateVmi() takes bridge and masquerade on the pod network, with ports and KubeVirt's CIDRs", () => {
  for (const binding of ["bridge", "masquerade"]) {
    const vmi = baseVmi();
    vmi.spec.domain.devices.interfaces[0] = {
      name: "default",
      [binding]: {},
      ports: [{ name: "http", port: 80, protocol: "TCP" }],
    };
    vmi.spec.domain.devices.autoattachPodInterface = true;
    vmi.spec.networks[0] = { name: "default", pod: { vmNetworkCIDR: "10.11.0.0/24" } };
    check(vmi);
  }
});

Deno.test("validateVmi() says why SR-IOV and binding plugins are refused; a Multus bridge passes", () => {
  const secondary = baseVmi();
  secondary.spec.domain.devices.interfaces.push({ name: "red", bridge: {} });
  secondary.spec.networks.push({ name: "red", multus: { networkName: "other/red" } });
  check(secondary);
  const cases: [(v: Json) => void, RegExp][] = [
    [(v) => v.spec.domain.devices.interfaces[0] = { name: "default", sriov: {} }, /SR-IOV needs/],
    [
      (v) => v.spec.networks[0] = { name: "default", multus: {} },
      /networkName.*is required|is required.*networkName/,
    ],
    [
      (v) => v.spec.domain.devices.interfaces[0] = { name: "default", binding: { name: "x" } },
      /binding plugins are not supported/,
    ],
  ];
  for (const [change, message] of cases) {
    const vmi = baseVmi();
    change(vmi);
    assert.throws(() => check(vmi), message);
  }
});

/** Malformed input: each case and a pattern its message must match. */
const MALFORMED: [string, Json, RegExp][] = [
  ["null", null, /invalid field "\(root\)": expected an object, got null/],
  ["a string", "vm", /expected an object, got a string/],
  ["an array", [], /expected an object, got an array/],
  ["no spec", { metadata: { name: "vm1" } }, /invalid field "spec": is required/],
  [
    "no name",
    { metadata: {}, spec: { domain: { devices: {} } } },
    /"default\/<unnamed>": invalid field "metadata.name"/,
  ],
  [
    "a bad name",
    { metadata: { name: "VM_1" }, spec: { domain: { devices: {} } } },
    /metadata.name/,
  ],
];

for (const [what, vmi, pattern] of MALFORMED) {
  Deno.test(`validateVmi() refuses ${what} with a clear error`, () => {
    assert.throws(() => validateVmi(vmi), (error: unknown) => {
      assert.ok(error instanceof InvalidFieldError, `got ${error}`);
      assert.match(error.message, pattern);
      return true;
    });
  });
}

/** Semantically wrong VMIs: each change and the field the error must name. */
const INVALID: [string, string, (vmi: Json) => void][] = [
  ["a string for cores", "spec.domain.cpu.cores", (v) => v.spec.domain.cpu = { cores: "2" }],
  ["zero sockets", "spec.domain.cpu.sockets", (v) => v.spec.domain.cpu = { sockets: 0 }],
  ["a non-quantity memory", "spec.domain.memory.guest", (v) => v.spec.domain.memory.guest = "lots"],
  ["no memory at all", "spec.domain.memory.guest", (v) => delete v.spec.domain.memory],
  [
    "a disk without volume",
    "spec.domain.devices.disks[1].name",
    (v) => v.spec.domain.devices.disks.push({ name: "other" }),
  ],
  [
    "a volume without disk",
    "spec.volumes[1].name",
    (v) => v.spec.volumes.push({ name: "other", emptyDisk: { capacity: "1Gi" } }),
  ],
  [
    "a volume with two sources",
    "spec.volumes[0]",
    (v) => v.spec.volumes[0].emptyDisk = { capacity: "1Gi" },
  ],
  ["a volume without source", "spec.volumes[0]", (v) => v.spec.volumes[0] = { name: "rootdisk" }],
  [
    "duplicate disks",
    "spec.domain.devices.disks[1].name",
    (v) => v.spec.domain.devices.disks.push({ name: "rootdisk" }),
  ],
  [
    "disk and cdrom at once",
    "spec.domain.devices.disks[0]",
    (v) => v.spec.domain.devices.disks[0].cdrom = {},
  ],
  [
    "an interface without network",
    "spec.domain.devices.interfaces[0].name",
    (v) => v.spec.networks = [],
  ],
  [
    "a network without interface",
    "spec.networks[0].name",
    (v) => v.spec.networks = [{ name: "x", pod: {} }],
  ],
  [
    "two pod networks",
    "spec.networks[1].pod",
    (v) => v.spec.networks.push({ name: "x", pod: {} }),
  ],
  [
    "a port with a protocol other than TCP or UDP",
    "spec.domain.devices.interfaces[0].ports[0].protocol",
    (v) =>
      v.spec.domain.devices.interfaces[0] = {
        name: "default",
        masquerade: {},
        ports: [{ port: 80, protocol: "SCTP" }],
      },
  ],
  [
    "a port out of range",
    "spec.domain.devices.interfaces[0].ports[0].port",
    (v) =>
      v.spec.domain.devices.interfaces[0] = {
        name: "default",
        masquerade: {},
        ports: [{ port: 70000 }],
      },
  ],
  [
    "masquerade with the bridge's own MAC",
    "spec.domain.devices.interfaces[0].macAddress",
    (v) =>
      v.spec.domain.devices.interfaces[0] = {
        name: "default",
        masquerade: {},
        macAddress: "02:00:00:00:00:00",
      },
  ],
  [
    "a masquerade CIDR without room for the guest",
    "spec.networks[0].pod.vmNetworkCIDR",
    (v) => {
      v.spec.domain.devices.interfaces[0] = { name: "default", masquerade: {} };
      v.spec.networks[0] = { name: "default", pod: { vmNetworkCIDR: "10.0.2.0/31" } };
    },
  ],
  [
    "an interface without binding",
    "spec.domain.devices.interfaces[0]",
    (v) => v.spec.domain.devices.interfaces[0] = { name: "default" },
  ],
  [
    "a bad MAC",
    "spec.domain.devices.interfaces[0].macAddress",
    (v) => v.spec.domain.devices.interfaces[0].macAddress = "zz:00",
  ],
  [
    "a bad firmware UUID",
    "spec.domain.firmware.uuid",
    (v) => v.spec.domain.firmware = { uuid: "not-a-uuid" },
  ],
  [
    "secure boot without SMM",
    "spec.domain.features.smm",
    (v) => v.spec.domain.firmware = { bootloader: { efi: {} } },
  ],
  [
    "a boolean as string",
    "spec.domain.devices.autoattachSerialConsole",
    (v) => v.spec.domain.devices.autoattachSerialConsole = "false",
  ],
  [
    "a required watchdog type",
    "spec.domain.devices.watchdog.i6300esb",
    (v) => v.spec.domain.devices.watchdog = { name: "w" },
  ],
  ["a bad volume name", "spec.volumes[0].name", (v) => v.spec.volumes[0].name = "../etc"],
  [
    "a control character",
    "spec.domain.firmware.serial",
    (v) => v.spec.domain.firmware = { serial: "a\u0001" },
  ],
];

for (const [what, path, change] of INVALID) {
  Deno.test(`checkVmiSemantics() refuses ${what}, naming its field`, () => {
    // The error's path must be the field the case breaks, as the table gives it.
    const vmi = baseVmi();
    change(vmi);
    assert.throws(() => check(vmi), (error: unknown) => {
      assert.ok(error instanceof InvalidFieldError, `got ${error}`);
      assert.equal(error.path, path);
      assert.ok(error instanceof ConversionError);
      assert.match(error.message, /^Cannot convert VMI "default\/vm1": invalid field "/);
      return true;
    });
  });
}

Deno.test("checkVmiSemantics() refuses KVM-only fields for software-emulated guests", () => {
  const passthrough = baseVmi();
  passthrough.spec.domain.cpu = { model: "host-passthrough" };
  const hyperv = baseVmi();
  hyperv.spec.domain.features = { hyperv: { relaxed: {} } };
  for (
    const [vmi, path] of [[passthrough, "spec.domain.cpu.model"], [
      hyperv,
      "spec.domain.features.hyperv",
    ]]
  ) {
    checkVmiSemantics(validateVmi(vmi), { domainType: "kvm" });
    assert.throws(
      () => checkVmiSemantics(validateVmi(vmi), { domainType: "qemu" }),
      (error: unknown) => {
        assert.ok(error instanceof UnsupportedFieldError, `got ${error}`);
        assert.equal(error.path, path);
        assert.match(error.message, /needs? KVM/);
        return true;
      },
    );
  }
});

Deno.test("checkVmiSemantics() refuses EFI without ACPI, naming spec.domain.features.acpi", () => {
  const vmi = baseVmi();
  vmi.spec.domain.firmware = { bootloader: { efi: { secureBoot: false } } };
  vmi.spec.domain.features = { acpi: { enabled: false } };
  assert.throws(() => check(vmi), (error: unknown) => {
    assert.ok(error instanceof InvalidFieldError);
    assert.equal(error.path, "spec.domain.features.acpi");
    return true;
  });
});

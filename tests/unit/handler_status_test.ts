import assert from "node:assert/strict";
import type { VirtualMachineInstance, VolumeStatus } from "../../mod/api/mod.ts";
import {
  type Domain,
  type DomainChannel,
  LifeCycle,
  newDomain,
  StateChangeReason,
} from "../../mod/domain/mod.ts";
import {
  computeStatus,
  guestAgentConnected,
  memoryDumpPath,
  phaseChangeEvent,
  type StatusInput,
  SYNC_FAILED_REASON,
  volumePhaseEvents,
} from "../../mod/handler/testing.ts";

const T0 = "2026-11-29T10:00:00.000Z";
const T1 = "2026-11-29T10:00:05.000Z";

function vmi(phase?: string, extra: Partial<VirtualMachineInstance["spec"]> = {}) {
  return {
    metadata: { name: "vm1", namespace: "default", uid: "u1" },
    spec: { domain: { devices: {} }, ...extra },
    status: phase ? { phase } : {},
  } as VirtualMachineInstance;
}

function input(status?: LifeCycle, reason?: StateChangeReason, more: Partial<StatusInput> = {}) {
  return {
    domain: status
      ? newDomain({ namespace: "default", name: "vm1", uid: "u1" }, {
        status,
        reason: reason ?? StateChangeReason.Unknown,
      })
      : undefined,
    launcher: "responsive" as const,
    nodeName: "node1",
    standIn: { podInterfaceName: "eth0" },
    now: T0,
    ...more,
  };
}

Deno.test("computeStatus() moves a Scheduled VMI with a running domain to Running, stamping the transition", () => {
  const r = computeStatus(vmi("Scheduled"), input(LifeCycle.Running));
  assert.equal(r.status.phase, "Running");
  assert.deepEqual(r.phaseChange, { from: "Scheduled", to: "Running" });
  assert.deepEqual(r.status.phaseTransitionTimestamps, [
    { phase: "Running", phaseTransitionTimestamp: T0 },
  ]);
  assert.equal(r.status.nodeName, "node1");
  const ready = r.status.conditions!.find((c) => c.type === "Ready")!;
  assert.equal(ready.status, "True");
});

Deno.test("computeStatus() reports the domain's machine type in status.machine, as virt-handler does", () => {
  const withMachine = input(LifeCycle.Running);
  withMachine.domain!.spec.os = { machine: "pc-q35-7.2" };
  assert.deepEqual(computeStatus(vmi("Scheduled"), withMachine).status.machine, {
    type: "pc-q35-7.2",
  });
  // No machine in the domain: what the VMI had stays.
  const before = vmi("Running");
  before.status!.machine = { type: "q35" };
  assert.deepEqual(computeStatus(before, input(LifeCycle.Running)).status.machine, { type: "q35" });
});

Deno.test("computeStatus() carries the agent's guest OS and freeze state", () => {
  // Frozen is shown, thawed clears it, and an unknown state keeps what was there.
  const frozen = input(LifeCycle.Running);
  frozen.domain!.status.osInfo = { name: "virtnode test guest", id: "virtnode-guest" };
  frozen.domain!.status.fsFreezeStatus = { status: "frozen" };
  const r = computeStatus(vmi("Running"), frozen);
  assert.deepEqual(r.status.guestOSInfo, { name: "virtnode test guest", id: "virtnode-guest" });
  assert.equal(r.status.fsFreezeStatus, "frozen");
  const unknown = input(LifeCycle.Running);
  const kept = computeStatus({ ...vmi("Running"), status: r.status }, unknown).status;
  assert.equal(kept.fsFreezeStatus, "frozen");
  assert.equal(kept.guestOSInfo?.name, "virtnode test guest");
  const thawed = input(LifeCycle.Running);
  thawed.domain!.status.fsFreezeStatus = { status: "thawed" };
  assert.equal(
    computeStatus({ ...vmi("Running"), status: r.status }, thawed).status.fsFreezeStatus,
    undefined,
  );
});

Deno.test("computeStatus() is idempotent: recomputing its own result changes nothing, even later", () => {
  const first = computeStatus(vmi("Scheduled"), input(LifeCycle.Running));
  const again = computeStatus(
    { ...vmi(), status: first.status },
    input(LifeCycle.Running, undefined, { now: T1 }),
  );
  assert.deepEqual(again.status, first.status);
  assert.equal(again.phaseChange, undefined);
});

Deno.test("computeStatus() sets Synchronized=False with KubeVirt's reason and the error, and clears it after", () => {
  const failed = computeStatus(
    vmi("Scheduled"),
    input(undefined, undefined, { syncError: "boom" }),
  );
  const c = failed.status.conditions!.find((c) => c.type === "Synchronized")!;
  assert.deepEqual([c.status, c.reason, c.message], ["False", SYNC_FAILED_REASON, "boom"]);
  const ok = computeStatus({ ...vmi(), status: failed.status }, input(LifeCycle.Running));
  assert.equal(ok.status.conditions!.find((c) => c.type === "Synchronized"), undefined);
});

Deno.test("computeStatus() adds Paused with PausedByUser or PausedIOError and removes it on resume", () => {
  const byUser = computeStatus(
    vmi("Running"),
    input(LifeCycle.Paused, StateChangeReason.PausedUser),
  );
  assert.equal(byUser.status.phase, "Running");
  const p = byUser.status.conditions!.find((c) => c.type === "Paused")!;
  assert.deepEqual([p.status, p.reason], ["True", "PausedByUser"]);
  assert.equal(byUser.status.conditions!.find((c) => c.type === "Ready")!.status, "False");
  const io = computeStatus(
    vmi("Running"),
    input(LifeCycle.Paused, StateChangeReason.PausedIOError),
  );
  assert.equal(io.status.conditions!.find((c) => c.type === "Paused")!.reason, "PausedIOError");
  const resumed = computeStatus({ ...vmi(), status: byUser.status }, input(LifeCycle.Running));
  assert.equal(resumed.status.conditions!.find((c) => c.type === "Paused"), undefined);
});

Deno.test("computeStatus() fails a Running VMI whose launcher is unresponsive and has no domain", () => {
  const r = computeStatus(
    vmi("Running"),
    input(undefined, undefined, { launcher: "unresponsive" }),
  );
  assert.equal(r.status.phase, "Failed");
  assert.deepEqual(phaseChangeEvent(r.phaseChange!), {
    type: "Warning",
    reason: "Stopped",
    message: "The VirtualMachineInstance crashed.",
  });
});

Deno.test("computeStatus() never changes a final phase again", () => {
  const r = computeStatus(vmi("Succeeded"), input(LifeCycle.Running));
  assert.equal(r.status.phase, "Succeeded");
  assert.equal(r.phaseChange, undefined);
});

Deno.test("computeStatus() requeues a Scheduled VMI whose launcher is not ready yet", () => {
  const r = computeStatus(vmi("Scheduled"), input(undefined, undefined, { launcher: "notReady" }));
  assert.equal(r.status.phase, "Scheduled");
  assert.equal(r.requeue, true);
});

Deno.test("computeStatus(): pod-less, not Ready until the readiness probe passes, in the kubelet's words", () => {
  const probing = input(LifeCycle.Running, undefined, {
    standIn: {
      podInterfaceName: "eth0",
      readiness: {
        ready: false,
        message: 'Readiness probe failed: command "cat" exited with code 1',
      },
    },
  });
  const ready = computeStatus(vmi("Running"), probing).status.conditions!
    .find((c) => c.type === "Ready")!;
  assert.deepEqual([ready.status, ready.reason, ready.message], [
    "False",
    "ContainersNotReady",
    'Readiness probe failed: command "cat" exited with code 1',
  ]);
  const passed = input(LifeCycle.Running, undefined, {
    standIn: { podInterfaceName: "eth0", readiness: { ready: true, message: "" } },
  });
  assert.equal(
    computeStatus(vmi("Running"), passed).status.conditions!.find((c) => c.type === "Ready")!
      .status,
    "True",
  );
});

Deno.test("computeStatus() leaves Ready alone outside pod-less mode (virt-controller owns it)", () => {
  const r = computeStatus(
    vmi("Scheduled"),
    input(LifeCycle.Running, undefined, { standIn: undefined }),
  );
  assert.equal(r.status.conditions!.find((c) => c.type === "Ready"), undefined);
});

Deno.test("computeStatus() writes both migratable conditions with KubeVirt's first reason, and the method", () => {
  // Both conditions: LiveMigratable and StorageLiveMigratable; the method is migrationMethod.
  const plain = computeStatus(vmi("Running"), input(LifeCycle.Running)).status;
  const live = plain.conditions?.find((c) => c.type === "LiveMigratable");
  assert.equal(live?.status, "True");
  assert.equal(live?.reason, undefined);
  assert.equal(plain.conditions?.find((c) => c.type === "StorageLiveMigratable")?.status, "True");
  assert.equal(plain.migrationMethod, "LiveMigration");
  const blocked = computeStatus(
    vmi("Running", {
      domain: { devices: { hostDevices: [{ name: "h", deviceName: "x" }] } },
      volumes: [{ name: "d", hostDisk: { path: "/x", type: "Disk" } }],
    }),
    input(LifeCycle.Running),
  ).status;
  const byType = new Map(blocked.conditions?.map((c) => [c.type, c]));
  assert.equal(byType.get("LiveMigratable")?.reason, "HostDeviceNotLiveMigratable");
  assert.equal(byType.get("StorageLiveMigratable")?.reason, "NotMigratable");
  assert.equal(
    byType.get("StorageLiveMigratable")?.message,
    "HostDeviceNotLiveMigratable: VMI uses a PCI host devices",
  );
  assert.equal(blocked.migrationMethod, "BlockMigration");
  // Not before the VMI is scheduled here.
  assert.equal(
    computeStatus(vmi("Pending"), input()).status.conditions?.some((c) =>
      c.type === "LiveMigratable"
    ) ?? false,
    false,
  );
});

function runningDomain(channels: DomainChannel[], osName?: string): Domain {
  const domain = newDomain({ namespace: "default", name: "vm1", uid: "u1" }, {
    status: LifeCycle.Running,
    reason: StateChangeReason.Unknown,
  });
  domain.spec.devices.channels = channels;
  if (osName) domain.status.osInfo = { name: osName };
  return domain;
}

function agentChannel(state?: string, name = "org.qemu.guest_agent.0"): DomainChannel {
  return {
    type: "unix",
    target: state ? { type: "virtio", name, state } : { type: "virtio", name },
  };
}

Deno.test("guestAgentConnected() is true only for a connected org.qemu.guest_agent.0 channel", () => {
  const rows: [string, Domain | undefined, boolean][] = [
    ["no domain", undefined, false],
    ["no channel, though the guest OS is known", runningDomain([], "Fedora Linux"), false],
    ["channel without a state (domain not running)", runningDomain([agentChannel()]), false],
    ["channel disconnected", runningDomain([agentChannel("disconnected")]), false],
    ["another channel connected", runningDomain([agentChannel("connected", "org.qemu.x")]), false],
    ["channel without a target", runningDomain([{ type: "unix" }]), false],
    ["channel connected", runningDomain([agentChannel("connected")]), true],
    [
      "channel connected beside another",
      runningDomain([agentChannel("connected", "org.qemu.x"), agentChannel("connected")]),
      true,
    ],
  ];
  for (const [row, domain, want] of rows) assert.equal(guestAgentConnected(domain), want, row);
});

Deno.test("computeStatus() sets AgentConnected from the guest agent channel, not from the guest OS info", () => {
  const agentOf = (status: { conditions?: { type: string; status: string }[] }) =>
    status.conditions?.find((c) => c.type === "AgentConnected")?.status;
  const osOnly = computeStatus(
    vmi("Running"),
    input(undefined, undefined, {
      domain: runningDomain([agentChannel("disconnected")], "Fedora"),
    }),
  );
  assert.equal(agentOf(osOnly.status), undefined);
  const connected = computeStatus(
    vmi("Running"),
    input(undefined, undefined, { domain: runningDomain([agentChannel("connected")]) }),
  );
  assert.equal(agentOf(connected.status), "True");
  const gone = computeStatus(
    { ...vmi(), status: connected.status },
    input(undefined, undefined, { domain: runningDomain([agentChannel("disconnected")]) }),
  );
  assert.equal(agentOf(gone.status), undefined);
});

Deno.test("computeStatus() makes a VMI LiveMigratable unless KubeVirt's first blocker says why not", () => {
  // The labeller has read the host: this node has no host model.
  const known = { migratable: { hostCpuModel: "" } };
  const liveMigratable = (v: VirtualMachineInstance) =>
    computeStatus(v, input(LifeCycle.Running, undefined, known)).status.conditions?.find((c) =>
      c.type === "LiveMigratable"
    );
  const rows: [string, VirtualMachineInstance, string | undefined][] = [
    ["Running, nothing blocks", vmi("Running"), "True"],
    ["Scheduled, nothing blocks", vmi("Scheduled"), "True"],
    [
      "Running, non-shared hostDisk",
      vmi("Running", { volumes: [{ name: "d", hostDisk: { path: "/x", type: "Disk" } }] }),
      "DisksNotLiveMigratable",
    ],
    [
      "Running, host-model CPU, the node has no host model",
      vmi("Running", { domain: { cpu: { model: "host-model" }, devices: {} } }),
      "CPUModeLiveMigratable",
    ],
    [
      "Running, host-passthrough CPU (KubeVirt lets it migrate)",
      vmi("Running", { domain: { cpu: { model: "host-passthrough" }, devices: {} } }),
      "True",
    ],
    ["Succeeded", vmi("Succeeded"), undefined],
  ];
  for (const [row, v, reason] of rows) {
    const c = liveMigratable(v);
    if (reason === undefined) {
      assert.equal(c, undefined, row);
      continue;
    }
    if (reason === "True") {
      assert.equal(c?.status, "True", row);
      assert.equal(c?.reason, undefined, row);
      continue;
    }
    assert.equal(c?.status, "False", row);
    assert.equal(c?.reason, reason, row);
  }
});

Deno.test("computeStatus() lists the pod's IP first on the pod network's interface", () => {
  // The guest agent's address of the other family is added after it.
  const i = input(LifeCycle.Running, StateChangeReason.Unknown, {
    podAddresses: new Map([["default", { podIP: "10.244.1.5", podIPs: ["10.244.1.5"] }]]),
  });
  const domain = i.domain!;
  domain.spec.devices.interfaces = [
    { type: "user", mac: "52:54:00:00:00:09", alias: { name: "other", userDefined: true } },
    { type: "ethernet", mac: "0a:58:0a:f4:01:05", alias: { name: "default", userDefined: true } },
  ];
  domain.status.interfaces = [{
    mac: "0a:58:0A:F4:01:05",
    ip: "10.0.2.2",
    ips: ["10.0.2.2", "fd10:0:2::2"],
    interfaceName: "eth0",
  }];
  const { status } = computeStatus(vmi("Running"), i);
  assert.deepEqual(status.interfaces, [
    {
      name: "default",
      mac: "0a:58:0a:f4:01:05",
      ipAddress: "10.244.1.5",
      ipAddresses: ["10.244.1.5", "fd10:0:2::2"],
      interfaceName: "eth0",
      infoSource: "domain, guest-agent",
      queueCount: 1,
      linkState: "up",
      podInterfaceName: "eth0",
    },
    {
      name: "other",
      mac: "52:54:00:00:00:09",
      infoSource: "domain",
      queueCount: 1,
      linkState: "up",
    },
  ]);
  // In KubeVirt mode virt-controller names the pod interface; the handler keeps its name.
  const kubevirt = computeStatus(
    {
      ...vmi("Running"),
      status: { phase: "Running", interfaces: [{ name: "default", podInterfaceName: "pod123" }] },
    } as VirtualMachineInstance,
    { ...i, standIn: undefined },
  );
  assert.equal(kubevirt.status.interfaces![0].podInterfaceName, "pod123");
});

Deno.test("computeStatus() keeps multus-status in infoSource of the secondary networks' interfaces", () => {
  // virt-controller tags what the pod's network-status reported; a plugged interface not in
  // the domain yet keeps its entry; the pod network's interface goes first.
  const i = input(LifeCycle.Running, StateChangeReason.Unknown, {
    podAddresses: new Map([
      ["red", { podIPs: [] }],
      ["default", { podIP: "10.244.1.5", podIPs: ["10.244.1.5"] }],
    ]),
  });
  i.domain!.spec.devices.interfaces = [
    { type: "ethernet", mac: "02:00:00:00:00:0a", alias: { name: "red", userDefined: true } },
    { type: "ethernet", mac: "0a:58:0a:f4:01:05", alias: { name: "default", userDefined: true } },
  ];
  const base = vmi("Running");
  const v = {
    ...base,
    spec: {
      ...base.spec,
      domain: {
        ...base.spec.domain,
        devices: {
          interfaces: [
            { name: "default", masquerade: {} },
            { name: "red", bridge: {} },
            { name: "blue", bridge: {} },
          ],
        },
      },
      networks: [
        { name: "default", pod: {} },
        { name: "red", multus: { networkName: "red" } },
        { name: "blue", multus: { networkName: "blue" } },
      ],
    },
    status: {
      phase: "Running",
      interfaces: [
        { name: "default", podInterfaceName: "eth0", infoSource: "domain, multus-status" },
        { name: "red", podInterfaceName: "podb1f51a511f1", infoSource: "multus-status" },
        { name: "blue", podInterfaceName: "pod16477688c0e", infoSource: "multus-status" },
        { name: "gone", podInterfaceName: "pod1", infoSource: "multus-status" },
      ],
    },
  } as VirtualMachineInstance;
  const { status } = computeStatus(v, { ...i, standIn: undefined });
  assert.deepEqual(
    status.interfaces!.map((x) => [x.name, x.infoSource, x.podInterfaceName, x.ipAddress]),
    [
      ["default", "domain, multus-status", "eth0", "10.244.1.5"],
      ["red", "domain, multus-status", "podb1f51a511f1", undefined],
      ["blue", "multus-status", "pod16477688c0e", undefined],
    ],
  );
});

Deno.test("computeStatus() reports an SR-IOV interface from the domain's host device, as virt-handler", () => {
  // KubeVirt's launcher passes the VF through as a host device aliased ua-sriov-<name>: the
  // status has the name, the spec's MAC, the agent's addresses for that MAC and Multus' tag.
  const i = input(LifeCycle.Running, StateChangeReason.Unknown, {
    podAddresses: new Map([["default", { podIP: "10.244.1.5", podIPs: ["10.244.1.5"] }]]),
  });
  i.domain!.spec.devices.interfaces = [
    { type: "ethernet", mac: "0a:58:0a:f4:01:05", alias: { name: "default", userDefined: true } },
  ];
  i.domain!.spec.devices.hostDevices = [
    { type: "pci", alias: { name: "sriov-fast", userDefined: true } },
    { type: "pci", alias: { name: "sriov-slow", userDefined: true } },
    { type: "pci", alias: { name: "hostdevice-gpu0", userDefined: true } },
    { type: "pci" },
  ];
  i.domain!.status.interfaces = [
    { mac: "02:00:00:00:00:f1", ip: "192.0.2.10", ips: ["192.0.2.10"], interfaceName: "eth1" },
  ];
  const base = vmi("Running");
  const v = {
    ...base,
    spec: {
      ...base.spec,
      domain: {
        ...base.spec.domain,
        devices: {
          interfaces: [
            { name: "default", masquerade: {} },
            { name: "fast", sriov: {}, macAddress: "02:00:00:00:00:F1" },
            { name: "slow", sriov: {} },
          ],
        },
      },
      networks: [
        { name: "default", pod: {} },
        { name: "fast", multus: { networkName: "sriov-a" } },
        { name: "slow", multus: { networkName: "sriov-b" } },
      ],
    },
    status: {
      phase: "Running",
      interfaces: [
        { name: "fast", podInterfaceName: "net1", infoSource: "multus-status" },
        { name: "slow", podInterfaceName: "net2", infoSource: "multus-status" },
      ],
    },
  } as VirtualMachineInstance;
  const { status } = computeStatus(v, { ...i, standIn: undefined });
  assert.deepEqual(status.interfaces!.slice(1), [
    {
      name: "fast",
      mac: "02:00:00:00:00:F1",
      ipAddress: "192.0.2.10",
      ipAddresses: ["192.0.2.10"],
      interfaceName: "eth1",
      infoSource: "domain, guest-agent, multus-status",
      podInterfaceName: "net1",
    },
    { name: "slow", infoSource: "domain, multus-status", podInterfaceName: "net2" },
  ]);
  assert.equal(status.interfaces![0].name, "default");
});

Deno.test("computeStatus() adds an interface only the guest agent reports, named by nothing, as virt-handler", () => {
  const i = input(LifeCycle.Running, StateChangeReason.Unknown, {
    podAddresses: new Map([["default", { podIP: "10.244.1.5", podIPs: ["10.244.1.5"] }]]),
  });
  i.domain!.spec.devices.interfaces = [
    { type: "ethernet", mac: "0a:58:0a:f4:01:05", alias: { name: "default", userDefined: true } },
  ];
  i.domain!.status.interfaces = [
    { mac: "0A:58:0A:F4:01:05", ip: "10.0.2.2", ips: ["10.0.2.2"], interfaceName: "eth0" },
    // A VLAN the guest made on eth0 (another MAC), and a bridge of its own.
    {
      mac: "0a:58:0a:f4:01:06",
      ip: "192.0.2.7",
      ips: ["192.0.2.7", "fe80::1"],
      interfaceName: "eth0.7",
    },
    { mac: "02:42:ac:11:00:01", interfaceName: "docker0" },
  ];
  const v = vmi("Running");
  v.spec.domain.devices.interfaces = [{ name: "default", masquerade: {} }];
  v.spec.networks = [{ name: "default", pod: {} }];
  const { status } = computeStatus(v, { ...i, standIn: undefined });
  assert.deepEqual(
    status.interfaces!.map((x) => [x.name, x.interfaceName, x.infoSource, x.ipAddress]),
    [
      ["default", "eth0", "domain, guest-agent", "10.244.1.5"],
      [undefined, "eth0.7", "guest-agent", "192.0.2.7"],
      [undefined, "docker0", "guest-agent", undefined],
    ],
  );
  assert.deepEqual(status.interfaces![1].ipAddresses, ["192.0.2.7", "fe80::1"]);
  assert.equal(status.interfaces![1].mac, "0a:58:0a:f4:01:06");
});

Deno.test("computeStatus() fills each volume's target into virt-controller's volumeStatus", () => {
  // The claim info and hotplug phase virt-controller wrote are kept.
  const claim = {
    claimName: "data",
    accessModes: ["ReadWriteOnce"],
    volumeMode: "Filesystem",
    capacity: { storage: "1Gi" },
  };
  const v = vmi("Running", {
    volumes: [
      { name: "root", containerDisk: { image: "i" } },
      { name: "data", persistentVolumeClaim: { claimName: "data" } },
      { name: "hp", persistentVolumeClaim: { claimName: "hp" } },
    ],
  });
  v.status!.volumeStatus = [
    { name: "data", target: "", persistentVolumeClaimInfo: claim },
    {
      name: "hp",
      target: "",
      phase: "MountedToPod",
      hotplugVolume: { attachPodName: "hp-volume-x", attachPodUID: "p" },
    },
  ];
  const i = input(LifeCycle.Running);
  i.domain!.spec.devices.disks = [
    { alias: { name: "ua-data" }, target: { dev: "vdb" }, source: { file: "/d/disk.img" } },
    { alias: { name: "ua-root" }, target: { dev: "vda" }, source: { file: "/r/disk.qcow2" } },
    { alias: { name: "ua-cd" }, target: { dev: "sda" }, source: {} }, // an empty CD-ROM
  ] as Domain["spec"]["devices"]["disks"];
  const { status } = computeStatus(v, i);
  assert.deepEqual(status.volumeStatus, [
    { name: "data", target: "vdb", persistentVolumeClaimInfo: claim },
    {
      name: "hp",
      target: "",
      phase: "MountedToPod",
      hotplugVolume: { attachPodName: "hp-volume-x", attachPodUID: "p" },
    },
    { name: "root", target: "vda" },
  ]);
});

Deno.test("computeStatus() moves a hotplugged volume through its phases as KubeVirt's handler does", () => {
  // MountedToPod once mounted, Ready once the domain has it,
  // UnMountedFromPod once it is out of the spec and unmounted.
  const hot = (phase: string, target = "") => ({
    name: "hp",
    target,
    phase,
    hotplugVolume: { attachPodName: "hp-volume-x", attachPodUID: "p" },
  });
  const inSpec = { volumes: [{ name: "hp", persistentVolumeClaim: { claimName: "c" } }] };
  const run = (
    spec: Partial<VirtualMachineInstance["spec"]>,
    entry: ReturnType<typeof hot>,
    mounted: string[],
    disk = false,
  ) => {
    const v = vmi("Running", spec);
    v.status!.volumeStatus = [entry];
    const i = input(LifeCycle.Running, undefined, {
      hotplugMounted: new Set(mounted),
      standIn: undefined,
    });
    if (disk) {
      i.domain!.spec.devices.disks = [
        { alias: { name: "ua-hp" }, target: { dev: "sda" }, source: { file: "/h/hp.img" } },
      ] as Domain["spec"]["devices"]["disks"];
    }
    return computeStatus(v, i).status.volumeStatus![0];
  };
  assert.equal(run(inSpec, hot("AttachedToNode"), []).phase, "AttachedToNode", "not mounted yet");
  const mounted = run(inSpec, hot("AttachedToNode"), ["hp"]);
  assert.equal(mounted.phase, "MountedToPod");
  assert.equal(mounted.reason, "VolumeMountedToPod");
  assert.equal(mounted.message, "Volume hp has been mounted in virt-launcher pod");
  const ready = run(inSpec, hot("MountedToPod"), ["hp"], true);
  assert.deepEqual([ready.phase, ready.target, ready.reason], ["Ready", "sda", "VolumeReady"]);
  assert.equal(run({ volumes: [] }, hot("Ready"), ["hp"]).phase, "Ready", "still mounted");
  const gone = run({ volumes: [] }, hot("Ready"), []);
  assert.deepEqual([gone.phase, gone.reason], ["UnMountedFromPod", "VolumeUnMountedFromPod"]);
  assert.equal(run({ volumes: [] }, hot("Detaching"), []).phase, "Detaching", "controller's");
});

Deno.test("computeStatus() in pod-less mode writes a hotplugged claim's volumeStatus entry itself", () => {
  // Pending while in the spec, MountedToPod once found, Ready
  // once attached, and gone once out of the spec and detached.
  const spec = {
    volumes: [
      { name: "root", containerDisk: { image: "i" } },
      { name: "hp", persistentVolumeClaim: { claimName: "c", hotpluggable: true } },
    ],
  };
  const run = (
    volumes: Partial<VirtualMachineInstance["spec"]>,
    entries: VolumeStatus[] | undefined,
    found: string[],
    attached: boolean,
  ) => {
    const v = vmi("Running", volumes);
    v.status!.volumeStatus = entries;
    const i = input(LifeCycle.Running, undefined, {
      hotplugMounted: new Set(found),
      standIn: {
        hotplugClaims: new Map(found.map((n) => [n, { claimName: "c", volumeMode: "Block" }])),
        podInterfaceName: "eth0",
      },
    });
    i.domain!.spec.devices.disks = [
      { alias: { name: "ua-root" }, target: { dev: "vda" }, source: { file: "/r/disk.qcow2" } },
      ...(attached
        ? [{ alias: { name: "ua-hp" }, target: { dev: "sda" }, source: { dev: "/b" } }]
        : []),
    ] as Domain["spec"]["devices"]["disks"];
    return computeStatus(v, i).status.volumeStatus;
  };
  const pending = run(spec, undefined, [], false)!;
  assert.deepEqual(pending.map((e) => [e.name, e.phase, e.target]), [
    ["hp", "Pending", ""],
    ["root", undefined, "vda"],
  ]);
  assert.deepEqual(pending[0].hotplugVolume, {});
  assert.equal(pending[0].persistentVolumeClaimInfo, undefined, "not found yet");
  const found = run(spec, pending, ["hp"], false)!;
  assert.equal(found[0].phase, "MountedToPod");
  assert.deepEqual(found[0].persistentVolumeClaimInfo, { claimName: "c", volumeMode: "Block" });
  const ready = run(spec, found, ["hp"], true)!;
  assert.deepEqual([ready[0].phase, ready[0].target], ["Ready", "sda"]);
  const removed = { volumes: [spec.volumes[0]] };
  const detaching = run(removed, ready, [], true)!;
  assert.deepEqual(detaching.map((e) => e.name), ["hp", "root"], "kept while the domain has it");
  const gone = run(removed, detaching, [], false)!;
  assert.deepEqual(gone.map((e) => e.name), ["root"]);
});

Deno.test("computeStatus() reports the launcher's SELinux context once a domain runs, as virt-handler does", () => {
  const running = computeStatus(
    vmi("Running"),
    input(LifeCycle.Running, undefined, { selinuxContext: "none" }),
  );
  assert.equal(running.status.selinuxContext, "none");
  const none = computeStatus(
    vmi("Scheduled"),
    input(undefined, undefined, { selinuxContext: "none" }),
  );
  assert.equal(none.status.selinuxContext, undefined, "no domain, nothing to say");
});

Deno.test("computeStatus() reports the launcher's access-credential verdict as virt-handler does", () => {
  // The verdict goes into AccessCredentialsSynchronized with its message; each change is an Event.
  const withVerdict = (succeeded: boolean, message?: string, now = T0) => {
    const i = input(LifeCycle.Running, undefined, { now });
    i.domain!.spec.metadata.kubevirt.accessCredential = { succeeded, message };
    return i;
  };
  const condition = (r: ReturnType<typeof computeStatus>) =>
    r.status.conditions?.find((c) => c.type === "AccessCredentialsSynchronized");

  // No verdict from the launcher: no condition, no Event.
  const none = computeStatus(vmi("Running"), input(LifeCycle.Running));
  assert.equal(condition(none), undefined);
  assert.deepEqual(none.events, []);

  const ok = computeStatus(vmi("Running"), withVerdict(true));
  assert.deepEqual(condition(ok), {
    type: "AccessCredentialsSynchronized",
    status: "True",
    lastProbeTime: null,
    lastTransitionTime: T0,
  });
  assert.deepEqual(ok.events, [{
    type: "Normal",
    reason: "AccessCredentialsSyncSuccess",
    message: "Access credentials sync successful.",
  }]);
  // The same verdict again: nothing changes, no second Event.
  const again = computeStatus({ ...vmi(), status: ok.status }, withVerdict(true, undefined, T1));
  assert.deepEqual(again.status, ok.status);
  assert.deepEqual(again.events, []);

  const failed = computeStatus(
    { ...vmi(), status: ok.status },
    withVerdict(false, "guest agent lacks guest-ssh-add-authorized-keys", T1),
  );
  assert.deepEqual(condition(failed), {
    type: "AccessCredentialsSynchronized",
    status: "False",
    message: "guest agent lacks guest-ssh-add-authorized-keys",
    lastProbeTime: null,
    lastTransitionTime: T1,
  });
  assert.deepEqual(failed.events, [{
    type: "Warning",
    reason: "AccessCredentialsSyncFailed",
    message: "Access credentials sync failed: guest agent lacks guest-ssh-add-authorized-keys",
  }]);
  // A launcher that stops saying leaves the condition as it was.
  const silent = computeStatus({ ...vmi(), status: failed.status }, input(LifeCycle.Running));
  assert.deepEqual(condition(silent), condition(failed));
});

Deno.test("computeStatus() warns when a VMI to be live-migrated on eviction cannot migrate", () => {
  // As virt-handler does; the strategy may be the VMI's own evictionStrategy or the cluster's.
  const hostDevice = { domain: { devices: { hostDevices: [{ name: "h", deviceName: "x" }] } } };
  const warning = {
    type: "Warning",
    reason: "Migrated",
    message: "EvictionStrategy is set but vmi is not migratable; VMI uses a PCI host devices",
  };
  // The cluster's strategy (the KubeVirt CR's) applies to a VMI without its own.
  const byCluster = computeStatus(
    vmi("Running", hostDevice),
    input(LifeCycle.Running, undefined, { clusterEvictionStrategy: "LiveMigrate" }),
  );
  assert.deepEqual(byCluster.events, [warning]);
  // Said once per verdict, not at every sync.
  const again = computeStatus(
    { ...vmi("Running", hostDevice), status: byCluster.status },
    input(LifeCycle.Running, undefined, { clusterEvictionStrategy: "LiveMigrate", now: T1 }),
  );
  assert.deepEqual(again.events, []);
  // The VMI's own None wins over the cluster's; KubeVirt's default is None.
  const own = computeStatus(
    vmi("Running", { ...hostDevice, evictionStrategy: "None" }),
    input(LifeCycle.Running, undefined, { clusterEvictionStrategy: "LiveMigrate" }),
  );
  assert.deepEqual(own.events, []);
  assert.deepEqual(computeStatus(vmi("Running", hostDevice), input(LifeCycle.Running)).events, []);
  // A migratable VMI: nothing to say.
  assert.deepEqual(
    computeStatus(
      vmi("Running", { evictionStrategy: "LiveMigrate" }),
      input(LifeCycle.Running),
    ).events,
    [],
  );
});

Deno.test("computeStatus() moves a memory dump volume through virt-handler's phases from the launcher's record", () => {
  // KubeVirt mode: virt-controller hotplugs the dump's claim; the handler mounts its
  // directory, names the file, and reads how the dump went from the domain's metadata.
  const dumpVmi = (phase: string, dump: Record<string, string>) => {
    const v = vmi("Running", {
      volumes: [{ name: "dump", memoryDump: { claimName: "dump", hotpluggable: true } }],
    });
    v.status!.volumeStatus = [{
      name: "dump",
      target: "",
      phase,
      hotplugVolume: { attachPodName: "hp-volume-x", attachPodUID: "u2" },
      memoryDumpVolume: { claimName: "dump", ...dump },
    }];
    return v;
  };
  const kubevirtMode = (domain?: Domain) => ({
    ...input(LifeCycle.Running, undefined, {
      standIn: undefined,
      hotplugMounted: new Set(["dump"]),
    }),
    ...(domain ? { domain } : {}),
  });
  const mounted = computeStatus(dumpVmi("Bound", {}), kubevirtMode());
  const entry = mounted.status.volumeStatus![0];
  const file = "vm1-dump-20261129-100000.memory.dump";
  assert.deepEqual(entry, {
    name: "dump",
    target: "",
    phase: "MemoryDumpInProgress",
    reason: "VolumeMountedToPod",
    message: "Memory dump Volume dump is attached, getting memory dump",
    hotplugVolume: { attachPodName: "hp-volume-x", attachPodUID: "u2" },
    memoryDumpVolume: { claimName: "dump", targetFileName: file },
  });
  assert.ok(mounted.requeue, "looked at again until the dump ends");
  assert.deepEqual(volumePhaseEvents(undefined, mounted.status.volumeStatus), [
    {
      reason: "VolumeMountedToPod",
      message: "Memory dump Volume dump is attached, getting memory dump",
    },
  ]);
  assert.equal(memoryDumpPath(entry), `/var/run/kubevirt/hotplug-disks/dump/${file}`);

  const withDump = (record: NonNullable<Domain["spec"]["metadata"]["kubevirt"]["memoryDump"]>) => {
    const domain = newDomain({ namespace: "default", name: "vm1", uid: "u1" }, {
      status: LifeCycle.Running,
      reason: StateChangeReason.Unknown,
    });
    domain.spec.metadata.kubevirt.memoryDump = record;
    return kubevirtMode(domain);
  };
  const inProgress = dumpVmi("MemoryDumpInProgress", { targetFileName: file });
  // The launcher's record of another file (an earlier dump) says nothing about this one.
  const other = computeStatus(
    inProgress,
    withDump({ fileName: "old.memory.dump", completed: true, endTimestamp: T1 }),
  );
  assert.equal(other.status.volumeStatus![0].phase, "MemoryDumpInProgress");
  const started = computeStatus(inProgress, withDump({ fileName: file, startTimestamp: T0 }));
  assert.equal(started.status.volumeStatus![0].phase, "MemoryDumpInProgress");
  assert.equal(started.status.volumeStatus![0].memoryDumpVolume!.startTimestamp, T0);
  const done = computeStatus(
    inProgress,
    withDump({ fileName: file, startTimestamp: T0, endTimestamp: T1, completed: true }),
  ).status.volumeStatus![0];
  assert.equal(done.phase, "MemoryDumpCompleted");
  assert.equal(done.reason, "VolumeReady");
  assert.equal(done.message, "Memory dump to Volume dump has completed successfully");
  assert.deepEqual(done.memoryDumpVolume, {
    claimName: "dump",
    targetFileName: file,
    startTimestamp: T0,
    endTimestamp: T1,
  });
  assert.equal(memoryDumpPath(done), undefined, "a finished dump is not asked for again");
  const failed = computeStatus(
    inProgress,
    withDump({
      fileName: file,
      endTimestamp: T1,
      completed: true,
      failed: true,
      failureReason: "no space left",
    }),
  ).status.volumeStatus![0];
  assert.equal(failed.phase, "MemoryDumpFailed");
  assert.equal(failed.message, "Memory dump to pvc dump failed: no space left");
});

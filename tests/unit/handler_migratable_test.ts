import assert from "node:assert/strict";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import {
  ALLOW_POD_BRIDGE_MIGRATION_ANNOTATION,
  joinBlockers,
  migratability,
} from "../../mod/handler/testing.ts";

type Spec = VirtualMachineInstance["spec"];

function vmi(
  spec: Partial<Spec> = {},
  more: { annotations?: Record<string, string>; status?: VirtualMachineInstance["status"] } = {},
): VirtualMachineInstance {
  return {
    metadata: { name: "vm1", namespace: "default", uid: "u1", annotations: more.annotations },
    spec: { domain: { devices: {} }, ...spec },
    status: { nodeName: "node1", ...more.status },
  } as VirtualMachineInstance;
}

const podBridge: Partial<Spec> = {
  domain: { devices: { interfaces: [{ name: "default", bridge: {} }] } },
  networks: [{ name: "default", pod: {} }],
};

Deno.test("migratability: a VMI with nothing local or special has no blocker and migrates live", () => {
  const m = migratability(vmi());
  assert.deepEqual(m, { blockers: [], storageBlockers: [], method: "LiveMigration" });
});

Deno.test("migratability: the pod network's binding decides as KubeVirt's does", () => {
  // Masquerade migrates; bridge only with the annotation; a binding plugin only if migratable.
  const bridge = migratability(vmi(podBridge));
  assert.equal(bridge.blockers[0]?.reason, "InterfaceNotLiveMigratable");
  assert.match(bridge.blockers[0].message, /allow-pod-bridge-network-live-migration/);
  assert.equal(bridge.storageBlockers[0]?.reason, "InterfaceNotLiveMigratable");
  assert.deepEqual(
    migratability(vmi(podBridge, { annotations: { [ALLOW_POD_BRIDGE_MIGRATION_ANNOTATION]: "" } }))
      .blockers,
    [],
  );
  const masquerade: Partial<Spec> = {
    domain: { devices: { interfaces: [{ name: "default", masquerade: {} }] } },
    networks: [{ name: "default", pod: {} }],
  };
  assert.deepEqual(migratability(vmi(masquerade)).blockers, []);
  const plugin: Partial<Spec> = {
    domain: { devices: { interfaces: [{ name: "default", binding: { name: "passt" } }] } },
    networks: [{ name: "default", pod: {} }],
  };
  assert.equal(migratability(vmi(plugin)).blockers[0]?.reason, "InterfaceNotLiveMigratable");
  assert.deepEqual(
    migratability(vmi(plugin), { migratableBindings: new Set(["passt"]) }).blockers,
    [],
  );
  // Bridge binding on a secondary network only: the pod network is not used.
  const secondary: Partial<Spec> = {
    domain: { devices: { interfaces: [{ name: "blue", bridge: {} }] } },
    networks: [{ name: "blue", multus: { networkName: "blue" } }],
  } as Partial<Spec>;
  assert.deepEqual(migratability(vmi(secondary)).blockers, []);
});

Deno.test("migratability: a host-model CPU needs a node with a host model; passthrough needs nothing", () => {
  const hostModel: Partial<Spec> = { domain: { cpu: { model: "host-model" }, devices: {} } };
  const refused = migratability(vmi(hostModel));
  assert.equal(refused.blockers[0]?.reason, "CPUModeLiveMigratable");
  assert.equal(
    refused.blockers[0].message,
    'the node "node1" does not allow migration with host-model',
  );
  assert.deepEqual(migratability(vmi(hostModel), { hostCpuModel: "EPYC" }).blockers, []);
  assert.deepEqual(
    migratability(vmi({ domain: { cpu: { model: "host-passthrough" }, devices: {} } })).blockers,
    [],
  );
});

Deno.test("migratability: host devices, confidential computing, some Hyper-V and SCSI settings each block", () => {
  // The cases: host devices, GPUs, SEV, SNP, TDX, SCSI reservations,
  // Hyper-V passthrough, and reenlightenment without a TSC frequency.
  const cases: [Partial<Spec>, string, VirtualMachineInstance["status"]?][] = [
    [{ domain: { devices: { hostDevices: [{}] } } }, "HostDeviceNotLiveMigratable"],
    [{ domain: { devices: { gpus: [{}] } } }, "HostDeviceNotLiveMigratable"],
    [{ domain: { devices: {}, launchSecurity: { sev: {} } } }, "SEVNotLiveMigratable"],
    [{ domain: { devices: {}, launchSecurity: { snp: {} } } }, "SEVNotLiveMigratable"],
    [{ domain: { devices: {}, launchSecurity: { tdx: {} } } }, "TDXNotLiveMigratable"],
    [
      { domain: { devices: { disks: [{ name: "l", lun: { reservation: true } }] } } },
      "PersistentReservationNotLiveMigratable",
    ],
    [
      { domain: { devices: {}, features: { hypervPassthrough: {} } } },
      "HypervPassthroughNotLiveMigratable",
    ],
    [
      { domain: { devices: {}, features: { hyperv: { reenlightenment: {} } } } },
      "NoTSCFrequencyNotLiveMigratable",
    ],
  ];
  for (const [spec, reason] of cases) {
    const m = migratability(vmi(spec));
    assert.equal(m.blockers[0]?.reason, reason, JSON.stringify(spec));
    assert.equal(m.storageBlockers[0]?.reason, reason, "storage migration too");
  }
  const reenlightened: Partial<Spec> = {
    domain: { devices: {}, features: { hyperv: { reenlightenment: { enabled: true } } } },
  };
  assert.deepEqual(
    migratability(vmi(reenlightened, { status: { topologyHints: { tscFrequency: 2e9 } } }))
      .blockers,
    [],
    "a TSC frequency virt-controller chose",
  );
  assert.deepEqual(
    migratability(vmi({
      domain: { devices: {}, features: { hyperv: { reenlightenment: { enabled: false } } } },
    })).blockers,
    [],
  );
  assert.deepEqual(
    migratability(
      vmi({ domain: { devices: {}, features: { hypervPassthrough: { enabled: false } } } }),
    )
      .blockers,
    [],
  );
});

Deno.test("migratability: claims must be ReadWriteMany, hostDisks shared; local disks copy along", () => {
  // The claims' access modes are read as virt-controller recorded them.
  const claim: Partial<Spec> = {
    volumes: [{ name: "root", persistentVolumeClaim: { claimName: "pvc1" } }],
  };
  const unknown = migratability(vmi(claim));
  assert.equal(unknown.blockers[0]?.reason, "DisksNotLiveMigratable");
  assert.match(unknown.blockers[0].message, /Unable to determine if PVC pvc1 is shared/);
  assert.deepEqual(unknown.storageBlockers, [], "volumes do not block a storage migration");
  const rwo = migratability(vmi(claim, {
    status: {
      volumeStatus: [{
        name: "root",
        target: "vda",
        persistentVolumeClaimInfo: { claimName: "pvc1", accessModes: ["ReadWriteOnce"] },
      }],
    },
  }));
  assert.match(rwo.blockers[0]?.message ?? "", /PVC pvc1 is not shared/);
  const rwx = migratability(vmi(claim, {
    status: {
      volumeStatus: [{
        name: "root",
        target: "vda",
        persistentVolumeClaimInfo: { claimName: "pvc1", accessModes: ["ReadWriteMany"] },
      }],
    },
  }));
  assert.deepEqual(rwx, { blockers: [], storageBlockers: [], method: "LiveMigration" });
  const dataVolume = migratability(vmi({ volumes: [{ name: "dv", dataVolume: { name: "dv1" } }] }));
  assert.match(dataVolume.blockers[0]?.message ?? "", /PVC dv1/);

  const hostDisk = migratability(vmi({
    volumes: [{ name: "h", hostDisk: { path: "/x", type: "Disk" } }],
  }));
  assert.equal(hostDisk.blockers[0]?.message, "cannot migrate VMI with non-shared HostDisk");
  assert.deepEqual(
    migratability(vmi({
      volumes: [{ name: "h", hostDisk: { path: "/x", type: "Disk", shared: true } }],
    })).blockers,
    [],
  );
  // A filesystem claim turned into a hostDisk: its claim's access modes decide.
  assert.match(
    migratability(vmi({ volumes: [{ name: "h", hostDisk: { path: "/x", type: "Disk" } }] }, {
      status: {
        volumeStatus: [{
          name: "h",
          target: "vda",
          persistentVolumeClaimInfo: { claimName: "pvc2", accessModes: ["ReadWriteOnce"] },
        }],
      },
    })).blockers[0]?.message ?? "",
    /PVC pvc2 is not shared/,
  );

  const local = migratability(vmi({
    domain: { devices: { disks: [{ name: "root", disk: {} }, { name: "iso", cdrom: {} }] } },
    volumes: [
      { name: "root", containerDisk: { image: "quay.io/x/y" } },
      { name: "iso", cloudInitNoCloud: { userData: "#cloud-config" } },
    ],
  }));
  assert.deepEqual(local.blockers, []);
  assert.equal(local.method, "BlockMigration", "the containerDisk copies along");
  const cdromOnly = migratability(vmi({
    domain: { devices: { disks: [{ name: "iso", cdrom: {} }] } },
    volumes: [{ name: "iso", cloudInitNoCloud: { userData: "#cloud-config" } }],
  }));
  assert.equal(cdromOnly.method, "LiveMigration", "a read-only CD-ROM is rebuilt on the target");
  const writableCdrom = migratability(vmi({
    domain: { devices: { disks: [{ name: "iso", cdrom: { readonly: false } }] } },
    volumes: [{ name: "iso", cloudInitNoCloud: { userData: "#cloud-config" } }],
  }));
  assert.equal(writableCdrom.method, "BlockMigration");
});

Deno.test("migratability: LiveMigratable shows the first blocker, the storage condition all but volumes'", () => {
  // The storage condition's message joins every blocker except those about volumes.
  const m = migratability(vmi({
    ...podBridge,
    domain: {
      ...podBridge.domain!,
      cpu: { model: "host-model" },
      devices: { ...podBridge.domain!.devices, hostDevices: [{}] },
    },
    volumes: [{ name: "h", hostDisk: { path: "/x", type: "Disk" } }],
  }));
  assert.deepEqual(m.blockers.map((b) => b.reason), [
    "InterfaceNotLiveMigratable",
    "CPUModeLiveMigratable",
    "HostDeviceNotLiveMigratable",
    "DisksNotLiveMigratable",
  ]);
  assert.equal(m.storageBlockers.length, 3);
  assert.match(
    joinBlockers(m.storageBlockers),
    /^InterfaceNotLiveMigratable: .*, CPUModeLiveMigratable: .*, HostDeviceNotLiveMigratable: VMI uses a PCI host devices$/,
  );
});

/**
 * Mediated devices made to order from `mediatedDevicesConfiguration` (mod/node/mdev_types.ts),
 * on a sysfs fixture whose `create` and `remove` attributes act as the kernel's do: a UUID
 * written to a type's `create` makes the device (its link under `bus/mdev/devices`, its type
 * and IOMMU group), `1` written to a device's `remove` takes it away.
 *
 * @module
 */
import assert from "node:assert/strict";
import { dirname, join } from "node:path";
import {
  configureMdevTypes,
  desiredMdevTypes,
  externallyProvidedMdevTypes,
} from "../../mod/node/mod.ts";
import { HostDeviceConfiguration } from "../../mod/node/mod.ts";
import type { PermanentDevice } from "../../mod/node/mod.ts";

interface Fixture {
  sys: string;
  writes: string[];
  write: (path: string, value: string) => void;
  uuid: () => string;
  /** A parent PCI device offering these types: ID to [name, available instances]. */
  parent(address: string, types: Record<string, [string, number]>): Promise<void>;
  /** An existing mediated device of `type` on `parent`. */
  mdev(uuid: string, parent: string, type: string): Promise<void>;
  /** The UUIDs under bus/mdev/devices. */
  mdevs(): string[];
  cleanup(): Promise<void>;
}

async function fixture(): Promise<Fixture> {
  const sys = await Deno.makeTempDir({ prefix: "virtnode-mdev-" });
  const devices = join(sys, "devices/pci0000:00");
  const bus = join(sys, "bus/mdev/devices");
  await Deno.mkdir(bus, { recursive: true });
  await Deno.mkdir(join(sys, "class/mdev_bus"), { recursive: true });
  let group = 100;
  let next = 0;
  const makeMdev = (uuid: string, parent: string, type: string) => {
    const dir = join(devices, parent, uuid);
    Deno.mkdirSync(dir, { recursive: true });
    Deno.symlinkSync(`../mdev_supported_types/${type}`, join(dir, "mdev_type"));
    Deno.symlinkSync(`../../../../kernel/iommu_groups/${group++}`, join(dir, "iommu_group"));
    Deno.symlinkSync(`../../../devices/pci0000:00/${parent}/${uuid}`, join(bus, uuid));
  };
  const writes: string[] = [];
  return {
    sys,
    writes,
    uuid: () => `00000000-0000-4000-8000-${String(++next).padStart(12, "0")}`,
    write(path, value) {
      const rel = path.slice(sys.length + 1);
      writes.push(`${rel} <- ${value}`);
      const parts = rel.split("/");
      if (parts[0] === "class" && parts.at(-1) === "create") {
        // class/mdev_bus/<parent>/mdev_supported_types/<type>/create
        makeMdev(value, parts[2], parts[4]);
      } else if (parts[0] === "bus" && parts.at(-1) === "remove") {
        const link = join(sys, dirname(rel));
        const real = join(dirname(link), Deno.readLinkSync(link));
        Deno.removeSync(link);
        Deno.removeSync(real, { recursive: true });
      } else {
        throw new Error(`unexpected write to ${rel}`);
      }
    },
    async parent(address, types) {
      const real = join(devices, address);
      for (const [id, [name, instances]] of Object.entries(types)) {
        const dir = join(real, "mdev_supported_types", id);
        await Deno.mkdir(dir, { recursive: true });
        await Deno.writeTextFile(join(dir, "name"), `${name}\n`);
        await Deno.writeTextFile(join(dir, "available_instances"), `${instances}\n`);
      }
      await Deno.writeTextFile(join(real, "numa_node"), "0\n");
      await Deno.symlink(
        `../../devices/pci0000:00/${address}`,
        join(sys, "class/mdev_bus", address),
      );
      // The PCI view the plugins read the NUMA node from.
      await Deno.mkdir(join(sys, "bus/pci/devices"), { recursive: true });
      await Deno.symlink(
        `../../../devices/pci0000:00/${address}`,
        join(sys, "bus/pci/devices", address),
      );
    },
    async mdev(uuid, parent, type) {
      makeMdev(uuid, parent, type);
      await Promise.resolve();
    },
    mdevs: () => [...Deno.readDirSync(bus)].map((e) => e.name).sort(),
    cleanup: () => Deno.remove(sys, { recursive: true }),
  };
}

Deno.test("desired mdev types: the node's matching entries, else the top-level list, either spelling", () => {
  const config = {
    mediatedDeviceTypes: ["nvidia-222", "nvidia-222"],
    nodeMediatedDeviceTypes: [
      { nodeSelector: { "gpu": "t4" }, mediatedDeviceTypes: ["nvidia-231"] },
      { nodeSelector: { "gpu": "t4", "zone": "a" }, mediatedDevicesTypes: ["nvidia-232"] },
      { nodeSelector: { "gpu": "a10" }, mediatedDeviceTypes: ["nvidia-500"] },
    ],
  };
  assert.deepEqual(desiredMdevTypes(config, { gpu: "t4" }), ["nvidia-231"]);
  assert.deepEqual(desiredMdevTypes(config, { gpu: "t4", zone: "a" }), [
    "nvidia-231",
    "nvidia-232",
  ]);
  // No entry selects the node: the top-level list, once each.
  assert.deepEqual(desiredMdevTypes(config, { gpu: "none" }), ["nvidia-222"]);
  assert.deepEqual(desiredMdevTypes({ mediatedDevicesTypes: ["i915-GVTg_V5_4"] }, {}), [
    "i915-GVTg_V5_4",
  ]);
  assert.deepEqual(desiredMdevTypes(undefined, {}), []);
  assert.deepEqual(
    [...externallyProvidedMdevTypes({
      mediatedDevices: [
        { mdevNameSelector: "GRID T4-1Q", resourceName: "a", externalResourceProvider: true },
        { mdevNameSelector: "GRID T4-2Q", resourceName: "b" },
      ],
    })],
    ["GRID_T4-1Q"],
  );
});

function options(f: Fixture) {
  return { sysRoot: f.sys, write: f.write, uuid: f.uuid };
}

/** The parents of the tests below, with an existing device on A, B and E. */
async function cards(f: Fixture): Promise<void> {
  // A: a device of a type nobody wants. B: a device of a wanted type. C and D: free, offering
  // both wanted types. E: a device of an externally provided type.
  await f.parent("0000:3a:00.0", { "nvidia-100": ["GRID T4-4Q", 1] });
  await f.parent("0000:3b:00.0", { "nvidia-232": ["GRID T4-2Q", 1] });
  for (const free of ["0000:3c:00.0", "0000:3d:00.0"]) {
    await f.parent(free, { "nvidia-231": ["GRID T4-1Q", 2], "nvidia-232": ["GRID T4-2Q", 1] });
  }
  await f.parent("0000:3e:00.0", { "nvidia-300": ["GRID T4-8Q", 1] });
  await f.mdev("aaaaaaaa-0000-4000-8000-000000000001", "0000:3a:00.0", "nvidia-100");
  await f.mdev("bbbbbbbb-0000-4000-8000-000000000001", "0000:3b:00.0", "nvidia-232");
  await f.mdev("eeeeeeee-0000-4000-8000-000000000001", "0000:3e:00.0", "nvidia-300");
}

Deno.test("mediated devices made to order: unwanted removed, parents filled, a second pass changes nothing", async () => {
  // External and configured parents are kept, and each free parent gets one type.
  // With no configuration, all but the externally provided devices are removed.
  const f = await fixture();
  try {
    await cards(f);
    // One type wanted by ID, one by name (spaces as "_"); one externally provided.
    const external = new Set(["GRID_T4-8Q"]);
    const first = configureMdevTypes(["nvidia-232", "GRID_T4-1Q"], external, options(f));
    assert.deepEqual(first.errors, []);
    assert.deepEqual(first.removed, ["aaaaaaaa-0000-4000-8000-000000000001"]);
    // B is configured already; C and D are free: each type takes one, filled to its
    // available instances. A, now free, offers nothing wanted.
    assert.deepEqual(first.created, [
      {
        type: "nvidia-231",
        parent: "0000:3c:00.0",
        uuids: ["00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002"],
      },
      {
        type: "nvidia-232",
        parent: "0000:3d:00.0",
        uuids: ["00000000-0000-4000-8000-000000000003"],
      },
    ]);
    assert.deepEqual(f.writes, [
      "bus/mdev/devices/aaaaaaaa-0000-4000-8000-000000000001/remove <- 1",
      "class/mdev_bus/0000:3c:00.0/mdev_supported_types/nvidia-231/create <- 00000000-0000-4000-8000-000000000001",
      "class/mdev_bus/0000:3c:00.0/mdev_supported_types/nvidia-231/create <- 00000000-0000-4000-8000-000000000002",
      "class/mdev_bus/0000:3d:00.0/mdev_supported_types/nvidia-232/create <- 00000000-0000-4000-8000-000000000003",
    ]);
    assert.equal(f.mdevs().length, 5);

    // The same configuration again (the next heartbeat): nothing to do.
    const again = configureMdevTypes(["nvidia-232", "GRID_T4-1Q"], external, options(f));
    assert.deepEqual([again.removed, again.created, again.errors], [[], [], []]);
    assert.equal(f.writes.length, 4);

    // No configuration: as in KubeVirt, every device not externally provided goes.
    const none = configureMdevTypes([], external, options(f));
    assert.equal(none.removed.length, 4);
    assert.deepEqual(none.created, []);
    assert.deepEqual(f.mdevs(), ["eeeeeeee-0000-4000-8000-000000000001"]);
  } finally {
    await f.cleanup();
  }
});

Deno.test("a parent whose creation fails is reported and the other types are still made", async () => {
  const f = await fixture();
  try {
    await cards(f);
    const result = configureMdevTypes(["nvidia-231", "nvidia-232"], new Set(), {
      ...options(f),
      write: (path, value) => {
        if (path.includes("0000:3c:00.0")) throw new Error("Device or resource busy");
        f.write(path, value);
      },
    });
    assert.deepEqual(result.errors, [
      "Cannot create mediated devices of type nvidia-231 on 0000:3c:00.0: Device or resource busy",
    ]);
    assert.deepEqual(result.created.map((c) => [c.type, c.parent, c.uuids.length]), [
      ["nvidia-232", "0000:3d:00.0", 1],
    ]);
  } finally {
    await f.cleanup();
  }
});

Deno.test("host-device configuration: mediated devices wait for the node's labels and follow the gate", async () => {
  // The device plugins serve what was made.
  const f = await fixture();
  try {
    await cards(f);
    const served: (readonly PermanentDevice[])[] = [];
    const config = new HostDeviceConfiguration(
      { setHostDevices: (devices) => served.push(devices) },
      { sysRoot: f.sys, mdev: { write: f.write, uuid: f.uuid } },
    );
    const keys = {
      permittedHostDevices: {
        mediatedDevices: [{ mdevNameSelector: "GRID T4-1Q", resourceName: "nvidia.com/T4_1Q" }],
      },
      mediatedDevicesConfiguration: {
        nodeMediatedDeviceTypes: [{
          nodeSelector: { gpu: "t4" },
          mediatedDeviceTypes: ["nvidia-231"],
        }],
      },
    };
    // The gate on: devices are left as they are, the plugins still follow the configuration.
    config.configure({ ...keys, mdevHandling: false });
    config.nodeLabels({ gpu: "t4" });
    assert.equal(f.writes.length, 0);
    assert.deepEqual(served.at(-1)!.map((d) => d.resourceName), []);
    // Handling on, labels known: the one type takes every free parent offering it, round
    // after round (C, then D: two devices each); all four are served.
    config.configure({ ...keys, mdevHandling: true });
    assert.equal(f.writes.filter((w) => w.includes("/nvidia-231/create <- ")).length, 4);
    const plugin = served.at(-1)!.find((d) => d.resourceName === "nvidia.com/T4_1Q");
    assert.equal(plugin?.ids?.length, 4);
    // Labels that select no entry, and no top-level list: every device goes (none is
    // externally provided here), as in KubeVirt, and the plugin with them.
    config.nodeLabels({ gpu: "none" });
    assert.deepEqual(f.mdevs(), []);
    assert.deepEqual(served.at(-1)!.map((d) => d.resourceName), []);
  } finally {
    await f.cleanup();
  }
});

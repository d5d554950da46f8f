/**
 * KubeVirt's permanent device plugins against a test kubelet that speaks the real
 * v1beta1 protocol over unix sockets: a grpc-js `v1beta1.Registration` server on a
 * temporary `kubelet.sock`, and `v1beta1.DevicePlugin` clients dialing the plugins'
 * sockets. Device nodes are plain files under a temporary device root.
 */

import * as grpc from "@grpc/grpc-js";
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  DevicePluginManager,
  type DevicePluginManagerOptions,
  discoverPciHostDevices,
  hostDevicePlugins,
  pciSelectors,
  PERMANENT_DEVICES,
} from "../../mod/node/mod.ts";
import {
  type AllocateResponse,
  type DevicePluginClient,
  type ListAndWatchResponse,
  newDevicePluginClient,
  type PreferredAllocationResponse,
  type RegisterRequest,
  registrationService,
} from "../../mod/proto/mod.ts";
import { type ServiceError, unixTarget } from "../../mod/proto/mod.ts";

const grpcTest = { sanitizeOps: false, sanitizeResources: false };

/** The kubelet's side of registration, nothing more. */
class TestKubelet {
  readonly registrations: RegisterRequest[] = [];
  readonly socketPath: string;
  #server: grpc.Server | undefined;

  constructor(dir: string) {
    this.socketPath = join(dir, "kubelet.sock");
  }

  async start(): Promise<this> {
    const server = new grpc.Server();
    server.addService(registrationService(), {
      Register: (
        call: grpc.ServerUnaryCall<RegisterRequest, unknown>,
        callback: grpc.sendUnaryData<unknown>,
      ) => {
        this.registrations.push(call.request);
        callback(null, {});
      },
    });
    await new Promise<void>((resolve, reject) =>
      server.bindAsync(
        unixTarget(this.socketPath),
        grpc.ServerCredentials.createInsecure(),
        (error) => error ? reject(error) : resolve(),
      )
    );
    this.#server = server;
    return this;
  }

  stop(): void {
    this.#server?.forceShutdown();
    this.#server = undefined;
  }

  resources(): string[] {
    return this.registrations.map((r) => r.resource_name).sort();
  }
}

async function waitFor(what: string, cond: () => boolean, timeoutMs = 10_000): Promise<number> {
  const started = performance.now();
  while (!cond()) {
    if (performance.now() - started > timeoutMs) throw new Error(`Timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
  return performance.now() - started;
}

/** Collects a ListAndWatch stream's messages. */
function watch(client: DevicePluginClient) {
  const messages: ListAndWatchResponse[] = [];
  const stream = client.ListAndWatch({});
  let ended = false;
  stream.on("data", (m: ListAndWatchResponse) => messages.push(m));
  stream.on("error", () => ended = true);
  stream.on("end", () => ended = true);
  return { messages, stream, ended: () => ended };
}

function unary<Res>(
  call: (cb: (error: ServiceError | null, response?: Res) => void) => unknown,
): Promise<Res> {
  return new Promise((resolve, reject) =>
    call((error, response) => error ? reject(error) : resolve(response!))
  );
}

interface Env {
  dir: string;
  pluginDir: string;
  deviceRoot: string;
  kubelet: TestKubelet;
  manager: DevicePluginManager;
  /** Runs the manager until {@linkcode Env.stop}. */
  start(): void;
  /** Stops the manager and waits for it (a no-op when it is not running). */
  stop(): Promise<void>;
}

async function setup(
  devices: string[],
  options: DevicePluginManagerOptions = {},
  startKubelet = true,
): Promise<Env> {
  const dir = await Deno.makeTempDir({ prefix: "virtnode-dp-" });
  const pluginDir = join(dir, "device-plugins");
  const deviceRoot = join(dir, "root");
  await Deno.mkdir(pluginDir);
  for (const device of devices) {
    await Deno.mkdir(join(deviceRoot, device, ".."), { recursive: true });
    await Deno.writeTextFile(join(deviceRoot, device), "");
  }
  const kubelet = new TestKubelet(pluginDir);
  if (startKubelet) await kubelet.start();
  const manager = new DevicePluginManager({
    pluginDir,
    deviceRoot,
    maxDevices: 5,
    backoffMs: [100, 200],
    pollIntervalMs: 60_000,
    // Unless told: the permanent devices this test made a node for (each plugin registers
    // whether its node exists or not; the first tests show that with all of them).
    devices: PERMANENT_DEVICES.filter((d) => devices.includes(d.path.slice(1))),
    ...options,
  });
  let running: { stop: AbortController; done: Promise<void> } | undefined;
  return {
    dir,
    pluginDir,
    deviceRoot,
    kubelet,
    manager,
    start() {
      const stop = new AbortController();
      running = { stop, done: manager.run(stop.signal) };
    },
    async stop() {
      running?.stop.abort();
      await running?.done;
      running = undefined;
    },
  };
}

/**
 * Stops everything and removes the test's directory. The directory reads here are
 * synchronous on purpose: Deno 2.9.3 closes a node:net unix socket's descriptor twice
 * (tests/repro/pipe_double_close.ts), and a directory that Deno's blocking pool reads at that
 * moment can lose its descriptor, which Deno answers with a panic ("unexpected error during
 * closedir"). A synchronous read runs on this thread, between the socket's two closes never.
 */
async function teardown(env: Env): Promise<void> {
  await env.stop();
  env.kubelet.stop();
  Deno.removeSync(env.dir, { recursive: true });
}

Deno.test(
  "every permanent plugin registers with the kubelet; an absent device's are listed Unhealthy",
  grpcTest,
  async () => {
    // No /dev/vhost-net here: its plugin registers all the same, as KubeVirt's does, so
    // the node shows the resource with nothing allocatable.
    const env = await setup(["dev/kvm", "dev/net/tun"], { devices: PERMANENT_DEVICES });
    const vhost = newDevicePluginClient(join(env.pluginDir, "kubevirt-vhost-net.sock"));
    try {
      const started = performance.now();
      env.start();
      await waitFor(
        "three registrations",
        () => env.kubelet.registrations.length === 3 && env.manager.allRegistered(),
      );
      const ms = performance.now() - started;
      console.log(`  start to the three plugins registered: ${ms.toFixed(0)} ms`);
      assert.deepEqual(env.kubelet.resources(), [
        "devices.kubevirt.io/kvm",
        "devices.kubevirt.io/tun",
        "devices.kubevirt.io/vhost-net",
      ]);
      const kvm = env.kubelet.registrations.find((r) => r.resource_name.endsWith("/kvm"))!;
      assert.equal(kvm.version, "v1beta1");
      assert.equal(kvm.endpoint, "kubevirt-kvm.sock");
      assert.equal(kvm.options?.pre_start_required, false);
      const info = await Deno.stat(join(env.pluginDir, "kubevirt-kvm.sock"));
      assert.equal(info.isSocket, true);
      assert.equal(info.mode! & 0o777, 0o600);
      const w = watch(vhost);
      await waitFor("vhost-net's list", () => w.messages.length === 1);
      assert.equal(w.messages[0].devices.length, 5);
      assert.ok(w.messages[0].devices.every((d) => d.health === "Unhealthy"));
      w.stream.cancel();
      // Stopped plugins take their sockets with them.
      await env.stop();
      const left = [...Deno.readDirSync(env.pluginDir)].map((e) => e.name);
      assert.deepEqual(left, ["kubelet.sock"]);
    } finally {
      vhost.close();
      await teardown(env);
    }
  },
);

Deno.test("a device that appears later turns its plugin's devices Healthy", grpcTest, async () => {
  const env = await setup(["dev/kvm"], { pollIntervalMs: 100, devices: PERMANENT_DEVICES });
  const vhost = newDevicePluginClient(join(env.pluginDir, "kubevirt-vhost-net.sock"));
  try {
    env.start();
    await waitFor("three registrations", () => env.kubelet.registrations.length === 3);
    await waitFor("vhost-net registered", () => env.manager.allRegistered());
    const w = watch(vhost);
    await waitFor("vhost-net's first list", () => w.messages.length === 1);
    assert.ok(w.messages[0].devices.every((d) => d.health === "Unhealthy"));
    await Deno.writeTextFile(join(env.deviceRoot, "dev/vhost-net"), "");
    await waitFor("vhost-net's Healthy list", () => w.messages.length === 2);
    assert.ok(w.messages[1].devices.every((d) => d.health === "Healthy"));
    // Registered once: the device's coming is a health change, not a new plugin.
    assert.equal(env.kubelet.registrations.length, 3);
    w.stream.cancel();
  } finally {
    vhost.close();
    await teardown(env);
  }
});

Deno.test(
  "ListAndWatch reports a device Unhealthy when its node goes and Healthy when it returns",
  grpcTest,
  async () => {
    const env = await setup(["dev/kvm"]);
    const client = newDevicePluginClient(join(env.pluginDir, "kubevirt-kvm.sock"));
    try {
      env.start();
      await waitFor(
        "registration",
        () => env.manager.plugins.length > 0 && env.manager.allRegistered(),
      );
      const w = watch(client);
      await waitFor("the first list", () => w.messages.length === 1);
      assert.deepEqual(w.messages[0].devices.map((d) => [d.ID, d.health]), [
        ["kvm0", "Healthy"],
        ["kvm1", "Healthy"],
        ["kvm2", "Healthy"],
        ["kvm3", "Healthy"],
        ["kvm4", "Healthy"],
      ]);
      // The poll is 60 s here: the watch on the parent directory must do the work.
      await Deno.remove(join(env.deviceRoot, "dev/kvm"));
      const goneMs = await waitFor("the Unhealthy list", () => w.messages.length === 2);
      assert.ok(w.messages[1].devices.every((d) => d.health === "Unhealthy"));
      assert.equal(w.messages[1].devices.length, 5);
      await Deno.writeTextFile(join(env.deviceRoot, "dev/kvm"), "");
      const backMs = await waitFor("the Healthy list", () => w.messages.length === 3);
      assert.ok(w.messages[2].devices.every((d) => d.health === "Healthy"));
      console.log(
        `  health pushed after removal: ${goneMs.toFixed(0)} ms, after restore: ${
          backMs.toFixed(0)
        } ms`,
      );
      await env.stop();
      // On stop the kubelet gets an empty list, then the stream ends.
      await waitFor("the stream to end", () => w.ended());
      assert.deepEqual(w.messages[w.messages.length - 1].devices, []);
    } finally {
      client.close();
      await teardown(env);
    }
  },
);

Deno.test(
  "the periodic stat catches a device change when no watch event comes",
  grpcTest,
  async () => {
    // The device lives in a directory created after the plugin started watching: a
    // renamed-in parent is invisible to the watch, only the stat sees it.
    const env = await setup(["dev/net/tun"], { pollIntervalMs: 150 });
    const client = newDevicePluginClient(join(env.pluginDir, "kubevirt-tun.sock"));
    try {
      env.start();
      await waitFor(
        "registration",
        () => env.manager.plugins.length > 0 && env.manager.allRegistered(),
      );
      const w = watch(client);
      await waitFor("the first list", () => w.messages.length === 1);
      await Deno.rename(join(env.deviceRoot, "dev/net"), join(env.deviceRoot, "dev/net.old"));
      await waitFor("the Unhealthy list", () => w.messages.length === 2);
      assert.ok(w.messages[1].devices.every((d) => d.health === "Unhealthy"));
      await Deno.rename(join(env.deviceRoot, "dev/net.old"), join(env.deviceRoot, "dev/net"));
      await waitFor("the Healthy list", () => w.messages.length === 3);
      assert.ok(w.messages[2].devices.every((d) => d.health === "Healthy"));
    } finally {
      client.close();
      await teardown(env);
    }
  },
);

Deno.test("Allocate returns the device node with rw permissions", grpcTest, async () => {
  const env = await setup(["dev/kvm", "dev/net/tun"]);
  const kvm = newDevicePluginClient(join(env.pluginDir, "kubevirt-kvm.sock"));
  const tun = newDevicePluginClient(join(env.pluginDir, "kubevirt-tun.sock"));
  try {
    env.start();
    await waitFor(
      "registration",
      () => env.manager.allRegistered() && env.manager.plugins.length === 2,
    );
    const options = await unary((cb) => kvm.GetDevicePluginOptions({}, cb));
    assert.deepEqual(options, {
      pre_start_required: false,
      get_preferred_allocation_available: false,
    });
    const response = await unary<AllocateResponse>((cb) =>
      kvm.Allocate(
        { container_requests: [{ devices_ids: ["kvm0"] }, { devices_ids: ["kvm3"] }] },
        cb,
      )
    );
    assert.equal(response.container_responses.length, 2);
    for (const container of response.container_responses) {
      assert.deepEqual(container.devices, [
        { container_path: "/dev/kvm", host_path: "/dev/kvm", permissions: "rw" },
      ]);
      assert.deepEqual(container.mounts, []);
    }
    const tunResponse = await unary<AllocateResponse>((cb) =>
      tun.Allocate({ container_requests: [{ devices_ids: ["tun1"] }] }, cb)
    );
    assert.deepEqual(tunResponse.container_responses[0].devices, [
      { container_path: "/dev/net/tun", host_path: "/dev/net/tun", permissions: "rw" },
    ]);
    await assert.rejects(
      unary((cb) => kvm.Allocate({ container_requests: [{ devices_ids: ["tun0"] }] }, cb)),
      (error: grpc.ServiceError) =>
        error.code === grpc.status.INVALID_ARGUMENT &&
        /unknown device IDs "tun0"/.test(error.details),
    );
    const preferred = await unary<PreferredAllocationResponse>((cb) =>
      kvm.GetPreferredAllocation({
        container_requests: [{
          available_deviceIDs: ["kvm0", "kvm1", "kvm2"],
          must_include_deviceIDs: ["kvm2"],
          allocation_size: 2,
        }],
      }, cb)
    );
    assert.deepEqual(preferred.container_responses, [{ deviceIDs: ["kvm2", "kvm0"] }]);
    assert.deepEqual(await unary((cb) => kvm.PreStartContainer({ devices_ids: ["kvm0"] }, cb)), {});
  } finally {
    kvm.close();
    tun.close();
    await teardown(env);
  }
});

Deno.test(
  "plugins register again after the kubelet wipes its directory and restarts",
  grpcTest,
  async () => {
    const env = await setup(["dev/kvm", "dev/net/tun"], { backoffMs: undefined });
    try {
      env.start();
      await waitFor("registration", () => env.kubelet.registrations.length === 2);
      // A kubelet restart: the old one goes, the directory is emptied, a new one serves.
      env.kubelet.stop();
      // Synchronous on purpose: see teardown().
      for (const entry of Deno.readDirSync(env.pluginDir)) {
        // A plugin may remove its own socket meanwhile (it sees the kubelet go).
        try {
          Deno.removeSync(join(env.pluginDir, entry.name));
        } catch (error) {
          if (!(error instanceof Deno.errors.NotFound)) throw error;
        }
      }
      const started = performance.now();
      await waitFor("plugins to notice", () => !env.manager.allRegistered());
      const kubelet = await new TestKubelet(env.pluginDir).start();
      env.kubelet = kubelet;
      await waitFor("re-registration", () => kubelet.registrations.length === 2, 15_000);
      console.log(
        `  wipe to both plugins registered again (default backoff): ${
          (performance.now() - started).toFixed(0)
        } ms`,
      );
      assert.deepEqual(kubelet.resources(), ["devices.kubevirt.io/kvm", "devices.kubevirt.io/tun"]);
      // The kubelet records the request before the plugin has its answer.
      await waitFor(
        "the plugins to see their registration answered",
        () => env.manager.allRegistered(),
      );
      // The plugin serves on its re-created socket.
      const client = newDevicePluginClient(join(env.pluginDir, "kubevirt-kvm.sock"));
      try {
        const w = watch(client);
        await waitFor("a list from the new socket", () => w.messages.length === 1);
        w.stream.cancel();
      } finally {
        client.close();
      }
    } finally {
      await teardown(env);
    }
  },
);

Deno.test("a re-created kubelet socket alone also triggers registration", grpcTest, async () => {
  const env = await setup(["dev/kvm"]);
  try {
    env.start();
    await waitFor("registration", () => env.kubelet.registrations.length === 1);
    env.kubelet.stop();
    await Deno.remove(env.kubelet.socketPath).catch(() => {});
    const kubelet = await new TestKubelet(env.pluginDir).start();
    env.kubelet = kubelet;
    await waitFor("re-registration", () => kubelet.registrations.length === 1);
    await waitFor("the plugin to count it", () => env.manager.plugins[0].registrations === 2);
    assert.equal(env.manager.plugins[0].registrations, 2);
  } finally {
    await teardown(env);
  }
});

Deno.test("a plugin retries with backoff until a kubelet answers", grpcTest, async () => {
  const env = await setup(["dev/kvm"], {}, false);
  try {
    env.start();
    // Deliberate: with no kubelet for a while (a few backoff rounds) nothing registers.
    await new Promise((r) => setTimeout(r, 400));
    assert.equal(env.manager.allRegistered(), false);
    await env.kubelet.start();
    await waitFor("registration", () => env.kubelet.registrations.length === 1);
    // The kubelet records the request before the plugin has its answer.
    await waitFor(
      "the plugin to see its registration answered",
      () => env.manager.plugins.length > 0 && env.manager.allRegistered(),
    );
    assert.equal(env.kubelet.registrations.length, 1);
  } finally {
    await teardown(env);
  }
});

/** A sysfs PCI device: its uevent, driver and IOMMU group links, NUMA node. */
async function pciDevice(
  sysRoot: string,
  address: string,
  o: { pciId: string; driver?: string; group?: string; numa?: number },
): Promise<void> {
  const dir = join(sysRoot, "bus/pci/devices", address);
  await Deno.mkdir(dir, { recursive: true });
  await Deno.writeTextFile(
    join(dir, "uevent"),
    `DRIVER=${o.driver ?? ""}\nPCI_CLASS=30000\nPCI_ID=${o.pciId}\nPCI_SLOT_NAME=${address}\n`,
  );
  if (o.driver) await Deno.symlink(`../../../bus/pci/drivers/${o.driver}`, join(dir, "driver"));
  if (o.group) {
    await Deno.symlink(`../../../kernel/iommu_groups/${o.group}`, join(dir, "iommu_group"));
  }
  await Deno.writeTextFile(join(dir, "numa_node"), `${o.numa ?? -1}\n`);
}

Deno.test(
  "permitted PCI host devices: one plugin per resource, IOMMU groups as devices, VFIO on Allocate",
  grpcTest,
  async () => {
    // Only devices on vfio-pci count. Allocate gives KubeVirt's variable and
    // the VFIO nodes, and the plugins follow changes to the configuration.
    const env = await setup(["dev/kvm", "dev/vfio/vfio", "dev/vfio/12", "dev/vfio/13"]);
    const sysRoot = join(env.dir, "sys");
    const gpu = newDevicePluginClient(join(env.pluginDir, "kubevirt-nvidia.com-TU104GL.sock"));
    try {
      // Two of the permitted ID on vfio-pci, one on another driver, one without a group, one
      // of an ID nobody permits.
      await pciDevice(sysRoot, "0000:65:00.0", {
        pciId: "10DE:1EB8",
        driver: "vfio-pci",
        group: "12",
        numa: 1,
      });
      await pciDevice(sysRoot, "0000:66:00.0", {
        pciId: "10DE:1EB8",
        driver: "vfio-pci",
        group: "13",
      });
      await pciDevice(sysRoot, "0000:67:00.0", {
        pciId: "10DE:1EB8",
        driver: "nvidia",
        group: "14",
      });
      await pciDevice(sysRoot, "0000:68:00.0", { pciId: "10DE:1EB8", driver: "vfio-pci" });
      await pciDevice(sysRoot, "0000:69:00.0", {
        pciId: "8086:1572",
        driver: "vfio-pci",
        group: "15",
      });
      const permitted = {
        pciHostDevices: [
          { pciVendorSelector: "10de:1eb8", resourceName: "nvidia.com/TU104GL" },
          {
            pciVendorSelector: "8086:1572",
            resourceName: "intel.com/x710",
            externalResourceProvider: true,
          },
        ],
      };
      const found = discoverPciHostDevices(pciSelectors(permitted), sysRoot);
      assert.deepEqual(Object.fromEntries(found), {
        "nvidia.com/TU104GL": [
          { address: "0000:65:00.0", iommuGroup: "12", numaNode: 1 },
          { address: "0000:66:00.0", iommuGroup: "13", numaNode: -1 },
        ],
      });
      env.start();
      await waitFor("kvm registration", () => env.kubelet.registrations.length === 1);
      env.manager.setHostDevices(hostDevicePlugins(permitted, { sysRoot }));
      await waitFor(
        "the GPU resource's registration",
        () => env.kubelet.resources().includes("nvidia.com/TU104GL"),
      );
      const listed = watch(gpu);
      await waitFor("the device list", () => listed.messages.length > 0);
      assert.deepEqual(listed.messages[0].devices, [
        { ID: "12", health: "Healthy", topology: { nodes: [{ ID: "1" }] } },
        { ID: "13", health: "Healthy", topology: null },
      ]);
      const allocated = await unary<AllocateResponse>((cb) =>
        gpu.Allocate({ container_requests: [{ devices_ids: ["13", "12"] }] }, cb)
      );
      assert.deepEqual(allocated.container_responses[0].envs, {
        PCI_RESOURCE_NVIDIA_COM_TU104GL: "0000:66:00.0,0000:65:00.0",
      });
      assert.deepEqual(allocated.container_responses[0].devices.map((d) => d.host_path), [
        "/dev/vfio/vfio",
        "/dev/vfio/13",
        "/dev/vfio/vfio",
        "/dev/vfio/12",
      ]);
      // The configuration no longer permits it: the plugin stops and its socket goes.
      env.manager.setHostDevices(hostDevicePlugins({}, { sysRoot }));
      await waitFor("the GPU plugin's socket gone", () => {
        try {
          Deno.statSync(join(env.pluginDir, "kubevirt-nvidia.com-TU104GL.sock"));
          return false;
        } catch {
          return true;
        }
      });
      assert.deepEqual(env.manager.plugins.map((p) => p.resourceName), ["devices.kubevirt.io/kvm"]);
      listed.stream.cancel();
    } finally {
      gpu.close();
      await teardown(env);
    }
  },
);

Deno.test(
  "permitted mediated devices: one plugin per type, IOMMU groups as devices, UUIDs on Allocate",
  grpcTest,
  async () => {
    // Devices carry the parent's NUMA node, Allocate gives the UUIDs in
    // KubeVirt's variable, and a group whose VFIO node went fails the allocation.
    const env = await setup(["dev/vfio/vfio", "dev/vfio/20"]);
    const sysRoot = join(env.dir, "sys");
    const grid = newDevicePluginClient(join(env.pluginDir, "kubevirt-nvidia.com-GRID_T4-1Q.sock"));
    try {
      // Two mdevs of type "GRID T4-1Q" under one parent GPU, one of another type.
      const parent = "0000:3b:00.0";
      await Deno.mkdir(join(sysRoot, "bus/pci/devices", parent), { recursive: true });
      await Deno.writeTextFile(join(sysRoot, "bus/pci/devices", parent, "numa_node"), "0\n");
      const mdev = async (uuid: string, typeName: string, group: string) => {
        const real = join(sysRoot, "devices/pci0000:3a", parent, uuid);
        await Deno.mkdir(join(real, "mdev_type"), { recursive: true });
        await Deno.writeTextFile(join(real, "mdev_type/name"), `${typeName}\n`);
        await Deno.symlink(`../../../kernel/iommu_groups/${group}`, join(real, "iommu_group"));
        await Deno.mkdir(join(sysRoot, "bus/mdev/devices"), { recursive: true });
        await Deno.symlink(
          `../../../devices/pci0000:3a/${parent}/${uuid}`,
          join(sysRoot, "bus/mdev/devices", uuid),
        );
      };
      await mdev("4b20d080-1b54-4048-85b3-a6a62d165c01", "GRID T4-1Q", "20");
      await mdev("4b20d080-1b54-4048-85b3-a6a62d165c02", "GRID T4-1Q", "21");
      await mdev("4b20d080-1b54-4048-85b3-a6a62d165c03", "GRID T4-2Q", "22");
      const permitted = {
        mediatedDevices: [{
          mdevNameSelector: "GRID T4-1Q",
          resourceName: "nvidia.com/GRID_T4-1Q",
        }],
      };
      env.start();
      env.manager.setHostDevices(
        hostDevicePlugins(permitted, { sysRoot, deviceRoot: env.deviceRoot }),
      );
      await waitFor(
        "the mdev resource's registration",
        () => env.kubelet.resources().includes("nvidia.com/GRID_T4-1Q"),
      );
      const listed = watch(grid);
      await waitFor("the device list", () => listed.messages.length > 0);
      assert.deepEqual(listed.messages[0].devices, [
        { ID: "20", health: "Healthy", topology: { nodes: [{ ID: "0" }] } },
        { ID: "21", health: "Healthy", topology: { nodes: [{ ID: "0" }] } },
      ]);
      const allocated = await unary<AllocateResponse>((cb) =>
        grid.Allocate({ container_requests: [{ devices_ids: ["20"] }] }, cb)
      );
      assert.deepEqual(allocated.container_responses[0].envs, {
        // KubeVirt's name: only "/" and "." become "_".
        "MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-1Q": "4b20d080-1b54-4048-85b3-a6a62d165c01",
      });
      assert.deepEqual(allocated.container_responses[0].devices.map((d) => d.host_path), [
        "/dev/vfio/vfio",
        "/dev/vfio/20",
      ]);
      // Group 21 has no VFIO node on this host: KubeVirt refuses the allocation.
      await assert.rejects(
        unary((cb) => grid.Allocate({ container_requests: [{ devices_ids: ["21"] }] }, cb)),
        (error: grpc.ServiceError) =>
          error.code === grpc.status.INTERNAL &&
          /Failed to allocate resource nvidia.com\/GRID_T4-1Q/.test(error.details),
      );
      listed.stream.cancel();
    } finally {
      grid.close();
      await teardown(env);
    }
  },
);

Deno.test(
  "permitted USB devices: one device set per selector, nodes handed to user 107, stable IDs",
  grpcTest,
  async () => {
    // Allocate gives KubeVirt's bus:device variable and hands the nodes beneath the
    // device root to user 107; reading the configuration again keeps the same IDs.
    const env = await setup(["dev/bus/usb/001/004", "dev/bus/usb/001/005", "dev/bus/usb/002/007"]);
    const sysRoot = join(env.dir, "sys");
    const keys = newDevicePluginClient(join(env.pluginDir, "kubevirt-kubevirt.io-token.sock"));
    try {
      const usb = async (name: string, product: string, bus: number, dev: number) => {
        const dir = join(sysRoot, "bus/usb/devices", name);
        await Deno.mkdir(dir, { recursive: true });
        const [vendor, prod] = product.split(":");
        await Deno.writeTextFile(join(dir, "idVendor"), `${vendor}\n`);
        await Deno.writeTextFile(
          join(dir, "uevent"),
          `MAJOR=189\nDEVNAME=bus/usb/${String(bus).padStart(3, "0")}/${
            String(dev).padStart(3, "0")
          }\nDEVTYPE=usb_device\nPRODUCT=${vendor}/${prod}/100\nBUSNUM=${bus}\nDEVNUM=${dev}\n`,
        );
      };
      // Two tokens and a reader; a root hub (a controller) is left out.
      await usb("1-1", "1050:0407", 1, 4);
      await usb("1-2", "1050:0407", 1, 5);
      await usb("2-1", "072f:b100", 2, 7);
      await usb("usb1", "1d6b:0002", 1, 1);
      const permitted = {
        usb: [{
          resourceName: "kubevirt.io/token",
          selectors: [{ vendor: "1050", product: "0407" }, { vendor: "072f", product: "b100" }],
        }],
      };
      // One complete set only: the second token has no reader left to pair with.
      const first = hostDevicePlugins(permitted, { sysRoot, deviceRoot: env.deviceRoot });
      assert.deepEqual(first.map((d) => d.ids), [[{ id: "kubevirt.io/token-1.4", numaNode: -1 }]]);
      assert.deepEqual(
        hostDevicePlugins(permitted, { sysRoot, deviceRoot: env.deviceRoot }).map((d) => d.ids),
        first.map((d) => d.ids),
      );
      env.start();
      env.manager.setHostDevices(first);
      await waitFor(
        "the USB resource's registration",
        () => env.kubelet.resources().includes("kubevirt.io/token"),
      );
      const allocated = await unary<AllocateResponse>((cb) =>
        keys.Allocate({ container_requests: [{ devices_ids: ["kubevirt.io/token-1.4"] }] }, cb)
      );
      assert.deepEqual(allocated.container_responses[0].envs, {
        USB_RESOURCE_KUBEVIRT_IO_TOKEN: "1:4,2:7",
      });
      assert.deepEqual(allocated.container_responses[0].devices, [
        {
          container_path: "/dev/bus/usb/001/004",
          host_path: "/dev/bus/usb/001/004",
          permissions: "mrw",
        },
        {
          container_path: "/dev/bus/usb/002/007",
          host_path: "/dev/bus/usb/002/007",
          permissions: "mrw",
        },
      ]);
      assert.equal((await Deno.lstat(join(env.deviceRoot, "dev/bus/usb/001/004"))).uid, 107);
      assert.equal((await Deno.lstat(join(env.deviceRoot, "dev/bus/usb/001/005"))).uid, 0);
      // A node that is a symlink out of the device root is refused, its target untouched.
      const outside = await Deno.makeTempFile();
      await Deno.remove(join(env.deviceRoot, "dev/bus/usb/002/007"));
      await Deno.symlink(outside, join(env.deviceRoot, "dev/bus/usb/002/007"));
      await assert.rejects(
        unary((cb) =>
          keys.Allocate({ container_requests: [{ devices_ids: ["kubevirt.io/token-1.4"] }] }, cb)
        ),
        (error: grpc.ServiceError) => error.code === grpc.status.INTERNAL,
      );
      assert.equal((await Deno.lstat(outside)).uid, 0);
      await Deno.remove(outside);
    } finally {
      keys.close();
      await teardown(env);
    }
  },
);

/**
 * The VirtualMachineOptions the handler sends with SyncVirtualMachine: KubeVirt's
 * defaults, the host's NUMA topology read from a sysfs tree, and the interfaces' domain
 * attachment.
 */
import assert from "node:assert/strict";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { hostTopology, topologyJson, virtualMachineOptions } from "../../mod/handler/testing.ts";
import { parseCpuList } from "../../mod/domain/mod.ts";

async function write(path: string, text: string): Promise<void> {
  await Deno.mkdir(path.slice(0, path.lastIndexOf("/")), { recursive: true });
  await Deno.writeTextFile(path, text);
}

Deno.test("parseCpuList() reads Linux CPU lists and refuses garbage", () => {
  assert.deepEqual(parseCpuList("0-3,8,10-11\n"), [0, 1, 2, 3, 8, 10, 11]);
  assert.deepEqual(parseCpuList(""), []);
  assert.throws(() => parseCpuList("a-b"), /Cannot read the CPU list "a-b"/);
});

Deno.test("hostTopology() reads NUMA cells, page pools, distances and thread siblings from sysfs", async () => {
  const sys = await Deno.makeTempDir({ prefix: "virtnode-sysfs-" });
  try {
    const node = (n: number) => `${sys}/devices/system/node/node${n}`;
    for (const n of [0, 1]) {
      await write(
        `${node(n)}/meminfo`,
        `Node ${n} MemTotal:        2097152 kB\nNode ${n} MemFree: 1 kB\n`,
      );
      await write(`${node(n)}/distance`, n === 0 ? "10 21\n" : "21 10\n");
      await write(`${node(n)}/cpulist`, n === 0 ? "0-1\n" : "2-3\n");
      await write(`${node(n)}/hugepages/hugepages-2048kB/nr_hugepages`, n === 0 ? "256\n" : "0\n");
      await write(`${node(n)}/hugepages/hugepages-1048576kB/nr_hugepages`, "0\n");
    }
    for (const [cpu, siblings] of [[0, "0-1"], [1, "0-1"], [2, "2"], [3, "3"]] as const) {
      await write(
        `${sys}/devices/system/cpu/cpu${cpu}/topology/thread_siblings_list`,
        `${siblings}\n`,
      );
    }
    const cells = hostTopology(sys);
    assert.equal(cells.length, 2);
    assert.deepEqual(cells[0], {
      id: 0,
      memory: { amount: "2097152", unit: "KiB" },
      pages: [
        // 2 GiB less 256 huge pages of 2 MiB, in 4 KiB pages.
        { count: String((2097152 - 256 * 2048) / 4), unit: "KiB", size: 4 },
        { count: "256", unit: "KiB", size: 2048 },
        { count: "0", unit: "KiB", size: 1048576 },
      ],
      distances: [{ id: 0, value: "10" }, { id: 1, value: "21" }],
      cpus: [{ id: 0, siblings: [0, 1] }, { id: 1, siblings: [0, 1] }],
    });
    assert.deepEqual(cells[1].cpus, [{ id: 2, siblings: [2] }, { id: 3, siblings: [3] }]);
    assert.deepEqual(hostTopology(`${sys}/missing`), [], "no NUMA nodes, no cells");
  } finally {
    await Deno.remove(sys, { recursive: true });
  }
});

Deno.test("virtualMachineOptions() carries KubeVirt's defaults and a tap attachment for bridge and masquerade", () => {
  const vmi = {
    metadata: { name: "vm1", namespace: "default", uid: "u1" },
    spec: {
      domain: {
        devices: {
          interfaces: [
            { name: "default", masquerade: {} },
            { name: "br", bridge: {} },
            { name: "sr", sriov: {} },
          ],
        },
      },
    },
  } as unknown as VirtualMachineInstance;
  const options = virtualMachineOptions(vmi, []);
  assert.deepEqual(options.VirtualMachineSMBios, {
    manufacturer: "KubeVirt",
    product: "None",
    version: "",
    sku: "",
    family: "KubeVirt",
  });
  assert.equal(options.MemBalloonStatsPeriod, 10);
  assert.deepEqual(options.interfaceDomainAttachment, { default: "tap", br: "tap" });
  assert.deepEqual(options.clusterConfig, {
    ExpandDisksEnabled: false,
    FreePageReportingDisabled: false,
    BochsDisplayForEFIGuests: true,
    SerialConsoleLogDisabled: false,
  });
  assert.deepEqual(options.topology, { numa_cells: [] });
});

Deno.test("topologyJson(): the host's topology as Go's encoder writes cmd.v1.Topology, for targetNodeTopology", () => {
  const json = topologyJson([
    {
      id: 0,
      memory: { amount: "2097152", unit: "KiB" },
      pages: [{ count: "0", unit: "KiB", size: 1048576 }, {
        count: "256",
        unit: "KiB",
        size: 2048,
      }],
      distances: [{ id: 0, value: "10" }, { id: 1, value: "21" }],
      cpus: [{ id: 0, siblings: [0, 1] }, { id: 1, siblings: [0, 1] }],
    },
    {
      id: 1,
      memory: { amount: "1048576", unit: "KiB" },
      pages: [],
      distances: [],
      cpus: [{ id: 2, siblings: [] }],
    },
  ]);
  // Numbers as numbers; zero values and empty lists left out (omitempty), as in Go.
  assert.equal(
    json,
    '{"numa_cells":[{"memory":{"amount":2097152,"unit":"KiB"},' +
      '"pages":[{"unit":"KiB","size":1048576},{"count":256,"unit":"KiB","size":2048}],' +
      '"distances":[{"value":10},{"id":1,"value":21}],' +
      '"cpus":[{"siblings":[0,1]},{"id":1,"siblings":[0,1]}]},' +
      '{"id":1,"memory":{"amount":1048576,"unit":"KiB"},"cpus":[{"id":2}]}]}',
  );
  assert.equal(topologyJson([]), "{}");
});

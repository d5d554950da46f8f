/**
 * Downward metrics: vhostmd's XML in KubeVirt's layout from a launcher's statistics and the
 * node's files, the request a guest sends, and the handler's side of the channel against a
 * socket that listens as QEMU's does.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  downwardMetrics,
  downwardMetricsXml,
  hostDownwardMetrics,
  isDownwardMetricsRequest,
  VHOSTMD_DISK_SIZE,
  vhostmdWrite,
} from "../../mod/metrics/mod.ts";
import { DownwardMetricsChannels } from "../../mod/handler/testing.ts";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";

const FACTS = {
  stat: "cpu  1000 50 250 9000 10 0 5 0 0 0\ncpu0 500 25 125 4500 5 0 2 0 0 0\n",
  meminfo: [
    "MemTotal:       16000000 kB",
    "MemFree:         4000000 kB",
    "Buffers:          100000 kB",
    "Cached:          2000000 kB",
    "SwapCached:            0 kB",
    "SwapTotal:       1000000 kB",
    "SwapFree:         900000 kB",
  ].join("\n"),
  vmstat: "pgpgin 10\npswpin 3\npswpout 5\n",
  packageIds: ["0", "0", "1", "1"],
  pageSize: 4096,
  now: 1_700_000_000,
};

Deno.test("downwardMetricsXml() lays out KubeVirt's metrics of the node and the VM as vhostmd's XML", () => {
  const host = hostDownwardMetrics(FACTS);
  const xml = downwardMetricsXml(downwardMetrics({
    nodeName: "node1",
    qemuVersion: "QEMU 7.2.19",
    stats: {
      NrVirtCpu: 2,
      Vcpu: [{ Time: 1_500_000_000 }, { Time: 500_000_000 }],
      Memory: { ActualBalloonSet: true, ActualBalloon: 131072 },
    },
    host,
  }));
  const lines = xml.split("\n");
  assert.equal(lines[0], "<metrics>");
  assert.equal(lines.at(-1), "</metrics>");
  assert.deepEqual(lines.slice(1, 5), [
    '  <metric type="string" context="host">',
    "    <name>HostName</name>",
    "    <value>node1</value>",
    "  </metric>",
  ]);
  const value = (name: string) =>
    new RegExp(`<metric ([^>]*)>\\n    <name>${name}</name>\\n    <value>([^<]*)</value>`)
      .exec(xml)?.slice(1);
  assert.deepEqual(value("VirtProductInfo"), ['type="string" context="host"', "QEMU 7.2.19"]);
  assert.deepEqual(value("TotalCPUTime"), ['type="real64" context="vm" unit="s"', "2.000000"]);
  assert.deepEqual(value("ResourceProcessorLimit"), ['type="uint64" context="vm"', "2"]);
  assert.deepEqual(value("ResourceMemoryLimit"), [
    'type="uint64" context="vm" unit="KiB"',
    "131072",
  ]);
  assert.deepEqual(value("NumberOfPhysicalCPUs"), ['type="int64" context="host"', "2"]);
  // The node's user, nice and system ticks, at 100 a second.
  assert.match(
    xml,
    /<metric type="real64" context="host" unit="s">\n {4}<name>TotalCPUTime<\/name>\n {4}<value>13\.000000<\/value>/,
  );
  assert.deepEqual(value("FreePhysicalMemory"), [
    'type="uint64" context="host" unit="KiB"',
    "4000000",
  ]);
  assert.deepEqual(value("FreeVirtualMemory")?.[1], "4900000");
  assert.deepEqual(value("MemoryAllocatedToVirtualServers")?.[1], "9900000");
  assert.deepEqual(value("UsedVirtualMemory")?.[1], "10900000");
  assert.deepEqual(value("PagedInMemory")?.[1], "12");
  assert.deepEqual(value("PagedOutMemory")?.[1], "20");
  assert.deepEqual(value("Time"), ['type="int64" context="host" unit="s"', "1700000000"]);
  // A name with XML's own characters is escaped.
  assert.match(
    downwardMetricsXml([{ type: "string", context: "host", name: "HostName", value: "a<b&c" }]),
    /<value>a&lt;b&amp;c<\/value>/,
  );
});

Deno.test("isDownwardMetricsRequest() takes GET /metrics/XML only", () => {
  assert.equal(isDownwardMetricsRequest("GET /metrics/XML"), true);
  assert.equal(isDownwardMetricsRequest("GET /metrics/XML?x=1"), true);
  for (
    const bad of [
      "PUT /metrics/XML",
      "GET /metrics/xml",
      "GET",
      "GET metrics/XML",
      "GET /metrics/XML HTTP/1.1",
      "",
    ]
  ) {
    assert.equal(isDownwardMetricsRequest(bad), false, bad);
  }
});

Deno.test("DownwardMetricsChannels answers a guest's requests on QEMU's socket, a bad one with INVALID REQUEST", async () => {
  const dir = await Deno.makeTempDir({ prefix: "virtnode-dm-" });
  const path = join(dir, "downwardmetrics.sock");
  const listener = Deno.listen({ transport: "unix", path });
  const vmi = {
    metadata: { namespace: "ns", name: "vm1", uid: "uid-1" },
    spec: { domain: { devices: { downwardMetrics: {} } } },
    status: { phase: "Running" },
  } as unknown as VirtualMachineInstance;
  let vmis = [vmi];
  const channels = new DownwardMetricsChannels({
    nodeName: "node1",
    vmis: () => vmis,
    open: () => Promise.resolve({ path, release: () => {} }),
    launcher: () =>
      Promise.resolve({
        getDomainStats: () => Promise.resolve({ Vcpu: [{ Time: 1e9 }], Memory: {} }),
        getQemuVersion: () => Promise.resolve("QEMU 7.2.19"),
      }),
    refreshMs: 50,
  });
  const stop = new AbortController();
  const running = channels.run(stop.signal);
  try {
    // The handler connects, as to QEMU's listening socket.
    const guest = await listener.accept();
    const read = async (until: string) => {
      let text = "";
      const buffer = new Uint8Array(65536);
      while (!text.endsWith(until)) {
        const n = await guest.read(buffer);
        if (n === null) throw new Error(`closed after ${JSON.stringify(text)}`);
        text += new TextDecoder().decode(buffer.subarray(0, n));
      }
      return text;
    };
    const asked = performance.now();
    await guest.write(new TextEncoder().encode("GET /metrics/XML\n\n"));
    const answer = await read("</metrics>\n\n");
    assert.match(answer, /<name>HostName<\/name>\n {4}<value>node1<\/value>/);
    assert.match(answer, /<value>QEMU 7\.2\.19<\/value>/);
    await guest.write(new TextEncoder().encode("GET /nothing\n\n"));
    assert.equal(await read("\n\n"), "INVALID REQUEST\n\n");
    // One request a second at most: the second answer comes a second after the first ask.
    assert.ok(performance.now() - asked >= 995, "a second between answers");
    assert.deepEqual(channels.serving, ["uid-1"]);
    // The VMI gone: its channel is closed.
    vmis = [];
    const buffer = new Uint8Array(16);
    assert.equal(await guest.read(buffer), null);
    guest.close();
  } finally {
    stop.abort();
    await running;
    listener.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("vhostmdWrite() lays a report out as vhostmd's disk: mvbd, flag, byte sum, length, body", () => {
  const w = vhostmdWrite("<metrics>é</metrics>");
  const body = new TextEncoder().encode("<metrics>é</metrics>\n");
  assert.deepEqual(w.body, body);
  const sum = body.reduce((a, b) => a + b, 0);
  const header = (flag: number) => {
    const bytes = new Uint8Array(16);
    bytes.set([0x6d, 0x76, 0x62, 0x64]); // "mvbd"
    new DataView(bytes.buffer).setInt32(4, flag);
    new DataView(bytes.buffer).setInt32(8, sum);
    new DataView(bytes.buffer).setInt32(12, body.length);
    return bytes;
  };
  assert.deepEqual(w.locked, header(1), "written first: busy");
  assert.deepEqual(w.unlocked, header(0), "written last: ready");
  // A report past the disk's 256 KiB (less KubeVirt's 24 bytes) is refused, not cut.
  assert.throws(
    () => vhostmdWrite("x".repeat(VHOSTMD_DISK_SIZE - 24)),
    /do not fit the vhostmd disk's 262120/,
  );
});

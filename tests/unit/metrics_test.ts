import assert from "node:assert/strict";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { describeRequest, WorkQueue } from "../../mod/kube/mod.ts";
import { addHandlerSamples, addVmiSamples, Exposition } from "../../mod/metrics/mod.ts";
import { deviceAliases, parseNetDev } from "../../mod/launcher/mod.ts";

const vmi = {
  apiVersion: "kubevirt.io/v1",
  kind: "VirtualMachineInstance",
  metadata: {
    name: "vm1",
    namespace: "ns1",
    labels: { "app.kubernetes.io/name": "web", "kubevirt.io/size": "small" },
  },
  spec: { domain: { devices: {} } },
  status: { nodeName: "node1", phase: "Running" },
} as unknown as VirtualMachineInstance;

Deno.test("Exposition writes HELP and TYPE once per family, escapes label values, leaves empty families out", () => {
  const exp = new Exposition();
  const spec = { name: "a_total", help: "A \\ count\nof things", type: "counter" as const };
  exp.sample(spec, { x: 'quo"te\\back\nline' }, 1);
  exp.sample(spec, { x: "two" }, 2.5);
  exp.sample({ name: "b", help: "b", type: "gauge" }, {}, NaN);
  assert.equal(
    exp.toString(),
    [
      "# HELP a_total A \\\\ count\\nof things",
      "# TYPE a_total counter",
      'a_total{x="quo\\"te\\\\back\\nline"} 1',
      'a_total{x="two"} 2.5',
      "# HELP b b",
      "# TYPE b gauge",
      "b NaN",
      "",
    ].join("\n"),
  );
  assert.throws(
    () => exp.sample({ name: "a_total", help: "", type: "gauge" }, {}, 1),
    /both counter and gauge/,
  );
  assert.throws(
    () => exp.sample({ name: "bad-name", help: "", type: "gauge" }, {}, 1),
    /Invalid metric name/,
  );
  assert.equal(new Exposition().toString(), "");
});

Deno.test("Exposition writes a histogram's buckets cumulatively with +Inf, _sum and _count", () => {
  const exp = new Exposition();
  exp.histogram({ name: "h_seconds", help: "h", type: "histogram" }, { name: "q" }, {
    bounds: [0.1, 1],
    counts: [2, 3],
    overflow: 1,
    sum: 4.5,
  });
  assert.deepEqual(exp.toString().split("\n").slice(2, 7), [
    'h_seconds_bucket{name="q",le="0.1"} 2',
    'h_seconds_bucket{name="q",le="1"} 5',
    'h_seconds_bucket{name="q",le="+Inf"} 6',
    'h_seconds_sum{name="q"} 4.5',
    'h_seconds_count{name="q"} 6',
  ]);
});

Deno.test("addVmiSamples() converts KiB and ns to bytes and seconds, names by alias, skips unset values", () => {
  // Drives and interfaces are named by their alias.
  const exp = new Exposition();
  addVmiSamples(exp, vmi, {
    Cpu: {
      TimeSet: true,
      Time: 2_500_000_000,
      UserSet: false,
      User: 0,
      SystemSet: true,
      System: 1e9,
    },
    Memory: {
      RSSSet: true,
      RSS: 1024,
      AvailableSet: false,
      Available: 0,
      MajorFaultSet: true,
      MajorFault: 7,
    },
    Vcpu: [{
      StateSet: true,
      State: 1,
      TimeSet: true,
      Time: 1e9,
      WaitSet: false,
      DelaySet: true,
      Delay: 5e8,
    }],
    Block: [
      {
        NameSet: true,
        Name: "vda",
        Alias: "boot",
        RdBytesSet: true,
        RdBytes: 4096,
        WrTimesSet: true,
        WrTimes: 2e9,
      },
      { NameSet: false, Name: "", RdBytesSet: true, RdBytes: 1 },
    ],
    Net: [{
      NameSet: true,
      Name: "tap0",
      AliasSet: true,
      Alias: "default",
      RxBytesSet: true,
      RxBytes: 10,
      TxBytesSet: true,
      TxBytes: 20,
    }],
  }, [{
    diskName: "vda1",
    mountPoint: "/",
    fileSystemType: "ext4",
    totalBytes: 100,
    usedBytes: 40,
  }]);
  const lines = exp.toString().split("\n").filter((l) => l && !l.startsWith("#"));
  const base =
    'node="node1",namespace="ns1",name="vm1",kubernetes_vmi_label_app_kubernetes_io_name="web",kubernetes_vmi_label_kubevirt_io_size="small"';
  assert.deepEqual(lines, [
    `kubevirt_vmi_cpu_usage_seconds_total{${base}} 2.5`,
    `kubevirt_vmi_cpu_system_usage_seconds_total{${base}} 1`,
    `kubevirt_vmi_vcpu_seconds_total{${base},id="0",state="running"} 1`,
    `kubevirt_vmi_vcpu_delay_seconds_total{${base},id="0"} 0.5`,
    `kubevirt_vmi_memory_resident_bytes{${base}} 1048576`,
    `kubevirt_vmi_memory_pgmajfault_total{${base}} 7`,
    `kubevirt_vmi_storage_read_traffic_bytes_total{${base},drive="boot"} 4096`,
    `kubevirt_vmi_storage_write_times_seconds_total{${base},drive="boot"} 2`,
    `kubevirt_vmi_network_traffic_bytes_total{${base},interface="default",type="rx"} 10`,
    `kubevirt_vmi_network_traffic_bytes_total{${base},interface="default",type="tx"} 20`,
    `kubevirt_vmi_network_receive_bytes_total{${base},interface="default"} 10`,
    `kubevirt_vmi_network_transmit_bytes_total{${base},interface="default"} 20`,
    `kubevirt_vmi_filesystem_capacity_bytes{${base},disk_name="vda1",mount_point="/",file_system_type="ext4"} 100`,
    `kubevirt_vmi_filesystem_used_bytes{${base},disk_name="vda1",mount_point="/",file_system_type="ext4"} 40`,
  ]);
});

Deno.test("addVmiSamples() counts the vCPUs' allowed host CPUs and gives the dirty rate in bytes", () => {
  const exp = new Exposition();
  // Two vCPUs on a 4-CPU host: the first pinned to CPU 2, the second free on all four.
  addVmiSamples(
    exp,
    vmi,
    {
      CPUMapSet: true,
      CPUMap: [[false, false, true, false], [true, true, true, true]],
    },
    [],
    3,
  );
  const base =
    'node="node1",namespace="ns1",name="vm1",kubernetes_vmi_label_app_kubernetes_io_name="web",kubernetes_vmi_label_kubevirt_io_size="small"';
  const text = exp.toString();
  assert.match(text, /# TYPE kubevirt_vmi_node_cpu_affinity gauge/);
  assert.match(text, /# TYPE kubevirt_vmi_dirty_rate_bytes_per_second gauge/);
  const lines = text.split("\n").filter((l) => l && !l.startsWith("#"));
  assert.deepEqual(lines, [
    `kubevirt_vmi_node_cpu_affinity{${base}} 5`,
    `kubevirt_vmi_dirty_rate_bytes_per_second{${base}} 3145728`,
  ]);
  // No map from the launcher, no measurement: no samples, never a 0.
  const none = new Exposition();
  addVmiSamples(none, vmi, { CPUMapSet: false, CPUMap: null });
  assert.equal(none.toString().split("\n").filter((l) => l && !l.startsWith("#")).length, 0);
});

Deno.test("describeRequest() gives KubeVirt's resource and verb and a URL template without names", () => {
  assert.deepEqual(
    describeRequest(
      "GET",
      "/apis/kubevirt.io/v1/namespaces/ns1/virtualmachineinstances/vm1",
      false,
    ),
    {
      resource: "virtualmachineinstances",
      verb: "get",
      url: "/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachineinstances/{name}",
    },
  );
  assert.equal(
    describeRequest("GET", "/apis/kubevirt.io/v1/virtualmachineinstances", true).verb,
    "watch",
  );
  assert.equal(
    describeRequest("GET", "/apis/kubevirt.io/v1/virtualmachineinstances", false).verb,
    "list",
  );
  assert.deepEqual(describeRequest("PATCH", "/api/v1/nodes/node1/status", false), {
    resource: "nodes",
    verb: "patch",
    url: "/api/v1/nodes/{name}/status",
  });
  assert.equal(describeRequest("POST", "/api/v1/namespaces/ns1/events", false).verb, "create");
});

Deno.test("WorkQueue.stats() counts adds and retries and times waiting and work", async () => {
  const q = new WorkQueue<string>();
  q.add("a");
  q.add("a"); // deduplicated: not an add
  q.add("b");
  assert.equal(q.stats().depth, 2);
  const key = await q.get();
  await new Promise((r) => setTimeout(r, 20));
  const during = q.stats();
  assert.ok(during.longestRunningSeconds >= 0.015, String(during.longestRunningSeconds));
  q.addRateLimited(key!);
  q.done(key!);
  const s = q.stats();
  assert.equal(s.adds, 2);
  assert.equal(s.retries, 1);
  assert.equal(s.depth, 1);
  assert.equal(s.workDuration.counts.reduce((a, b) => a + b, 0) + s.workDuration.overflow, 1);
  assert.ok(s.workDuration.sum >= 0.015);
  assert.equal(s.unfinishedWorkSeconds, 0);
  const exp = new Exposition();
  addHandlerSamples(exp, {
    info: { goversion: "deno2.9.3", kubeversion: "v1.7.0+virtnode.0.1.0" },
    machineTypes: { node: "node1", deprecated: ["pc-i440fx-1.4", "pc-i440fx-1.5"] },
    ready: true,
    syncs: { success: 3, error: 1 },
    queue: s,
    requests: [],
    latencies: [],
    refused: { domain: 2, k8s_event: 0 },
  });
  const text = exp.toString();
  assert.match(text, /^kubevirt_virt_handler_ready_status 1$/m);
  assert.match(text, /^# TYPE kubevirt_info gauge$/m);
  assert.match(
    text,
    /^kubevirt_info\{goversion="deno2\.9\.3",kubeversion="v1\.7\.0\+virtnode\.0\.1\.0"\} 1$/m,
  );
  assert.match(
    text,
    /^kubevirt_node_deprecated_machine_types\{machine_type="pc-i440fx-1\.5",node="node1"\} 1$/m,
  );
  assert.match(text, /^virtnode_notify_refused_total\{kind="domain"\} 2$/m);
  assert.match(text, /^kubevirt_workqueue_adds_total\{name="virt-handler-vm"\} 2$/m);
  assert.match(text, /^kubevirt_virt_handler_vmi_syncs_total\{result="error"\} 1$/m);
  q.shutDown();
});

Deno.test("parseNetDev() reads /proc/net/dev and deviceAliases() maps targets to the VMI's names", () => {
  const dev = [
    "Inter-|   Receive                                                |  Transmit",
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed",
    "    lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0",
    "  tap0:    1500      10    1    2    0     0          0         0     3000      20    3    4    0     0       0          0",
  ].join("\n");
  const tap = parseNetDev(dev).get("tap0")!;
  assert.deepEqual(tap, {
    rxBytes: 1500,
    rxPackets: 10,
    rxErrors: 1,
    rxDropped: 2,
    txBytes: 3000,
    txPackets: 20,
    txErrors: 3,
    txDropped: 4,
  });
  const xml =
    "<domain><devices><disk type='file'><target dev='vda' bus='virtio'/><alias name='ua-boot'/></disk>" +
    "<interface type='ethernet'><target dev='vn0123' managed='no'/><alias name='ua-default'/></interface>" +
    "<disk type='file'><target dev='sda'/><alias name='scsi0-0-0-0'/></disk></devices></domain>";
  assert.deepEqual([...deviceAliases(xml)], [["vda", "boot"], ["vn0123", "default"]]);
});

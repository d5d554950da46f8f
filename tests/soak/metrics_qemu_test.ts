/**
 * The handler's `/metrics` with QEMU (pod-less): ten test guests on the pod network, a
 * scrape over TLS as Prometheus makes it of virt-handler's port, checked by promtool (from
 * Debian's prometheus package), and every family a guest without a migration can have
 * present with a sample for each VMI, with KubeVirt's labels (the filesystem families from
 * the test guest's agent). KubeVirt v1.7.0's own alerts and recording rules (from its
 * monitoring packages) find every handler family they name in the scrape, and
 * `promtool test rules` evaluates them over it.
 */
import assert from "node:assert/strict";
import https from "node:https";
import { useCluster } from "../../deploy/cluster/cluster.ts";
import { promtoolCheck, promtoolTestRules } from "../helpers/promtool.ts";
import {
  familiesNamedByRules,
  kubevirtMonitoring,
  writeRulesTest,
} from "../helpers/kubevirt_rules.ts";
import { runText } from "../helpers/command.ts";
import { ensureLibvirtd } from "../helpers/libvirtd.ts";
import { guestVmi, installTestGuest } from "../helpers/guest.ts";
import {
  createVmi,
  deleteVmi,
  getVmi,
  killLaunchers,
  kubeClient,
  removeTestPodNetwork,
  startHandlerProcess,
  testPodNetwork,
  waitFor,
} from "../helpers/handler_process.ts";
import { makeCertificates } from "../helpers/rest_client.ts";

const BOOT_MS = 240_000;
const COUNT = 10;

/**
 * Families every running test guest has: CPU, vCPU, memory (with the balloon driver),
 * storage, and network (read in the pod's namespace, where the host's libvirtd cannot).
 */
const PER_VMI_FAMILIES = [
  "kubevirt_vmi_cpu_usage_seconds_total",
  "kubevirt_vmi_cpu_user_usage_seconds_total",
  "kubevirt_vmi_cpu_system_usage_seconds_total",
  "kubevirt_vmi_vcpu_seconds_total",
  "kubevirt_vmi_memory_resident_bytes",
  "kubevirt_vmi_memory_available_bytes",
  "kubevirt_vmi_memory_unused_bytes",
  "kubevirt_vmi_memory_usable_bytes",
  "kubevirt_vmi_memory_actual_balloon_bytes",
  "kubevirt_vmi_memory_domain_bytes",
  "kubevirt_vmi_memory_swap_in_traffic_bytes",
  "kubevirt_vmi_memory_swap_out_traffic_bytes",
  "kubevirt_vmi_memory_pgmajfault_total",
  "kubevirt_vmi_memory_pgminfault_total",
  "kubevirt_vmi_storage_iops_read_total",
  "kubevirt_vmi_storage_iops_write_total",
  "kubevirt_vmi_storage_read_traffic_bytes_total",
  "kubevirt_vmi_storage_write_traffic_bytes_total",
  "kubevirt_vmi_storage_read_times_seconds_total",
  "kubevirt_vmi_storage_write_times_seconds_total",
  "kubevirt_vmi_storage_flush_requests_total",
  "kubevirt_vmi_storage_flush_times_seconds_total",
  "kubevirt_vmi_network_receive_bytes_total",
  "kubevirt_vmi_network_transmit_bytes_total",
  "kubevirt_vmi_network_receive_packets_total",
  "kubevirt_vmi_network_transmit_packets_total",
  "kubevirt_vmi_network_receive_errors_total",
  "kubevirt_vmi_network_transmit_errors_total",
  "kubevirt_vmi_network_receive_packets_dropped_total",
  "kubevirt_vmi_network_transmit_packets_dropped_total",
  // The test guest's agent lists its /boot and /data filesystems.
  "kubevirt_vmi_filesystem_capacity_bytes",
  "kubevirt_vmi_filesystem_used_bytes",
  "kubevirt_vmi_network_traffic_bytes_total",
  // libvirt's vCPU pinning, and the dirty rate the launcher measures over a second.
  "kubevirt_vmi_node_cpu_affinity",
  "kubevirt_vmi_dirty_rate_bytes_per_second",
];

/** The handler's own families. */
const HANDLER_FAMILIES = [
  "kubevirt_info",
  // Debian 12's QEMU 7.2 calls its oldest machine types deprecated (libvirt's capabilities).
  "kubevirt_node_deprecated_machine_types",
  "kubevirt_virt_handler_ready_status",
  "kubevirt_virt_handler_vmi_syncs_total",
  "kubevirt_workqueue_depth",
  "kubevirt_workqueue_adds_total",
  "kubevirt_workqueue_retries_total",
  "kubevirt_workqueue_queue_duration_seconds",
  "kubevirt_workqueue_work_duration_seconds",
  "kubevirt_workqueue_unfinished_work_seconds",
  "kubevirt_workqueue_longest_running_processor_seconds",
  "kubevirt_rest_client_requests_total",
  "kubevirt_rest_client_request_latency_seconds",
];

function scrape(port: number, ca: string): Promise<{ status: number; type: string; body: string }> {
  return new Promise((resolve, reject) => {
    https.get({
      host: "127.0.0.1",
      port,
      path: "/metrics",
      ca,
      checkServerIdentity: () => undefined,
      agent: false,
    }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (c: string) => body += c);
      res.on("end", () =>
        resolve({
          status: res.statusCode ?? 0,
          type: String(res.headers["content-type"]),
          body,
        }));
    }).on("error", reject);
  });
}

/** Sample lines by family (histograms' series under their family's name). */
function samplesOf(text: string): Map<string, string[]> {
  const families = new Map<string, string[]>();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const name = /^[a-zA-Z_:][a-zA-Z0-9_:]*/.exec(line)![0].replace(/_(bucket|sum|count)$/, "");
    const known = families.get(name) ?? [];
    known.push(line);
    families.set(name, known);
  }
  return families;
}

Deno.test("metrics+QEMU (pod-less): a TLS scrape with ten guests passes promtool check metrics", async () => {
  // The scrape must hold each guest's CPU, vCPU, memory, storage,
  // network and filesystem families as well as the handler's own.
  const uri = await ensureLibvirtd();
  const cluster = await useCluster();
  const client = await kubeClient(cluster.kubeconfigPath);
  const id = crypto.randomUUID().slice(0, 8);
  const ns = `metrics-${id}`;
  const node = `metrics-node-${id}`;
  const network = testPodNetwork();
  await client.request("POST", "/api/v1/namespaces", { metadata: { name: ns } });
  const dir = await Deno.makeTempDir({ prefix: "virtnode-metrics-" });
  await installTestGuest(`${dir}/state/images`);
  const certs = await makeCertificates(dir);
  const h = await startHandlerProcess({
    kubeconfig: cluster.handlerKubeconfigPath,
    nodeName: node,
    libvirtUri: uri,
    dir,
    podNetwork: network,
    extraArgs: ["--health-tls", "--server-cert-dir", certs.serverDir],
    healthCa: certs.ca,
  });
  // The helper gives the handler its health address; with --health-tls it speaks TLS.
  const healthPort = Number(new URL(h.health).port);
  const names = Array.from({ length: COUNT }, (_, i) => `vm${i}`);
  try {
    for (const name of names) {
      const vmi = guestVmi(name, node, { namespace: ns, binding: "masquerade" });
      vmi.metadata.labels = {
        "app.kubernetes.io/name": "metrics-test",
        "kubevirt.io/size": "small",
      };
      await createVmi(client, vmi);
    }
    await waitFor(
      `${COUNT} VMIs Running`,
      async () => {
        const phases = await Promise.all(
          names.map(async (n) => (await getVmi(client, ns, n))?.status?.phase),
        );
        return phases.every((p) => p === "Running");
      },
      BOOT_MS,
      1_000,
    );

    // The balloon driver reports its statistics once the guests' kernels have loaded it.
    let text = "";
    await waitFor(
      "every guest's memory and network statistics",
      async () => {
        const r = await scrape(healthPort, certs.ca);
        assert.equal(r.status, 200);
        assert.match(r.type, /^text\/plain; version=0\.0\.4/);
        text = r.body;
        const samples = samplesOf(text);
        return PER_VMI_FAMILIES.every((f) =>
          names.every((n) => (samples.get(f) ?? []).some((l) => l.includes(`name="${n}"`)))
        );
      },
      BOOT_MS,
      2_000,
    ).catch((error) => {
      const samples = samplesOf(text);
      const missing = PER_VMI_FAMILIES.filter((f) =>
        !names.every((n) => (samples.get(f) ?? []).some((l) => l.includes(`name="${n}"`)))
      );
      throw new Error(`Families missing a guest: ${missing.join(", ")}`, { cause: error });
    });

    // KubeVirt names a VMI label `kubernetes_vmi_label_<label>` with only `.`, `/` and `-`
    // replaced, so `kubevirt.io/nodeName` (on every VMI) keeps its capital, which promtool's
    // lint calls camelCase; virt-handler's own scrape draws the same complaint. The scrape
    // must pass whole but for that one complaint, and pass outright without those labels.
    const whole = await promtoolCheck(text);
    const others = whole.complaints.split("\n").filter((l) =>
      l && !/label names should be written in 'snake_case' not 'camelCase'$/.test(l)
    );
    assert.deepEqual(others, [], `promtool check metrics: ${whole.complaints}`);
    const stripped = text.replace(/,kubernetes_vmi_label_[a-zA-Z0-9_]+="[^"]*"/g, "");
    const clean = await promtoolCheck(stripped);
    assert.ok(clean.ok, `promtool check metrics (VMI labels left out): ${clean.complaints}`);
    assert.equal(clean.complaints.trim(), "");

    const samples = samplesOf(text);
    for (const f of HANDLER_FAMILIES) assert.ok(samples.get(f)?.length, `${f} has samples`);
    const resident = samples.get("kubevirt_vmi_memory_resident_bytes")!.find((l) =>
      l.includes('name="vm3"')
    )!;
    assert.match(resident, new RegExp(`node="${node}"`));
    assert.match(resident, new RegExp(`namespace="${ns}"`));
    assert.match(resident, /kubernetes_vmi_label_app_kubernetes_io_name="metrics-test"/);
    assert.match(resident, /kubernetes_vmi_label_kubevirt_io_size="small"/);
    assert.ok(Number(resident.split(" ").at(-1)) > 1024 * 1024, resident);
    const drive = samples.get("kubevirt_vmi_storage_read_traffic_bytes_total")!.find((l) =>
      l.includes('name="vm3"')
    )!;
    assert.match(drive, /drive="boot"/);
    const bootFs = samples.get("kubevirt_vmi_filesystem_capacity_bytes")!.find((l) =>
      l.includes('name="vm3"') && l.includes('mount_point="/boot"')
    )!;
    assert.match(bootFs, /file_system_type="vfat"/);
    assert.ok(Number(bootFs.split(" ").at(-1)) > 1_000_000, bootFs);
    assert.ok(Number(drive.split(" ").at(-1)) > 0, `the guest read its boot disk: ${drive}`);
    // One vCPU, pinned nowhere: it may run on each of the host's CPUs.
    const affinity = samples.get("kubevirt_vmi_node_cpu_affinity")!.find((l) =>
      l.includes('name="vm3"')
    )!;
    assert.equal(Number(affinity.split(" ").at(-1)), navigator.hardwareConcurrency, affinity);
    const dirty = samples.get("kubevirt_vmi_dirty_rate_bytes_per_second")!.find((l) =>
      l.includes('name="vm3"')
    )!;
    assert.ok(Number(dirty.split(" ").at(-1)) >= 0, dirty);
    assert.equal(Number(dirty.split(" ").at(-1)) % (1024 * 1024), 0, `whole MB/s: ${dirty}`);
    assert.match(
      samples.get("kubevirt_virt_handler_ready_status")![0],
      /^kubevirt_virt_handler_ready_status 1$/,
    );
    assert.match(
      samples.get("kubevirt_info")![0],
      /^kubevirt_info\{goversion="deno[\d.]+",kubeversion="v1\.7\.0\+virtnode\.[^"]+"\} 1$/,
    );
    const deprecated = samples.get("kubevirt_node_deprecated_machine_types")!;
    assert.ok(
      deprecated.every((l) => l.includes(`node="${node}"`) && /machine_type="pc-/.test(l)),
      deprecated.join("\n"),
    );
    console.log(
      `scrape of ${COUNT} VMIs: ${text.split("\n").length} lines, ${samples.size} families`,
    );

    // KubeVirt v1.7.0's own alerts and recording rules: every handler family they name is
    // in the scrape, but the guest load, which libvirt gives from version 11.1 on (this
    // host's has no `virsh guestinfo --load`; virt-handler has none to report here either).
    const monitoring = await kubevirtMonitoring();
    const { named, missing } = familiesNamedByRules(monitoring, text);
    const loadUnsupported = !(await runText("virsh", "guestinfo", "--help")).includes("--load");
    const expectedMissing = loadUnsupported ? ["kubevirt_vmi_guest_load_1m"] : [];
    assert.deepEqual(
      missing,
      expectedMissing,
      `families KubeVirt's rules name, by rule: ${JSON.stringify(Object.fromEntries(named))}`,
    );
    // ... and they evaluate over the scrape with promtool as Prometheus would.
    const rulesTest = await writeRulesTest(monitoring, text, dir);
    const rules = await promtoolTestRules(rulesTest);
    assert.ok(rules.ok, `promtool test rules:\n${rules.output}`);
    console.log(
      `KubeVirt's ${
        monitoring.ruleGroups.flatMap((g) => g.rules).length
      } rules name ${named.size} handler families; promtool test rules passed`,
    );
  } catch (error) {
    console.error((await Deno.readTextFile(h.logFile).catch(() => "")).slice(-20_000));
    throw error;
  } finally {
    for (const n of names) await deleteVmi(client, ns, n);
    await waitFor("the VMIs to go", async () => {
      const left = await Promise.all(names.map((n) => getVmi(client, ns, n)));
      return left.every((v) => !v);
    }, 120_000).catch(() => {});
    await h.kill();
    killLaunchers(h.stateDir);
    await removeTestPodNetwork(network);
    await client.request("DELETE", `/api/v1/namespaces/${ns}`).catch(() => {});
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    client.close();
    await cluster.stop();
  }
});

import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import {
  type CapabilitySource,
  computeNodeLabels,
  DEFAULT_OBSOLETE_CPU_MODELS,
  gatherNodeLabelInfo,
  hostModelCpuXml,
  isLabellerLabel,
  isValidLabel,
  mergeLabellerLabels,
  type NodeLabelInfo,
  parseCpuFeatures,
  parseDomainCapabilities,
  parseHostCapabilities,
} from "../../mod/node/mod.ts";
import { parseXml } from "../../mod/xml/mod.ts";

const FIXTURES = fileURLToPath(new URL("../fixtures/labeller/", import.meta.url));
const HOSTS = ["intel-skylake-server", "amd-epyc-rome"] as const;
const UPDATE = Deno.env.get("UPDATE_GOLDEN") === "1";

function fixture(name: string): string {
  return Deno.readTextFileSync(`${FIXTURES}${name}`);
}

function infoOf(host: string, domcaps = fixture(`${host}.domcapabilities.xml`)): NodeLabelInfo {
  return {
    host: parseHostCapabilities(fixture(`${host}.capabilities.xml`)),
    domain: parseDomainCapabilities(domcaps),
    supportedFeatures: parseCpuFeatures(fixture(`${host}.baseline.xml`)),
  };
}

function sorted(labels: Record<string, string>): Record<string, string> {
  return Object.fromEntries(Object.entries(labels).sort(([a], [b]) => a < b ? -1 : 1));
}

for (const host of HOSTS) {
  Deno.test(`computeNodeLabels() matches the golden labels of ${host}`, () => {
    const { labels, invalid } = computeNodeLabels(infoOf(host));
    assert.deepEqual(invalid, []);
    const golden = `${FIXTURES}${host}.labels.json`;
    const text = JSON.stringify(sorted(labels), null, 2) + "\n";
    if (UPDATE) Deno.writeTextFileSync(golden, text);
    assert.equal(text, Deno.readTextFileSync(golden));
  });
}

Deno.test("computeNodeLabels() labels an Intel Skylake-Server host as KubeVirt does", () => {
  const { labels, obsoleteHostModel } = computeNodeLabels(infoOf("intel-skylake-server"));
  assert.equal(obsoleteHostModel, undefined);
  assert.equal(labels["host-model-cpu.node.kubevirt.io/Skylake-Server-IBRS"], "true");
  assert.equal(labels["cpu-vendor.node.kubevirt.io/Intel"], "true");
  assert.equal(labels["cpu-timer.node.kubevirt.io/tsc-frequency"], "2095078000");
  assert.equal(labels["cpu-timer.node.kubevirt.io/tsc-scalable"], "true");
  assert.equal(labels["host-model-required-features.node.kubevirt.io/tsx-ctrl"], "true");
  assert.equal(labels["host-model-required-features.node.kubevirt.io/hle"], undefined);
  // Usable models are labelled; unusable ones only as migration candidates.
  assert.equal(labels["cpu-model.node.kubevirt.io/Skylake-Server-noTSX-IBRS"], "true");
  assert.equal(labels["cpu-model.node.kubevirt.io/Skylake-Server-IBRS"], undefined);
  assert.equal(labels["cpu-model-migration.node.kubevirt.io/Skylake-Server-IBRS"], "true");
  // Features of the baseline: required ones only, disabled ones never.
  assert.equal(labels["cpu-feature.node.kubevirt.io/avx512f"], "true");
  assert.equal(labels["cpu-feature.node.kubevirt.io/vmx"], "true");
  assert.equal(labels["cpu-feature.node.kubevirt.io/rtm"], undefined);
  // Machine types from every guest, aliases included, once each.
  assert.equal(labels["machine-type.node.kubevirt.io/q35"], "true");
  assert.equal(labels["machine-type.node.kubevirt.io/pc-q35-rhel8.6.0"], "true");
  for (const key of ["kubevirt.io/sev", "kubevirt.io/sev-es", "kubevirt.io/tdx"]) {
    assert.equal(labels[key], undefined, key);
  }
});

Deno.test("computeNodeLabels() labels an AMD EPYC-Rome host with SEV and SEV-ES", () => {
  const { labels } = computeNodeLabels(infoOf("amd-epyc-rome"));
  assert.equal(labels["host-model-cpu.node.kubevirt.io/EPYC-Rome"], "true");
  assert.equal(labels["cpu-vendor.node.kubevirt.io/AMD"], "true");
  assert.equal(labels["cpu-model.node.kubevirt.io/EPYC-Rome"], "true");
  assert.equal(labels["cpu-model.node.kubevirt.io/EPYC-Milan"], undefined);
  assert.equal(labels["kubevirt.io/sev"], "true");
  assert.equal(labels["kubevirt.io/sev-es"], "true");
  assert.equal(labels["kubevirt.io/sev-snp"], undefined);
  assert.equal(labels["cpu-feature.node.kubevirt.io/svm"], "true");
});

Deno.test("computeNodeLabels() never labels obsolete models, even usable ones", () => {
  for (const host of HOSTS) {
    const { labels } = computeNodeLabels(infoOf(host));
    for (const model of DEFAULT_OBSOLETE_CPU_MODELS) {
      assert.equal(labels[`cpu-model.node.kubevirt.io/${model}`], undefined, model);
      assert.equal(labels[`cpu-model-migration.node.kubevirt.io/${model}`], undefined, model);
    }
  }
  const custom = computeNodeLabels(infoOf("intel-skylake-server"), { obsoleteModels: ["Penryn"] });
  assert.equal(custom.labels["cpu-model.node.kubevirt.io/Penryn"], undefined);
  assert.equal(custom.labels["cpu-model.node.kubevirt.io/qemu64"], "true");
});

Deno.test("computeNodeLabels() flags a host model the configured list names, as virt-handler does", () => {
  // Without a configured list, no model is flagged.
  const domcaps = fixture("intel-skylake-server.domcapabilities.xml")
    .replace("<model fallback='forbid'>Skylake-Server-IBRS</model>", "<model>kvm64</model>");
  const info = infoOf("intel-skylake-server", domcaps);
  const { labels, obsoleteHostModel } = computeNodeLabels(info, { obsoleteModels: ["kvm64"] });
  assert.equal(obsoleteHostModel, "kvm64");
  assert.equal(labels["node-labeller.kubevirt.io/obsolete-host-model"], "true");
  assert.equal(labels["host-model-cpu.node.kubevirt.io/kvm64"], "true");
  // No obsoleteCPUModels in the cluster's configuration: virt-handler looks the host model
  // up in a nil map, and kvm64, though in KubeVirt's default list, is not marked.
  const byDefault = computeNodeLabels(info);
  assert.equal(byDefault.obsoleteHostModel, undefined);
  assert.equal(byDefault.labels["node-labeller.kubevirt.io/obsolete-host-model"], undefined);
  assert.equal(byDefault.labels["host-model-cpu.node.kubevirt.io/kvm64"], "true");
  // The default list still keeps its models out of the cpu-model labels.
  assert.equal(byDefault.labels["cpu-model.node.kubevirt.io/kvm64"], undefined);
});

Deno.test("parseDomainCapabilities() reads SEV-SNP, TDX and SEV without ES", () => {
  const base = fixture("amd-epyc-rome.domcapabilities.xml");
  const snp = parseDomainCapabilities(
    base.replace("<value>sev</value>", "<value>sev</value><value>sev-snp</value>"),
  );
  assert.deepEqual([snp.sev, snp.sevEs, snp.sevSnp], [true, true, true]);
  const noEs = parseDomainCapabilities(
    base.replace("<maxESGuests>256</maxESGuests>", "<maxESGuests>0</maxESGuests>"),
  );
  assert.deepEqual([noEs.sev, noEs.sevEs, noEs.sevSnp], [true, false, false]);
  const tdx = parseDomainCapabilities(
    fixture("intel-skylake-server.domcapabilities.xml")
      .replace(/<sev supported='no'\s*\/>/, "<tdx supported='yes'/><sev supported='no'/>"),
  );
  assert.equal(tdx.tdx, true);
  const { labels } = computeNodeLabels({
    host: parseHostCapabilities(fixture("intel-skylake-server.capabilities.xml")),
    domain: tdx,
    supportedFeatures: [],
  });
  assert.equal(labels["kubevirt.io/tdx"], "true");
});

Deno.test("parseHostCapabilities() reads the TSC counter, vendor and machine types", () => {
  const caps = parseHostCapabilities(fixture("amd-epyc-rome.capabilities.xml"));
  assert.deepEqual(caps.tsc, { frequency: 2994374000, scalable: true });
  assert.equal(caps.arch, "x86_64");
  assert.equal(caps.vendor, "AMD");
  assert.deepEqual(caps.machines, [
    "pc-q35-rhel9.2.0",
    "q35",
    "pc-q35-rhel9.0.0",
    "pc-q35-rhel8.6.0",
    "pc-i440fx-rhel7.6.0",
    "pc",
  ]);
  assert.deepEqual(caps.deprecatedMachines, [], "the fixture's QEMU deprecates none");
  // As QEMU 7.2 marks its old machine types (Debian 12's libvirt reports 8 such).
  const older = parseHostCapabilities(
    fixture("amd-epyc-rome.capabilities.xml").replace(
      "<machine maxCpus='240'>pc-i440fx-rhel7.6.0</machine>",
      "<machine maxCpus='240' deprecated='yes'>pc-i440fx-rhel7.6.0</machine>",
    ),
  );
  assert.deepEqual(older.deprecatedMachines, ["pc-i440fx-rhel7.6.0"]);
  assert.ok(older.machines.includes("pc-i440fx-rhel7.6.0"), "still a machine type");
  const noTsc = parseHostCapabilities(
    fixture("amd-epyc-rome.capabilities.xml").replace(/<counter[^>]*>/, ""),
  );
  assert.equal(noTsc.tsc, undefined);
  const { labels } = computeNodeLabels({
    host: noTsc,
    domain: parseDomainCapabilities(fixture("amd-epyc-rome.domcapabilities.xml")),
    supportedFeatures: [],
  });
  assert.equal(labels["cpu-timer.node.kubevirt.io/tsc-frequency"], undefined);
});

Deno.test("parse functions refuse documents of the wrong kind or malformed XML", () => {
  assert.throws(
    () => parseDomainCapabilities(fixture("amd-epyc-rome.capabilities.xml")),
    /Cannot read domain capabilities: root element is "capabilities"/,
  );
  assert.throws(() => parseHostCapabilities("<capabilities><host>"), /is not closed/);
  assert.throws(() => parseCpuFeatures("<cpu><feature name='a'></cpu>"), /does not match/);
});

Deno.test("hostModelCpuXml() round-trips through parseCpuFeatures()", () => {
  const domain = parseDomainCapabilities(fixture("intel-skylake-server.domcapabilities.xml"));
  const xml = hostModelCpuXml(domain.hostModel!);
  assert.match(xml, /<model fallback='forbid'>Skylake-Server-IBRS<\/model>/);
  assert.match(xml, /<feature policy='disable' name='hle'\/>/);
  assert.deepEqual(parseCpuFeatures(xml), domain.hostModel!.requiredFeatures);
});

Deno.test("gatherNodeLabelInfo() queries libvirt as the KubeVirt labeller script does", async () => {
  const calls: unknown[] = [];
  const source: CapabilitySource = {
    getCapabilities: () => Promise.resolve(fixture("intel-skylake-server.capabilities.xml")),
    getDomainCapabilities: (query) => {
      calls.push(["domcaps", query]);
      return Promise.resolve(fixture("intel-skylake-server.domcapabilities.xml"));
    },
    baselineHypervisorCPU: (xmls, query) => {
      calls.push(["baseline", xmls.length, query]);
      assert.match(xmls[0], /Skylake-Server-IBRS/);
      return Promise.resolve(fixture("intel-skylake-server.baseline.xml"));
    },
  };
  const gathered = await gatherNodeLabelInfo(source, {
    kvmPath: "/nonexistent/kvm",
    schedRtRuntimePath: "/nonexistent",
  });
  const query = { arch: "x86_64", virttype: "qemu", machine: "q35" };
  assert.deepEqual(calls, [["domcaps", query], ["baseline", 1, query]]);
  assert.equal(gathered.info.realtime, false);
  assert.ok(gathered.info.supportedFeatures.includes("avx512f"));
});

Deno.test("mergeLabellerLabels() removes stale labeller labels and keeps others", () => {
  const merged = mergeLabellerLabels({
    "kubernetes.io/hostname": "n1",
    "cpu-model.node.kubevirt.io/Gone": "true",
    "kubevirt.io/sev": "true",
    "kubevirt.io/schedulable": "true",
    // KubeVirt matches by prefix: this one is the labeller's too.
    "kubevirt.io/sev-extra": "x",
  }, { "cpu-model.node.kubevirt.io/Penryn": "true" });
  assert.deepEqual(merged, {
    "kubernetes.io/hostname": "n1",
    "kubevirt.io/schedulable": "true",
    "cpu-model.node.kubevirt.io/Penryn": "true",
  });
  assert.equal(isLabellerLabel("kubevirt.io/schedulable"), false);
  assert.equal(isLabellerLabel("kubevirt.io/sev-snp"), true);
});

Deno.test("isValidLabel() follows Kubernetes' qualified-name rules", () => {
  assert.equal(isValidLabel("cpu-model.node.kubevirt.io/Skylake-Server-IBRS", "true"), true);
  assert.equal(isValidLabel("machine-type.node.kubevirt.io/pc-q35-rhel9.2.0", "true"), true);
  assert.equal(isValidLabel("cpu-feature.node.kubevirt.io/bad name", "true"), false);
  assert.equal(isValidLabel(`cpu-feature.node.kubevirt.io/${"a".repeat(64)}`, "true"), false);
  assert.equal(isValidLabel("cpu-feature.node.kubevirt.io/-x", "true"), false);
  const { labels, invalid } = computeNodeLabels({
    ...infoOf("intel-skylake-server"),
    supportedFeatures: ["ok", "not ok"],
  });
  assert.equal(labels["cpu-feature.node.kubevirt.io/ok"], "true");
  assert.deepEqual(invalid, ["cpu-feature.node.kubevirt.io/not ok"]);
});

Deno.test("parseXml() decodes entities, skips comments and keeps text per element", () => {
  const root = parseXml(
    "<?xml version='1.0'?><!-- c --><a x='1 &amp; 2' y=\"&lt;\"><b>t&#65;&#x42;</b><![CDATA[<raw>]]></a>",
  );
  assert.equal(root.attrs.x, "1 & 2");
  assert.equal(root.attrs.y, "<");
  assert.equal(root.children[0].text, "tAB");
  assert.equal(root.text, "<raw>");
  assert.throws(() => parseXml("<a></a><b/>"), /more than one root/);
  assert.throws(() => parseXml("<a>&nope;</a>"), /unknown entity/);
});

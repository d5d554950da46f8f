/**
 * The KubeVirt CR's configuration read as KubeVirt v1.7.0's components read it
 * (`pkg/virt-config`): over its defaults, with Go's omitempty, nested merges, lists that
 * replace, and its five checks with its messages.
 */
import assert from "node:assert/strict";
import {
  featureGateEnabled,
  KUBEVIRT_DEFAULTS,
  KubevirtConfigError,
  logLevelForVerbosity,
  parseKubevirtConfiguration,
} from "../../mod/config/mod.ts";
import { virtualMachineOptions } from "../../mod/handler/testing.ts";
import { migrationOptions } from "../../mod/handler/testing.ts";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";

const SOURCE = { resourceVersion: "42", nodeName: "node-a" };

Deno.test("parseKubevirtConfiguration(): no configuration is KubeVirt's defaults, stamped with the CR's version", () => {
  assert.deepEqual(parseKubevirtConfiguration(undefined, SOURCE), {
    ...KUBEVIRT_DEFAULTS,
    resourceVersion: "42",
  });
  assert.deepEqual(parseKubevirtConfiguration({}, SOURCE), {
    ...KUBEVIRT_DEFAULTS,
    resourceVersion: "42",
  });
});

Deno.test("parseKubevirtConfiguration(): zero values are unset, nested objects merge, lists replace", () => {
  // Zero values count as absent, as Go's omitempty makes them.
  const c = parseKubevirtConfiguration({
    developerConfiguration: {
      useEmulation: false,
      logVerbosity: { virtHandler: 0 },
      featureGates: [],
    },
    smbios: { manufacturer: "ACME", sku: "" },
    supportedGuestAgentVersions: ["7.*"],
    migrations: { progressTimeout: 0, bandwidthPerMigration: "64Mi", allowPostCopy: true },
  }, SOURCE);
  assert.equal(c.useEmulation, false);
  assert.equal(c.handlerLogVerbosity, 2);
  assert.equal(c.handlerLogVerbositySet, false);
  assert.deepEqual(c.featureGates, []);
  assert.deepEqual(c.smbios, {
    manufacturer: "ACME",
    product: "None",
    version: "",
    sku: "",
    family: "KubeVirt",
  });
  assert.deepEqual(c.supportedGuestAgentVersions, ["7.*"]);
  assert.equal(c.migrations.progressTimeout, 150);
  assert.equal(c.migrations.bandwidthPerMigration, "64Mi");
  // Unset, it follows post-copy, as KubeVirt's handler reads it.
  assert.equal(c.migrations.allowWorkloadDisruption, true);
});

Deno.test("parseKubevirtConfiguration(): vmRolloutStrategy is LiveUpdate unless the CR says Stage", () => {
  assert.equal(parseKubevirtConfiguration({}, SOURCE).vmRolloutStrategy, "LiveUpdate");
  const stage = parseKubevirtConfiguration({ vmRolloutStrategy: "Stage" }, SOURCE);
  assert.equal(stage.vmRolloutStrategy, "Stage");
  const live = parseKubevirtConfiguration({ vmRolloutStrategy: "LiveUpdate" }, SOURCE);
  assert.equal(live.vmRolloutStrategy, "LiveUpdate");
});

Deno.test("parseKubevirtConfiguration(): a memBalloonStatsPeriod of 0 is kept", () => {
  // KubeVirt holds the period as a pointer, so 0 means no statistics rather than unset.
  assert.equal(
    parseKubevirtConfiguration({ memBalloonStatsPeriod: 0 }, SOURCE).memBalloonStatsPeriod,
    0,
  );
  assert.equal(
    parseKubevirtConfiguration({ memBalloonStatsPeriod: 3 }, SOURCE).memBalloonStatsPeriod,
    3,
  );
});

Deno.test("parseKubevirtConfiguration(): this node's nodeVerbosity wins over virtHandler's", () => {
  const verbosity = { virtHandler: 3, nodeVerbosity: { "node-a": 6, "node-b": 1 } };
  const here = parseKubevirtConfiguration(
    { developerConfiguration: { logVerbosity: verbosity } },
    SOURCE,
  );
  assert.equal(here.handlerLogVerbosity, 6);
  const there = parseKubevirtConfiguration(
    { developerConfiguration: { logVerbosity: verbosity } },
    { ...SOURCE, nodeName: "node-c" },
  );
  assert.equal(there.handlerLogVerbosity, 3);
  assert.equal(logLevelForVerbosity(6), "debug");
  assert.equal(logLevelForVerbosity(3), "info");
});

Deno.test("parseKubevirtConfiguration() refuses what KubeVirt's validateConfig refuses, in its words", () => {
  const rows: [string, Record<string, unknown>, string][] = [
    [
      "pull policy",
      { imagePullPolicy: "Sometimes" },
      "invalid dev.imagePullPolicy in config: Sometimes",
    ],
    [
      "memory overcommit",
      { developerConfiguration: { memoryOvercommit: -5 } },
      "invalid memoryOvercommit in ConfigMap: -5",
    ],
    [
      "CPU allocation ratio",
      { developerConfiguration: { cpuAllocationRatio: -1 } },
      "invalid cpu allocation ratio in ConfigMap: -1",
    ],
    [
      "PVC space tolerance",
      { developerConfiguration: { pvcTolerateLessSpaceUpToPercent: 101 } },
      "invalid lessPVCSpaceToleration in ConfigMap: 101",
    ],
    [
      "default network interface",
      { network: { defaultNetworkInterface: "vhostuser" } },
      "invalid default-network-interface in config: vhostuser",
    ],
  ];
  for (const [what, configuration, message] of rows) {
    assert.throws(
      () => parseKubevirtConfiguration(configuration, SOURCE),
      (e: unknown) => e instanceof KubevirtConfigError && e.message === message,
      what,
    );
  }
  // Zero is no value (omitempty), so these keep KubeVirt's defaults instead of failing.
  const zero = parseKubevirtConfiguration(
    { developerConfiguration: { memoryOvercommit: 0, cpuAllocationRatio: 0 } },
    SOURCE,
  );
  assert.equal(zero.resourceVersion, "42");
});

Deno.test("featureGateEnabled(): GA gates are on unlisted, Beta and Alpha gates only when listed", () => {
  const none = parseKubevirtConfiguration({}, SOURCE);
  assert.equal(featureGateEnabled(none, "LiveMigration"), true);
  assert.equal(featureGateEnabled(none, "ImageVolume"), false);
  assert.equal(featureGateEnabled(none, "CPUManager"), false);
  const listed = parseKubevirtConfiguration(
    { developerConfiguration: { featureGates: ["CPUManager", "ExpandDisks"] } },
    SOURCE,
  );
  assert.equal(featureGateEnabled(listed, "CPUManager"), true);
  assert.equal(featureGateEnabled(listed, "ExpandDisks"), true);
});

const VMI = {
  metadata: { name: "vm", namespace: "ns", uid: "u" },
  spec: { domain: { devices: {} } },
} as unknown as VirtualMachineInstance;

Deno.test("the launcher's VirtualMachineOptions follow the KubeVirt configuration", () => {
  // Covered: SMBIOS, balloon period, free page reporting, serial log, VGA for EFI, ExpandDisks.
  const defaults = virtualMachineOptions(VMI, []);
  assert.deepEqual(defaults.VirtualMachineSMBios, KUBEVIRT_DEFAULTS.smbios);
  assert.equal(defaults.MemBalloonStatsPeriod, 10);
  const c = parseKubevirtConfiguration({
    smbios: { family: "Lab", product: "virtnode" },
    memBalloonStatsPeriod: 0,
    virtualMachineOptions: { disableFreePageReporting: {}, disableSerialConsoleLog: {} },
    developerConfiguration: { featureGates: ["ExpandDisks"] },
  }, { ...SOURCE, annotations: { "kubevirt.io/vga-display-efi-x86": "true" } });
  const o = virtualMachineOptions(VMI, [], c);
  assert.deepEqual(o.VirtualMachineSMBios, {
    manufacturer: "KubeVirt",
    product: "virtnode",
    version: "",
    sku: "",
    family: "Lab",
  });
  assert.equal(o.MemBalloonStatsPeriod, 0);
  assert.equal(o.ExpandDisksEnabled, true);
  assert.deepEqual(o.clusterConfig, {
    ExpandDisksEnabled: true,
    FreePageReportingDisabled: true,
    BochsDisplayForEFIGuests: false,
    SerialConsoleLogDisabled: true,
  });
});

Deno.test("migrationOptions(): the VMI's own migration configuration wins; without one the cluster's applies", () => {
  const cluster = parseKubevirtConfiguration(
    { migrations: { bandwidthPerMigration: "32Mi", progressTimeout: 30 } },
    SOURCE,
  ).migrations;
  const bare = migrationOptions(VMI, cluster);
  assert.equal(bare.Bandwidth, "32Mi");
  assert.equal(bare.ProgressTimeout, 30);
  const own = migrationOptions({
    ...VMI,
    status: { migrationState: { migrationConfiguration: { bandwidthPerMigration: "8Mi" } } },
  } as unknown as VirtualMachineInstance, cluster);
  assert.equal(own.Bandwidth, "8Mi");
  assert.equal(own.ProgressTimeout, 150);
});

Deno.test("the key table is the same in the module doc, KUBEVIRT_KEYS and docs/cluster-configuration.md", async () => {
  const root = new URL("../../", import.meta.url);
  const moduleDoc = await Deno.readTextFile(new URL("mod/config/kubevirt.ts", root));
  const operatorsDoc = await Deno.readTextFile(new URL("docs/cluster-configuration.md", root));
  const { KUBEVIRT_KEYS } = await import("../../mod/config/mod.ts");
  const rows = (text: string, prefix: string) =>
    text.split("\n").filter((l) => l.startsWith(`${prefix}| \``)).map((l) =>
      l.slice(prefix.length).split("|").map((c) => c.trim().replaceAll("`", ""))
    );
  const inModule = rows(moduleDoc, " * ").map((c) => [c[1], c[4]]);
  // The page lists each key as an item: "- `key` (default ...): what follows. Tests: U1, I1."
  const items = operatorsDoc.replace(/\n {2}/g, " ").split("\n").filter((l) => l.startsWith("- `"));
  const inDocs = items.map((l) => [
    l.slice(3, l.indexOf("`", 3)),
    l.slice(l.lastIndexOf(" Tests: ") + 8).replace(/\.$/, ""),
  ]);
  const data = KUBEVIRT_KEYS.map((k) => [k.key, k.tests]);
  const norm = (r: string[][]) => r.map(([key, tests]) => `${key} ${tests}`);
  assert.deepEqual(norm(inModule), norm(data));
  assert.deepEqual(norm(inDocs), norm(data));
});

/**
 * Writes the results document of the conformance runs (docs/conformance.md) from the JSON the
 * tier writes to `$VIRTNODE_CONFORMANCE_RESULTS`, with the reasons kept by hand in
 * docs/conformance-reasons.json (spec name -> why it fails, with the evidence), which a rerun
 * keeps. Several runs may be given, oldest first: a later run's result for a spec and handler
 * replaces an earlier one (a full run, then reruns of some specs after fixes). A run's commit
 * is the one its JSON names, or the one after `@` in its argument.
 *
 *   deno run -A tests/conformance/report.ts <results.json>[@<commit>] ... > docs/conformance.md
 *
 * @module
 */
import type { SpecResult } from "../helpers/kubevirt_suite.ts";
import { summaryLine } from "../helpers/kubevirt_suite.ts";

interface Results {
  date: string;
  commit?: string;
  focus: string[];
  labelFilter?: string;
  /** What the run merged into the KubeVirt CR's `spec.configuration`, if anything. */
  configuration?: Record<string, unknown>;
  results: { virtnode?: SpecResult[]; "virt-handler"?: SpecResult[] };
}

if (Deno.args.length === 0) {
  console.error("usage: report.ts <results.json>[@<commit>] ...");
  Deno.exit(2);
}
const runs: (Results & { commit: string })[] = [];
for (const arg of Deno.args) {
  const [file, given] = arg.split("@");
  const run: Results = JSON.parse(await Deno.readTextFile(file));
  runs.push({ ...run, commit: given ?? run.commit ?? "unknown" });
}
const reasonsFile = new URL("../../docs/conformance-reasons.json", import.meta.url);
const reasonsJson: Record<string, string | string[]> = await Deno.readTextFile(reasonsFile)
  .then((t) => JSON.parse(t), () => ({}));
/** Paragraphs about the runs as a whole (`_notes`), shown under the summary lines. */
const notes = Array.isArray(reasonsJson._notes) ? reasonsJson._notes : [];
const reasons = Object.fromEntries(
  Object.entries(reasonsJson).filter((e): e is [string, string] => typeof e[1] === "string"),
);

/** A run's CR configuration as text ("{}": KubeVirt's defaults but for the install's own). */
const configKey = (run: Results) => JSON.stringify(run.configuration ?? {});

/**
 * Per handler, each spec's latest result: of the conformance runs, or of the runs with a
 * label filter of their own (`extra`: specs beyond the conformance label), with the CR
 * configuration `config`.
 */
function latest(
  handler: "virtnode" | "virt-handler",
  extra: boolean,
  config = "{}",
): SpecResult[] {
  const bySpec = new Map<string, SpecResult>();
  for (const run of runs.filter((r) => !!r.labelFilter === extra && configKey(r) === config)) {
    for (const r of run.results[handler] ?? []) bySpec.set(r.name, r);
  }
  return [...bySpec.values()];
}
const virtnode = latest("virtnode", false);
const yardstick = latest("virt-handler", false);
const specNames = (a: SpecResult[], b: SpecResult[]) =>
  [...new Set([...a, ...b].filter((r) => !r.setup).map((r) => r.name))].sort();
const cell = (r: SpecResult | undefined) =>
  r ? `${r.status}${r.status === "passed" ? "" : r.reason ? `: ${esc(r.reason)}` : ""}` : "not run";
const esc = (s: string) => s.replaceAll("\n", " ").slice(0, 200);
/** The spec's text without KubeVirt's bracketed tags, for the list. */
const short = (name: string) =>
  name.replace(/\[(rfe_id|crit|vendor|level|test_id|posneg|label|release-blocker)[^\]]*\]/g, "")
    .replace(/\s+/g, " ").trim();
const runLine = (run: Results & { commit: string }) => {
  const handlers = (["virtnode", "virt-handler"] as const).filter((h) => run.results[h]);
  const scope = run.focus.length === 0 ? "all specs of its filter" : `${run.focus.length} focused`;
  return `- ${run.date.slice(0, 16).replace("T", " ")} UTC, commit ${run.commit}, ${
    handlers.join(" and ")
  }, ${scope}${run.labelFilter ? ` (label filter \`${run.labelFilter}\`)` : ""}${
    run.configuration ? `, CR configuration \`${configKey(run)}\`` : ""
  }`;
};

/**
 * A list item per spec: each handler's result beside the other's, and why where either fails
 * (a list, not a table: the specs' names are long, and a list wraps at the docs' width).
 */
function specList(a: SpecResult[], b: SpecResult[]): string[] {
  const items: string[] = [];
  for (const name of specNames(a, b)) {
    const x = a.find((r) => r.name === name);
    const y = b.find((r) => r.name === name);
    const why = x?.status === "failed" || y?.status === "failed" ? esc(reasons[name] ?? "") : "";
    items.push(specItem(short(name), cell(x), cell(y), why)); // names whole, as they wrap
  }
  return items;
}

/** One spec's list item. */
function specItem(spec: string, virtnode: string, yardstick: string, why: string): string {
  return `- ${spec}: **virtnode ${virtnode}; virt-handler ${yardstick}**${
    why ? `. Why: ${why}` : ""
  }`;
}

/** A handler's summary line, or that it has no run in this list. */
const summaryOrNone = (handler: string, results: SpecResult[]) =>
  results.length > 0
    ? summaryLine(handler, results)
    : `${handler}: no run with this configuration (see the notes)`;

const lines = [
  "# KubeVirt v1.7.0 conformance specs with substitute guest images",
  "",
  "Runs, oldest first (a later run's result for a spec replaces an earlier one):",
  "",
  ...runs.map(runLine),
  "",
  "KubeVirt's own functional suite (`kubevirt.io/kubevirt/tests`, v1.7.0, built from the Go",
  "module), its `conformance` specs that fit one node, IPv4 only, offline and without CDI (62",
  "of 96), on one real node (kubelet, containerd, kube-proxy) with KubeVirt installed by its",
  "own virt-operator. First with virtnode in the operator's `virt-handler` DaemonSet (the",
  "KubeVirt CR's `customizeComponents` patches), then with KubeVirt's own virt-handler, the",
  "yardstick, on the same node. Guests run under QEMU's software emulation (TCG): the",
  "machine of these runs had no /dev/kvm.",
  "",
  "The guest images are **substitutes** built here from Debian's packages under the suite's",
  "names (tests/harness/guest/suite_images.sh): none of KubeVirt's can be fetched. The fedora one is",
  "a busybox userland with Debian's qemu-guest-agent, sshd, sudo and bash, not Fedora. A",
  "result here says how virtnode and virt-handler compare on these specs and these guests;",
  "it is not a certification.",
  "",
  "- " + summaryOrNone("virtnode", virtnode),
  "- " + summaryOrNone("virt-handler", yardstick),
  "",
  ...notes.flatMap((n) => [n, ""]),
  ...specList(virtnode, yardstick),
];
const configured = [...new Set(runs.filter((r) => !r.labelFilter).map(configKey))]
  .filter((k) => k !== "{}");
const configuredResults: SpecResult[] = [];
for (const config of configured) {
  const a = latest("virtnode", false, config);
  const b = latest("virt-handler", false, config);
  configuredResults.push(...a, ...b);
  lines.push(
    "",
    "## The conformance specs with a configuration of their own",
    "",
    `The same specs, with \`${config}\` merged into the KubeVirt CR's \`spec.configuration\``,
    "for both handlers: what KubeVirt's handler can run here when its default cannot be built",
    "(see the notes above).",
    "",
    "- " + summaryOrNone("virtnode", a).replace(/ of \d+$/, ` of ${specNames(a, b).length}`),
    "- " + summaryOrNone("virt-handler", b).replace(/ of \d+$/, ` of ${specNames(a, b).length}`),
    "",
    ...specList(a, b),
  );
}
const extraVirtnode = latest("virtnode", true);
const extraYardstick = latest("virt-handler", true);
if (extraVirtnode.length + extraYardstick.length > 0) {
  lines.push(
    "",
    "## Config-changing specs beyond the conformance label",
    "",
    "Specs that change the KubeVirt CR and wait for every handler's `/healthz`",
    "`config-resource-version` (runs with a label filter of their own, above):",
    "",
    "- " + summaryLine("virtnode", extraVirtnode).replace(/ of \d+$/, ""),
    "- " + summaryLine("virt-handler", extraYardstick).replace(/ of \d+$/, ""),
    "",
    ...specList(extraVirtnode, extraYardstick),
  );
}
const setup = [
  ...virtnode,
  ...yardstick,
  ...extraVirtnode,
  ...extraYardstick,
  ...configuredResults,
].filter((r) => r.setup);
if (setup.length > 0) {
  lines.push("", "Set-up nodes that failed:", "");
  for (const r of setup) lines.push(`- ${r.name}: ${esc(r.reason ?? "")}`);
}
console.log(lines.join("\n"));

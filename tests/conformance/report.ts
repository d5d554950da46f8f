/**
 * Writes the results document of a full conformance run (docs/conformance.md) from the
 * JSON the tier writes to `$VIRTNODE_CONFORMANCE_RESULTS`, with the reasons kept by hand
 * in docs/conformance-reasons.json (spec name -> why it fails, with the evidence), which a
 * rerun keeps.
 *
 *   deno run -A tests/conformance/report.ts <results.json> <commit> > docs/conformance.md
 *
 * @module
 */
import type { SpecResult } from "../helpers/kubevirt_suite.ts";
import { summaryLine } from "../helpers/kubevirt_suite.ts";

interface Results {
  date: string;
  focus: string[];
  results: { virtnode?: SpecResult[]; "virt-handler"?: SpecResult[] };
}

const [file, commit] = Deno.args;
if (!file || !commit) {
  console.error("usage: report.ts <results.json> <commit>");
  Deno.exit(2);
}
const run: Results = JSON.parse(await Deno.readTextFile(file));
const reasonsFile = new URL("../../docs/conformance-reasons.json", import.meta.url);
const reasons: Record<string, string> = await Deno.readTextFile(reasonsFile)
  .then((t) => JSON.parse(t), () => ({}));

const virtnode = run.results.virtnode ?? [];
const yardstick = run.results["virt-handler"] ?? [];
const names = [...new Set([...virtnode, ...yardstick].filter((r) => !r.setup).map((r) => r.name))]
  .sort();
const cell = (r: SpecResult | undefined) =>
  r ? `${r.status}${r.status === "passed" ? "" : r.reason ? `: ${esc(r.reason)}` : ""}` : "not run";
const esc = (s: string) => s.replaceAll("|", "\\|").replaceAll("\n", " ").slice(0, 200);
/** The spec's text without KubeVirt's bracketed tags, for the table. */
const short = (name: string) =>
  name.replace(/\[(rfe_id|crit|vendor|level|test_id|posneg|label|release-blocker)[^\]]*\]/g, "")
    .replace(/\s+/g, " ").trim();

const lines = [
  "# KubeVirt v1.7.0 conformance specs with substitute guest images",
  "",
  `Latest full run: ${
    run.date.slice(0, 10)
  }, commit ${commit}, \`deno task test:conformance --all\`.`,
  "",
  "KubeVirt's own functional suite (`kubevirt.io/kubevirt/tests`, v1.7.0, built from the Go",
  "module), its `conformance` specs that fit one node, IPv4 only, offline and without CDI (62",
  "of 96), on one real node (kubelet, containerd, kube-proxy) with KubeVirt installed by its",
  "own virt-operator. First with virtnode in the operator's `virt-handler` DaemonSet (the",
  "KubeVirt CR's `customizeComponents` patches), then with KubeVirt's own virt-handler, the",
  "yardstick, on the same node. Guests run under QEMU's software emulation (TCG): this kind",
  "of machine's KVM is kvm-pvm, which cannot run them.",
  "",
  "The guest images are **substitutes** built here from Debian's packages under the suite's",
  "names (deploy/guest/suite_images.sh): none of KubeVirt's can be fetched. The fedora one is",
  "a busybox userland with Debian's qemu-guest-agent, sshd, sudo and bash, not Fedora. A",
  "result here says how virtnode and virt-handler compare on these specs and these guests;",
  "it is not a certification.",
  "",
  "- " + summaryLine("virtnode", virtnode),
  "- " + summaryLine("virt-handler", yardstick),
  "",
  "| Spec | virtnode | virt-handler | Why (where either fails) |",
  "|---|---|---|---|",
];
for (const name of names) {
  const a = virtnode.find((r) => r.name === name);
  const b = yardstick.find((r) => r.name === name);
  const why = a?.status === "failed" || b?.status === "failed" ? esc(reasons[name] ?? "") : "";
  lines.push(`| ${esc(short(name))} | ${cell(a)} | ${cell(b)} | ${why} |`);
}
const setup = [...virtnode, ...yardstick].filter((r) => r.setup);
if (setup.length > 0) {
  lines.push("", "Set-up nodes that failed:", "");
  for (const r of setup) lines.push(`- ${r.name}: ${esc(r.reason ?? "")}`);
}
console.log(lines.join("\n"));

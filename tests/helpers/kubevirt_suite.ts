/**
 * KubeVirt's own functional suite (`tests.test`, tests/harness/kubevirt/build_suite.sh) run
 * against a test cluster, and its JUnit report read back: which specs passed, failed or
 * were skipped, and the first line of each failure.
 *
 * @module
 */
import { join } from "node:path";
import { KUBEVIRT_IMAGE_PREFIX, KUBEVIRT_IMAGE_TAG } from "../harness/node/operator.ts";

/**
 * The specs of KubeVirt's `conformance` label that fit one node, IPv4 only, offline and
 * without CDI (issue 36): 62 of the 96.
 */
export const ONE_NODE_CONFORMANCE =
  "conformance && !requires-two-schedulable-nodes && !sig-storage && !storage-req && " +
  "!QUARANTINE && !RequiresOutsideConnectivity && !IPv6";
/** IPv6 specs that carry no IPv6 label (they skip themselves on an IPv4-only cluster). */
export const ONE_NODE_SKIP = "IPv6";

/** One spec's outcome. */
export interface SpecResult {
  /** The spec's full text, as Ginkgo names it. */
  name: string;
  status: "passed" | "failed" | "skipped";
  /** A set-up or tear-down node of the suite (BeforeSuite and the like), not a spec. */
  setup?: true;
  /** The first line of the failure, for a failed spec; why, for a spec that skipped itself. */
  reason?: string;
  seconds: number;
}

/** Options of {@linkcode runSuite}. */
export interface RunSuiteOptions {
  /** The directory of build_suite.sh's output. */
  suiteDir: string;
  kubeconfig: string;
  /** KubeVirt's virtctl (deploy/kubevirt/build_virtctl.sh). */
  virtctl: string;
  /** Where the report and the suite's artifacts go. */
  artifacts: string;
  /** Ginkgo's label filter; {@linkcode ONE_NODE_CONFORMANCE} unless told. */
  labelFilter?: string;
  /** Ginkgo's focus (regular expressions on the spec text), to run fewer specs. */
  focus?: string[];
  /** Ginkgo's skip; {@linkcode ONE_NODE_SKIP} unless told. */
  skip?: string[];
  /** The whole run's time limit (Ginkgo's `--timeout`). */
  timeout?: string;
  /** Where the suite's own output goes, line by line. */
  log?: (line: string) => void;
}

/** Runs the suite; resolves with every spec's outcome once it has ended. */
export async function runSuite(o: RunSuiteOptions): Promise<SpecResult[]> {
  const report = join(o.artifacts, "junit.xml");
  await Deno.mkdir(o.artifacts, { recursive: true });
  const args = [
    `--kubeconfig=${o.kubeconfig}`,
    `--container-prefix=${KUBEVIRT_IMAGE_PREFIX}`,
    `--container-tag=${KUBEVIRT_IMAGE_TAG}`,
    `--utility-container-prefix=${KUBEVIRT_IMAGE_PREFIX}`,
    `--utility-container-tag=${KUBEVIRT_IMAGE_TAG}`,
    "--installed-namespace=kubevirt",
    "--kubectl-path=/usr/bin/kubectl",
    `--virtctl-path=${o.virtctl}`,
    `--config=${join(o.suiteDir, "tests", "default-config.json")}`,
    `--artifacts=${o.artifacts}`,
    `--ginkgo.label-filter=${o.labelFilter ?? ONE_NODE_CONFORMANCE}`,
    ...(o.skip ?? [ONE_NODE_SKIP]).map((s) => `--ginkgo.skip=${s}`),
    ...(o.focus ?? []).map((f) => `--ginkgo.focus=${f}`),
    `--ginkgo.junit-report=${report}`,
    `--ginkgo.timeout=${o.timeout ?? "2h"}`,
    "--ginkgo.no-color",
    "--ginkgo.v",
  ];
  const child = new Deno.Command(join(o.suiteDir, "tests.test"), {
    args,
    cwd: o.artifacts,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    env: { KUBECONFIG: o.kubeconfig },
  }).spawn();
  const pump = async (stream: ReadableStream<Uint8Array>, file: Deno.FsFile) => {
    let rest = "";
    for await (const chunk of stream.pipeThrough(new TextDecoderStream())) {
      await file.write(new TextEncoder().encode(chunk));
      const lines = (rest + chunk).split("\n");
      rest = lines.pop() ?? "";
      for (const line of lines) o.log?.(line);
    }
    if (rest) o.log?.(rest);
  };
  const out = await Deno.open(join(o.artifacts, "suite.log"), { write: true, create: true });
  try {
    await Promise.all([pump(child.stdout, out), pump(child.stderr, out), child.status]);
  } finally {
    out.close();
  }
  let xml: string;
  try {
    xml = await Deno.readTextFile(report);
  } catch (error) {
    throw new Error(
      `KubeVirt's suite wrote no report (${report}); its log: ${join(o.artifacts, "suite.log")}`,
      { cause: error },
    );
  }
  return parseGinkgoJunit(xml);
}

function unescapeXml(s: string): string {
  return s.replaceAll("&quot;", '"').replaceAll("&apos;", "'").replaceAll("&lt;", "<")
    .replaceAll("&gt;", ">").replaceAll("&#xA;", "\n").replaceAll("&#x9;", "\t")
    .replaceAll("&amp;", "&");
}

/**
 * The specs a Ginkgo JUnit report says were run (`[It]` cases the filters selected; the
 * suite's set-up nodes only when they failed).
 */
export function parseGinkgoJunit(xml: string): SpecResult[] {
  const results: SpecResult[] = [];
  const cases = xml.matchAll(/<testcase\b([^>]*?)(\/>|>([\s\S]*?)<\/testcase>)/g);
  for (const m of cases) {
    const attr = (name: string) => m[1].match(new RegExp(`\\b${name}="([^"]*)"`))?.[1];
    const name = unescapeXml(attr("name") ?? "");
    const status = attr("status") ?? "";
    const body = m[3] ?? "";
    const seconds = Number(attr("time") ?? 0);
    if (!name.startsWith("[It]")) {
      // BeforeSuite and the like: only their failures matter.
      if (/<failure|<error/.test(body)) {
        results.push({ name, status: "failed", reason: firstLine(body), seconds, setup: true });
      }
      continue;
    }
    const spec = name.slice("[It] ".length);
    // Specs the filters left out are reported as skipped with the bare message "skipped";
    // a spec that skipped itself says why ("skipped - ..."). Pending specs never run.
    if (status === "pending" || /<skipped message="skipped"\s*\/?>/.test(body)) continue;
    if (status === "passed") results.push({ name: spec, status: "passed", seconds });
    else if (status === "skipped") {
      results.push({ name: spec, status: "skipped", reason: skipReason(body), seconds });
    } else results.push({ name: spec, status: "failed", reason: firstLine(body), seconds });
  }
  return results;
}

function skipReason(body: string): string {
  return unescapeXml(body.match(/<skipped message="([^"]*)"/)?.[1] ?? "").replace(/^skipped - /, "")
    .split("\n")[0].slice(0, 300);
}

function firstLine(body: string): string {
  const failure = body.match(
    /<(failure|error)\b([^>]*)>([\s\S]*?)<\/\1>|<(failure|error)\b([^>]*)\/>/,
  );
  const message = unescapeXml(
    (failure?.[2] ?? failure?.[5] ?? "").match(/message="([^"]*)"/)?.[1] ?? "",
  ).trim();
  const text = message || unescapeXml(failure?.[3] ?? "").trim();
  const lines = text.split("\n").map((l) => l.trim()).filter((l) => l !== "");
  // Gomega's "Expected success, but got an error:" says what on the lines after it.
  const first = lines[0] ?? "";
  return (first.endsWith(":") ? `${first} ${lines.slice(1, 3).join(" ")}` : first).slice(0, 300);
}

/** The line each run prints: `KubeVirt v1.7.0 conformance, substitute guests: ...`. */
export function summaryLine(handler: string, results: SpecResult[]): string {
  const specs = results.filter((r) => !r.setup);
  const of = specs.length;
  const count = (s: SpecResult["status"]) => specs.filter((r) => r.status === s).length;
  return `KubeVirt v1.7.0 conformance, substitute guests (${handler}): ${
    count("passed")
  } passed, ` +
    `${count("failed")} failed, ${count("skipped")} skipped of ${of}`;
}

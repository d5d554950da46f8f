/**
 * Runs the test tiers (unit, integration, e2e, fresh) with `deno test` and prints one
 * plain summary line, `tests: N passed, N failed, N skipped`, that CI reads.
 * Skipped tests are listed loudly: a skip is never a pass.
 *
 * Usage: `deno run -A tests/run.ts [unit|integration|e2e ...]`
 *
 * @module
 */
import { join } from "node:path";
import { type Cluster, startCluster } from "../deploy/cluster/cluster.ts";

// fresh: tests/fresh/check.sh installs the project into a debootstrapped Debian 12 root.
const TIERS = ["unit", "integration", "e2e", "fresh"] as const;
type Tier = typeof TIERS[number];

/** Counts read from one tier's JUnit report. */
interface TierResult {
  tier: Tier;
  passed: number;
  failed: string[];
  skipped: string[];
  seconds: number;
}

const root = new URL("..", import.meta.url).pathname;

function testFiles(tier: Tier): string[] {
  const dir = join(root, "tests", tier);
  try {
    return [...Deno.readDirSync(dir)]
      .filter((e) => e.isFile && e.name.endsWith("_test.ts"))
      .map((e) => join(dir, e.name))
      .sort();
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return [];
    throw error;
  }
}

function unescapeXml(s: string): string {
  return s.replaceAll("&quot;", '"').replaceAll("&apos;", "'").replaceAll("&lt;", "<")
    .replaceAll("&gt;", ">").replaceAll("&amp;", "&");
}

/** Reads passed, failed and skipped test names out of Deno's JUnit XML. */
export function parseJunit(xml: string): { passed: number; failed: string[]; skipped: string[] } {
  let passed = 0;
  const failed: string[] = [];
  const skipped: string[] = [];
  const cases = xml.matchAll(
    /<testcase name="([^"]*)" classname="([^"]*)"[^>]*?(\/>|>([\s\S]*?)<\/testcase>)/g,
  );
  for (const m of cases) {
    const name = `${unescapeXml(m[2])}: ${unescapeXml(m[1])}`;
    const body = m[4] ?? "";
    if (/<failure|<error/.test(body)) failed.push(name);
    else if (/<skipped/.test(body)) skipped.push(name);
    else passed++;
  }
  return { passed, failed, skipped };
}

async function runTier(tier: Tier, env: Record<string, string>): Promise<TierResult | undefined> {
  const files = testFiles(tier);
  if (files.length === 0) {
    console.log(`\n=== ${tier}: no test files`);
    return undefined;
  }
  console.log(`\n=== ${tier}: ${files.length} test files`);
  const junit = await Deno.makeTempFile({ prefix: `virtnode-${tier}-`, suffix: ".xml" });
  const args = ["test", "-A", `--junit-path=${junit}`];
  if (tier === "unit") args.push("--parallel");
  const started = performance.now();
  const status = await new Deno.Command(Deno.execPath(), {
    args: [...args, ...files],
    cwd: root,
    env,
    stdin: "null",
    stdout: "inherit",
    stderr: "inherit",
  }).output();
  const seconds = (performance.now() - started) / 1000;
  let xml = "";
  try {
    xml = await Deno.readTextFile(junit);
  } catch {
    // No report: the run died before writing one; counted below as a failure.
  }
  await Deno.remove(junit).catch(() => {});
  const result = { tier, ...parseJunit(xml), seconds };
  if (!status.success && result.failed.length === 0) {
    result.failed.push(`${tier}: deno test exited with code ${status.code} (see output above)`);
  }
  return result;
}

async function main(): Promise<number> {
  const asked = Deno.args.length > 0 ? Deno.args : [...TIERS];
  for (const t of asked) {
    if (!(TIERS as readonly string[]).includes(t)) {
      console.error(`Unknown test tier ${JSON.stringify(t)}: allowed: ${TIERS.join(", ")}`);
      return 2;
    }
  }
  const results: TierResult[] = [];
  // One control plane for the tiers that talk to an apiserver; tests that must stop
  // it or need an empty store start their own.
  let cluster: Cluster | undefined;
  const env: Record<string, string> = {};
  try {
    for (const tier of asked as Tier[]) {
      if (tier !== "unit" && tier !== "fresh" && !cluster && testFiles(tier).length > 0) {
        console.log("\n=== starting the shared test control plane (kube-apiserver + etcd)");
        cluster = await startCluster();
        env.VIRTNODE_TEST_KUBECONFIG = cluster.kubeconfigPath;
        console.log(`kubeconfig: ${cluster.kubeconfigPath}`);
      }
      const r = await runTier(tier, env);
      if (r) results.push(r);
    }
  } finally {
    await cluster?.stop();
  }
  const passed = results.reduce((n, r) => n + r.passed, 0);
  const failed = results.flatMap((r) => r.failed);
  const skipped = results.flatMap((r) => r.skipped);
  console.log("\n=== summary");
  for (const r of results) {
    console.log(
      `${r.tier}: ${r.passed} passed, ${r.failed.length} failed, ${r.skipped.length} skipped ` +
        `in ${r.seconds.toFixed(1)} s`,
    );
  }
  if (skipped.length > 0) {
    console.log(`\n!!! ${skipped.length} TESTS WERE SKIPPED (not counted as passing):`);
    for (const s of skipped) console.log(`!!!   ${s}`);
  }
  if (failed.length > 0) {
    console.log(`\nFAILED:`);
    for (const f of failed) console.log(`  ${f}`);
  }
  console.log(`\ntests: ${passed} passed, ${failed.length} failed, ${skipped.length} skipped`);
  return failed.length > 0 || results.length === 0 ? 1 : 0;
}

if (import.meta.main) Deno.exit(await main());

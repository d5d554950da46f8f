/**
 * KubeVirt v1.7.0's own conformance specs, with substitute guest images, on a real node:
 * KubeVirt installed by its own virt-operator (tests/harness/node/operator.ts), the specs run
 * first with virtnode in the operator's `virt-handler` DaemonSet, then with KubeVirt's own
 * virt-handler on the same node, the yardstick. Each run prints its line
 * (`KubeVirt v1.7.0 conformance, substitute guests (<handler>): N passed, ...`) and each
 * failed spec with the first line of its failure; the test fails when virtnode fails a
 * spec virt-handler passes.
 *
 * Which specs: `VIRTNODE_CONFORMANCE=all` runs the 62 that fit one node
 * ({@linkcode ONE_NODE_CONFORMANCE}); otherwise the CI subset ({@linkcode CI_FOCUS}).
 * `VIRTNODE_CONFORMANCE_FOCUS` (Ginkgo focus expressions, separated by `;`) runs those
 * specs instead, and `VIRTNODE_CONFORMANCE_HANDLERS` (`virtnode`, `virt-handler`) one
 * handler's run only. `VIRTNODE_CONFORMANCE_LABELS` replaces the label filter, to run specs
 * beyond the conformance label (e.g. the config-changing node-labeller specs, labelled
 * `Serial`); `VIRTNODE_CONFORMANCE_PLAN` names a JSON file of steps (handler, focus, label
 * filter, results file) run in order on one install. The results of both runs are written as
 * JSON to
 * `$VIRTNODE_CONFORMANCE_RESULTS` when set (docs/conformance.md is made from the full run's).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { startCluster } from "../../deploy/cluster/cluster.ts";
import { buildVirtctl } from "../../deploy/kubevirt/virtctl.ts";
import { startNode } from "../harness/node/node.ts";
import { type ClusterDns, startClusterDns } from "../harness/node/cluster_dns.ts";
import { type HandlerKind, installByOperator } from "../harness/node/operator.ts";
import { SUITE_IMAGES, suiteImageArchive } from "../harness/guest/suite_images.ts";
import { runSuite, type SpecResult, summaryLine } from "../helpers/kubevirt_suite.ts";

/**
 * The specs CI runs (Ginkgo focus expressions): a subset that fits its time beside the
 * other tiers.
 */
export const CI_FOCUS: string[] = [
  "lead to get the burstable QOS class assigned when limit and requests differ",
];

const ALL = Deno.env.get("VIRTNODE_CONFORMANCE") === "all";

/** The commit of the tree the run used, for the results; "unknown" outside a git tree. */
async function headCommit(): Promise<string> {
  const out = await new Deno.Command("git", {
    args: ["rev-parse", "--short", "HEAD"],
    cwd: new URL("../../", import.meta.url).pathname,
    stdout: "piped",
    stderr: "null",
  }).output().catch(() => undefined);
  return out?.success ? new TextDecoder().decode(out.stdout).trim() : "unknown";
}
/**
 * One run of the suite in a plan: a handler, its focus, its label filter, its results file,
 * and what it merges into the KubeVirt CR's `spec.configuration` (e.g. a default network
 * interface other than KubeVirt's bridge, which KubeVirt's handler cannot build here).
 */
interface PlanStep {
  handler: HandlerKind;
  focus?: string[];
  labels?: string;
  out?: string;
  configuration?: Record<string, unknown>;
}

/**
 * `VIRTNODE_CONFORMANCE_PLAN`: a JSON file of {@linkcode PlanStep}s run in order on one
 * install, each step's results written to its `out` when it ends (by hand: e.g. KubeVirt's
 * own handler on the 62, then both on the config-changing specs).
 */
const PLAN: PlanStep[] | undefined = Deno.env.get("VIRTNODE_CONFORMANCE_PLAN")
  ? JSON.parse(Deno.readTextFileSync(Deno.env.get("VIRTNODE_CONFORMANCE_PLAN")!))
  : undefined;

async function writeResults(
  file: string,
  focus: string[],
  labelFilter: string | undefined,
  results: Partial<Record<HandlerKind, SpecResult[]>>,
  configuration?: Record<string, unknown>,
): Promise<void> {
  const run = {
    date: new Date().toISOString(),
    commit: await headCommit(),
    focus,
    labelFilter,
    ...(configuration && Object.keys(configuration).length > 0 ? { configuration } : {}),
  };
  await Deno.writeTextFile(file, JSON.stringify({ ...run, results }, null, 2));
}

/**
 * `VIRTNODE_CONFORMANCE_DEADLINE` (an ISO time), by hand: no step starts within 5 minutes of
 * it, and a step's suite is given until 2 minutes before it (Ginkgo reports what ran).
 */
const DEADLINE = Deno.env.get("VIRTNODE_CONFORMANCE_DEADLINE")
  ? Date.parse(Deno.env.get("VIRTNODE_CONFORMANCE_DEADLINE")!)
  : undefined;

/** A Ginkgo label filter instead of the one-node conformance one, by hand. */
const LABELS = Deno.env.get("VIRTNODE_CONFORMANCE_LABELS");
const FOCUS = Deno.env.get("VIRTNODE_CONFORMANCE_FOCUS")?.split(";").filter(Boolean);
/** `VIRTNODE_CONFORMANCE_HANDLERS=virt-handler` (or `virtnode`): one run only, by hand. */
const HANDLERS = (Deno.env.get("VIRTNODE_CONFORMANCE_HANDLERS")?.split(",") ??
  ["virtnode", "virt-handler"]) as HandlerKind[];

Deno.test({
  name:
    "KubeVirt v1.7.0 conformance: virtnode passes every spec virt-handler passes on the same node",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    // The specs run with substitute guest images in place of KubeVirt's own, once per handler.
    const cluster = await startCluster({ podNetwork: true, crdDir: false });
    let node: Awaited<ReturnType<typeof startNode>> | undefined;
    let install: Awaited<ReturnType<typeof installByOperator>> | undefined;
    let dns: ClusterDns | undefined;
    const artifacts = await Deno.makeTempDir({ prefix: "virtnode-conformance-" });
    try {
      // The suite gives its guests the cluster DNS Service's address, and its Jobs reach
      // Services by name: the kubelet hands that nameserver to every pod.
      dns = await startClusterDns(cluster);
      node = await startNode(cluster, { isolated: true, clusterDns: dns.address });
      const virtctl = await buildVirtctl();
      install = await installByOperator(
        cluster,
        node,
        PLAN?.[0]?.handler ?? HANDLERS[0],
        PLAN?.[0]?.configuration,
      );
      // The suite's guests and its helper pod's image, under the names it gives them:
      // substitutes built here (tests/harness/guest/suite_images.sh).
      for (const image of SUITE_IMAGES) {
        await node.importImage((await suiteImageArchive(image)).archive);
      }
      const focus = FOCUS ?? (ALL ? [] : CI_FOCUS);
      const steps: PlanStep[] = PLAN ??
        HANDLERS.map((handler) => ({ handler, focus, labels: LABELS }));
      const results: Partial<Record<HandlerKind, SpecResult[]>> = {};
      /**
       * Per label filter (the conformance one: "") and CR configuration, per handler, the
       * specs run.
       */
      const byGroup = new Map<string, Partial<Record<HandlerKind, SpecResult[]>>>();
      for (const [i, step] of steps.entries()) {
        const handler = step.handler;
        const left = DEADLINE === undefined ? Infinity : DEADLINE - Date.now();
        if (left < 5 * 60_000) {
          console.log(`  step ${i} (${handler}) not started: the deadline is near`);
          continue;
        }
        const configuration = step.configuration ?? {};
        if (
          install.handler !== handler ||
          JSON.stringify(install.configuration) !== JSON.stringify(configuration)
        ) {
          await install.useHandler(handler, configuration);
        }
        const started = Date.now();
        const specs = await runSuite({
          suiteDir: install.suiteDir,
          kubeconfig: cluster.kubeconfigPath,
          virtctl,
          artifacts: join(artifacts, `${i}-${handler}`),
          focus: step.focus ?? [],
          labelFilter: step.labels,
          timeout: DEADLINE !== undefined
            ? `${Math.max(60, Math.floor((DEADLINE - Date.now()) / 1000) - 120)}s`
            : ALL || PLAN
            ? "4h"
            : "1h",
          log: (line) => {
            // The spec headers and outcomes only: the whole log is in the artifacts.
            if (/^(• |\[FAIL\]|\[It\]|S \[SKIPPED\]|Ran \d+ of)/.test(line)) {
              console.log(`  [${handler}] ${line.slice(0, 240)}`);
            }
          },
        });
        results[handler] = [...(results[handler] ?? []), ...specs];
        const groupKey = `${step.labels ?? ""} ${JSON.stringify(configuration)}`;
        const group = byGroup.get(groupKey) ?? {};
        group[handler] = [...(group[handler] ?? []), ...specs];
        byGroup.set(groupKey, group);
        console.log(summaryLine(handler, specs));
        for (const s of specs.filter((s) => s.status === "failed")) {
          console.log(`  FAILED (${handler}): ${s.name}\n    ${s.reason}`);
        }
        console.log(`  (${((Date.now() - started) / 60_000).toFixed(1)} min)`);
        // Each step's results as soon as it ends: a plan takes hours.
        if (step.out) {
          await writeResults(
            step.out,
            step.focus ?? [],
            step.labels,
            { [handler]: specs },
            step.configuration,
          );
        }
      }
      const out = Deno.env.get("VIRTNODE_CONFORMANCE_RESULTS");
      if (out && !PLAN) await writeResults(out, focus, LABELS, results);
      for (const group of byGroup.values()) {
        const passedByYardstick = new Set(
          (group["virt-handler"] ?? []).filter((s) => s.status === "passed").map((s) => s.name),
        );
        const ran = new Set((group.virtnode ?? []).map((s) => s.name));
        const passedByVirtnode = new Set(
          (group.virtnode ?? []).filter((s) => s.status === "passed").map((s) => s.name),
        );
        const behind = [...passedByYardstick].filter((n) => ran.has(n) && !passedByVirtnode.has(n));
        assert.deepEqual(behind, [], "specs virt-handler passes and virtnode does not");
      }
      if (!ALL && !FOCUS && !PLAN) {
        // CI's subset holds specs both handlers pass here: every one must pass, so that a
        // broken set-up (nothing passing on either side) fails too.
        for (const handler of HANDLERS) {
          const failed = (results[handler] ?? []).filter((s) => s.status !== "passed");
          assert.deepEqual(failed.map((s) => s.name), [], `${handler}: CI's specs not passed`);
          assert.ok((results[handler] ?? []).length >= CI_FOCUS.length, `${handler}: specs run`);
        }
      }
      // A plan is run by hand, to be looked into: its logs stay.
      if (PLAN) console.log(`Artifacts of the plan's steps: ${artifacts}`);
      else await Deno.remove(artifacts, { recursive: true });
    } catch (error) {
      console.log(`Artifacts kept for the failure: ${artifacts}`);
      throw error;
    } finally {
      await install?.uninstall().catch((e) => console.log(`uninstall: ${e}`));
      await dns?.stop();
      await node?.stop();
      await cluster.stop();
    }
  },
});

/**
 * The yardstick of tests/node/migration_node_test.ts: the same journey (a VM migrated between
 * two real nodes, then a live CPU change carried by a migration) with KubeVirt's
 * own virt-handler in its DaemonSet on both nodes (tests/harness/node/migration_journey.ts).
 * In the conformance tier: it takes a two-node cluster of its own, which the test command's
 * fresh-machine budget has no room for twice; docs/conformance.md keeps its latest result.
 */
import { migrationJourney } from "../harness/node/migration_journey.ts";

Deno.test("yardstick: virt-handler migrates a VM between two nodes, then plugs a vCPU and memory", async () => {
  await migrationJourney("virt-handler");
});

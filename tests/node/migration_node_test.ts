/**
 * Live migration, and a live CPU and memory change carried by one, on a cluster of two real
 * nodes with virtnode's DaemonSet applied as shipped (only its image is this machine's):
 * tests/harness/node/migration_journey.ts. virtnode's handlers prepare the target, carry the
 * migration through their mutual-TLS proxy between the two handler pods, hand the VMI over,
 * and on the target of the change's migration plug the new vCPU and memory; then a NIC added
 * to the VM's template is plugged on the target of the migration virt-controller starts for
 * it, and unplugged again (`state: absent`). The same journey with KubeVirt's own virt-handler,
 * the yardstick (without the NIC, whose bridge binding virt-handler cannot build on this
 * kernel), is in the conformance tier
 * (tests/conformance/migration_yardstick_test.ts), whose latest result docs/conformance.md keeps.
 */
import { migrationJourney } from "../harness/node/migration_journey.ts";

Deno.test("node: migration between two nodes, then a vCPU, memory and a NIC plugged live, the NIC unplugged", async () => {
  await migrationJourney("virtnode");
});

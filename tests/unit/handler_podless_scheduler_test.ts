import assert from "node:assert/strict";
import { scheduledStatus, wantsNode } from "../../mod/handler/testing.ts";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { computeStatus } from "../../mod/handler/testing.ts";

function vmi(status: VirtualMachineInstance["status"], labels?: Record<string, string>) {
  return {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachineInstance",
    metadata: { name: "vm", namespace: "default", labels },
    spec: { nodeSelector: { "kubernetes.io/hostname": "node-a" }, domain: { devices: {} } },
    status,
  } as VirtualMachineInstance;
}

Deno.test("scheduledStatus() moves a Pending VMI to Scheduled on the node, keeping what virt-api stamped", () => {
  const pending = vmi(
    {
      phase: "Pending",
      phaseTransitionTimestamps: [{ phase: "Pending", phaseTransitionTimestamp: "t0" }],
    } as VirtualMachineInstance["status"],
  );
  const s = scheduledStatus(pending, "node-a", "t1");
  assert.equal(s.phase, "Scheduled");
  assert.equal(s.nodeName, "node-a");
  assert.deepEqual(s.phaseTransitionTimestamps, [
    { phase: "Pending", phaseTransitionTimestamp: "t0" },
    { phase: "Scheduled", phaseTransitionTimestamp: "t1" },
  ]);
  assert.equal(pending.status!.phase, "Pending", "the VMI it was given is not changed");
  // A VMI without any status (no virt-api) is Pending too.
  assert.equal(scheduledStatus(vmi(undefined), "node-a", "t1").phase, "Scheduled");
});

Deno.test("scheduledStatus() leaves a VMI that is past Pending as it is", () => {
  const running = vmi({ phase: "Running", nodeName: "node-b" } as VirtualMachineInstance["status"]);
  assert.deepEqual(scheduledStatus(running, "node-a", "t1"), running.status);
});

Deno.test("wantsNode() takes only unplaced Pending VMIs whose nodeSelector names the node", () => {
  assert.equal(
    wantsNode(vmi({ phase: "Pending" } as VirtualMachineInstance["status"]), "node-a"),
    true,
  );
  assert.equal(wantsNode(vmi(undefined), "node-b"), false, "another node");
  assert.equal(
    wantsNode(vmi(undefined, { "kubevirt.io/nodeName": "node-a" }), "node-a"),
    false,
    "placed already",
  );
  assert.equal(
    wantsNode(vmi({ phase: "Scheduled" } as VirtualMachineInstance["status"]), "node-a"),
    false,
  );
});

Deno.test("scheduledStatus() carries what the handler's first sync computes, so that sync writes nothing", () => {
  const pending = vmi({ phase: "Pending" } as VirtualMachineInstance["status"]);
  const s = scheduledStatus(pending, "node-a", "t1");
  const ready = s.conditions?.find((c) => c.type === "Ready");
  assert.equal(ready?.status, "False");
  assert.equal(ready?.reason, "GuestNotRunning");
  assert.ok(s.conditions?.some((c) => c.type === "LiveMigratable"));
  // The first sync: Scheduled, its launcher not ready yet, no domain.
  const first = computeStatus({ ...pending, status: s }, {
    domain: undefined,
    launcher: "notReady",
    nodeName: "node-a",
    standIn: { podInterfaceName: "eth0" },
    now: "t2",
  });
  assert.deepEqual(first.status, s);
  assert.equal(first.phaseChange, undefined);
});

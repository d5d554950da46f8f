/** Local mode's screen (deploy/local_screen.ts): the VMIs' rows and the handler's last action. */
import assert from "node:assert/strict";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { age, lastActionLine, vmiRows } from "../../deploy/local_screen.ts";

const NOW = Date.parse("2026-12-06T10:00:00Z");
const ago = (s: number) => new Date(NOW - s * 1000).toISOString();

function vmi(name: string, status: VirtualMachineInstance["status"], created: number) {
  return {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachineInstance",
    metadata: { name, namespace: "default", creationTimestamp: ago(created) },
    spec: { domain: { devices: {} } },
    status,
  } as VirtualMachineInstance;
}

Deno.test("age() counts as kubectl shows it: seconds, minutes, hours, days", () => {
  assert.equal(age(ago(42), NOW), "42s");
  assert.equal(age(ago(119), NOW), "119s");
  assert.equal(age(ago(7 * 60), NOW), "7m");
  assert.equal(age(ago(3 * 3600), NOW), "3h");
  assert.equal(age(ago(3 * 86_400), NOW), "3d");
  assert.equal(age(undefined, NOW), "-");
  assert.equal(age("not a time", NOW), "-");
});

Deno.test("vmiRows() shows name, phase, IP, node, age and Ready, and a sync error after its row", () => {
  const rows = vmiRows(
    [
      vmi("vmi-cirros", {
        phase: "Running",
        nodeName: "host1",
        interfaces: [{ name: "default", ipAddress: "10.245.0.7" }],
        conditions: [{ type: "Ready", status: "True" }],
      }, 42),
      vmi("vmi-bad", {
        phase: "Scheduled",
        conditions: [{ type: "Synchronized", status: "False", message: "no such disk" }],
      }, 5),
    ],
    false,
    NOW,
  );
  assert.match(rows[0], /^NAME +PHASE +IP +NODE +AGE +READY$/);
  assert.match(rows[1], /^vmi-cirros +Running +10\.245\.0\.7 +host1 +42s +True$/);
  assert.match(rows[2], /^vmi-bad +Scheduled +- +- +5s +- +sync error: no such disk$/);
  const stale = vmiRows([vmi("vmi-cirros", { phase: "Running" }, 1)], true, NOW);
  assert.match(stale[1], /Running \(stale\)/);
});

Deno.test("lastActionLine() names the handler's newest Event, its VMI and how long ago", () => {
  const events = [
    {
      reason: "Created",
      message: "VirtualMachineInstance defined.",
      lastTimestamp: ago(30),
      source: { component: "virt-handler" },
      involvedObject: { namespace: "default", name: "vmi-cirros" },
    },
    {
      reason: "Started",
      message: "VirtualMachineInstance started.",
      lastTimestamp: ago(4),
      source: { component: "virt-handler" },
      involvedObject: { namespace: "demo", name: "vmi-alpine" },
    },
    {
      reason: "SuccessfulCreate",
      message: "not the handler's",
      lastTimestamp: ago(1),
      source: { component: "virt-controller" },
    },
  ];
  assert.equal(
    lastActionLine(events, NOW),
    "handler, 4s ago: Started: VirtualMachineInstance started. (demo/vmi-alpine)",
  );
  assert.equal(lastActionLine([], NOW), "handler: no Event yet");
});

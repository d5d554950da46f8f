/**
 * SR-IOV interfaces plugged into a running VMI in KubeVirt mode (mod/handler/sriov_hotplug.ts):
 * which VMIs ask for it, virt-handler's limited backoff, and the controller raising QEMU's
 * locked-memory limit before the launcher's HotplugHostDevices.
 */
import assert from "node:assert/strict";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { LimitedBackoff, sriovInterfacesToPlug } from "../../mod/handler/testing.ts";
import { runningController } from "../helpers/controller_doubles.ts";

const UID = "5a3c0e1e-0000-4000-8000-0000000000a1";

function vmi(interfaces: { name: string; infoSource?: string }[]): VirtualMachineInstance {
  return {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachineInstance",
    metadata: { namespace: "default", name: "vm1", uid: UID, resourceVersion: "1" },
    spec: {
      domain: {
        devices: {
          interfaces: [
            { name: "default", masquerade: {} },
            { name: "fast", sriov: {} },
            { name: "slow", sriov: {} },
          ],
        },
      },
      networks: [
        { name: "default", pod: {} },
        { name: "fast", multus: { networkName: "sriov-a" } },
        { name: "slow", multus: { networkName: "sriov-b" } },
      ],
    },
    status: { phase: "Running", nodeName: "node1", interfaces },
  } as VirtualMachineInstance;
}

Deno.test("sriovInterfacesToPlug(): SR-IOV interfaces Multus reported outnumber those in the domain", () => {
  assert.equal(sriovInterfacesToPlug(vmi([])), false, "nothing reported by Multus yet");
  assert.equal(
    sriovInterfacesToPlug(vmi([{ name: "fast", infoSource: "domain, multus-status" }])),
    false,
  );
  assert.equal(
    sriovInterfacesToPlug(vmi([
      { name: "fast", infoSource: "domain, guest-agent, multus-status" },
      { name: "slow", infoSource: "multus-status" },
    ])),
    true,
  );
  // A bridge interface waiting for its domain is not SR-IOV's business.
  assert.equal(
    sriovInterfacesToPlug(vmi([{ name: "default", infoSource: "multus-status" }])),
    false,
  );
  const bridged = vmi([{ name: "fast", infoSource: "multus-status" }]);
  bridged.spec.domain.devices.interfaces = [{ name: "fast", bridge: {} }];
  assert.equal(sriovInterfacesToPlug(bridged), false);
});

Deno.test("LimitedBackoff: at once, then 3 s growing by 1.8 up to 10 minutes, nothing after 5 hours", () => {
  let now = 1_000_000;
  const b = new LimitedBackoff(() => now);
  const waits: number[] = [];
  for (let i = 0; i < 12; i++) {
    assert.equal(b.ready(), true);
    b.step();
    const from = now;
    while (!b.ready()) now += 100;
    waits.push(now - from);
  }
  assert.deepEqual(waits.slice(0, 4), [3_100, 5_500, 9_800, 17_500]);
  assert.equal(waits.at(-1), 600_100, "capped at 10 minutes");
  now = 1_000_000 + 5 * 3600_000;
  assert.equal(b.ready(), false, "never again after 5 hours");
});

Deno.test("reconcile() of a running VMI raises QEMU's memlock, then asks HotplugHostDevices, with backoff", async () => {
  const calls: string[] = [];
  let now = 0;
  let lockFails = false;
  const client = {
    hotplugHostDevices: () => {
      calls.push("hotplugHostDevices");
      return Promise.resolve();
    },
    syncVirtualMachine: () => {
      calls.push("syncVirtualMachine");
      return Promise.resolve();
    },
  };
  const { controller, cache, events, stop } = runningController({
    uid: UID,
    client,
    provider: {
      lockQemuMemory: () => {
        calls.push("lockQemuMemory");
        return lockFails
          ? Promise.reject(new Error("no QEMU process found under process 7 child processes"))
          : Promise.resolve({ pid: 9, bytes: 1 });
      },
    },
    sriovClock: () => now,
  });
  const v = vmi([
    { name: "default", infoSource: "domain" },
    { name: "fast", infoSource: "multus-status" },
  ]);
  cache.set("default/vm1", v);
  // The first sync adopts the running domain; the next ones plug.
  await controller.reconcile("default/vm1");
  calls.length = 0;
  await controller.reconcile("default/vm1");
  assert.deepEqual(calls, ["lockQemuMemory", "hotplugHostDevices"]);
  // Within the backoff: nothing; after 3 s: again.
  calls.length = 0;
  now += 1_000;
  await controller.reconcile("default/vm1");
  assert.deepEqual(calls, []);
  now += 3_000;
  lockFails = true;
  const failed = await controller.reconcile("default/vm1").then(
    (r) => JSON.stringify(r),
    (e: Error) => e.message,
  );
  assert.match(failed, /failed to hot-plug SR-IOV interfaces: no QEMU process found/);
  assert.deepEqual(calls, ["lockQemuMemory"], "no plug without the limit");
  assert.ok(events.some((e) => e.startsWith("Warning no QEMU process found")), events.join("; "));
  // Plugged: the domain has it; nothing more is asked.
  calls.length = 0;
  now += 600_000;
  cache.set("default/vm1", vmi([{ name: "fast", infoSource: "domain, multus-status" }]));
  await controller.reconcile("default/vm1");
  assert.deepEqual(calls, []);
  stop();
});

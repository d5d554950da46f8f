/**
 * Bridge interfaces plugged into a running VMI in KubeVirt mode (mod/handler/nic_hotplug.ts):
 * which interfaces are to plug, and the controller building their bindings in the pod and
 * syncing the launcher, which attaches them (after the migration virt-controller starts).
 */
import assert from "node:assert/strict";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { interfacesToPlug, interfacesToUnplug } from "../../mod/handler/testing.ts";
import { runningController } from "../helpers/controller_doubles.ts";

const UID = "5a3c0e1e-0000-4000-8000-0000000000b2";

function vmi(
  interfaces: { name: string; infoSource?: string; podInterfaceName?: string }[],
  redState?: string,
): VirtualMachineInstance {
  return {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachineInstance",
    metadata: { namespace: "default", name: "vm1", uid: UID, resourceVersion: "1" },
    spec: {
      domain: {
        devices: {
          interfaces: [
            { name: "default", masquerade: {} },
            { name: "red", bridge: {}, ...(redState ? { state: redState } : {}) },
          ],
        },
      },
      networks: [{ name: "default", pod: {} }, { name: "red", multus: { networkName: "red" } }],
    },
    status: { phase: "Running", nodeName: "node1", interfaces },
  } as VirtualMachineInstance;
}

Deno.test("interfacesToPlug(): in the pod (multus-status), not in the domain, not absent", () => {
  assert.deepEqual(interfacesToPlug(vmi([{ name: "red", infoSource: "multus-status" }])), ["red"]);
  assert.deepEqual(
    interfacesToPlug(vmi([{ name: "red", infoSource: "domain, multus-status" }])),
    [],
  );
  assert.deepEqual(interfacesToPlug(vmi([])), [], "Multus has not reported it yet");
  assert.deepEqual(
    interfacesToPlug(vmi([{ name: "red", infoSource: "multus-status" }], "absent")),
    [],
    "an absent one is unplugged, not plugged",
  );
  assert.deepEqual(
    interfacesToPlug(vmi([{ name: "gone", infoSource: "multus-status" }])),
    [],
    "only the spec's interfaces",
  );
  const sriov = vmi([{ name: "red", infoSource: "multus-status" }]);
  sriov.spec.domain.devices.interfaces![1] = { name: "red", sriov: {} };
  assert.deepEqual(interfacesToPlug(sriov), [], "SR-IOV is plugged as host devices");
});

Deno.test("interfacesToUnplug(): absent, and no longer from the domain, with its pod interface", () => {
  assert.deepEqual(
    interfacesToUnplug(vmi([{ name: "red", infoSource: "multus-status" }], "absent")),
    [{ name: "red", podInterface: "podb1f51a511f1" }],
  );
  assert.deepEqual(
    interfacesToUnplug(
      vmi([{ name: "red", infoSource: "multus-status", podInterfaceName: "net1" }], "absent"),
    ),
    [{ name: "red", podInterface: "net1" }],
    "the name virt-controller reported",
  );
  assert.deepEqual(
    interfacesToUnplug(
      vmi([{ name: "red", infoSource: "multus-status", podInterfaceName: "../x" }], "absent"),
    ),
    [{ name: "red", podInterface: "podb1f51a511f1" }],
    "a reported name that is no link name is not used",
  );
  assert.deepEqual(
    interfacesToUnplug(vmi([{ name: "red", infoSource: "domain, multus-status" }], "absent")),
    [],
    "still in the domain: the launcher detaches it first",
  );
  assert.deepEqual(interfacesToUnplug(vmi([{ name: "red", infoSource: "multus-status" }])), []);
});

Deno.test("reconcile() of a running VMI builds the binding of an interface to plug, then syncs the launcher", async () => {
  const calls: string[] = [];
  const client = {
    syncVirtualMachine: (v: VirtualMachineInstance) => {
      calls.push(`sync ${v.status?.interfaces?.map((i) => `${i.name}:${i.infoSource}`).join(" ")}`);
      return Promise.resolve();
    },
  };
  const target = { netns: "/proc/1/ns/net" };
  let setupFails = false;
  const { controller, cache, events, stop } = runningController({
    uid: UID,
    client,
    provider: { podNetwork: () => Promise.resolve(target) },
    networks: {
      unplug: (
        _v: VirtualMachineInstance,
        t: unknown,
        gone: { name: string; podInterface: string }[],
      ) => {
        calls.push(
          `unplug ${gone.map((g) => `${g.name}:${g.podInterface}`).join(",")} in ${
            (t as typeof target).netns
          }`,
        );
        return Promise.resolve(gone.map((g) => g.name));
      },
      setup: (_v: VirtualMachineInstance, t: unknown, only?: ReadonlySet<string>) => {
        calls.push(`setup ${[...(only ?? [])].join(",")} in ${(t as typeof target).netns}`);
        return setupFails
          ? Promise.reject(new Error("no pod interface podb1f51a511f1"))
          : Promise.resolve();
      },
    },
  });
  // The migrated domain is adopted; nothing to plug: no sync.
  cache.set("default/vm1", vmi([{ name: "default", infoSource: "domain" }]));
  await controller.reconcile("default/vm1");
  assert.deepEqual(calls, []);
  // virt-controller reports the new pod's network: the binding, then a sync that plugs it.
  cache.set(
    "default/vm1",
    vmi([{ name: "default", infoSource: "domain" }, { name: "red", infoSource: "multus-status" }]),
  );
  await controller.reconcile("default/vm1");
  assert.deepEqual(calls, ["setup red in /proc/1/ns/net", "sync default:domain red:multus-status"]);
  // Again with nothing new: no second sync.
  calls.length = 0;
  await controller.reconcile("default/vm1");
  assert.deepEqual(calls, []);
  // Plugged: the domain has it; the spec as synced last, one sync for the change of state.
  cache.set("default/vm1", vmi([{ name: "red", infoSource: "domain, multus-status" }]));
  await controller.reconcile("default/vm1");
  assert.deepEqual(calls, ["sync red:domain, multus-status"]);
  // A binding that cannot be built is told and the sync goes on (virt-handler's NicHotplug).
  calls.length = 0;
  setupFails = true;
  cache.set("default/vm1", vmi([{ name: "red", infoSource: "multus-status" }]));
  await controller.reconcile("default/vm1");
  assert.deepEqual(calls, ["setup red in /proc/1/ns/net", "sync red:multus-status"]);
  assert.ok(events.some((e) => e.startsWith("Warning NicHotplug") && /podb1f51a511f1/.test(e)));
  // Unplugged: the spec says absent (a sync has the launcher detach it), then the status has
  // it no longer from the domain: its binding is taken down.
  calls.length = 0;
  cache.set("default/vm1", vmi([{ name: "red", infoSource: "domain, multus-status" }], "absent"));
  await controller.reconcile("default/vm1");
  assert.deepEqual(calls, ["sync red:domain, multus-status"]);
  calls.length = 0;
  cache.set("default/vm1", vmi([{ name: "red", infoSource: "multus-status" }], "absent"));
  await controller.reconcile("default/vm1");
  assert.deepEqual(calls, ["unplug red:podb1f51a511f1 in /proc/1/ns/net"]);
  stop();
});

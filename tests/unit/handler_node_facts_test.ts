/**
 * LiveMigratable hangs on a fact of the node, its host-model CPU, which the labeller reads
 * after the handler starts: the condition is not written from a guess before the fact is
 * known, and the VMIs that depend on it are synced again once it is.
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import type { KubeClient } from "../../mod/kube/mod.ts";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { LifeCycle, newDomain, StateChangeReason } from "../../mod/domain/mod.ts";
import {
  type NodeLabelInfo,
  NodeLabeller,
  parseCpuFeatures,
  parseDomainCapabilities,
  parseHostCapabilities,
} from "../../mod/node/mod.ts";
import { computeStatus } from "../../mod/handler/testing.ts";
import {
  type ControllerDeps,
  type HostCpuSource,
  VmiController,
} from "../../mod/handler/testing.ts";
import { Expectations, WorkQueue } from "../../mod/kube/mod.ts";

const FIXTURES = fileURLToPath(new URL("../fixtures/labeller/", import.meta.url));
const HOST = "intel-skylake-server";

function hostInfo(withHostModel = true): NodeLabelInfo {
  const read = (name: string) => Deno.readTextFileSync(`${FIXTURES}${HOST}.${name}.xml`);
  const domcaps = read("domcapabilities");
  return {
    host: parseHostCapabilities(read("capabilities")),
    domain: parseDomainCapabilities(
      withHostModel ? domcaps : domcaps.replace(/name=['"]host-model['"]/, "name='no-model'"),
    ),
    supportedFeatures: parseCpuFeatures(read("baseline")),
  };
}

function vmi(model: string | undefined, conditions?: { type: string; status: string }[]) {
  return {
    metadata: { name: "vm1", namespace: "default", uid: "u1" },
    spec: { domain: { ...(model ? { cpu: { model } } : {}), devices: {} } },
    status: { phase: "Running", nodeName: "node1", ...(conditions ? { conditions } : {}) },
  } as VirtualMachineInstance;
}

function liveMigratable(v: VirtualMachineInstance, hostCpuModel: string | undefined) {
  const domain = newDomain({ namespace: "default", name: "vm1", uid: "u1" }, {
    status: LifeCycle.Running,
    reason: StateChangeReason.Unknown,
  });
  const status = computeStatus(v, {
    domain,
    launcher: "responsive",
    nodeName: "node1",
    standIn: { podInterfaceName: "eth0" },
    now: "2026-11-29T10:00:00Z",
    migratable: { hostCpuModel },
  }).status;
  return status.conditions?.find((c) => c.type === "LiveMigratable");
}

Deno.test("NodeLabeller.hostCpuModel is unknown before the first read, then the model or empty", async () => {
  let withModel = true;
  const labeller = new NodeLabeller({} as KubeClient, "node1", {
    source: () => Promise.resolve(hostInfo(withModel)),
  });
  assert.equal(labeller.hostCpuModel, undefined);
  await labeller.info();
  assert.equal(labeller.hostCpuModel, "Skylake-Server-IBRS");
  withModel = false;
  await labeller.info(true);
  assert.equal(labeller.hostCpuModel, "");
});

Deno.test("NodeLabeller tells listeners of a new or changed host CPU model, not of an unchanged read", async () => {
  let withModel = true;
  const labeller = new NodeLabeller({} as KubeClient, "node1", {
    source: () => Promise.resolve(hostInfo(withModel)),
  });
  const heard: (string | undefined)[] = [];
  const off = labeller.onHostCpuModel(() => heard.push(labeller.hostCpuModel));
  await labeller.info();
  await labeller.info(true);
  assert.deepEqual(heard, ["Skylake-Server-IBRS"]);
  withModel = false;
  await labeller.info(true);
  assert.deepEqual(heard, ["Skylake-Server-IBRS", ""]);
  off();
  withModel = true;
  await labeller.info(true);
  assert.deepEqual(heard, ["Skylake-Server-IBRS", ""], "a listener taken off hears nothing");
});

Deno.test("computeStatus() keeps a host-model VMI's LiveMigratable while the host's CPU model is unknown", () => {
  const before = [{ type: "LiveMigratable", status: "True" }];
  assert.deepEqual(liveMigratable(vmi("host-model", before), undefined), before[0]);
  assert.equal(liveMigratable(vmi("host-model"), undefined), undefined, "none written");
  // Known: the verdict is written, either way.
  assert.equal(liveMigratable(vmi("host-model", before), "Skylake-Server-IBRS")?.status, "True");
  const none = liveMigratable(vmi("host-model", before), "");
  assert.equal(none?.status, "False");
  assert.equal(none?.reason, "CPUModeLiveMigratable");
  // A VMI that does not use the host model does not wait for it.
  assert.equal(liveMigratable(vmi("host-passthrough"), undefined)?.status, "True");
});

Deno.test("the controller syncs the host-model VMIs again when the labeller learns the host's CPU model", async () => {
  const listeners: (() => void)[] = [];
  const hostCpu: HostCpuSource = {
    hostCpuModel: undefined,
    onHostCpuModel(listener) {
      listeners.push(listener);
      return () => {};
    },
  };
  const vmis = [
    { ...vmi("host-model"), metadata: { name: "a", namespace: "ns", uid: "ua" } },
    { ...vmi("host-passthrough"), metadata: { name: "b", namespace: "ns", uid: "ub" } },
    { ...vmi("host-model"), metadata: { name: "c", namespace: "ns", uid: "uc" } },
  ] as VirtualMachineInstance[];
  const queue = new WorkQueue<string>();
  new VmiController({
    nodeName: "node1",
    informer: {
      addHandlers: () => {},
      list: () => vmis,
      hasSynced: () => true,
      get: () => undefined,
    },
    queue,
    expectations: new Expectations(),
    hostCpu,
  } as unknown as ControllerDeps);
  assert.equal(queue.len(), 0);
  assert.equal(listeners.length, 1, "the controller listens");
  listeners[0]();
  const keys: string[] = [];
  while (queue.len() > 0) {
    const key = (await queue.get())!;
    keys.push(key);
    queue.done(key);
  }
  assert.deepEqual(keys.sort(), ["ns/a", "ns/c"]);
  queue.shutDown();
});

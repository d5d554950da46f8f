/**
 * Bad network specs end where the user looks, through KubeVirt's own admission and a
 * pod-less handler: what virt-api refuses never gets created (kubectl's message names the
 * field), and what it lets through but the node cannot serve is refused by the handler with
 * a `Synchronized=False` condition and a `SyncFailed` Event that name the field, without a
 * domain, a pod namespace or a crash.
 */
import assert from "node:assert/strict";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { KubeApiError } from "../../mod/kube/mod.ts";
import {
  createVmi,
  eventsFor,
  getVmi,
  testVmi,
  waitFor,
  withHandler,
} from "../helpers/handler_process.ts";

type Spec = { interfaces: Record<string, unknown>[]; networks: Record<string, unknown>[] };

const CASES: { what: string; spec: Spec; refusedBy: "virt-api" | "handler"; message: RegExp }[] = [
  {
    what: "an interface without a matching network",
    spec: {
      interfaces: [{ name: "default", masquerade: {} }],
      networks: [{ name: "other", pod: {} }],
    },
    refusedBy: "virt-api",
    message: /spec\.domain\.devices\.interfaces\[0\]\.name 'default' not found/,
  },
  {
    what: "two interfaces on the pod network",
    spec: {
      interfaces: [{ name: "a", masquerade: {} }, { name: "b", bridge: {} }],
      networks: [{ name: "a", pod: {} }, { name: "b", pod: {} }],
    },
    refusedBy: "virt-api",
    message: /more than one interface is connected to a pod network/,
  },
  {
    what: "a port with a bad protocol",
    spec: {
      interfaces: [{ name: "default", masquerade: {}, ports: [{ port: 80, protocol: "SCTP" }] }],
      networks: [{ name: "default", pod: {} }],
    },
    refusedBy: "virt-api",
    message: /Unknown protocol, only TCP or UDP allowed/,
  },
  {
    what: "the passt binding",
    spec: {
      interfaces: [{ name: "default", passt: {} }],
      networks: [{ name: "default", pod: {} }],
    },
    refusedBy: "virt-api",
    message: /[Pp]asst/,
  },
  {
    what: "SR-IOV on the pod network",
    spec: {
      interfaces: [{ name: "default", sriov: {} }],
      networks: [{ name: "default", pod: {} }],
    },
    refusedBy: "handler",
    message: /spec\.domain\.devices\.interfaces\[0\]\.sriov.*SR-IOV/,
  },
  {
    what: "a secondary network whose NetworkAttachmentDefinition does not exist",
    spec: {
      interfaces: [{ name: "default", masquerade: {} }, { name: "sec", bridge: {} }],
      networks: [{ name: "default", pod: {} }, { name: "sec", multus: { networkName: "nad1" } }],
    },
    refusedBy: "handler",
    message: /NetworkAttachmentDefinition "default\/nad1" of network "sec"/,
  },
  {
    what: "a network binding plugin",
    spec: {
      interfaces: [{ name: "default", binding: { name: "passt" } }],
      networks: [{ name: "default", pod: {} }],
    },
    refusedBy: "handler",
    message: /spec\.domain\.devices\.interfaces\[0\]\.binding.*binding plugins/,
  },
];

Deno.test("bad network specs: virt-api refuses what it checks, the handler names the field of the rest", async () => {
  // For specs virt-api lets through, the handler names the bad field in a condition and an Event.
  await withHandler("badnet", async ({ h, node, client }) => {
    for (const [i, c] of CASES.entries()) {
      const name = `bad${i}`;
      const vmi = testVmi(name, node, { extra: { interfaces: c.spec.interfaces } });
      (vmi.spec.domain.devices as Record<string, unknown>).autoattachPodInterface = undefined;
      vmi.spec.networks = c.spec.networks as unknown as VirtualMachineInstance["spec"]["networks"];
      if (c.refusedBy === "virt-api") {
        await assert.rejects(createVmi(client, vmi), (error: unknown) => {
          assert.ok(error instanceof KubeApiError, `${c.what}: ${error}`);
          assert.match(error.message, c.message, c.what);
          return true;
        });
        continue;
      }
      await createVmi(client, vmi);
      const condition = await waitFor(
        `${c.what}: the Synchronized condition`,
        async () =>
          (await getVmi(client, "default", name))?.status?.conditions?.find((x) =>
            x.type === "Synchronized"
          ),
      );
      assert.equal(condition.status, "False");
      assert.match(condition.message ?? "", c.message, c.what);
      const event = await waitFor(
        `${c.what}: the SyncFailed event`,
        async () =>
          (await eventsFor(client, "default", name)).find((e) => e.reason === "SyncFailed"),
      );
      assert.equal(event.type, "Warning");
      assert.match(event.message ?? "", c.message);
      assert.equal(
        (await getVmi(client, "default", name))?.status?.phase,
        "Scheduled",
        "nothing ran",
      );
      await client.request(
        "DELETE",
        `/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances/${name}`,
      );
    }
    // Nothing was built for any of them, and the handler still serves.
    assert.deepEqual([...Deno.readDirSync(h.runDir)].filter((e) => e.name === "netns"), []);
    assert.equal((await fetch(`${h.health}/readyz`).then((r) => r.text())).trim(), "ok");
  });
});

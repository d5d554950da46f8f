/**
 * Events a launcher asks the handler to record (`HandleK8sEvent`) are about its own VMI
 * only, as KubeVirt's handler checks them: a VMI of this node's cache with the same UID,
 * and no flood (client-go's spam filter: 25 at once per VMI, then one per 5 minutes).
 * A real handler process, a real apiserver with KubeVirt's CRDs and admission, and the
 * handler's own notify socket.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { SocketNames } from "../../mod/api/mod.ts";
import { EventSpamFilter } from "../../mod/kube/mod.ts";
import { newNotifyClient, type Response } from "../../mod/proto/mod.ts";
import {
  createVmi,
  deleteVmi,
  eventsFor,
  testVmi,
  waitFor,
  waitForPhase,
  withHandler,
} from "../helpers/handler_process.ts";

function sendEvent(
  socket: string,
  about: { namespace: string; name: string; uid?: string },
  reason: string,
  message: string,
): Promise<Response> {
  const client = newNotifyClient(socket);
  const event = {
    involvedObject: { kind: "VirtualMachineInstance", apiVersion: "kubevirt.io/v1", ...about },
    type: "Warning",
    reason,
    message,
  };
  return new Promise<Response>((resolve, reject) =>
    client.HandleK8sEvent(
      { eventJSON: new TextEncoder().encode(JSON.stringify(event)) },
      (err, res) => err ? reject(err) : resolve(res!),
    )
  ).finally(() => client.close());
}

Deno.test("the handler records a launcher's Events only about its node's VMI of that UID, and not a flood", async () => {
  // A burst of Events is thinned out as client-go's spam filter does, not recorded whole.
  await withHandler("sec-events", async ({ h, node, client }) => {
    const name = "sec-events-vm";
    const created = await createVmi(client, testVmi(name, node));
    await waitForPhase(client, "default", name, "Running");
    const uid = created.metadata.uid!;
    const socket = join(h.runDir, SocketNames.DomainNotify);
    try {
      const nobody = await sendEvent(
        socket,
        { namespace: "default", name: "sec-events-nobody", uid: crypto.randomUUID() },
        "Forged",
        "about a VMI that does not exist",
      );
      assert.equal(nobody.success, false);
      const wrongUid = await sendEvent(
        socket,
        { namespace: "default", name, uid: crypto.randomUUID() },
        "Forged",
        "with another UID",
      );
      assert.equal(wrongUid.success, false);

      const answers: Response[] = [];
      for (let i = 0; i < 60; i++) {
        answers.push(
          await sendEvent(socket, { namespace: "default", name, uid }, "Flood", `#${i}`),
        );
      }
      assert.equal(answers.filter((a) => a.success).length, 25);
      const flood = await waitFor("the flood's Events", async () => {
        const events = (await eventsFor(client, "default", name)).filter((e) =>
          e.reason === "Flood"
        );
        return events.length >= 25 ? events : undefined;
      }, 20_000);
      // A moment more: nothing past the burst arrives late.
      await new Promise((r) => setTimeout(r, 1_000));
      const all = await eventsFor(client, "default", name);
      assert.equal(all.filter((e) => e.reason === "Flood").length, flood.length);
      assert.equal(flood.length, 25);
      assert.equal(all.filter((e) => e.reason === "Forged").length, 0);
      assert.equal((await eventsFor(client, "default", "sec-events-nobody")).length, 0);
    } finally {
      await deleteVmi(client, "default", name);
    }
  });
});

Deno.test("EventSpamFilter lets a burst through, then one event per refill period per object", () => {
  let now = 0;
  const filter = new EventSpamFilter({ burst: 3, refillMs: 1_000, now: () => now });
  assert.deepEqual([1, 2, 3, 4].map(() => filter.allow("a")), [true, true, true, false]);
  assert.equal(filter.allow("b"), true, "each object has a bucket of its own");
  now = 999;
  assert.equal(filter.allow("a"), false);
  now = 1_000;
  assert.equal(filter.allow("a"), true);
  assert.equal(filter.allow("a"), false);
  now = 10_000;
  assert.deepEqual([1, 2, 3, 4].map(() => filter.allow("a")), [true, true, true, false]);
});

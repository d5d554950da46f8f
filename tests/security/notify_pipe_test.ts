/**
 * A launcher pod is untrusted (a guest that escaped QEMU is in it): its notify pipe may
 * speak only for the VMI it was opened for. A stand-in pod (its own mount namespace with
 * a tmpfs on `/run`, a listener on its cmd socket below a kubelet-style pods directory)
 * gets a real pipe from {@linkcode NotifyPipes}; the test then speaks to that pipe as a
 * compromised launcher would, with KubeVirt's notify client protocol.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { encodeDomainJson, LifeCycle, newDomain, StateChangeReason } from "../../mod/domain/mod.ts";
import {
  type DomainNotification,
  type K8sEventNotification,
  MAX_PIPE_CONNECTIONS,
  NotifyPipes,
  notifyRefusals,
  PodLaunchers,
} from "../../mod/handler/testing.ts";
import { DomainEventType, newNotifyClient, type Response } from "../../mod/proto/mod.ts";
import { startStandInPod } from "./_pod.ts";

const OWN = { namespace: "tenant-a", name: "vm-a", uid: "aaaaaaaa-0000-4000-8000-000000000001" };
const VICTIM = { namespace: "tenant-b", name: "vm-b", uid: "bbbbbbbb-0000-4000-8000-000000000002" };

async function setup() {
  const started = await startStandInPod();
  const { podsDir, socket } = started;
  const dir = join(podsDir, "..");
  const pod = { ...started, pipe: `${started.run}/kubevirt/domain-notify-pipe.sock` };
  const domains: DomainNotification[] = [];
  const events: K8sEventNotification[] = [];
  // The provider's own resolver: the pod's socket opened beneath the pod's directory.
  const provider = new PodLaunchers({
    nodeName: "node1",
    ghosts: undefined as never,
    podsDir,
    notify: { onDomainEvent: () => {}, onK8sEvent: () => {} },
    mountRecordDir: join(dir, "mounts"),
    hotplugRecordDir: join(dir, "hotplug"),
  });
  const pipes = new NotifyPipes({
    handlers: { onDomainEvent: (e) => domains.push(e), onK8sEvent: (e) => events.push(e) },
    dialResolver: provider.dialResolver,
  });
  try {
    await pipes.open(OWN, socket);
  } catch (error) {
    await pod.stop(); // the pod and its folder go even when the pipe could not open
    throw error;
  }
  return {
    pod,
    pipes,
    domains,
    events,
    async close() {
      await pipes.closeAll();
      await pod.stop();
    },
  };
}

function call<T>(fn: (cb: (err: Error | null, res?: Response) => void) => T): Promise<Response> {
  return new Promise((resolve, reject) => fn((err, res) => err ? reject(err) : resolve(res!)));
}

function sendDomain(pipe: string, ref: { namespace: string; name: string; uid?: string }) {
  const client = newNotifyClient(pipe);
  const domain = newDomain(ref, { status: LifeCycle.Crashed, reason: StateChangeReason.Crashed });
  return call((cb) =>
    client.HandleDomainEvent({
      eventType: DomainEventType.Modified,
      domainJSON: new TextEncoder().encode(encodeDomainJson(domain)),
      statusJSON: new Uint8Array(),
    }, cb)
  ).finally(() => client.close());
}

function sendK8sEvent(pipe: string, about: { namespace: string; name: string; uid?: string }) {
  const client = newNotifyClient(pipe);
  const event = {
    involvedObject: { kind: "VirtualMachineInstance", ...about },
    type: "Warning",
    reason: "Forged",
    message: "written by another tenant's launcher",
  };
  return call((cb) =>
    client.HandleK8sEvent({ eventJSON: new TextEncoder().encode(JSON.stringify(event)) }, cb)
  ).finally(() => client.close());
}

Deno.test("a launcher pod's notify pipe drops a Crashed domain naming another tenant's VMI, and counts it", async () => {
  const s = await setup();
  try {
    const before = notifyRefusals.domainEvents;
    const forged = await sendDomain(s.pod.pipe, { namespace: VICTIM.namespace, name: VICTIM.name });
    assert.equal(forged.success, false);
    assert.match(forged.message, /tenant-b\/vm-b/);
    const withUid = await sendDomain(s.pod.pipe, VICTIM);
    assert.equal(withUid.success, false);
    assert.equal(s.domains.length, 0, "a forged domain reached the controller");
    assert.equal(notifyRefusals.domainEvents, before + 2);
    // The pipe still serves its own VMI.
    const own = await sendDomain(s.pod.pipe, OWN);
    assert.equal(own.success, true, own.message);
    assert.deepEqual(s.domains.map((d) => d.domain.metadata.name), [OWN.name]);
  } finally {
    await s.close();
  }
});

Deno.test("a launcher pod's notify pipe drops a domain of its own VMI's name that lacks the VMI's UID", async () => {
  const s = await setup();
  try {
    const noUid = await sendDomain(s.pod.pipe, { namespace: OWN.namespace, name: OWN.name });
    assert.equal(noUid.success, false);
    assert.match(noUid.message, /UID/);
    assert.equal(s.domains.length, 0);
  } finally {
    await s.close();
  }
});

Deno.test("a launcher pod's notify pipe refuses a Kubernetes event about another VMI", async () => {
  const s = await setup();
  try {
    const forged = await sendK8sEvent(s.pod.pipe, VICTIM);
    assert.equal(forged.success, false);
    const wrongUid = await sendK8sEvent(s.pod.pipe, { ...OWN, uid: VICTIM.uid });
    assert.equal(wrongUid.success, false);
    assert.equal(s.events.length, 0, "a forged Event reached the recorder");
    const own = await sendK8sEvent(s.pod.pipe, OWN);
    assert.equal(own.success, true, own.message);
    assert.equal(s.events.length, 1);
  } finally {
    await s.close();
  }
});

Deno.test("a launcher pod's notify pipe serves a bounded number of connections at once", async () => {
  const s = await setup();
  const conns: Deno.UnixConn[] = [];
  try {
    for (let i = 0; i < MAX_PIPE_CONNECTIONS + 6; i++) {
      conns.push(await Deno.connect({ transport: "unix", path: s.pod.pipe }));
    }
    // The pipe's own server speaks first on a connection it serves (HTTP/2 settings); a
    // refused one is closed: its read ends at once with nothing.
    const outcomes = await Promise.all(conns.map(async (c) => {
      const buf = new Uint8Array(64);
      const n = await Promise.race([
        c.read(buf).catch(() => null),
        new Promise<"open">((r) => setTimeout(() => r("open"), 2_000)),
      ]);
      return n === null ? "closed" : "served";
    }));
    assert.equal(outcomes.filter((o) => o === "served").length, MAX_PIPE_CONNECTIONS);
    assert.equal(outcomes.filter((o) => o === "closed").length, 6);
  } finally {
    for (const c of conns) {
      try {
        c.close();
      } catch { /* closed by the pipe */ }
    }
    await s.close();
  }
});

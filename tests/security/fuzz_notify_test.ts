/**
 * Fuzzing the handler's notify server (`kubevirt.notify.v1.Notify`) as a compromised
 * launcher would: over a real unix socket, with grpc-js, `HandleDomainEvent` and
 * `HandleK8sEvent` carrying real domains (the converter's fixture XMLs read as a launcher
 * reads its domain, then KubeVirt's domain JSON) and real launcher Events, mutated as JSON
 * and as bytes, and whole protobuf messages mutated as bytes.
 *
 * Every call is answered: a `Response`, or for protobuf grpc-js cannot decode a gRPC error
 * status; nothing malformed reaches the handler's callbacks; the server stays up, its
 * answers stay fast and its memory bounded.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  type Domain,
  domainFromWire,
  domainToWire,
  LifeCycle,
  newDomain,
  StateChangeReason,
} from "../../mod/domain/mod.ts";
import { domainFromXml } from "../../mod/launcher/testing.ts";
import {
  type DomainNotification,
  type K8sEventNotification,
  NotifyServer,
} from "../../mod/handler/testing.ts";
import { notifyInfoService, notifyService } from "../../mod/proto/mod.ts";
import {
  fuzz,
  genericMutations,
  hex,
  type Json,
  mutate,
  mutateJson,
  Outcomes,
  type Rand,
} from "./_fuzz.ts";
import { RawGrpcClient } from "./_fuzz_grpc.ts";

const VMI = { namespace: "default", name: "vm-fuzz", uid: "6f1c2d3e-0000-4000-8000-00000000f022" };
const encoder = new TextEncoder();

/** Real domains: each fixture's XML as the launcher reads it, in several states. */
async function domains(): Promise<Json[]> {
  const out: Json[] = [];
  const states = [
    { status: LifeCycle.Running, reason: StateChangeReason.Unknown },
    { status: LifeCycle.Paused, reason: StateChangeReason.PausedUser },
    { status: LifeCycle.Shutoff, reason: StateChangeReason.Destroyed },
    { status: LifeCycle.Crashed, reason: StateChangeReason.Unknown },
  ];
  const dir = new URL("../fixtures/converter/", import.meta.url);
  const names = [...Deno.readDirSync(dir)].map((e) => e.name).filter((n) => n.endsWith(".xml"))
    .sort();
  for (const name of names) {
    const xml = await Deno.readTextFile(new URL(name, dir));
    const domain = domainFromXml(VMI, xml, states[out.length % states.length]);
    domain.metadata.uid = VMI.uid;
    domain.spec.metadata.kubevirt.uid = VMI.uid;
    out.push(domainToWire(domain) as Json);
  }
  const agent: Domain = newDomain(VMI, states[0]);
  agent.status.osInfo = { name: "Fedora Linux", prettyName: "Fedora Linux 39", id: "fedora" };
  agent.status.interfaces = [{ mac: "52:54:00:12:34:56", ip: "10.0.2.2", ips: ["10.0.2.2"] }];
  out.push(domainToWire(agent) as Json);
  return out;
}

/** A launcher's Event about its VMI, as the launcher's notify client writes it. */
function k8sEvent(rand: Rand): Json {
  return {
    metadata: { creationTimestamp: null },
    involvedObject: {
      kind: "VirtualMachineInstance",
      namespace: VMI.namespace,
      name: VMI.name,
      uid: VMI.uid,
      apiVersion: "kubevirt.io/v1",
    },
    reason: rand.pick(["Started", "ShuttingDown", "Created", "Migrated"]),
    message: rand.pick(["VirtualMachineInstance started.", "Signaled Graceful Shutdown", "é💣"]),
    source: {},
    firstTimestamp: null,
    lastTimestamp: null,
    eventTime: null,
    type: rand.pick(["Normal", "Warning"]),
    reportingComponent: "",
    reportingInstance: "",
  };
}

/** JSON text of `value` after a few structural mutations, then maybe byte mutations. */
function mutatedJson(value: Json, rand: Rand, applied: string[]): Uint8Array {
  let v = value;
  for (let i = 0, n = rand.int(4); i < n; i++) {
    const m = mutateJson(v, rand);
    v = m.value;
    applied.push(m.applied);
  }
  let bytes: Uint8Array = encoder.encode(JSON.stringify(v));
  if (rand.chance(0.3)) {
    const m = mutate(bytes, rand, genericMutations(1024 * 1024));
    bytes = m.bytes;
    applied.push(...m.applied);
  }
  if (rand.chance(0.02)) {
    // Deep nesting where a value was.
    const depth = 10_000 + rand.int(100_000);
    bytes = encoder.encode(`{"ObjectMeta":${"[".repeat(depth)}1${"]".repeat(depth)}}`);
    applied.push(`nesting-${depth}`);
  }
  return bytes;
}

const EVENT_TYPES = ["ADDED", "MODIFIED", "DELETED", "ERROR", "", "added", "BOOKMARK", "💣"];

/** Checks what reached the handler's callbacks: only well-formed notifications. */
function checkDomainNotification(event: DomainNotification): void {
  assert.ok(["ADDED", "MODIFIED", "DELETED"].includes(event.type), `type ${event.type}`);
  const { metadata, status } = event.domain;
  assert.ok(typeof metadata.name === "string" && metadata.name !== "", "a domain without a name");
  assert.ok(typeof metadata.namespace === "string" && metadata.namespace !== "");
  assert.ok(Object.values(LifeCycle).includes(status.status), `status ${status.status}`);
  assert.ok(Object.values(StateChangeReason).includes(status.reason), `reason ${status.reason}`);
  // What the controller keeps must survive a round trip through KubeVirt's wire JSON.
  domainFromWire(JSON.parse(JSON.stringify(domainToWire(event.domain))));
}

function checkK8sNotification(event: K8sEventNotification): void {
  assert.ok(event.type === "Normal" || event.type === "Warning");
  assert.ok(typeof event.reason === "string" && event.reason !== "");
  assert.ok(typeof event.message === "string");
  assert.ok(typeof event.namespace === "string" && typeof event.name === "string");
  assert.ok(event.uid === undefined || typeof event.uid === "string");
}

const grpcTest = { sanitizeOps: false, sanitizeResources: false };

Deno.test(
  "notify server: mutated events and protobuf from a launcher are each answered; it stays up",
  grpcTest,
  async () => {
    // Domain events, Kubernetes events and protobuf are mutated; nothing malformed gets through.
    const dir = await Deno.makeTempDir({ prefix: "vn-fuzz-notify-" });
    const socket = join(dir, "domain-notify.sock");
    const received = { domains: [] as DomainNotification[], k8s: [] as K8sEventNotification[] };
    const server = await NotifyServer.start(socket, {
      onDomainEvent: (event) => received.domains.push(event),
      onK8sEvent: (event) => received.k8s.push(event),
    });
    const abort = new AbortController();
    const running = server.run(abort.signal);
    const client = new RawGrpcClient(socket);
    const notify = notifyService();
    const bases = await domains();
    const outcomes = new Outcomes();
    const count = (what: string) => outcomes.count(what);
    try {
      // The unmutated messages get through, or the test measures nothing.
      const first = await client.call(
        notify,
        "HandleDomainEvent",
        notify.HandleDomainEvent.requestSerialize({
          eventType: "ADDED",
          domainJSON: encoder.encode(JSON.stringify(bases[0])),
        }),
      );
      assert.deepEqual(first.response, { success: true, message: "" }, JSON.stringify(first));
      await fuzz("notify", { budgetMs: 10_000, minCases: 100 }, async (c) => {
        const applied: string[] = [];
        const k8s = c.rand.chance(0.25);
        const method = k8s ? "HandleK8sEvent" : "HandleDomainEvent";
        const request = k8s ? { eventJSON: mutatedJson(k8sEvent(c.rand), c.rand, applied) } : {
          eventType: c.rand.chance(0.8)
            ? c.rand.pick(EVENT_TYPES.slice(0, 3))
            : c.rand.pick(EVENT_TYPES),
          domainJSON: mutatedJson(c.rand.pick(bases), c.rand, applied),
          statusJSON: c.rand.chance(0.2) ? c.rand.bytes(c.rand.int(64)) : new Uint8Array(),
        };
        let bytes: Uint8Array = notify[method].requestSerialize(request);
        if (c.rand.chance(0.2)) {
          const m = mutate(bytes, c.rand, genericMutations(2 * 1024 * 1024));
          bytes = m.bytes;
          applied.push(...m.applied.map((a) => `protobuf-${a}`));
        }
        c.note = `${method} ${applied.join("+")} ${hex(bytes, 300)}`;
        const domainsBefore = received.domains.length;
        const k8sBefore = received.k8s.length;
        const started = performance.now();
        const outcome = await client.call(notify, method, bytes);
        const ms = performance.now() - started;
        outcomes.timed(ms);
        assert.ok(ms < 2_000, `answered in ${ms.toFixed(0)} ms`);
        if (outcome.error) {
          // Only protobuf grpc-js cannot read may fail the call; the connection holds.
          assert.ok(
            applied.some((a) => a.startsWith("protobuf-")),
            `call failed: ${outcome.error.message}`,
          );
          assert.equal(
            outcome.error.code,
            13,
            `status of an undecodable message: ${outcome.error.message}`,
          );
          count("grpc error");
          return;
        }
        const response = outcome.response as { success: boolean; message: string };
        assert.equal(typeof response.success, "boolean");
        if (!response.success) {
          assert.ok(response.message.length > 0, "a refusal without a message");
          assert.ok(
            !/^(TypeError|RangeError|SyntaxError)\b|is not a function|Cannot read properties/.test(
              response.message,
            ),
            `refused with a runtime error: ${response.message}`,
          );
          assert.equal(
            received.domains.length,
            domainsBefore,
            "a refused domain event reached the handler",
          );
          assert.equal(
            received.k8s.length,
            k8sBefore,
            "a refused Kubernetes event reached the handler",
          );
          count("refused");
          return;
        }
        count("accepted");
        for (const event of received.domains.splice(domainsBefore)) checkDomainNotification(event);
        for (const event of received.k8s.splice(k8sBefore)) checkK8sNotification(event);
      });
      const info = await client.call(notifyInfoService(), "Info", new Uint8Array());
      assert.ok(info.response, `Info after the run: ${info.error?.message}`);
      outcomes.report("accepted", "refused");
    } finally {
      client.close();
      abort.abort();
      await running;
      await Deno.remove(dir, { recursive: true });
    }
  },
);

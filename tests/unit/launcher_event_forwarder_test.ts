import assert from "node:assert/strict";
import type { DomainEvent } from "../../ffi/mod.ts";
import {
  type Domain,
  GUEST_AGENT_CHANNEL,
  LifeCycle,
  newDomain,
  StateChangeReason,
} from "../../mod/domain/mod.ts";
import { DomainEventType } from "../../mod/proto/mod.ts";
import {
  EventForwarder,
  type EventSink,
  type ForwardedDomain,
  updatesDomain,
} from "../../mod/launcher/testing.ts";

const VMI = { namespace: "default", name: "vm1", uid: "uid-1" };
const DOMAIN_REF = { name: "default_vm1", uuid: "0b5c9a4e-1111-2222-3333-444455556666" };

/** A running domain whose guest agent channel is in `agentState`. */
function runningDomain(agentState: string): Domain {
  const domain = newDomain(VMI, { status: LifeCycle.Running, reason: StateChangeReason.Unknown });
  domain.spec.devices.channels = [
    { type: "unix", target: { type: "virtio", name: GUEST_AGENT_CHANNEL, state: agentState } },
  ];
  return domain;
}

function agentEvent(state: 1 | 2, domain = DOMAIN_REF): DomainEvent {
  return {
    type: "agentLifecycle",
    domain,
    state,
    stateName: state === 1 ? "Connected" : "Disconnected",
    reason: 2,
    reasonName: "Channel",
  };
}

function recordingSink(): EventSink & { sent: { type: DomainEventType; domain: Domain }[] } {
  const sent: { type: DomainEventType; domain: Domain }[] = [];
  return {
    sent,
    sendDomainEvent: (type, domain) => {
      sent.push({ type, domain });
      return Promise.resolve();
    },
    sendK8sEvent: () => Promise.resolve(),
    flush: () => Promise.resolve(true),
    close: () => {},
  };
}

/** A manager whose domain's agent channel is whatever `current.agentState` says now. */
function fakeManager(
  current: {
    agentState: string;
    osName?: string;
    agentAsked?: number;
    silentAsks?: number;
    paused?: boolean;
    asked?: string[];
    askedAt?: number[];
  },
): ForwardedDomain {
  let known: string | undefined;
  return {
    get agentAnswered() {
      return known !== undefined;
    },
    vmi: VMI,
    domainName: DOMAIN_REF.name,
    getDomain: () => {
      const domain = runningDomain(current.agentState);
      if (current.paused) {
        domain.status = { status: LifeCycle.Paused, reason: StateChangeReason.User };
      }
      if (known) domain.status.osInfo = { name: known };
      return Promise.resolve(domain);
    },
    nonExistentDomain: () =>
      newDomain(VMI, { status: LifeCycle.NoState, reason: StateChangeReason.NonExistent }),
    isForeignDomain: () => false,
    refreshAgentInfo: (which = "all") => {
      current.asked?.push(which);
      current.askedAt?.push(performance.now());
      current.agentAsked = (current.agentAsked ?? 0) + 1;
      if ((current.silentAsks ?? 0) > 0) {
        current.silentAsks!--;
        return Promise.resolve(false);
      }
      const changed = current.osName !== known;
      known = current.osName;
      return Promise.resolve(changed);
    },
  };
}

function agentStatesSent(sink: ReturnType<typeof recordingSink>): string[] {
  return sink.sent.map(({ type, domain }) =>
    `${type}:${domain.spec.devices.channels[0]?.target?.state}`
  );
}

Deno.test("EventForwarder sends the domain again when the guest agent connects and disconnects", async () => {
  const current = { agentState: "disconnected" };
  const sink = recordingSink();
  const forwarder = new EventForwarder(fakeManager(current), sink, () => {
    assert.fail("an agent event never means the domain went down");
  });

  current.agentState = "connected";
  forwarder.handle(agentEvent(1));
  await forwarder.idle();
  current.agentState = "disconnected";
  forwarder.handle(agentEvent(2));
  await forwarder.idle();

  assert.deepEqual(agentStatesSent(sink), [
    `${DomainEventType.Modified}:connected`,
    `${DomainEventType.Modified}:disconnected`,
  ]);
  assert.equal(sink.sent[0].domain.status.status, LifeCycle.Running);
  forwarder.stopAgentRetry();
});

Deno.test("EventForwarder asks a guest agent that connects what it knows, before sending the domain", async () => {
  // Only a connect asks; a disconnect sends the domain without asking.
  const current = { agentState: "connected", osName: "virtnode test guest", agentAsked: 0 };
  const sink = recordingSink();
  const forwarder = new EventForwarder(fakeManager(current), sink, () => {});
  forwarder.handle(agentEvent(1));
  await forwarder.idle();
  assert.equal(current.agentAsked, 1);
  assert.equal(sink.sent[0].domain.status.osInfo?.name, "virtnode test guest");
  current.agentState = "disconnected";
  forwarder.handle(agentEvent(2));
  await forwarder.idle();
  assert.equal(current.agentAsked, 1, "a disconnect asks no agent");
  assert.equal(sink.sent.length, 2);
  forwarder.stopAgentRetry();
});

Deno.test("EventForwarder asks a silent connected guest agent again until it answers or disconnects", async () => {
  // Retries also stop once the instance has ended.
  const current = {
    agentState: "connected",
    osName: "virtnode test guest",
    agentAsked: 0,
    silentAsks: 2,
  };
  const sink = recordingSink();
  const forwarder = new EventForwarder(fakeManager(current), sink, () => {});
  forwarder.handle(agentEvent(1));
  await forwarder.idle();
  assert.equal(current.agentAsked, 1);
  assert.equal(sink.sent[0].domain.status.osInfo, undefined);
  assert.ok(forwarder.agentRetryPending, "a silent agent is asked again");
  // 1 s, then 2 s later: the third ask is answered and the domain goes out with the OS.
  const deadline = Date.now() + 6_000;
  while (sink.sent.length < 2 && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    await forwarder.idle();
  }
  assert.equal(current.agentAsked, 3);
  assert.equal(sink.sent[1].domain.status.osInfo?.name, "virtnode test guest");
  assert.ok(!forwarder.agentRetryPending, "an agent that answered is not asked again");
  forwarder.stopAgentRetry();

  // A silent agent that disconnects is not asked again either.
  const other = { agentState: "connected", osName: "x", agentAsked: 0, silentAsks: 100 };
  const quiet = new EventForwarder(fakeManager(other), recordingSink(), () => {});
  quiet.handle(agentEvent(1));
  await quiet.idle();
  assert.ok(quiet.agentRetryPending);
  other.agentState = "disconnected";
  quiet.handle(agentEvent(2));
  await quiet.idle();
  assert.ok(!quiet.agentRetryPending);
  assert.equal(other.agentAsked, 1);

  // Nor one of an instance that ended.
  const third = { agentState: "connected", osName: "x", agentAsked: 0, silentAsks: 100 };
  const ended = new EventForwarder(fakeManager(third), recordingSink(), () => {});
  ended.handle(agentEvent(1));
  await ended.idle();
  ended.stopAgentRetry();
  assert.ok(!ended.agentRetryPending);
});

Deno.test("EventForwarder.refresh() resends the domain; refreshAgent() only if the agent's answers changed", async () => {
  const current = { agentState: "connected", osName: "one" };
  const sink = recordingSink();
  const forwarder = new EventForwarder(fakeManager(current), sink, () => {});
  forwarder.refresh();
  await forwarder.idle();
  assert.deepEqual(agentStatesSent(sink), [`${DomainEventType.Modified}:connected`]);
  await forwarder.refreshAgent();
  assert.equal(sink.sent.length, 2);
  assert.equal(sink.sent[1].domain.status.osInfo?.name, "one");
  await forwarder.refreshAgent();
  assert.equal(sink.sent.length, 2, "unchanged answers send nothing");
  current.osName = "two";
  await forwarder.refreshAgent();
  assert.equal(sink.sent[2].domain.status.osInfo?.name, "two");
  forwarder.stopAgentRetry();
});

Deno.test("EventForwarder polls an answering agent as KubeVirt's launcher does, not while paused", async () => {
  // Scaled times: the freeze state every 40 ms, the OS after 60 ms, then 120, then 200 (its
  // longest), then every 200.
  const times = { freezeMs: 40, initialMs: 60, sysMs: 200 };
  const current = {
    agentState: "connected",
    osName: "guest",
    asked: [] as string[],
    askedAt: [] as number[],
    paused: false,
  };
  const sink = recordingSink();
  const forwarder = new EventForwarder(fakeManager(current), sink, () => {}, times);
  try {
    const started = performance.now();
    forwarder.handle(agentEvent(1));
    await forwarder.idle();
    assert.ok(forwarder.agentPolling, "an agent that answered is polled");
    // Four OS rounds: timers never fire early, so each gap is at least its interval (the
    // times taken when the agent is asked).
    const rounds = (which: string) =>
      current.asked.flatMap((w, i) => w === which ? [current.askedAt[i] - started] : []);
    const deadline = performance.now() + 10_000;
    while (rounds("os").length < 4 && performance.now() < deadline) {
      await new Promise((r) => setTimeout(r, 5));
    }
    const osTimes = rounds("os").slice(0, 4);
    const freezeTimes = rounds("freeze");
    assert.equal(osTimes.length, 4, `rounds: ${current.asked.join(",")}`);
    const gaps = osTimes.map((t, i) => t - (osTimes[i - 1] ?? 0));
    for (const [i, least] of [60, 120, 200, 200].entries()) {
      assert.ok(gaps[i] >= least - 5, `OS round ${i + 1} came ${gaps[i]} ms after the last`);
    }
    assert.ok(freezeTimes.length >= 3, `freeze rounds: ${freezeTimes.length}`);
    const freezeGaps = freezeTimes.slice(1).map((t, i) => t - freezeTimes[i]);
    assert.ok(freezeGaps.every((g) => g >= 30), `freeze gaps: ${freezeGaps.join(",")}`);
    assert.ok(freezeTimes.length > osTimes.length, "the freeze state is asked more often");
    assert.equal(sink.sent.length, 1, "unchanged answers send nothing");
    // A change the agent tells is sent.
    current.osName = "guest 2";
    const until = performance.now() + 10_000;
    while (sink.sent.length < 2 && performance.now() < until) {
      await new Promise((r) => setTimeout(r, 10));
      await forwarder.idle();
    }
    assert.equal(sink.sent.at(-1)?.domain.status.osInfo?.name, "guest 2");

    // Paused: no polling; resumed: polling again.
    current.paused = true;
    forwarder.refresh();
    await forwarder.idle();
    assert.ok(!forwarder.agentPolling, "a paused guest's agent is not polled");
    const before = current.asked.length;
    await new Promise((r) => setTimeout(r, 150));
    assert.equal(current.asked.length, before);
    current.paused = false;
    forwarder.refresh();
    await forwarder.idle();
    assert.ok(forwarder.agentPolling);
    // A disconnected agent is not polled.
    current.agentState = "disconnected";
    forwarder.handle(agentEvent(2));
    await forwarder.idle();
    assert.ok(!forwarder.agentPolling);
  } finally {
    forwarder.stopAgentRetry();
  }
});

Deno.test("EventForwarder leaves out another domain's agent events", async () => {
  const sink = recordingSink();
  const forwarder = new EventForwarder(fakeManager({ agentState: "connected" }), sink, () => {});
  forwarder.handle(agentEvent(1, { name: "default_other", uuid: "other" }));
  await forwarder.idle();
  assert.deepEqual(sink.sent, []);
});

Deno.test("updatesDomain() is true for lifecycle, reboot, agent and device events, false for IO errors", () => {
  // The device events are device added and device removed.
  const lifecycle: DomainEvent = {
    type: "lifecycle",
    domain: DOMAIN_REF,
    event: 4,
    detail: 0,
    eventName: "Started",
    detailName: "Booted",
  };
  assert.equal(updatesDomain(lifecycle), true);
  assert.equal(updatesDomain({ type: "reboot", domain: DOMAIN_REF }), true);
  assert.equal(updatesDomain(agentEvent(1)), true);
  assert.equal(updatesDomain(agentEvent(2)), true);
  assert.equal(
    updatesDomain({ type: "deviceRemoved", domain: DOMAIN_REF, devAlias: "ua-x" }),
    true,
  );
  assert.equal(
    updatesDomain({ type: "deviceAdded", domain: DOMAIN_REF, devAlias: "ua-x" }),
    true,
  );
  assert.equal(
    updatesDomain({
      type: "ioError",
      domain: DOMAIN_REF,
      srcPath: "/d",
      devAlias: "ua-x",
      action: 1,
      actionName: "Pause",
      reason: "enospc",
    }),
    false,
  );
});

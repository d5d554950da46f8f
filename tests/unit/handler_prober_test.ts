/**
 * Pod-less mode's prober (mod/handler/podless/prober.ts): each probe kind passes and fails
 * as the kubelet's does, against a launcher that answers as virtnode's does and against
 * real TCP and HTTP listeners; readiness flips after its thresholds and wakes the VMI;
 * liveness says a guest is unhealthy once; probes stop with the guest.
 */
import assert from "node:assert/strict";
import type { Probe, VirtualMachineInstance } from "../../mod/api/mod.ts";
import { PodlessProber, type ProbeLauncher, runProbe } from "../../mod/handler/testing.ts";

/** A launcher whose guest answers exec with `exitCode` and pings while `agentUp`. */
function launcher(state: { exitCode: number; agentUp: boolean }) {
  const calls: string[] = [];
  const l: ProbeLauncher = {
    guestPing: (domainName, timeoutSeconds) => {
      calls.push(`ping ${domainName} ${timeoutSeconds}`);
      return state.agentUp ? Promise.resolve() : Promise.reject(new Error("agent not connected"));
    },
    exec: (domainName, command, args, timeoutSeconds) => {
      calls.push(`exec ${domainName} ${command} ${args.join(" ")} ${timeoutSeconds}`);
      return Promise.resolve({ exitCode: state.exitCode });
    },
  };
  return { l, calls };
}

function vmi(spec: { readinessProbe?: Probe; livenessProbe?: Probe }): VirtualMachineInstance {
  return {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachineInstance",
    metadata: { namespace: "ns", name: "vm", uid: "uid-1" },
    spec: { domain: { devices: {} }, ...spec },
  } as VirtualMachineInstance;
}

const until = async (what: string, ok: () => boolean, ms = 5_000) => {
  const deadline = Date.now() + ms;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error(`no ${what} within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
};

Deno.test("exec and guestAgentPing probes go to the launcher with KubeVirt's domain name and timeout", async () => {
  const state = { exitCode: 0, agentUp: true };
  const { l, calls } = launcher(state);
  const target = { domainName: "ns_vm", launcher: l };
  await runProbe({ exec: { command: ["cat", "/tmp/ready"] }, timeoutSeconds: 3 }, target);
  await runProbe({ guestAgentPing: {} }, target);
  assert.deepEqual(calls, ["exec ns_vm cat /tmp/ready 3", "ping ns_vm 1"]);
  state.exitCode = 1;
  await assert.rejects(
    runProbe({ exec: { command: ["cat", "/tmp/ready"] } }, target),
    /command "cat" exited with code 1/,
  );
  state.agentUp = false;
  await assert.rejects(runProbe({ guestAgentPing: {} }, target), /agent not connected/);
  await assert.rejects(runProbe({ exec: { command: [] } }, target), /has no command/);
  await assert.rejects(
    runProbe({ guestAgentPing: {} }, { domainName: "ns_vm" }),
    /no launcher to ask its guest agent/,
  );
});

Deno.test("tcpSocket and httpGet probes reach the VMI's address as the kubelet's do", async () => {
  const tcp = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const accepting = (async () => {
    for await (const conn of tcp) conn.close();
  })();
  let status = 200;
  const http = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen: () => {} },
    (request) => {
      const agent = request.headers.get("user-agent") ?? "";
      return new Response(agent, {
        status: new URL(request.url).pathname === "/ok" ? status : 404,
      });
    },
  );
  try {
    const target = { domainName: "ns_vm", address: "127.0.0.1" };
    await runProbe({ tcpSocket: { port: tcp.addr.port } }, target);
    await runProbe({ tcpSocket: { port: String(tcp.addr.port) } }, target);
    const free = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const closedPort = free.addr.port;
    free.close();
    await assert.rejects(
      runProbe({ tcpSocket: { port: closedPort } }, target),
      new RegExp(`dial tcp 127\\.0\\.0\\.1:${closedPort}: `),
    );
    await assert.rejects(runProbe({ tcpSocket: { port: "http" } }, target), /named ports/);
    await runProbe({ httpGet: { port: http.addr.port, path: "ok" } }, target);
    status = 302;
    await runProbe({ httpGet: { port: http.addr.port, path: "/ok" } }, target);
    status = 500;
    await assert.rejects(
      runProbe({ httpGet: { port: http.addr.port, path: "/ok" } }, target),
      /HTTP probe failed with statuscode: 500/,
    );
    await assert.rejects(
      runProbe({ httpGet: { port: http.addr.port } }, target),
      /statuscode: 404/,
    );
    await assert.rejects(
      runProbe({ tcpSocket: { port: 80 } }, { domainName: "ns_vm" }),
      /no address on the pod network yet/,
    );
  } finally {
    tcp.close();
    await accepting.catch(() => {});
    await http.shutdown();
  }
});

Deno.test("readiness turns after its thresholds and wakes the VMI; the probes stop with the guest", async () => {
  const state = { exitCode: 1, agentUp: true };
  const { l, calls } = launcher(state);
  const woken: string[] = [];
  const prober = new PodlessProber({
    launcher: () => l,
    wake: (key) => woken.push(key),
    unhealthy: () => assert.fail("no liveness probe here"),
  });
  try {
    const v = vmi({
      readinessProbe: { exec: { command: ["true"] }, periodSeconds: 1, failureThreshold: 1 },
    });
    assert.deepEqual(prober.observe(v, { running: false }), {
      ready: false,
      message: "the guest is not running",
    });
    assert.deepEqual(prober.observe(v, { running: true }), {
      ready: false,
      message: "the readiness probe has not passed yet",
    });
    await until("a failure's verdict", () => woken.length === 1);
    assert.deepEqual(prober.observe(v, { running: true }), {
      ready: false,
      message: 'Readiness probe failed: command "true" exited with code 1',
    });
    assert.deepEqual(woken, ["ns/vm"]);
    state.exitCode = 0;
    await until("a pass's verdict", () => woken.length === 2, 3_000);
    assert.deepEqual(prober.observe(v, { running: true }), { ready: true, message: "" });
    // The guest stopped: no more probes.
    prober.observe(v, { running: false });
    const made = calls.length;
    await new Promise((r) => setTimeout(r, 1_500));
    assert.equal(calls.length, made);
    assert.equal(prober.observe(vmi({}), { running: true }), undefined, "no probe, no verdict");
  } finally {
    prober.stop();
  }
});

Deno.test("a failing liveness probe says the guest is unhealthy once, after failureThreshold failures", async () => {
  const state = { exitCode: 0, agentUp: false };
  const { l, calls } = launcher(state);
  const unhealthy: string[] = [];
  const prober = new PodlessProber({
    launcher: () => l,
    wake: () => assert.fail("liveness does not touch readiness"),
    unhealthy: (v, message) => unhealthy.push(`${v.metadata.name}: ${message}`),
  });
  try {
    const v = vmi({ livenessProbe: { guestAgentPing: {}, periodSeconds: 1, failureThreshold: 2 } });
    assert.equal(prober.observe(v, { running: true }), undefined);
    await until("the unhealthy verdict", () => unhealthy.length === 1, 4_000);
    assert.ok(calls.length >= 2, "two failures before the verdict");
    assert.deepEqual(unhealthy, ["vm: Liveness probe failed: agent not connected"]);
    await new Promise((r) => setTimeout(r, 1_200));
    assert.equal(unhealthy.length, 1, "said once per guest run");
  } finally {
    prober.stop();
  }
});

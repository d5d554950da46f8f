/**
 * The `AgentVersionNotSupported` condition, as virt-handler judges a connected guest agent
 * (mod/handler/guest_agent_support.ts) and keeps the condition (mod/handler/status.ts).
 *
 * @module
 */
import assert from "node:assert/strict";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { LifeCycle, newDomain, StateChangeReason } from "../../mod/domain/mod.ts";
import { guestAgentSupport } from "../../mod/handler/testing.ts";
import { computeStatus } from "../../mod/handler/testing.ts";

const BASIC = [
  "guest-ping",
  "guest-get-time",
  "guest-info",
  "guest-shutdown",
  "guest-network-get-interfaces",
  "guest-get-fsinfo",
  "guest-get-host-name",
  "guest-get-users",
  "guest-get-timezone",
  "guest-get-osinfo",
];
const VERSIONS = ["2.*", "3.*", "4.*", "5.*"];

function vmi(accessCredentials?: unknown[]): VirtualMachineInstance {
  return {
    metadata: { name: "vm1", namespace: "default", uid: "u1" },
    spec: { domain: { devices: {} }, ...(accessCredentials ? { accessCredentials } : {}) },
    status: { phase: "Running" },
  } as VirtualMachineInstance;
}

const commands = (names: string[], disabled: string[] = []) =>
  names.map((name) => ({ name, enabled: !disabled.includes(name) }));

Deno.test("a connected agent is judged by its commands, else by its version", () => {
  const judge = (info: Parameters<typeof guestAgentSupport>[1], v = vmi()) =>
    guestAgentSupport(v, info, VERSIONS);
  assert.deepEqual(judge({ supportedCommands: commands(BASIC) }), {
    supported: true,
    reason: "This guest agent is supported",
  });
  // The suite's spec blacklists guest-shutdown in the agent: a basic command disabled.
  assert.deepEqual(judge({ supportedCommands: commands(BASIC, ["guest-shutdown"]) }), {
    supported: false,
    reason: "This guest agent doesn't support required basic commands",
  });
  // Optional commands missing change nothing.
  assert.equal(judge({ supportedCommands: commands(BASIC, ["guest-exec"]) }).supported, true);
  const keyByAgent = vmi([{
    sshPublicKey: { propagationMethod: { qemuGuestAgent: { users: ["root"] } } },
  }]);
  assert.deepEqual(judge({ supportedCommands: commands(BASIC) }, keyByAgent), {
    supported: false,
    reason: "This guest agent doesn't support required public key commands",
  });
  assert.equal(
    judge({
      supportedCommands: commands([
        ...BASIC,
        "guest-ssh-get-authorized-keys",
        "guest-ssh-add-authorized-keys",
        "guest-ssh-remove-authorized-keys",
      ]),
    }, keyByAgent).supported,
    true,
  );
  const passwordByAgent = vmi([{ userPassword: { propagationMethod: { qemuGuestAgent: {} } } }]);
  assert.deepEqual(judge({ supportedCommands: commands(BASIC) }, passwordByAgent), {
    supported: false,
    reason: "This guest agent doesn't support required password commands",
  });
  // No command list (an old launcher): the CR's versions decide, unanchored as Go's regexp.
  assert.equal(judge({ guestAgentVersion: "5.2.0" }).supported, true);
  assert.deepEqual(guestAgentSupport(vmi(), { guestAgentVersion: "5.2.0" }, ["X.*"]), {
    supported: false,
    reason: "Guest agent version '5.2.0' is not supported",
  });
});

Deno.test("computeStatus() adds AgentVersionNotSupported once, keeps it, and drops it when supported", () => {
  const domain = newDomain({ namespace: "default", name: "vm1", uid: "u1" }, {
    status: LifeCycle.Running,
    reason: StateChangeReason.Unknown,
  });
  const base = {
    domain,
    launcher: "responsive" as const,
    nodeName: "node1",
  };
  const unsupported = (r: { supported: boolean; reason: string }, now: string, from = vmi()) =>
    computeStatus(from, { ...base, now, agentSupport: r });
  const first = unsupported({ supported: false, reason: "first" }, "2026-12-05T10:00:00Z");
  const cond = (s: { conditions?: { type: string; reason?: string }[] }) =>
    s.conditions?.find((c) => c.type === "AgentVersionNotSupported");
  assert.equal(cond(first.status)?.reason, "first");
  // Still unsupported, another reason: the condition stands as it was.
  const again = unsupported({ supported: false, reason: "second" }, "2026-12-05T10:00:05Z", {
    ...vmi(),
    status: first.status,
  });
  assert.equal(cond(again.status)?.reason, "first");
  // No verdict (no agent connected now): left as it is.
  const none = computeStatus({ ...vmi(), status: again.status }, {
    ...base,
    now: "2026-12-05T10:00:10Z",
  });
  assert.equal(cond(none.status)?.reason, "first");
  const fixed = unsupported({ supported: true, reason: "" }, "2026-12-05T10:00:15Z", {
    ...vmi(),
    status: none.status,
  });
  assert.equal(cond(fixed.status), undefined);
});

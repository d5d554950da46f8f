/**
 * The launcher's access credentials (mod/launcher/access_credentials.ts) against a recording
 * agent: what KubeVirt's launcher sends for each kind of credential, the results it
 * reports in KubeVirt's words, and when it applies again.
 */
import assert from "node:assert/strict";
import { agentCredentials } from "../../mod/api/mod.ts";
import {
  type AccessCredentialResult,
  AccessCredentials,
  credentialPlan,
} from "../../mod/launcher/testing.ts";

const SSH = (secret: string, users: string[]) => ({
  sshPublicKey: {
    source: { secret: { secretName: secret } },
    propagationMethod: { qemuGuestAgent: { users } },
  },
});
const PASSWORD = (secret: string) => ({
  userPassword: {
    source: { secret: { secretName: secret } },
    propagationMethod: { qemuGuestAgent: {} },
  },
});

Deno.test("access credentials: only qemuGuestAgent entries with a Secret are read", () => {
  const found = agentCredentials([
    SSH("keys", ["root", "virtnode"]),
    PASSWORD("passwords"),
    {
      sshPublicKey: {
        source: { secret: { secretName: "cloud" } },
        propagationMethod: { noCloud: {} },
      },
    },
    { sshPublicKey: { propagationMethod: { qemuGuestAgent: { users: ["x"] } } } },
    "not an entry",
  ]);
  assert.deepEqual(found, [
    { kind: "ssh", secret: "keys", users: ["root", "virtnode"] },
    { kind: "password", secret: "passwords", users: [] },
  ]);
  assert.deepEqual(agentCredentials(undefined), []);
});

Deno.test("access credentials: each user gets every key of their Secrets; passwords by user", () => {
  const plan = credentialPlan(
    agentCredentials([SSH("a", ["root"]), SSH("b", ["root", "virtnode"]), PASSWORD("p")]),
    {
      // Keys in the order of the Secret's keys' names; blank lines dropped.
      a: { "2": "ssh-ed25519 BBB two\n\n", "1": "  ssh-ed25519 AAA one  \nssh-rsa CCC three" },
      b: { key: "ssh-ed25519 DDD four" },
      p: { root: " s3cret\n", virtnode: "  ", other: "pw:with:colons" },
    },
  );
  assert.deepEqual(Object.fromEntries(plan.keys), {
    root: [
      "ssh-ed25519 AAA one",
      "ssh-rsa CCC three",
      "ssh-ed25519 BBB two",
      "ssh-ed25519 DDD four",
    ],
    virtnode: ["ssh-ed25519 DDD four"],
  });
  assert.deepEqual(Object.fromEntries(plan.passwords), { root: "s3cret", other: "pw:with:colons" });
  assert.deepEqual(plan.errors, []);

  // A Secret not handed over: named; its users' files are still set from the others.
  const missing = credentialPlan(agentCredentials([SSH("gone", ["root"]), SSH("b", ["root"])]), {
    b: { key: "ssh-ed25519 DDD four" },
  });
  assert.deepEqual(Object.fromEntries(missing.keys), { root: ["ssh-ed25519 DDD four"] });
  assert.deepEqual(missing.errors, [
    'the Secret "gone" of spec.accessCredentials is not here',
  ]);
});

/** An agent that answers as told and records what it was sent. */
function recordingAgent() {
  const sent: Record<string, unknown>[] = [];
  const ran: string[] = [];
  const state = { online: true, failing: new Set<string>(), file: undefined as string | undefined };
  return {
    sent,
    ran,
    state,
    exec(command: string, args: string[]): Promise<{ exitCode: number; stdOut: string }> {
      ran.push([command, ...args].join(" "));
      return Promise.resolve({
        exitCode: 0,
        stdOut: command === "getent" ? "root:x:0:0:root:/root:/bin/sh\n" : "",
      });
    },
    agent(command: Record<string, unknown>): Promise<string> {
      if (!state.online) return Promise.reject(new Error("Guest agent is not responding"));
      if (state.failing.has(String(command.execute))) {
        return Promise.reject(new Error("internal error: unable to execute QEMU agent command"));
      }
      sent.push(command);
      // The file commands of the fallback, against one file.
      const args = command.arguments as Record<string, unknown> | undefined;
      switch (command.execute) {
        case "guest-file-open":
          if (args?.mode === "r" && state.file === undefined) {
            return Promise.reject(
              new Error(
                "failed to open file '/root/.ssh/authorized_keys' " +
                  "(mode: 'r'): No such file or directory",
              ),
            );
          }
          return Promise.resolve('{"return":1000}');
        case "guest-file-read":
          return Promise.resolve(JSON.stringify({
            return: { count: state.file!.length, "buf-b64": btoa(state.file!), eof: true },
          }));
        case "guest-file-write":
          state.file = atob(String(args?.["buf-b64"]));
          return Promise.resolve('{"return":{"count":1,"eof":false}}');
      }
      return Promise.resolve('{"return":{}}');
    },
  };
}

/** A manager on `a` whose results go into `results`; it checks only when told (`check()`). */
function managerOf(
  a: ReturnType<typeof recordingAgent>,
  results: AccessCredentialResult[],
  resyncMs = 3_600_000,
): AccessCredentials {
  return new AccessCredentials({
    agent: (c) => a.agent(c),
    exec: (command, args) => a.exec(command, args),
    report: (r) => results.push(r),
    checkMs: 3_600_000,
    resyncMs,
  });
}

Deno.test("access credentials: keys replace authorized_keys, passwords are set, results reported", async () => {
  const a = recordingAgent();
  a.state.online = false;
  const results: AccessCredentialResult[] = [];
  const manager = managerOf(a, results);
  try {
    const spec = [SSH("keys", ["root"]), PASSWORD("pw")];
    manager.update(spec, { keys: { k: "ssh-ed25519 AAA one" }, pw: { root: "s3cret é" } });

    // No agent yet: KubeVirt's words, and the next check tries again.
    await manager.check();
    assert.deepEqual(results.at(-1), { succeeded: false, message: "Guest agent is offline" });
    a.state.online = true;
    await manager.check();
    assert.deepEqual(results.at(-1), { succeeded: true, message: "" });
    assert.deepEqual(a.sent, [
      { execute: "guest-ping" },
      {
        execute: "guest-ssh-add-authorized-keys",
        arguments: { username: "root", keys: ["ssh-ed25519 AAA one"], reset: true },
      },
      {
        execute: "guest-set-user-password",
        arguments: {
          username: "root",
          password: btoa(String.fromCharCode(...new TextEncoder().encode("s3cret é"))),
          crypted: false,
        },
      },
    ]);

    // Nothing changed: nothing is sent until the resync.
    a.sent.length = 0;
    await manager.check();
    manager.update(spec, { keys: { k: "ssh-ed25519 AAA one" }, pw: { root: "s3cret é" } });
    await manager.check();
    assert.equal(a.sent.length, 0, "nothing sent");

    // A new key: the whole list again.
    manager.update(spec, { keys: { k: "ssh-ed25519 AAA one\nssh-ed25519 EEE five" }, pw: {} });
    await manager.check();
    assert.deepEqual(a.sent.map((c) => c.execute), ["guest-ping", "guest-ssh-add-authorized-keys"]);
    assert.deepEqual((a.sent[1].arguments as { keys: string[] }).keys, [
      "ssh-ed25519 AAA one",
      "ssh-ed25519 EEE five",
    ]);

    // The agent refuses the password: reported for the user, and tried again next check.
    a.sent.length = 0;
    a.state.failing.add("guest-set-user-password");
    manager.update(spec, { keys: { k: "ssh-ed25519 AAA one" }, pw: { virtnode: "x" } });
    await manager.check();
    assert.deepEqual(results.at(-1), {
      succeeded: false,
      message: "Error encountered setting password for user [virtnode]: " +
        "internal error: unable to execute QEMU agent command",
    });
    a.state.failing.clear();
    await manager.check();
    assert.deepEqual(results.at(-1), { succeeded: true, message: "" });
  } finally {
    await manager.close();
  }
});

Deno.test("access credentials: everything is applied again once the resync is due", async () => {
  const a = recordingAgent();
  const manager = managerOf(a, [], 0);
  try {
    manager.update([SSH("keys", ["root"])], { keys: { k: "ssh-ed25519 AAA one" } });
    await manager.check();
    await manager.check();
    assert.equal(a.sent.filter((c) => c.execute === "guest-ssh-add-authorized-keys").length, 2);
  } finally {
    await manager.close();
  }
});

Deno.test("access credentials: an agent without guest-ssh-* gets the file written, as KubeVirt's does", async () => {
  const a = recordingAgent();
  a.state.failing.add("guest-ssh-add-authorized-keys");
  const results: AccessCredentialResult[] = [];
  const manager = managerOf(a, results);
  try {
    manager.update([SSH("keys", ["root"])], {
      keys: { k: "ssh-ed25519 AAA one\nssh-ed25519 BBB" },
    });
    await manager.check();
    assert.deepEqual(results.at(-1), { succeeded: true, message: "" });
    assert.equal(a.state.file, "ssh-ed25519 AAA one\nssh-ed25519 BBB");
    // A new file: the folder made the user's, 700; the file the user's, 600, once written.
    assert.deepEqual(a.ran, [
      "getent passwd root",
      "mkdir -p /root/.ssh",
      "chown 0:0 /root/.ssh",
      "chmod 700 /root/.ssh",
      "chown 0:0 /root/.ssh/authorized_keys",
      "chmod 600 /root/.ssh/authorized_keys",
    ]);
    // The same keys again (the resync): the file is read, found equal, and left alone.
    a.ran.length = 0;
    manager.update([SSH("keys", ["root"])], {
      keys: { k: "ssh-ed25519 AAA one", j: "ssh-ed25519 BBB" },
    });
    a.state.file = "ssh-ed25519 BBB\nssh-ed25519 AAA one";
    await manager.check();
    assert.deepEqual(a.ran, ["getent passwd root"]);

    // Neither way works: both errors, in KubeVirt's words.
    a.exec = () => Promise.resolve({ exitCode: 2, stdOut: "" });
    manager.update([SSH("keys", ["root"])], { keys: { k: "ssh-ed25519 CCC" } });
    await manager.check();
    assert.match(
      results.at(-1)!.message,
      /^Error encountered writing ssh pub key access credentials for user \[root\]: failed to set SSH keys: error from guest-ssh-add-authorized-keys: .*; error from using guest-file-write: getent exited with 2 in the guest$/,
    );
  } finally {
    await manager.close();
  }
});

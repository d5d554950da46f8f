/**
 * Access credentials in pod-less mode, with QEMU's guest agent in the test guest: a VMI whose
 * `spec.accessCredentials` name an SSH key Secret and a password Secret, made through
 * KubeVirt's admission. While a Secret is missing the VMI does not start, and its
 * Synchronized condition and a warning Event name it (tests/integration/rbac_test.ts shows
 * a node that may not read Secrets, which is told what to apply). Once both exist the guest runs, the
 * agent writes root's authorized_keys and sets root's password (read back from the guest's
 * files through the agent, past virtnode: virsh), and the VMI shows
 * AccessCredentialsSynchronized=True. A key added to the Secret reaches the guest, also once
 * the guest's agent runs without its guest-ssh commands (KubeVirt's fallback: the file
 * written through the agent's file commands).
 *
 * In the soak tier, beside the others: it mostly waits (a guest's boot under software
 * emulation, and the minute in which the handler reads a changed Secret again).
 */
import assert from "node:assert/strict";
import { useCluster } from "../../deploy/cluster/cluster.ts";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { ensureLibvirtd, virsh } from "../helpers/libvirtd.ts";
import { guestVmi, inGuest, installTestGuest } from "../helpers/guest.ts";
import {
  createVmi,
  deleteVmi,
  eventsFor,
  getVmi,
  killLaunchers,
  kubeClient,
  startHandlerProcess,
  waitFor,
  waitForPhase,
} from "../helpers/handler_process.ts";

/** A guest booting under software emulation takes its time on a busy 2-core machine. */
const BOOT_MS = 180_000;
/** The handler reads the Secrets again every minute; the launcher applies within 15 s. */
const SECRET_CHANGE_MS = 120_000;

const KEY_1 =
  "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAvirtnodeTestKeyOne0000000000000000000 one@test";
const KEY_2 =
  "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAvirtnodeTestKeyTwo0000000000000000000 two@test";
const KEY_3 =
  "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAvirtnodeTestKeyThree00000000000000000 three@test";
const PASSWORD = "virtnode-Pa55:word";

function condition(vmi: VirtualMachineInstance | undefined, type: string) {
  return vmi?.status?.conditions?.find((c) => c.type === type);
}

function secret(namespace: string, name: string, data: Record<string, string>) {
  return {
    apiVersion: "v1",
    kind: "Secret",
    metadata: { name, namespace },
    stringData: data,
  };
}

Deno.test("access credentials (pod-less): SSH keys and a password reach the guest through its agent", async () => {
  const uri = await ensureLibvirtd();
  const cluster = await useCluster();
  const client = await kubeClient(cluster.kubeconfigPath);
  const id = crypto.randomUUID().slice(0, 8);
  const ns = `creds-${id}`;
  const node = `creds-node-${id}`;
  await client.request("POST", "/api/v1/namespaces", { metadata: { name: ns } });
  const dir = await Deno.makeTempDir({ prefix: "virtnode-creds-" });
  await installTestGuest(`${dir}/state/images`);
  const h = await startHandlerProcess({
    kubeconfig: cluster.handlerKubeconfigPath,
    nodeName: node,
    libvirtUri: uri,
    dir,
  });
  try {
    const vmi = guestVmi("vm1", node, { namespace: ns, binding: "none" });
    vmi.spec.accessCredentials = [
      {
        sshPublicKey: {
          source: { secret: { secretName: "keys" } },
          propagationMethod: { qemuGuestAgent: { users: ["root"] } },
        },
      },
      {
        userPassword: {
          source: { secret: { secretName: "passwords" } },
          propagationMethod: { qemuGuestAgent: {} },
        },
      },
    ];
    await createVmi(client, vmi);

    // A Secret that does not exist: the VMI waits, and says which.
    const missing = await waitFor("Synchronized=False naming the missing Secret", async () => {
      const c = condition(await getVmi(client, ns, "vm1"), "Synchronized");
      return c?.status === "False" && /does not exist/.test(c.message ?? "") ? c : undefined;
    }, 60_000);
    assert.match(missing.message!, new RegExp(`Secret "${ns}/keys" does not exist`));
    const warnings = (await eventsFor(client, ns, "vm1")).filter((e) => e.type === "Warning");
    assert.ok(
      warnings.some((e) => /Secret/.test(e.message ?? "")),
      `a warning Event names the Secret: ${JSON.stringify(warnings.map((e) => e.message))}`,
    );

    await client.request(
      "POST",
      `/api/v1/namespaces/${ns}/secrets`,
      secret(ns, "keys", { key1: KEY_1 }),
    );
    await client.request(
      "POST",
      `/api/v1/namespaces/${ns}/secrets`,
      secret(ns, "passwords", { root: PASSWORD }),
    );
    await waitForPhase(client, ns, "vm1", "Running", BOOT_MS);
    const synced = await waitFor("AccessCredentialsSynchronized=True", async () => {
      const c = condition(await getVmi(client, ns, "vm1"), "AccessCredentialsSynchronized");
      return c?.status === "True" ? c : undefined;
    }, BOOT_MS);
    // As virt-handler writes it: no reason on the condition, the reason on its Event.
    assert.equal(synced.message, undefined);
    await waitFor(
      "the AccessCredentialsSyncSuccess event",
      async () =>
        (await eventsFor(client, ns, "vm1")).some((e) =>
          e.reason === "AccessCredentialsSyncSuccess" &&
          e.message === "Access credentials sync successful."
        ),
    );

    // What the guest has: root's authorized_keys holds the key, and root's shadow entry is
    // the password's crypt (checked with the guest's own mkpasswd and the entry's salt).
    const domain = `${ns}_vm1`;
    const keys = await inGuest(domain, "cat /root/.ssh/authorized_keys");
    assert.equal(keys.trim(), KEY_1);
    const check = await inGuest(
      domain,
      `h=$(grep '^root:' /etc/shadow | cut -d: -f2); s=$(echo "$h" | cut -d'$' -f3); ` +
        `[ -n "$s" ] && [ "$(mkpasswd -m sha512 '${PASSWORD}' "$s")" = "$h" ] && echo password-ok`,
    );
    assert.equal(check.trim(), "password-ok");

    // A key added to the Secret reaches the guest; the old one stays.
    await client.request(
      "PATCH",
      `/api/v1/namespaces/${ns}/secrets/keys`,
      { stringData: { key2: KEY_2 } },
      { contentType: "application/merge-patch+json" },
    );
    await waitFor(
      "the new key in the guest",
      async () => {
        const now = await inGuest(domain, "cat /root/.ssh/authorized_keys");
        return now.trim() === `${KEY_1}\n${KEY_2}` ? true : undefined;
      },
      SECRET_CHANGE_MS,
      5_000,
    );
    assert.equal(
      condition(await getVmi(client, ns, "vm1"), "AccessCredentialsSynchronized")?.status,
      "True",
    );

    // An agent without the guest-ssh commands (restarted inside the guest with them blocked,
    // as older agents lack them): the keys go through its file commands, KubeVirt's fallback.
    await inGuest(
      domain,
      "setsid sh -c 'sleep 2; kill $(cat /run/qemu-ga.pid); sleep 1; " +
        "for p in /sys/class/virtio-ports/*; do " +
        '[ "$(cat $p/name)" = org.qemu.guest_agent.0 ] && d=/dev/${p##*/}; done; ' +
        "/usr/sbin/qemu-ga -m virtio-serial -p $d -t /run -f /run/qemu-ga.pid -d " +
        "-b guest-ssh-add-authorized-keys,guest-ssh-get-authorized-keys," +
        "guest-ssh-remove-authorized-keys' </dev/null >/dev/null 2>&1 &",
    );
    await waitFor(
      "the agent back without guest-ssh-add-authorized-keys",
      async () => {
        const info = await virsh("qemu-agent-command", domain, '{"execute":"guest-info"}')
          .catch(() => "");
        const commands = info
          ? (JSON.parse(info) as {
            return: { supported_commands: { name: string; enabled: boolean }[] };
          })
            .return.supported_commands
          : [];
        return commands.some((c) => c.name === "guest-ssh-add-authorized-keys" && !c.enabled)
          ? true
          : undefined;
      },
      60_000,
      1_000,
    );
    await client.request(
      "PATCH",
      `/api/v1/namespaces/${ns}/secrets/keys`,
      { stringData: { key3: KEY_3 } },
      { contentType: "application/merge-patch+json" },
    );
    await waitFor(
      "the third key in the guest, written through the file commands",
      async () => {
        const now = await inGuest(domain, "cat /root/.ssh/authorized_keys");
        return now.trim() === `${KEY_1}\n${KEY_2}\n${KEY_3}` ? true : undefined;
      },
      SECRET_CHANGE_MS,
      5_000,
    );
    const modes = await inGuest(domain, "stat -c '%a %u' /root/.ssh /root/.ssh/authorized_keys");
    assert.deepEqual(modes.trim().split("\n"), ["700 0", "600 0"]);
  } catch (error) {
    const log = await Deno.readTextFile(h.logFile).catch(() => "");
    console.error(`handler log:\n${log.slice(-6000)}`);
    throw error;
  } finally {
    await deleteVmi(client, ns, "vm1").catch(() => {});
    await waitFor("vm1 to go", async () => !(await getVmi(client, ns, "vm1")), 60_000).catch(
      () => {},
    );
    await h.kill();
    killLaunchers(h.stateDir);
    await client.request("DELETE", `/api/v1/namespaces/${ns}`).catch(() => {});
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    client.close();
    await cluster.stop();
  }
});

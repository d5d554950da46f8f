/**
 * The source side of a migration opens its proxy sockets in the launcher's
 * `migrationproxy` folder, which a compromised launcher can write to: it may swap a
 * socket for a link to any host file between the bind and the change of mode and owner.
 * The handler changes them through the socket opened beneath the folder, and uses a
 * folder only root or the launcher's own QEMU user may write to (KubeVirt's launcher makes it,
 * as its user's, when it is a migration target).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { GhostRecordStore, PodLaunchers } from "../../mod/handler/testing.ts";
import { MigrationProxyManager } from "../../mod/migration/mod.ts";
import { POD_UID, startStandInPod } from "./_pod.ts";

const NO_TLS = () => {
  throw new Error("no TLS in this test: nothing connects");
};

Deno.test("a migration source socket swapped for a link to a host file never changes that file's mode or owner", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vn-proxy-" });
  const folder = join(dir, "migrationproxy");
  await Deno.mkdir(folder);
  // The host file the launcher aims at.
  const hostFile = join(dir, "host-secret");
  await Deno.writeTextFile(hostFile, "root's\n");
  await Deno.chmod(hostFile, 0o644);
  const key = "vmi1";
  const socket = join(folder, `${key}-49152-source.sock`);
  // The launcher: renames a fresh link to the host file over the socket, as fast as it can.
  const racer = new Deno.Command("python3", {
    args: [
      "-c",
      [
        "import os, stat, sys",
        "target, sock, tmp = sys.argv[1], sys.argv[2], sys.argv[2] + '.tmp'",
        "while True:",
        "    try:",
        "        if stat.S_ISSOCK(os.lstat(sock).st_mode):",
        "            os.symlink(target, tmp); os.rename(tmp, sock)",
        "    except OSError:",
        "        pass",
      ].join("\n"),
      hostFile,
      socket,
    ],
  }).spawn();
  const proxies = new MigrationProxyManager({ serverTls: NO_TLS, clientTls: NO_TLS });
  let opened = 0;
  let refused = 0;
  try {
    for (let i = 0; i < 300; i++) {
      try {
        await proxies.startSourceListener(key, "127.0.0.1", { "1": 49152 }, dir, {
          socketDir: folder,
          owner: { uid: 107, gid: 107 },
        });
        opened++;
      } catch {
        refused++; // the socket was a link by the time it was opened: refused, not followed
      }
      await proxies.stopSourceListener(key);
      const stat = await Deno.stat(hostFile);
      assert.equal(stat.mode! & 0o777, 0o644, `the host file's mode changed (try ${i})`);
      assert.equal(stat.uid, 0, `the host file's owner changed (try ${i})`);
    }
  } finally {
    racer.kill("SIGKILL");
    await racer.status;
    await proxies.shutdown();
    await Deno.remove(dir, { recursive: true });
  }
  // Most tries open the socket; those the swap won are refused, never followed.
  assert.ok(opened > 0, `no socket was opened in 300 tries (${refused} refused)`);
});

Deno.test("the migration source takes a migrationproxy folder of root or the launcher's user alone", async () => {
  const pod = await startStandInPod();
  const ghostsDir = await Deno.makeTempDir({ prefix: "virtnode-sec-ghosts-" });
  try {
    const ghosts = new GhostRecordStore(ghostsDir);
    await ghosts.load();
    const pods = new PodLaunchers({
      nodeName: "node1",
      ghosts,
      podsDir: pod.podsDir,
      notify: { onDomainEvent: () => {}, onK8sEvent: () => {} },
      mountRecordDir: join(ghostsDir, "mounts"),
      hotplugRecordDir: join(ghostsDir, "hotplug"),
    });
    const vmi = {
      metadata: { namespace: "default", name: "vm1", uid: "2222bbbb-0000-4000-8000-000000000002" },
      spec: { domain: { devices: {} } },
      status: { phase: "Running", runtimeUser: 107, activePods: { [POD_UID]: "node1" } },
    } as unknown as VirtualMachineInstance;
    // Another user's folder is refused.
    const made = `${pod.run}/kubevirt/migrationproxy`;
    await Deno.mkdir(made);
    await Deno.chmod(made, 0o755);
    await Deno.chown(made, 1000, 1000);
    await assert.rejects(pods.migrationSourceDir(vmi), /migrationproxy: it belongs to uid 1000/);
    // The launcher's (QEMU's user, 107), as KubeVirt's launcher leaves it after it was a
    // migration target, is used: the proxy never follows what is in it (the test above).
    await Deno.chown(made, 107, 107);
    const launchers = await pods.migrationSourceDir(vmi);
    assert.deepEqual(launchers.owner, { uid: 107, gid: 107 });
    launchers.release();
    await Deno.chmod(made, 0o775);
    await assert.rejects(pods.migrationSourceDir(vmi), /mode 0775/);
    // Root's own folder, writable by root alone, is used.
    await Deno.chmod(made, 0o755);
    await Deno.chown(made, 0, 0);
    await Deno.chmod(made, 0o755);
    const ok = await pods.migrationSourceDir(vmi);
    ok.release();
    // ... but not one that others may write to.
    await Deno.chmod(made, 0o777);
    await assert.rejects(pods.migrationSourceDir(vmi), /mode 0777/);
  } finally {
    await pod.stop();
    await Deno.remove(ghostsDir, { recursive: true });
  }
});

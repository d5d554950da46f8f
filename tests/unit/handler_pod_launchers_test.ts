/**
 * KubeVirt mode's launcher sockets live in a directory the launcher pod controls: the
 * handler reaches them beneath the pod's directory and never through a symlink.
 */
import assert from "node:assert/strict";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { GhostRecordStore, PodLaunchers } from "../../mod/handler/testing.ts";

const POD = "9a3e1c2d-1111-4222-8333-444455556666";
const SOCKETS = `${POD}/volumes/kubernetes.io~empty-dir/sockets`;

function vmi(): VirtualMachineInstance {
  return {
    metadata: { namespace: "default", name: "vm1", uid: "vmi-uid-1" },
    spec: { domain: { devices: {} } },
    status: { phase: "Scheduled", activePods: { [POD]: "node1" } },
  } as VirtualMachineInstance;
}

async function setup() {
  const dir = await Deno.makeTempDir({ prefix: "virtnode-pods-" });
  const podsDir = `${dir}/pods`;
  await Deno.mkdir(`${podsDir}/${SOCKETS}`, { recursive: true });
  const ghosts = new GhostRecordStore(`${dir}/ghosts`);
  await ghosts.load();
  const pods = new PodLaunchers({
    nodeName: "node1",
    ghosts,
    podsDir,
    notify: { onDomainEvent: () => {}, onK8sEvent: () => {} },
    mountRecordDir: `${dir}/mounts`,
    hotplugRecordDir: `${dir}/hotplug`,
  });
  return { dir, podsDir, pods, socket: `${podsDir}/${SOCKETS}/launcher-sock` };
}

Deno.test("PodLaunchers dials a launcher pod's real socket through a descriptor opened beneath the pod", async () => {
  const { dir, pods, socket } = await setup();
  // The kubelet's path is longer than a socket address may be: bind short, then move it
  // there, as the launcher's socket is bound inside the pod under a short path.
  const listener = Deno.listen({ transport: "unix", path: `${dir}/s` });
  await Deno.rename(`${dir}/s`, socket);
  try {
    assert.equal(await pods.socketOf(vmi()), socket);
    const target = pods.dialResolver(socket);
    assert.match(target.path, /^\/proc\/self\/fd\/\d+$/);
    const accepted = listener.accept();
    const conn = await Deno.connect({ transport: "unix", path: target.path });
    (await accepted).close();
    conn.close();
    target.release();
  } finally {
    listener.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("PodLaunchers refuses a socket reached through a symlink the pod planted", async (t) => {
  const { dir, podsDir, pods, socket } = await setup();
  // A socket of the host's the pod would like the privileged handler to talk to.
  const hostSocketDir = `${dir}/host-run`;
  await Deno.mkdir(hostSocketDir);
  const hostSocket = `${hostSocketDir}/launcher-sock`;
  const host = Deno.listen({ transport: "unix", path: hostSocket });
  let connections = 0;
  (async () => {
    for await (const c of host) {
      connections++;
      c.close();
    }
  })();
  try {
    await t.step("the socket file itself is a symlink", async () => {
      await Deno.symlink(hostSocket, socket);
      assert.equal(await pods.socketOf(vmi()), undefined);
      assert.throws(() => pods.dialResolver(socket), /beneath/);
      await Deno.remove(socket);
    });
    await t.step("a directory on the way is a symlink", async () => {
      await Deno.remove(`${podsDir}/${SOCKETS}`, { recursive: true });
      await Deno.symlink(hostSocketDir, `${podsDir}/${SOCKETS}`);
      assert.equal(await pods.socketOf(vmi()), undefined);
      assert.throws(() => pods.dialResolver(socket), /beneath/);
    });
    await t.step("a regular file is not a socket", async () => {
      await Deno.remove(`${podsDir}/${SOCKETS}`);
      await Deno.mkdir(`${podsDir}/${SOCKETS}`);
      await Deno.writeTextFile(socket, "");
      assert.equal(await pods.socketOf(vmi()), undefined);
      assert.throws(() => pods.dialResolver(socket), /not a socket/);
    });
    await t.step("a path outside the kubelet's pods directory", () => {
      assert.throws(() => pods.dialResolver(hostSocket), /not a socket below the kubelet's pods/);
      assert.throws(
        () => pods.dialResolver(`${podsDir}/../host-run/launcher-sock`),
        /not a socket below|beneath/,
      );
    });
    assert.equal(connections, 0, "the host's socket was never dialled");
  } finally {
    host.close();
    await Deno.remove(dir, { recursive: true });
  }
});

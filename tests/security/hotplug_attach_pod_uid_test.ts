/**
 * A hotplugged volume's `attachPodUID` becomes part of a path below the kubelet's pods
 * directory (issue 34, Low): one that is not a pod UID fails that volume's mount with a
 * clear error, and nothing outside the pods directory is looked at.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { HotplugMountError, HotplugMounts } from "../../mod/handler/testing.ts";

const ATTACH_SOCKET_DIR = "volumes/kubernetes.io~empty-dir/hotplug-disks";

Deno.test("a hotplugged volume whose attachPodUID climbs out of the pods directory is refused", async () => {
  // The error is clear and nothing outside the pods directory is dialled.
  const dir = await Deno.makeTempDir({ prefix: "virtnode-attach-uid-" });
  const podsDir = join(dir, "kubelet", "pods");
  await Deno.mkdir(podsDir, { recursive: true });
  // What "../../outside" names from the pods directory: a socket someone put there.
  const outside = join(dir, "outside", ATTACH_SOCKET_DIR);
  await Deno.mkdir(outside, { recursive: true });
  const listener = Deno.listen({ transport: "unix", path: join(dir, "hp") });
  await Deno.rename(join(dir, "hp"), join(outside, "hp.sock"));
  let dialled = 0;
  const accepting = (async () => {
    for await (const conn of listener) {
      dialled++;
      conn.close();
    }
  })();
  // A launcher that has ended: nothing could be mounted into it whatever happened.
  const ended = new Deno.Command("true").spawn();
  await ended.status;
  const vmi = {
    metadata: { namespace: "tenant", name: "vm1", uid: "0b5e7c1a-1111-4222-8333-444455556666" },
    spec: {
      domain: { devices: {} },
      volumes: [
        { name: "hp-escape", persistentVolumeClaim: { claimName: "c1", hotpluggable: true } },
        { name: "hp-good", persistentVolumeClaim: { claimName: "c2", hotpluggable: true } },
      ],
    },
    status: {
      volumeStatus: [
        { name: "hp-escape", hotplugVolume: { attachPodUID: "../../outside" } },
        // A real pod UID whose pod does not serve yet: looked at, and waited for.
        {
          name: "hp-good",
          hotplugVolume: { attachPodUID: "7d2f0b8e-5a4c-4e1f-9b3a-2c6d8e0f1a2b" },
        },
      ],
    },
  } as unknown as VirtualMachineInstance;
  const mounts = new HotplugMounts(join(dir, "records"), podsDir);
  try {
    await assert.rejects(
      mounts.mount(vmi, ended.pid),
      (error: Error) => {
        assert.ok(error instanceof HotplugMountError, `a HotplugMountError: ${error}`);
        assert.equal(
          error.message,
          'Cannot mount hotplugged volume "hp-escape" of VMI "tenant/vm1": ' +
            'its attachPodUID "../../outside" is not a pod UID',
        );
        return true;
      },
    );
    assert.equal(dialled, 0, "the socket outside the pods directory was dialled");
    assert.deepEqual([...await mounts.mounted(vmi.metadata.uid!)], [], "nothing was recorded");
  } finally {
    listener.close();
    await accepting.catch(() => {});
    await Deno.remove(dir, { recursive: true });
  }
});

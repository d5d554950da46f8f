/**
 * KubeVirt's ImageVolume gate in the handler's containerDisk hand-over, as virt-handler
 * decides it: with the gate on, a launcher pod's containerDisks are image volumes the
 * launcher links itself, so the handler waits for no container-disk server and mounts
 * nothing; a pod made before the gate (KubeVirt's `container-disk-binary` init container)
 * is still waited for and served the old way.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { ContainerDiskMounts } from "../../mod/handler/testing.ts";

function vmi(uid: string): VirtualMachineInstance {
  return {
    metadata: { name: "vm1", namespace: "default", uid },
    spec: {
      domain: { devices: {} },
      volumes: [{ name: "boot", containerDisk: { image: "example/disk:1" } }],
    },
  } as unknown as VirtualMachineInstance;
}

Deno.test("containerDisks under the ImageVolume gate need no wait or mount, unless the pod predates it", async () => {
  // Only a pod made before the gate was turned on still needs the container-disk wait and mount.
  const dir = await Deno.makeTempDir({ prefix: "virtnode-image-volume-" });
  try {
    const podDir = join(dir, "pod");
    // The pod's containerDisk volume, with no container-disk server in it.
    await Deno.mkdir(join(podDir, "volumes/kubernetes.io~empty-dir/container-disks"), {
      recursive: true,
    });
    let gate = false;
    const mounts = new ContainerDiskMounts(join(dir, "records"), { imageVolume: () => gate });
    // Gate off: the server's socket is waited for.
    assert.equal(await mounts.mount(vmi("u1"), podDir, Deno.pid), "notReady");
    // Gate on, read at each mount: the launcher has its disks already; no record is written.
    gate = true;
    assert.equal(await mounts.mount(vmi("u1"), podDir, Deno.pid), "mounted");
    assert.equal(
      await Deno.stat(join(dir, "records", "u1.json")).catch(() => undefined),
      undefined,
    );
    // A pod made before the gate keeps its container-disk servers: still waited for.
    await Deno.mkdir(join(podDir, "containers", "container-disk-binary"), { recursive: true });
    assert.equal(await mounts.mount(vmi("u2"), podDir, Deno.pid), "notReady");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

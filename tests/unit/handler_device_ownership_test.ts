/**
 * A non-root launcher's devices go to its runtime user inside its root, and nothing the
 * root links to outside of it does (the pod controls its own /dev).
 */
import assert from "node:assert/strict";
import { claimLauncherDevices } from "../../mod/handler/testing.ts";

async function owner(path: string): Promise<number | null> {
  return (await Deno.lstat(path)).uid;
}

Deno.test("device ownership: the launcher's kvm and tun nodes go to the runtime user; no vhost-net is fine", async () => {
  // The nodes are /dev/kvm and /dev/net/tun; a missing /dev/vhost-net is skipped, not an error.
  const root = await Deno.makeTempDir();
  try {
    await Deno.mkdir(`${root}/dev/net`, { recursive: true });
    await Deno.writeTextFile(`${root}/dev/kvm`, "");
    await Deno.writeTextFile(`${root}/dev/net/tun`, "");
    assert.deepEqual(claimLauncherDevices(root, 107), ["/dev/kvm", "/dev/net/tun"]);
    assert.equal(await owner(`${root}/dev/kvm`), 107);
    assert.equal(await owner(`${root}/dev/net/tun`), 107);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("device ownership: a device symlinked out of the root is refused and its target keeps its owner", async () => {
  const root = await Deno.makeTempDir();
  const outside = await Deno.makeTempFile();
  try {
    await Deno.mkdir(`${root}/dev`);
    await Deno.symlink(outside, `${root}/dev/kvm`);
    assert.throws(() => claimLauncherDevices(root, 107), /Cannot give \/dev\/kvm .* ELOOP/);
    assert.equal(await owner(outside), 0);
  } finally {
    await Deno.remove(root, { recursive: true });
    await Deno.remove(outside);
  }
});

Deno.test("device ownership: a /dev that is a symlink out of the root is refused", async () => {
  const root = await Deno.makeTempDir();
  const outside = await Deno.makeTempDir();
  try {
    await Deno.writeTextFile(`${outside}/kvm`, "");
    await Deno.symlink(outside, `${root}/dev`);
    assert.throws(() => claimLauncherDevices(root, 107), /Cannot give \/dev\/kvm/);
    assert.equal(await owner(`${outside}/kvm`), 0);
  } finally {
    await Deno.remove(root, { recursive: true });
    await Deno.remove(outside, { recursive: true });
  }
});

Deno.test("device ownership: a launcher without /dev/kvm fails its set-up unless emulation is allowed", async () => {
  // This follows the cluster's useEmulation, as virt-handler does.
  const root = await Deno.makeTempDir();
  try {
    await Deno.mkdir(`${root}/dev/net`, { recursive: true });
    await Deno.writeTextFile(`${root}/dev/net/tun`, "");
    assert.throws(
      () => claimLauncherDevices(root, 107, { emulation: false }),
      /failed to set up file ownership for \/dev\/kvm: .*useEmulation/,
    );
    assert.deepEqual(claimLauncherDevices(root, 107, { emulation: true }), ["/dev/net/tun"]);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

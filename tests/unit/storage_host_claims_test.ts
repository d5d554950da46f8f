import assert from "node:assert/strict";
import { join } from "node:path";
import { type ClaimReader, HostClaimError, resolveHostClaim } from "../../mod/storage/mod.ts";

/** An apiserver holding one claim `ns/c` bound to volume `pv` of `path` (and `mode`). */
function apiserver(path: string, mode?: string): ClaimReader {
  const objects: Record<string, unknown> = {
    "/api/v1/namespaces/ns/persistentvolumeclaims/c": {
      metadata: { name: "c", namespace: "ns" },
      spec: { volumeName: "pv", accessModes: ["ReadWriteOnce"] },
      status: { capacity: { storage: "1Gi" } },
    },
    "/api/v1/persistentvolumes/pv": {
      spec: { claimRef: { name: "c", namespace: "ns" }, hostPath: { path }, volumeMode: mode },
    },
  };
  return {
    request<T>(_method: string, url: string): Promise<T> {
      if (url in objects) return Promise.resolve(objects[url] as T);
      return Promise.reject(new Error(`unexpected ${url}`));
    },
  };
}

const REF = { namespace: "ns", name: "c" };

Deno.test("a memory dump's claim is found as its folder beneath the root, never through a link", async () => {
  const root = await Deno.makeTempDir({ prefix: "virtnode-claims-" });
  try {
    const host = { root, node: "n" };
    const folder = join(root, "ns", "dump");
    await Deno.mkdir(folder, { recursive: true });
    const found = await resolveHostClaim(apiserver(folder), REF, host, { folder: true });
    assert.equal(found.path, folder);
    assert.equal(found.block, false);
    assert.equal(found.claimInfo.claimName, "c");
    // As a disk the same claim needs its disk.img.
    await assert.rejects(resolveHostClaim(apiserver(folder), REF, host), /disk\.img/);
    // No folder, a file, a link, a block volume: refused, saying why.
    const refused = async (path: string, why: RegExp, mode?: string) =>
      await assert.rejects(
        resolveHostClaim(apiserver(path, mode), REF, host, { folder: true }),
        (error: unknown) => error instanceof HostClaimError && why.test(error.message),
      );
    await refused(join(root, "ns", "none"), /the folder ".*none" does not exist/);
    await Deno.writeTextFile(join(root, "ns", "file"), "");
    await refused(join(root, "ns", "file"), /is not a folder/);
    const outside = await Deno.makeTempDir({ prefix: "virtnode-claims-out-" });
    try {
      await Deno.symlink(outside, join(root, "ns", "link"));
      await refused(join(root, "ns", "link"), /is a symbolic link, which is not followed/);
    } finally {
      await Deno.remove(outside, { recursive: true });
    }
    await refused(folder, /is a block volume, and a folder is needed/, "Block");
    await refused(join(root, "other", "dump"), /is outside/);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

/**
 * The FFI layer shipped mount operations that take paths and follow symlinks (`mount`,
 * `setPropagation`, `chmod`, `lchown`, `detachedBindMount`, and the `bindMount`,
 * `setPropagation`, `umount`, `mkdir`, `writeTextFile`, `lchown` and `chmod` actions of the
 * mount namespace child) with no caller in the handler: a later caller could hand them a
 * path a pod controls. They are gone; the child refuses an action it does not know.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import * as ffi from "../../ffi/mod.ts";

Deno.test("ffi/ ships no path-following mount operation that nothing calls", () => {
  const shipped = ["mount", "setPropagation", "chmod", "lchown", "detachedBindMount"]
    .filter((name) => name in ffi);
  assert.deepEqual(shipped, []);
});

Deno.test("the mount namespace child refuses a path-following action it no longer ships", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vn-deadops-" });
  const file = join(dir, "file");
  await Deno.writeTextFile(file, "x");
  await Deno.chmod(file, 0o600);
  const sleeper = new Deno.Command("sleep", { args: ["30"], stdin: "null" }).spawn();
  try {
    const chmod = { op: "chmod", path: file, mode: 0o777 };
    await assert.rejects(
      ffi.runInMountNamespace(sleeper.pid, [chmod as unknown as ffi.MountNamespaceAction]),
      /Unknown mount namespace action "chmod"/,
    );
    assert.equal((await Deno.stat(file)).mode! & 0o777, 0o600);
  } finally {
    sleeper.kill("SIGKILL");
    await sleeper.status;
    await Deno.remove(dir, { recursive: true });
  }
});

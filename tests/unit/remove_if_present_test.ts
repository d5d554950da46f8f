import assert from "node:assert/strict";
import { join } from "node:path";
import { removeIfPresent } from "../../mod/lifecycle/mod.ts";

Deno.test("removeIfPresent() removes a file and returns true", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const file = join(dir, "f");
    await Deno.writeTextFile(file, "x");
    assert.equal(await removeIfPresent(file), true);
    await assert.rejects(Deno.stat(file), Deno.errors.NotFound);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("removeIfPresent() returns false for a path that is not there", async () => {
  const dir = await Deno.makeTempDir();
  try {
    assert.equal(await removeIfPresent(join(dir, "missing")), false);
    assert.equal(await removeIfPresent(join(dir, "missing", "deeper"), { recursive: true }), false);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("removeIfPresent() rethrows an error other than NotFound and leaves the path", async () => {
  // A directory that is not empty, removed without `recursive`: ENOTEMPTY must reach the
  // caller, since the path is still there.
  const dir = await Deno.makeTempDir();
  try {
    const full = join(dir, "full");
    await Deno.mkdir(full);
    await Deno.writeTextFile(join(full, "f"), "x");
    await assert.rejects(removeIfPresent(full), (error: unknown) => {
      assert.ok(error instanceof Error);
      assert.ok(!(error instanceof Deno.errors.NotFound), `unexpected NotFound: ${error}`);
      return true;
    });
    assert.ok((await Deno.stat(full)).isDirectory);
    assert.equal(await removeIfPresent(full, { recursive: true }), true);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

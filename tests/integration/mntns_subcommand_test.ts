import assert from "node:assert/strict";
import { MNTNS_CHILD_SUBCOMMAND, runInMountNamespace } from "../../ffi/mod.ts";

const MAIN = new URL("../../main.ts", import.meta.url).pathname;

Deno.test("virtnode's hidden __mntns-child subcommand enters another process's mount namespace", async () => {
  // This is what a compiled virtnode binary runs.
  const dir = await Deno.makeTempDir();
  // A process in its own mount namespace with a tmpfs only it can see. `exec sleep`: the
  // SIGKILL below must end the sleep itself, not only a shell that would orphan it.
  const child = new Deno.Command("unshare", {
    args: [
      "--mount",
      "--propagation",
      "private",
      "sh",
      "-c",
      `mount -t tmpfs none ${dir} && echo inside > ${dir}/marker && exec sleep 30`,
    ],
    stdin: "null",
    stdout: "null",
    stderr: "null",
  }).spawn();
  try {
    let results: (string | null)[] = [];
    for (let i = 0; i < 50; i++) {
      try {
        results = await runInMountNamespace(child.pid, [
          { op: "readTextFile", path: `${dir}/marker` },
        ], { command: [Deno.execPath(), "run", "-A", MAIN, MNTNS_CHILD_SUBCOMMAND] });
        break;
      } catch {
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    assert.deepEqual(results, ["inside\n"]);
    await assert.rejects(Deno.readTextFile(`${dir}/marker`), Deno.errors.NotFound);
  } finally {
    child.kill("SIGKILL");
    await child.status;
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
});

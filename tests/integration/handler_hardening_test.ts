/**
 * What a hostile or broken environment must not do to the handler: launchers that
 * inherit its descriptors, planted symlinks in directories a launcher controls.
 */
import assert from "node:assert/strict";
import {
  createVmi,
  deleteVmi,
  hostPid,
  testVmi,
  waitFor,
  waitForPhase,
  withHandler,
} from "../helpers/handler_process.ts";

function suffix(): string {
  return crypto.randomUUID().slice(0, 8);
}

/**
 * A process's sockets and pipes by descriptor: their link names carry the inode, so the
 * same name in two processes is the same object, shared. (A file path is not: two
 * processes open the same file separately; anon_inode names repeat for any object.)
 */
function descriptorTargets(pid: number): Map<string, string> {
  const out = new Map<string, string>();
  for (const e of Deno.readDirSync(`/proc/${pid}/fd`)) {
    try {
      const target = Deno.readLinkSync(`/proc/${pid}/fd/${e.name}`);
      if (!/^(socket|pipe):\[\d+\]$/.test(target)) continue;
      out.set(e.name, target);
    } catch {
      // Closed meanwhile.
    }
  }
  return out;
}

Deno.test("handler: the launcher host holds none of the handler's descriptors (notify listener, connections)", async () => {
  await withHandler("fds", async ({ h, node, client }) => {
    // Two VMIs: the second launcher starts while the handler holds a connection to the first.
    const names = [`vm-${suffix()}`, `vm-${suffix()}`];
    for (const name of names) {
      await createVmi(client, testVmi(name, node));
      await waitForPhase(client, "default", name, "Running");
    }
    const handlerFds = descriptorTargets(h.child.pid);
    const sockets = [...handlerFds.values()].filter((t) => t.startsWith("socket:"));
    assert.ok(sockets.length >= 2, `the handler holds its sockets: ${[...handlerFds.values()]}`);
    const handlerTargets = new Set(handlerFds.values());
    const pid = await waitFor("the launcher host", () => hostPid(h.stateDir));
    const shared = [...descriptorTargets(pid)].filter(([, t]) => handlerTargets.has(t));
    assert.deepEqual(shared, [], `launcher host ${pid} holds the handler's descriptors`);
    for (const name of names) await deleteVmi(client, "default", name);
  });
});

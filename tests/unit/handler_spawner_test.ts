import assert from "node:assert/strict";
import { LauncherSpawner } from "../../mod/handler/launcher_spawner.ts";

Deno.test("LauncherSpawner lets only maxStarting launchers start at once and frees a slot when one is ready", async () => {
  const dir = await Deno.makeTempDir();
  const ready: string[] = [];
  const spawner = new LauncherSpawner({
    stateDir: `${dir}/state`,
    maxStarting: 2,
    // A stand-in launcher: its socket appears after 200 ms, then it idles.
    command: (spec) => ({
      cmd: "sh",
      args: ["-c", `sleep 0.2; touch "${spec.socketDir}/launcher-sock"; exec sleep 30`, spec.uid],
    }),
    onReady: (uid) => ready.push(uid),
  });
  const spec = (uid: string) => ({
    namespace: "default",
    name: uid,
    uid,
    gracePeriodSeconds: 0,
    socketDir: `${dir}/sockets/${uid}`,
  });
  try {
    assert.equal(await spawner.everStarted("a"), false, "nothing was ever started for a");
    assert.equal(spawner.canStart(), true);
    await spawner.start(spec("a"));
    await spawner.start(spec("b"));
    assert.equal(spawner.canStart(), false, "two are starting");
    assert.equal(await spawner.everStarted("a"), true);
    const freed = new Promise<number>((resolve) => {
      const t = performance.now();
      spawner.onSlotFree(() => resolve(performance.now() - t));
    });
    const waitedMs = await freed;
    assert.ok(waitedMs >= 100 && waitedMs < 3_000, `slot freed after ${waitedMs} ms`);
    assert.equal(spawner.canStart(), true);
    await new Promise((r) => setTimeout(r, 500));
    assert.deepEqual(ready.sort(), ["a", "b"]);
  } finally {
    await spawner.stop("a", 2_000);
    await spawner.stop("b", 2_000);
    await Deno.remove(dir, { recursive: true });
  }
});

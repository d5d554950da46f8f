import assert from "node:assert/strict";
import { aborted, every, orAborted, runStages, sleep } from "../../mod/lifecycle/mod.ts";

const LIFECYCLE = new URL("../../mod/lifecycle/mod.ts", import.meta.url).href;

Deno.test("surviveUnhandledRejections() keeps a process alive and reports the rejection", async () => {
  const script = `
    import { surviveUnhandledRejections } from "${LIFECYCLE}";
    surviveUnhandledRejections((e) => console.log("reported: " + e.message));
    Promise.reject(new Error("dropped write"));
    await new Promise((r) => setTimeout(r, 100));
    console.log("still running");
  `;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["eval", "--no-check", script],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout);
  assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
  assert.match(text, /reported: dropped write/);
  assert.match(text, /still running/);
});

Deno.test("runStages() stops stage after stage: a later stage is told only once the earlier ones ended", async () => {
  const order: string[] = [];
  const part = (name: string, windDownMs: number) => ({
    name,
    async run(signal: AbortSignal) {
      await aborted(signal);
      order.push(`${name} told`);
      await sleep(windDownMs);
      order.push(`${name} done`);
    },
  });
  const stop = new AbortController();
  const running = runStages([[part("heartbeat", 30)], [part("workers", 10)]], stop.signal);
  await sleep(10);
  stop.abort();
  await running;
  assert.deepEqual(order, ["heartbeat told", "heartbeat done", "workers told", "workers done"]);
});

Deno.test("runStages() stops everything when one runnable fails, and rejects naming it", async () => {
  let otherStopped = false;
  const stop = new AbortController();
  await assert.rejects(
    runStages([[
      { name: "broken", run: () => Promise.reject(new Error("bind failed")) },
      {
        name: "steady",
        run: async (s) => {
          await aborted(s);
          otherStopped = true;
        },
      },
    ]], stop.signal),
    /Runnable "broken" failed: bind failed/,
  );
  assert.ok(otherStopped);
});

Deno.test("every() never overlaps calls and ends when its signal aborts", async () => {
  let running = 0;
  let calls = 0;
  const stop = new AbortController();
  const loop = every(5, async () => {
    running++;
    assert.equal(running, 1, "no overlap");
    calls++;
    await sleep(15);
    running--;
    if (calls === 3) stop.abort();
  }, stop.signal);
  await loop;
  assert.equal(calls, 3);
});

Deno.test("every() reports a failing call and goes on when told how", async () => {
  const errors: unknown[] = [];
  let calls = 0;
  const stop = new AbortController();
  await every(
    1,
    () => {
      calls++;
      if (calls === 2) stop.abort();
      throw new Error(`call ${calls}`);
    },
    stop.signal,
    { onError: (e) => errors.push(e) },
  );
  assert.equal(errors.length, 2);
});

Deno.test("sleep() ends early when its signal aborts", async () => {
  const stop = new AbortController();
  const t0 = performance.now();
  setTimeout(() => stop.abort(), 10);
  await sleep(10_000, stop.signal);
  assert.ok(performance.now() - t0 < 1_000);
});

Deno.test("orAborted() settles as its promise does, or undefined on abort, and always drops its listener", async () => {
  const stop = new AbortController();
  let live = 0;
  const add = stop.signal.addEventListener.bind(stop.signal);
  const remove = stop.signal.removeEventListener.bind(stop.signal);
  stop.signal.addEventListener = ((...args: Parameters<typeof add>) => {
    live++;
    add(...args);
  }) as typeof add;
  stop.signal.removeEventListener = ((...args: Parameters<typeof remove>) => {
    live--;
    remove(...args);
  }) as typeof remove;
  for (let i = 0; i < 100; i++) assert.equal(await orAborted(Promise.resolve(i), stop.signal), i);
  await assert.rejects(orAborted(Promise.reject(new Error("gone")), stop.signal), /gone/);
  assert.equal(live, 0, "no listener left after 101 settled waits");
  const never = orAborted(new Promise<number>(() => {}), stop.signal);
  stop.abort();
  assert.equal(await never, undefined);
  assert.equal(await orAborted(Promise.resolve(1), stop.signal), undefined, "aborted already");
});

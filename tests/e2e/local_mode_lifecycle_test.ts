/**
 * Local mode under QEMU as users and operators treat it: its handler killed while it runs,
 * a VMI of the user's own beside the examples, and a stop right after a handler death.
 * Each run must end with nothing of it left on the host: no domain, no pinned network
 * namespace, no mount, none of the folders it made, no process.
 */
import assert from "node:assert/strict";
import { kubectl } from "../../deploy/cluster/cluster.ts";
import {
  createUserVmi,
  domainId,
  EXAMPLE_DOMAINS,
  EXAMPLES,
  leftovers,
  type LocalModeRun,
  NOTHING_LEFT,
  pinnedNetns,
  removeRun,
  runPaths,
  startLocalMode,
  waitForExamples,
  waitForOutput,
  waitForVmiRunning,
} from "../helpers/local_mode.ts";

/** Well under the 60 s a stop may wait for the VMIs: vmi-cirros's grace period is 30 s. */
const STOP_BUDGET_MS = 50_000;
/** How long a stop waits for the handler before it removes what is left itself. */
const STOP_WAIT_MS = 60_000;

/**
 * Runs `body` against a fresh local mode, then removes whatever the run left, whether the
 * test passed or not.
 */
async function withLocalMode(
  domains: string[],
  body: (run: LocalModeRun, netnsBefore: string[]) => Promise<void>,
): Promise<void> {
  const netnsBefore = await pinnedNetns();
  const run = startLocalMode();
  try {
    await body(run, netnsBefore);
  } finally {
    await removeRun(run, domains);
  }
}

/**
 * Sends the terminal's Ctrl-C and checks the stop: local mode ends with 0, within
 * `budgetMs` when given, and leaves nothing of the run on the host.
 */
async function ctrlC(
  run: LocalModeRun,
  o: { domains: string[]; netnsBefore: string[]; budgetMs?: number },
): Promise<void> {
  const { dirs } = runPaths(run);
  const started = Date.now();
  Deno.kill(-run.child.pid, "SIGINT");
  const status = await run.child.status;
  await run.drained;
  const ms = Date.now() - started;
  assert.equal(status.code, 0, run.output());
  if (o.budgetMs !== undefined) {
    assert.ok(ms < o.budgetMs, `the stop took ${ms} ms, over ${o.budgetMs} ms:\n${run.output()}`);
  }
  assert.deepEqual(
    await leftovers(run, { domains: o.domains, dirs, netnsBefore: o.netnsBefore }),
    NOTHING_LEFT,
    run.output(),
  );
  assert.match(run.output(), /\[local\] nothing left behind/);
}

/** The PID local mode gave for the handler it started last. */
function handlerPid(run: LocalModeRun): number {
  const all = [...run.output().matchAll(/handler started \(pid (\d+)\)/g)];
  assert.ok(all.length > 0, run.output());
  return Number(all.at(-1)![1]);
}

Deno.test("local mode restarts a killed handler, shows phases stale meanwhile, and no guest stops", async () => {
  // The phases stay marked stale until the restarted handler is ready again.
  await withLocalMode(EXAMPLE_DOMAINS, async (run, netnsBefore) => {
    const node = await waitForExamples(run);
    const { kubeconfig } = runPaths(run);
    const ids = await Promise.all(EXAMPLE_DOMAINS.map(domainId));
    assert.ok(ids.every((id) => /^\d+$/.test(id)), `every example's domain runs: ${ids}`);

    const killed = handlerPid(run);
    const from = run.output().length;
    Deno.kill(killed, "SIGKILL");
    await waitForOutput(run, new RegExp(`handler \\(pid ${killed}\\) died.*SIGKILL`), {
      what: "local mode did not say its handler died",
      timeoutMs: 30_000,
      from,
    });
    const down = await waitForOutput(run, /handler down since \d\d:\d\d:\d\d/, {
      what: "the table did not say the handler is down",
      timeoutMs: 30_000,
      from,
    });
    for (const name of EXAMPLES) {
      await waitForOutput(run, new RegExp(`^${name} +Running \\(stale\\) +\\S+ +${node}`, "m"), {
        what: `${name}'s phase was not marked stale while the handler was down`,
        timeoutMs: 30_000,
        from: down.index,
      });
    }
    const restarted = await waitForOutput(run, /handler started \(pid (\d+)\)/, {
      what: "local mode did not restart its handler",
      timeoutMs: 60_000,
      from,
    });
    assert.notEqual(Number(restarted[1]), killed);
    const ready = await waitForOutput(run, /handler is ready again/, {
      what: "the restarted handler was not said ready",
      timeoutMs: 120_000,
      from,
    });
    for (const name of EXAMPLES) {
      await waitForOutput(run, new RegExp(`^${name} +Running +\\S+ +${node}`, "m"), {
        what: `${name} was not shown Running (live) once the handler was ready again`,
        timeoutMs: 30_000,
        from: ready.index,
      });
    }
    // The handler's restart took no guest down: the same QEMU (domain ID) behind each VMI,
    // which the API still shows Running.
    assert.deepEqual(await Promise.all(EXAMPLE_DOMAINS.map(domainId)), ids);
    const phases = await kubectl(kubeconfig, [
      "get",
      "vmi",
      "-A",
      "-o",
      "jsonpath={range .items[*]}{.metadata.name}={.status.phase} {end}",
    ]);
    assert.deepEqual(
      phases.trim().split(" ").sort(),
      EXAMPLES.map((n) => `${n}=Running`),
    );

    await ctrlC(run, { domains: EXAMPLE_DOMAINS, netnsBefore });
  });
});

Deno.test("local mode: Ctrl-C with a user's VMI beside the examples deletes every VMI and leaves nothing", async () => {
  const mine = { namespace: "demo", name: "vmi-mine" };
  const domains = [...EXAMPLE_DOMAINS, "demo_vmi-mine"];
  await withLocalMode(domains, async (run, netnsBefore) => {
    const node = await waitForExamples(run);
    const { kubeconfig } = runPaths(run);
    await createUserVmi(kubeconfig, { ...mine, node });
    await waitForVmiRunning(kubeconfig, mine);
    assert.match(await domainId("demo_vmi-mine"), /^\d+$/);

    await ctrlC(run, { domains, netnsBefore, budgetMs: STOP_BUDGET_MS });
  });
});

Deno.test("local mode: Ctrl-C right after its handler was killed leaves nothing", async () => {
  await withLocalMode(EXAMPLE_DOMAINS, async (run, netnsBefore) => {
    await waitForExamples(run);
    const killed = handlerPid(run);
    Deno.kill(killed, "SIGKILL");
    await ctrlC(run, { domains: EXAMPLE_DOMAINS, netnsBefore, budgetMs: STOP_BUDGET_MS });
    assert.match(run.output(), new RegExp(`handler \\(pid ${killed}\\) died.*SIGKILL`));
  });
});

Deno.test("local mode: a guest that outlasts the stop's wait is destroyed through libvirt, and nothing is left", async () => {
  // Its grace period is longer than the minute a stop waits for the handler.
  const slow = { namespace: "demo", name: "vmi-slow", gracePeriodSeconds: 600 };
  const domains = [...EXAMPLE_DOMAINS, "demo_vmi-slow"];
  await withLocalMode(domains, async (run, netnsBefore) => {
    const node = await waitForExamples(run);
    const { kubeconfig } = runPaths(run);
    await createUserVmi(kubeconfig, { ...slow, node });
    await waitForVmiRunning(kubeconfig, slow);
    await ctrlC(run, { domains, netnsBefore, budgetMs: STOP_WAIT_MS + STOP_BUDGET_MS });
    assert.match(run.output(), /demo\/vmi-slow: not gone after 60 s/);
    assert.match(run.output(), /removed domain demo_vmi-slow, which the handler did not clean up/);
  });
});

/**
 * Local mode as a user runs it: `deno task start` until every example VMI runs, and
 * Ctrl-C from a terminal (SIGINT to the whole foreground process group); with
 * `--virtctl`, KubeVirt's virtctl reaches the VMIs' console and VNC through KubeVirt's
 * own virt-api and the handler, drives the example VM, and dumps its memory onto a claim.
 */
import assert from "node:assert/strict";
import { QEMU_CONF, QEMU_CONF_LINES } from "../../deploy/libvirtd.ts";
import {
  type AnyLocalModeRun,
  EXAMPLE_DOMAINS,
  EXAMPLES,
  leftovers,
  NOTHING_LEFT,
  pinnedNetns,
  removeRun,
  runPaths,
  startLocalMode,
  startLocalModeInTmux,
  waitForExamples,
} from "../helpers/local_mode.ts";
import {
  consoleAnswers,
  memoryDumpCompletes,
  usbredirGreets,
  vmStopsAndStarts,
  vncGreets,
} from "../helpers/virtctl.ts";

/** Checks that the run left nothing on the host. */
async function assertNothingLeft(run: AnyLocalModeRun, netnsBefore: string[]): Promise<void> {
  const { dirs } = runPaths(run);
  assert.deepEqual(
    await leftovers(run, { domains: EXAMPLE_DOMAINS, dirs, netnsBefore }),
    NOTHING_LEFT,
    run.output(),
  );
}

Deno.test("local mode (deno task start) brings every example VMI to Running under QEMU and stops cleanly", async () => {
  const netnsBefore = await pinnedNetns();
  const run = startLocalMode(["--until-running"]);
  try {
    const status = await run.child.status;
    await run.drained;
    const text = run.output();
    assert.equal(status.code, 0, text);
    assert.match(text, /kubeconfig: \/.*kubeconfig/);
    // libvirtd runs on every machine of this kind: a fallback to the test driver is a failure.
    assert.match(text, /libvirt: qemu:\/\/\/system/, text);
    assert.doesNotMatch(text, /TEST DRIVER/);
    for (const name of EXAMPLES) {
      assert.match(text, new RegExp(`${name} +Running`), `${name} reached Running`);
    }
    assert.match(text, /every example VMI is Running/);
    // vmi-cirros has a NIC on the pod network: its pod IP from the handler's default range.
    assert.match(text, /vmi-cirros +Running +10\.245\./);
    assert.match(
      text,
      /kubevirt\.io\/schedulable=true, [1-9]\d* labels from libvirt's capabilities/,
    );
    assert.match(text, /handler exited with code 0/);
    assert.match(text, /stopping the launcher host/);
    assert.match(text, /\[local\] nothing left behind/);
    assert.match(text, /\[local\] done/);
    await assertNothingLeft(run, netnsBefore);
  } finally {
    await removeRun(run, EXAMPLE_DOMAINS);
  }
});

Deno.test("local mode --virtctl in a terminal: screen, virtctl console, vnc, usbredir, stop/start, dump", async () => {
  // The VMIs are deleted through the control plane while it still runs.
  const original = await Deno.readTextFile(QEMU_CONF);
  // As on a host that never ran virtnode: qemu.conf without virtnode's lines.
  const pristine = original.replace(QEMU_CONF_LINES, "");
  await Deno.writeTextFile(QEMU_CONF, pristine);
  // A real terminal (tmux's): the screen is read as a user sees it, and Ctrl-C is typed.
  const netnsBefore = await pinnedNetns();
  const run = await startLocalModeInTmux(["--virtctl"]);
  try {
    await waitForExamples(run);
    let screen = "";
    const deadline = Date.now() + 30_000;
    const shows = (s: string) =>
      /^NAME +PHASE +IP +NODE +AGE +READY$/m.test(s) &&
      EXAMPLES.every((name) =>
        new RegExp(`^${name} +Running +\\S+ +\\S+ +\\d+[smh] +`, "m").test(s)
      ) &&
      /^vmi-cirros +Running +10\.245\.\d+\.\d+ /m.test(s) &&
      /^handler, \d+[smhd] ago: \w+: /m.test(s);
    while (!shows(screen = await run.screen()) && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 500));
    }
    assert.ok(shows(screen), `the screen:\n${screen}`);
    assert.match(screen, /^virtnode local mode — node \S+/m);
    assert.match(screen, /Ctrl-C stops everything/);
    assert.match(run.output(), /added virtnode's lines to qemu\.conf/);
    assert.match(run.output(), /virt-api: KubeVirt's own, at /);
    // The screen says how to reach the VMIs with virtctl (a line wider than the terminal:
    // read whole from what local mode printed); so does the test.
    assert.match(screen, /^virtctl: \//m);
    const [, virtctl, kubeconfig] = /^virtctl: (\S+) --kubeconfig (\S+) console\|vnc <vmi>$/m
      .exec(run.output()) ?? [];
    assert.ok(virtctl && kubeconfig, `local mode names virtctl:\n${run.output()}`);
    // vmi-efi has no disk to boot: OVMF gives up and opens its shell on the serial console.
    // Typed characters come back one by one between cursor moves; the answer is one run.
    await consoleAnswers({ virtctl, kubeconfig, name: "vmi-efi" }, {
      line: "echo virtnode-answer",
      enter: "\r",
      answer: /\r\nvirtnode-answer\r\n/,
      timeoutMs: 120_000,
    });
    await vncGreets({ virtctl, kubeconfig, name: "vmi-cirros" });
    // vmi-efi has four redirected USB ports: QEMU's greets a client through virtctl.
    await usbredirGreets({ virtctl, kubeconfig, name: "vmi-efi" });
    // vm-minimal is a VirtualMachine: virtctl restarts, stops and starts it through virt-api,
    // and the handler's VM controller carries it out.
    await vmStopsAndStarts({ virtctl, kubeconfig, name: "vm-minimal" });
    // virtctl memory-dump onto a claim of this host: the dump is the guest's memory as an
    // ELF core file.
    const [, root] = /claims: PersistentVolumes under (\S+)\/<namespace>\//.exec(run.output()) ??
      [];
    assert.ok(root, `local mode names its claims' folder:\n${run.output()}`);
    const dump = await memoryDumpCompletes({ virtctl, kubeconfig, name: "vm-minimal" }, { root });
    const elf = await new Deno.Command("readelf", { args: ["-h", dump] }).output();
    const header = new TextDecoder().decode(elf.stdout);
    assert.ok(elf.success, `readelf -h ${dump}: ${new TextDecoder().decode(elf.stderr)}`);
    assert.match(header, /Type:\s+CORE \(Core file\)/);
    assert.ok((await Deno.stat(dump)).size >= 64 * 1024 * 1024, "the guest's 64 MiB are in it");
    await run.keys("C-c");
    const status = await run.exited(180_000);
    const text = run.output();
    assert.equal(status, 0, `local mode exited with code ${status} after Ctrl-C:\n${text}`);
    const afterCtrlC = text.slice(text.indexOf("Ctrl-C: stopping"));
    assert.ok(text.includes("Ctrl-C: stopping"), `local mode did not say it stops:\n${text}`);
    assert.match(afterCtrlC, /deleting every VM and VMI/);
    assert.match(afterCtrlC, /deleting VM vm-minimal \(its VMI goes with it\)/);
    assert.match(afterCtrlC, /stopping virt-api/);
    assert.doesNotMatch(afterCtrlC, /refused/i, "the control plane outlived the deletion");
    assert.match(text, /handler exited with code 0/);
    assert.match(text, /\[local\] nothing left behind/);
    assert.match(text, /the host's configuration is as it was/);
    await assertNothingLeft(run, netnsBefore);
    assert.equal(await Deno.readTextFile(QEMU_CONF), pristine, "qemu.conf restored");
  } finally {
    await removeRun(run, EXAMPLE_DOMAINS);
    await Deno.writeTextFile(QEMU_CONF, original);
  }
});

/**
 * The QEMU threads of a dedicated-CPU VMI placed after its start, against a /proc tree of
 * a KVM host (this machine may have no KVM, so no PIT thread of its own): the realtime
 * mask's vCPUs under SCHED_FIFO 1, what is no vCPU on the housekeeping CPU, the PIT thread
 * on vCPU 0's CPUs and, for realtime, under SCHED_FIFO 2.
 */
import assert from "node:assert/strict";
import {
  findQemuPid,
  placeQemuThreads,
  QemuLocator,
  realtimeMask,
  type ThreadCalls,
} from "../../mod/cpus/mod.ts";

async function write(path: string, text: string): Promise<void> {
  await Deno.mkdir(path.slice(0, path.lastIndexOf("/")), { recursive: true });
  await Deno.writeTextFile(path, text);
}

/** A /proc of two QEMUs (100 runs ns_vm, 300 runs ns_vm2), 100's PIT thread and a shell. */
async function procTree(): Promise<string> {
  const proc = await Deno.makeTempDir({ prefix: "virtnode-proc-" });
  const qemu = (name: string) =>
    ["/usr/bin/qemu-system-x86_64", "-name", `guest=${name},debug-threads=on`, "-S", ""].join(
      "\0",
    );
  await write(`${proc}/100/cmdline`, qemu("ns_vm"));
  await write(`${proc}/300/cmdline`, qemu("ns_vm2"));
  await write(`${proc}/400/cmdline`, "/bin/sh\0-c\0echo -name guest=ns_vm,\0");
  await write(`${proc}/200/comm`, "kvm-pit/100\n");
  await write(`${proc}/400/comm`, "sh\n");
  const threads: Record<string, string> = {
    100: "qemu-system-x86",
    101: "CPU 0/KVM",
    102: "CPU 1/KVM",
    103: "TC tc-ram-node0",
    104: "IO mon_iothread",
  };
  for (const [tid, comm] of Object.entries(threads)) {
    await write(`${proc}/100/task/${tid}/comm`, `${comm}\n`);
  }
  return proc;
}

function kernel(proc: string, affinity: Record<number, number[]>) {
  const calls: string[] = [];
  const k: ThreadCalls = {
    procRoot: proc,
    getAffinity: (tid) => affinity[tid] ?? [0, 1, 2, 3],
    setAffinity: (tid, cpus) => {
      calls.push(`affinity ${tid} ${cpus.join(",")}`);
      affinity[tid] = [...cpus];
    },
    setScheduler: (tid, policy, priority) => calls.push(`scheduler ${tid} ${policy} ${priority}`),
  };
  return { k, calls };
}

Deno.test("findQemuPid() finds the QEMU of a domain by its -name, not another's, a shell's or an unaccepted one", async () => {
  const proc = await procTree();
  try {
    assert.equal(findQemuPid("ns_vm", { procRoot: proc }), 100);
    assert.equal(findQemuPid("ns_vm2", { procRoot: proc }), 300);
    assert.equal(findQemuPid("ns_v", { procRoot: proc }), undefined);
    // Only the processes a caller accepts (its launcher pod's) count.
    assert.equal(findQemuPid("ns_vm", { procRoot: proc, accept: (pid) => pid !== 100 }), undefined);
  } finally {
    await Deno.remove(proc, { recursive: true });
  }
});

Deno.test("placeQemuThreads(): housekeeping for what is no vCPU, the PIT beside vCPU 0, FIFO 2 for realtime", async () => {
  const proc = await procTree();
  try {
    // libvirt pinned the vCPUs (1 and 2) and the emulator (3); the thread context is not.
    const { k, calls } = kernel(proc, { 100: [3], 101: [1], 102: [2], 104: [3] });
    // KubeVirt's launcher writes no <vcpusched>: the realtime mask's vCPU 1 gets FIFO here.
    const placed = placeQemuThreads(
      100,
      { housekeeping: [3], realtime: true, fifo: realtimeMask("0-1,^0") },
      k,
    );
    assert.deepEqual(placed, { moved: [103], pit: 200 });
    assert.deepEqual(calls.toSorted(), [
      "affinity 103 3",
      "affinity 200 1",
      "scheduler 102 1 1",
      "scheduler 200 1 2",
    ]);
    // Idempotent: nothing left to move; the PIT is set again (cheap, and as virt-handler).
    calls.length = 0;
    assert.deepEqual(placeQemuThreads(100, { housekeeping: [3], realtime: true }, k).moved, []);

    // Without isolateEmulatorThread or realtime: the PIT's CPUs only.
    const plain = kernel(proc, { 101: [1] });
    assert.deepEqual(placeQemuThreads(100, { realtime: false }, plain.k), {
      moved: [],
      pit: 200,
    });
    assert.deepEqual(plain.calls, ["affinity 200 1"]);
    // Another QEMU without a PIT thread (software emulation): nothing for it.
    await write(`${proc}/300/task/300/comm`, "qemu-system-x86\n");
    await write(`${proc}/300/task/301/comm`, "CPU 0/TCG\n");
    const tcg = kernel(proc, { 300: [0, 1], 301: [0] });
    assert.deepEqual(placeQemuThreads(300, { housekeeping: [1], realtime: true }, tcg.k), {
      moved: [300],
    });
    assert.deepEqual(tcg.calls, ["affinity 300 1"]);
  } finally {
    await Deno.remove(proc, { recursive: true });
  }
});

Deno.test("QemuLocator finds a domain's QEMU once, then again only when another process runs it", async () => {
  // A stand-in QEMU on this host: argv[0] and -name as QEMU's, a shell behind them that
  // waits on its standard input (no child of its own is left when it is killed).
  const start = () =>
    new Deno.Command("bash", {
      args: [
        "-c",
        'exec -a qemu-system-stand-in bash -c "read -r _; :" -name guest=ns_locate,debug-threads=on',
      ],
      stdin: "piped",
    }).spawn();
  const locator = new QemuLocator();
  let child = start();
  try {
    const first = await waitFound(locator);
    assert.deepEqual(first, { pid: child.pid, fresh: true });
    assert.deepEqual(locator.locate("vmi", "ns_locate"), { pid: child.pid, fresh: false });
    child.kill("SIGKILL");
    await child.status;
    child = start();
    assert.deepEqual(await waitFound(locator), { pid: child.pid, fresh: true });
    locator.forget("vmi");
    assert.deepEqual(locator.locate("vmi", "ns_locate"), { pid: child.pid, fresh: true });
    assert.equal(locator.locate("other", "ns_absent"), undefined);
  } finally {
    child.kill("SIGKILL");
    await child.status;
  }
});

async function waitFound(locator: QemuLocator) {
  for (let i = 0; i < 100; i++) {
    const found = locator.locate("vmi", "ns_locate");
    if (found) return found;
    await new Promise((r) => setTimeout(r, 50));
  }
  return undefined;
}

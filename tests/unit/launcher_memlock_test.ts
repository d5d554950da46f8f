/**
 * The locked-memory limits KubeVirt mode's handler gives a launcher's virtqemud and QEMU for
 * a VMI that pins its memory (mod/handler/pods/memlock.ts): which VMIs, how many bytes, which
 * processes (on a /proc fixture), the real prlimit on a real process, and PodLaunchers
 * setting virtqemud's before the domain is defined.
 */
import assert from "node:assert/strict";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import {
  adjustQemuMemlock,
  adjustVirtqemudMemlock,
  GhostRecordStore,
  needsLockedMemory,
  parseProcStat,
  PodLaunchers,
  qemuMemlockBytes,
  virtqemudMemlockBytes,
} from "../../mod/handler/testing.ts";
import { setMemlockLimit } from "../../ffi/mod.ts";

function vmi(extra: Record<string, unknown> = {}): VirtualMachineInstance {
  return {
    metadata: { namespace: "default", name: "vm1", uid: "vmi-uid-1" },
    spec: {
      domain: {
        cpu: { cores: 2 },
        resources: { requests: { memory: "1Gi" } },
        devices: { hostDevices: [{ name: "gpu0", deviceName: "example.com/dev" }] },
        ...extra,
      },
    },
    status: { phase: "Scheduled" },
  } as unknown as VirtualMachineInstance;
}

Deno.test("needsLockedMemory(): host devices, GPUs, SR-IOV, realtime and SEV pin memory; others do not", () => {
  assert.equal(needsLockedMemory(vmi()), true);
  const plain = vmi({ devices: {} });
  assert.equal(needsLockedMemory(plain), false);
  assert.equal(needsLockedMemory(vmi({ devices: { gpus: [{ name: "g" }] } })), true);
  assert.equal(needsLockedMemory(vmi({ devices: { hostDevices: [] } })), false);
  assert.equal(
    needsLockedMemory(vmi({ devices: { interfaces: [{ name: "red", sriov: {} }] } })),
    true,
  );
  assert.equal(
    needsLockedMemory(vmi({ devices: { interfaces: [{ name: "red", bridge: {} }] } })),
    false,
  );
  assert.equal(needsLockedMemory(vmi({ devices: {}, cpu: { cores: 2, realtime: {} } })), true);
  assert.equal(needsLockedMemory(vmi({ devices: {}, launchSecurity: { sev: {} } })), true);
  assert.equal(needsLockedMemory(vmi({ devices: {}, launchSecurity: {} })), false);
});

Deno.test("the limits are KubeVirt's launcher overhead plus the guest's memory (boot, or the most)", () => {
  // Overhead, term by term (services.GetMemoryOverhead): page tables 1073742000 / 512 =
  // 2097152, the processes 220Mi, two vCPUs 16Mi, the IO thread 8Mi, graphics 32Mi, VFIO
  // 1024Mi: 1300Mi + 2097152 = 1365245952. Guest 1Gi in whole kilobytes: 1073742000.
  assert.equal(virtqemudMemlockBytes(vmi()), 1365245952 + 1073742000);
  // memory.guest wins over the request at boot; maxGuest is QEMU's.
  const grown = vmi({ memory: { guest: "512Mi", maxGuest: "2Gi" } });
  assert.equal(virtqemudMemlockBytes(grown), 1365245952 + 536871000);
  assert.equal(qemuMemlockBytes(grown), 1365245952 + 2147484000);
  assert.equal(qemuMemlockBytes(vmi()), 1365245952 + 1073742000);
  // The CR's ratio scales the overhead (in whole kilobytes), not the guest's memory.
  assert.equal(virtqemudMemlockBytes(vmi(), "2"), 1365245952 + 1365246000 + 1073742000);
});

Deno.test("parseProcStat() reads a command name that holds spaces and parentheses", () => {
  assert.deepEqual(parseProcStat("300 (virtqemud) S 200 300 300 0 -1 4194560 1 0"), {
    pid: 300,
    ppid: 200,
    command: "virtqemud",
  });
  assert.deepEqual(parseProcStat("7 (a) b (c) R 6 7 7 0"), { pid: 7, ppid: 6, command: "a) b (c" });
  assert.equal(parseProcStat("garbage"), undefined);
});

/** A /proc with a launcher pod's processes: monitor 100, launcher 200 and theirs. */
async function procFixture(): Promise<string> {
  const root = await Deno.makeTempDir({ prefix: "virtnode-proc-" });
  const table: [number, string, number][] = [
    [1, "systemd", 0],
    [100, "virt-launcher-m", 1],
    [200, "virt-launcher", 100],
    [250, "virtlogd", 200],
    [300, "virtqemud", 200],
    [400, "qemu-system-x86", 100],
    // Another pod's: never touched.
    [900, "virtqemud", 899],
    [901, "qemu-system-x86", 898],
  ];
  for (const [pid, command, ppid] of table) {
    await Deno.mkdir(`${root}/${pid}`);
    await Deno.writeTextFile(`${root}/${pid}/stat`, `${pid} (${command}) S ${ppid} ${pid} 0 0`);
  }
  // Not a process.
  await Deno.mkdir(`${root}/sys`);
  return root;
}

Deno.test("virtqemud under the launcher, then QEMU under the launcher's parent, get their limits", async () => {
  const procRoot = await procFixture();
  const set: [number, number][] = [];
  const options = { procRoot, setLimit: (pid: number, bytes: number) => set.push([pid, bytes]) };
  try {
    const daemon = await adjustVirtqemudMemlock(vmi(), 200, options);
    assert.deepEqual(daemon, {
      pid: 300,
      command: "virtqemud",
      bytes: virtqemudMemlockBytes(vmi()),
    });
    const qemu = await adjustQemuMemlock(vmi(), 200, options);
    assert.deepEqual(qemu, {
      pid: 400,
      command: "qemu-system-x86",
      bytes: qemuMemlockBytes(vmi()),
    });
    assert.deepEqual(set.map(([pid]) => pid), [300, 400]);

    // A VMI that pins nothing: nothing is looked at or set.
    set.length = 0;
    assert.equal(await adjustVirtqemudMemlock(vmi({ devices: {} }), 200, options), undefined);
    assert.equal(await adjustQemuMemlock(vmi({ devices: {} }), 200, options), undefined);
    assert.deepEqual(set, []);

    // No virtqemud yet: nothing set (virt-handler goes on); no QEMU: an error naming the parent.
    assert.equal(await adjustVirtqemudMemlock(vmi(), 250, options), undefined);
    await assert.rejects(
      adjustQemuMemlock(vmi(), 300, options),
      /^Error: no QEMU process found under process 200 child processes$/,
    );
    await assert.rejects(adjustQemuMemlock(vmi(), 12345, options), /no process 12345/);
    const failing = {
      procRoot,
      setLimit: () => {
        throw new Error("Operation not permitted");
      },
    };
    await assert.rejects(
      adjustVirtqemudMemlock(vmi(), 200, failing),
      new RegExp(
        `^Error: failed to set process 300 memlock rlimit to ${
          virtqemudMemlockBytes(vmi())
        }: Operation not permitted$`,
      ),
    );
  } finally {
    await Deno.remove(procRoot, { recursive: true });
  }
});

/** The soft and hard "Max locked memory" of a process, from /proc/<pid>/limits. */
async function lockedMemoryLimits(pid: number): Promise<string[]> {
  const line = (await Deno.readTextFile(`/proc/${pid}/limits`)).split("\n")
    .find((l) => l.startsWith("Max locked memory"))!;
  return line.slice("Max locked memory".length).trim().split(/\s+/).slice(0, 2);
}

Deno.test("setMemlockLimit() sets a real process's soft and hard limit (prlimit)", async () => {
  const child = new Deno.Command("sleep", { args: ["60"], stdout: "null", stderr: "null" }).spawn();
  try {
    // Below the hard limit the child inherited (8 MiB by default): raising it needs
    // CAP_SYS_RESOURCE, which a privileged handler has and some test machines drop.
    const [, hard] = await lockedMemoryLimits(child.pid);
    const bytes = (hard === "unlimited" ? 8 << 20 : Math.min(Number(hard), 8 << 20)) - 4096;
    setMemlockLimit(child.pid, bytes);
    assert.deepEqual(await lockedMemoryLimits(child.pid), [String(bytes), String(bytes)]);
  } finally {
    child.kill("SIGKILL");
    await child.status;
  }
  assert.throws(() => setMemlockLimit(child.pid, 1 << 20), /ESRCH|No such process/);
});

Deno.test("PodLaunchers sets virtqemud's limit when it finds the launcher, once per launcher socket", async () => {
  const dir = await Deno.makeTempDir({ prefix: "virtnode-pods-" });
  const pod = "9a3e1c2d-1111-4222-8333-444455556666";
  const sockets = `${dir}/pods/${pod}/volumes/kubernetes.io~empty-dir/sockets`;
  await Deno.mkdir(sockets, { recursive: true });
  // This process listens on the launcher's socket: it is "the launcher" the handler finds.
  const listener = Deno.listen({ transport: "unix", path: `${dir}/s` });
  await Deno.rename(`${dir}/s`, `${sockets}/launcher-sock`);
  const procRoot = `${dir}/proc`;
  for (
    const [pid, command, ppid] of [[Deno.pid, "virt-launcher", 1], [77, "virtqemud", Deno.pid]]
  ) {
    await Deno.mkdir(`${procRoot}/${pid}`, { recursive: true });
    await Deno.writeTextFile(`${procRoot}/${pid}/stat`, `${pid} (${command}) S ${ppid} 0 0 0`);
  }
  const set: [number, number][] = [];
  const ghosts = new GhostRecordStore(`${dir}/ghosts`);
  await ghosts.load();
  const pods = new PodLaunchers({
    nodeName: "node1",
    ghosts,
    podsDir: `${dir}/pods`,
    notify: { onDomainEvent: () => {}, onK8sEvent: () => {} },
    mountRecordDir: `${dir}/mounts`,
    hotplugRecordDir: `${dir}/hotplug`,
    memoryOverheadRatio: () => "2",
    procRoot,
    setMemlockLimit: (pid, bytes) => set.push([pid, bytes]),
  });
  const v = vmi();
  v.status = { phase: "Scheduled", activePods: { [pod]: "node1" } };
  try {
    assert.ok("socket" in await pods.start(v));
    assert.deepEqual(set, [[77, virtqemudMemlockBytes(v, "2")]]);
    await pods.start(v);
    assert.equal(set.length, 1, "set once for this launcher");
    // A VMI that pins nothing gets nothing.
    const plain = vmi({ devices: {} });
    plain.metadata.uid = "vmi-uid-2";
    plain.status = v.status;
    await pods.start(plain);
    assert.equal(set.length, 1);
  } finally {
    listener.close();
    await pods.stop(v).catch(() => {});
    await Deno.remove(dir, { recursive: true });
  }
});

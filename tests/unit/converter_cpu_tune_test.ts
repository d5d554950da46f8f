/**
 * Dedicated CPUs in the domain XML (converter_cpu_tune.ts) and the pool they come from
 * (cpu_pool.ts): pinning, the isolated emulator thread, realtime vCPUs and NUMA
 * passthrough over a two-node host read from a sysfs tree, as the handler sends it and
 * the launcher reads it; the admission's rules; the pool's choice, refusal and recovery.
 */
import assert from "node:assert/strict";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { hostTopology, virtualMachineOptions } from "../../mod/handler/testing.ts";
import {
  checkVmiSemantics,
  CpuPool,
  dedicatedCpuCount,
  DedicatedCpusError,
  generateDomainXml,
  hostNumaCellsOfOptions,
  InvalidFieldError,
  ownCpus,
  pinnedCpusOfDomainXml,
  pinnedForTarget,
  realtimeVcpus,
  threadSiblings,
  UnsupportedFieldError,
} from "../../mod/launcher/testing.ts";
import { virtXmlValidate } from "./converter_workspace.ts";

async function write(path: string, text: string): Promise<void> {
  await Deno.mkdir(path.slice(0, path.lastIndexOf("/")), { recursive: true });
  await Deno.writeTextFile(path, text);
}

/** A host of two NUMA nodes: CPUs 0-3 (cores 0-1 and 2-3 are thread pairs) and 4-7. */
async function twoNodeSysfs(): Promise<string> {
  const sys = await Deno.makeTempDir({ prefix: "virtnode-sysfs-" });
  for (const n of [0, 1]) {
    const node = `${sys}/devices/system/node/node${n}`;
    await write(`${node}/meminfo`, `Node ${n} MemTotal:        4194304 kB\n`);
    await write(`${node}/distance`, n === 0 ? "10 21\n" : "21 10\n");
    await write(`${node}/cpulist`, n === 0 ? "0-3\n" : "4-7\n");
    await write(`${node}/hugepages/hugepages-2048kB/nr_hugepages`, "512\n");
  }
  for (let cpu = 0; cpu < 8; cpu++) {
    const siblings = cpu < 4 ? `${cpu & ~1}-${cpu | 1}` : `${cpu}`;
    await write(`${sys}/devices/system/cpu/cpu${cpu}/topology/thread_siblings_list`, siblings);
  }
  return sys;
}

function vmi(cpu: Record<string, unknown>, memory: Record<string, unknown> = {}) {
  return {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachineInstance",
    metadata: { name: "rt", namespace: "ns", uid: "u-rt" },
    spec: {
      architecture: "amd64",
      domain: {
        cpu,
        memory: { guest: "1Gi", ...memory },
        devices: { autoattachMemBalloon: false },
      },
    },
  } as unknown as VirtualMachineInstance;
}

const flat = (xml: string) => xml.replace(/>\s+</g, "><");

Deno.test("converter: dedicated, isolated, realtime CPUs with NUMA passthrough over a two-node host", async () => {
  const sys = await twoNodeSysfs();
  try {
    const v = vmi(
      {
        sockets: 1,
        cores: 3,
        threads: 1,
        dedicatedCpuPlacement: true,
        isolateEmulatorThread: true,
        realtime: { mask: "0-2,^1" },
        numa: { guestMappingPassthrough: {} },
      },
      { hugepages: { pageSize: "2Mi" }, guest: "1026Mi" },
    );
    // What the handler sends and the launcher reads: the host's cells and their CPUs.
    const cells = hostNumaCellsOfOptions(virtualMachineOptions(v, hostTopology(sys)));
    assert.deepEqual(cells, [{ id: 0, cpus: [0, 1, 2, 3] }, { id: 1, cpus: [4, 5, 6, 7] }]);
    assert.equal(dedicatedCpuCount(v), 4);
    // vCPUs 0 and 1 on node 0, vCPU 2 on node 1, the emulator on CPU 6.
    const xml = generateDomainXml(v, {
      domainType: "kvm",
      runDir: "/run/x",
      volumes: {},
      dedicatedCpus: [2, 3, 4, 6],
      hostNumaCells: cells,
    });
    const f = flat(xml);
    assert.match(
      f,
      /<cputune><vcpupin vcpu='0' cpuset='2'\/><vcpupin vcpu='1' cpuset='3'\/><vcpupin vcpu='2' cpuset='4'\/><emulatorpin cpuset='6'\/><vcpusched vcpus='0,2' scheduler='fifo' priority='1'\/><\/cputune>/,
    );
    assert.match(
      f,
      /<numatune><memory mode='strict' nodeset='0,1'\/><memnode cellid='0' mode='strict' nodeset='0'\/><memnode cellid='1' mode='strict' nodeset='1'\/><\/numatune>/,
    );
    // 1026 MiB over two cells in 2 MiB pages: 513 pages, the odd one to the first cell.
    assert.match(
      f,
      /<numa><cell id='0' cpus='0-1' memory='538968064' unit='b'\/><cell id='1' cpus='2' memory='536870912' unit='b'\/><\/numa>/,
    );
    assert.match(
      f,
      /<memoryBacking><hugepages><page size='2048' unit='KiB' nodeset='0'\/><page size='2048' unit='KiB' nodeset='1'\/><\/hugepages><nosharepages\/><allocation mode='immediate'\/><\/memoryBacking>/,
    );
    assert.match(f, /<pmu state='off'\/>/);
    assert.match(f, /<kvm><hint-dedicated state='on'\/><\/kvm>/);
    const validated = await virtXmlValidate(xml);
    assert.ok(validated.ok, validated.output);

    // Software emulation has no KVM hints; without realtime, no FIFO and the PMU stays.
    const plain = vmi({ cores: 2, dedicatedCpuPlacement: true });
    const plainXml = flat(generateDomainXml(plain, {
      domainType: "qemu",
      runDir: "/run/x",
      volumes: {},
      dedicatedCpus: [5, 7],
    }));
    assert.match(
      plainXml,
      /<cputune><vcpupin vcpu='0' cpuset='5'\/><vcpupin vcpu='1' cpuset='7'\/><\/cputune>/,
    );
    assert.doesNotMatch(plainXml, /emulatorpin|vcpusched|pmu|hint-dedicated|numatune/);
    const validatedPlain = await virtXmlValidate(plainXml);
    assert.ok(validatedPlain.ok, validatedPlain.output);
  } finally {
    await Deno.remove(sys, { recursive: true });
  }
});

Deno.test("pinnedForTarget(): a migrating domain's cputune and numatune for the target's CPUs", async () => {
  const sys = await twoNodeSysfs();
  try {
    const v = vmi(
      {
        cores: 3,
        dedicatedCpuPlacement: true,
        isolateEmulatorThread: true,
        numa: { guestMappingPassthrough: {} },
      },
      { hugepages: { pageSize: "2Mi" } },
    );
    const cells = hostNumaCellsOfOptions(virtualMachineOptions(v, hostTopology(sys)));
    const options = { domainType: "kvm" as const, runDir: "/run/x", volumes: {} };
    const source = generateDomainXml(v, {
      ...options,
      dedicatedCpus: [2, 3, 4, 6],
      hostNumaCells: cells,
    });
    // On the target every vCPU is on node 1, the emulator too.
    const target = flat(pinnedForTarget(v, source, "kvm", [4, 5, 6, 7], cells));
    assert.match(
      target,
      /<cputune><vcpupin vcpu='0' cpuset='4'\/><vcpupin vcpu='1' cpuset='5'\/><vcpupin vcpu='2' cpuset='6'\/><emulatorpin cpuset='7'\/><\/cputune>/,
    );
    assert.match(
      target,
      /<numatune><memory mode='strict' nodeset='1'\/><memnode cellid='0' mode='strict' nodeset='1'\/><\/numatune>/,
    );
    // The guest's own cells and everything else stay as the source has them (KubeVirt's
    // source launcher, too, replaces only the tuning: a guest's NUMA cells cannot change
    // while it runs).
    const strip = (xml: string) =>
      flat(xml).replace(/<cputune>.*<\/cputune>|<numatune>.*<\/numatune>/g, "");
    assert.equal(strip(target), strip(source));
    const validated = await virtXmlValidate(target);
    assert.ok(validated.ok, validated.output);
    // The target's CPUs must be as many as the VMI needs.
    assert.throws(
      () => pinnedForTarget(v, source, "kvm", [5, 7], cells),
      (e: unknown) =>
        e instanceof InvalidFieldError && /needs 4 dedicated CPUs and was given 2/.test(e.message),
    );
    // A VMI without dedicated CPUs goes as it is.
    const plain = vmi({ cores: 1 });
    const plainXml = generateDomainXml(plain, options);
    assert.equal(pinnedForTarget(plain, plainXml, "kvm", [1], cells), plainXml);
  } finally {
    await Deno.remove(sys, { recursive: true });
  }
});

Deno.test("converter: dedicated CPUs are refused without CPUs given, or with the wrong count", () => {
  const v = vmi({ sockets: 2, dedicatedCpuPlacement: true, isolateEmulatorThread: true });
  const base = { domainType: "qemu" as const, runDir: "/r", volumes: {} };
  assert.throws(
    () => generateDomainXml(v, base),
    (e: unknown) =>
      e instanceof UnsupportedFieldError &&
      /spec\.domain\.cpu\.dedicatedCpuPlacement.*CPU manager/.test(e.message),
  );
  assert.throws(
    () => generateDomainXml(v, { ...base, dedicatedCpus: [0, 1] }),
    /needs 3 dedicated CPUs and was given 2/,
  );
});

Deno.test("converter: the admission's rules on isolateEmulatorThread, realtime and NUMA passthrough", () => {
  const refused = (cpu: Record<string, unknown>, memory: Record<string, unknown>, re: RegExp) =>
    assert.throws(
      () => checkVmiSemantics(vmi(cpu, memory)),
      (e: unknown) => e instanceof InvalidFieldError && re.test(e.message),
      JSON.stringify(cpu),
    );
  refused(
    { isolateEmulatorThread: true },
    {},
    /IsolateEmulatorThread should be only set in combination with DedicatedCPUPlacement/,
  );
  refused(
    { realtime: {} },
    {},
    /dedicatedCpuPlacement must be set to true when spec.domain.cpu.realtime is used/,
  );
  refused(
    { dedicatedCpuPlacement: true, realtime: {} },
    {},
    /guestMappingPassthrough must be defined when spec.domain.cpu.realtime is used/,
  );
  refused(
    { numa: { guestMappingPassthrough: {} } },
    { hugepages: { pageSize: "2Mi" } },
    /dedicatedCpuPlacement must be set to true when NUMA topology strategy is set/,
  );
  refused(
    { dedicatedCpuPlacement: true, numa: { guestMappingPassthrough: {} } },
    {},
    /hugepages must be requested when NUMA topology strategy is set/,
  );
  refused(
    {
      dedicatedCpuPlacement: true,
      numa: { guestMappingPassthrough: {} },
      realtime: { mask: "3-1" },
    },
    { hugepages: { pageSize: "2Mi" } },
    /invalid mask value '3-1'/,
  );
  checkVmiSemantics(vmi({
    dedicatedCpuPlacement: true,
    isolateEmulatorThread: true,
    numa: { guestMappingPassthrough: {} },
    realtime: {},
  }, { hugepages: { pageSize: "2Mi" } }));
});

Deno.test("realtimeVcpus(): ranges and single vCPUs add, ^n removes wherever it stands, empty is all", () => {
  assert.deepEqual(realtimeVcpus("k", undefined, 3), [0, 1, 2]);
  assert.deepEqual(realtimeVcpus("k", "", 3), [0, 1, 2]);
  assert.deepEqual(realtimeVcpus("k", "0-3,^1", 4), [0, 2, 3]);
  assert.deepEqual(realtimeVcpus("k", "^2, 0-3", 4), [0, 1, 3]);
  assert.deepEqual(realtimeVcpus("k", "5", 4), []);
  assert.throws(() => realtimeVcpus("k", "a", 4), /invalid mask value 'a' in 'a'/);
  assert.throws(() => realtimeVcpus("k", "^1-2", 4), /invalid mask value/);
});

Deno.test("CpuPool: whole cores first, the same CPUs again for the same VMI, a clear refusal, release", async () => {
  const sys = await twoNodeSysfs();
  try {
    const cpus = [0, 1, 2, 3];
    const pool = new CpuPool(cpus, threadSiblings(cpus, sys));
    // CPU 1 is taken (adopted): its core's CPU 0 is no whole core any more.
    pool.hold("adopted", [1]);
    assert.deepEqual(pool.claim("a", 2), [2, 3]);
    assert.deepEqual(pool.claim("a", 2), [2, 3], "idempotent");
    assert.throws(
      () => pool.claim("b", 2),
      (e: unknown) =>
        e instanceof DedicatedCpusError &&
        e.message ===
          "dedicated CPU placement needs 2 CPUs of this node's own; 1 of its 4 (0,1,2,3) are not dedicated to other VMIs",
    );
    assert.deepEqual(pool.claim("b", 1), [0]);
    assert.deepEqual(pool.free(), []);
    pool.release("a");
    assert.deepEqual(pool.free(), [2, 3]);
    // A claim of another size that cannot be had keeps what the owner held.
    assert.throws(() => pool.claim("b", 4), DedicatedCpusError);
    assert.deepEqual(pool.held("b"), [0]);
  } finally {
    await Deno.remove(sys, { recursive: true });
  }
});

Deno.test("CpuPool.grow(): plugged vCPUs get free CPUs beside the held ones, or a refusal that takes none", async () => {
  const sys = await twoNodeSysfs();
  try {
    const cpus = [0, 1, 2, 3];
    const pool = new CpuPool(cpus, threadSiblings(cpus, sys));
    assert.deepEqual(pool.claim("a", 1), [0]);
    pool.hold("b", [3]);
    // The held CPU stays, and a new one comes beside it (no core is wholly free).
    assert.deepEqual(pool.grow("a", 1), [1]);
    assert.deepEqual(pool.held("a"), [0, 1]);
    assert.deepEqual(pool.grow("a", 0), []);
    assert.throws(
      () => pool.grow("a", 2),
      (e: unknown) =>
        e instanceof DedicatedCpusError &&
        e.message ===
          "dedicated CPU placement needs 2 more CPUs of this node's own; 1 of its 4 (0,1,2,3) are not dedicated to other VMIs",
    );
    assert.deepEqual(pool.held("a"), [0, 1]);
    assert.deepEqual(pool.grow("a", 1), [2]);
    assert.deepEqual(pool.free(), []);
  } finally {
    await Deno.remove(sys, { recursive: true });
  }
});

Deno.test("pinnedCpusOfDomainXml() and ownCpus() read libvirt's and the kernel's CPU lists", () => {
  assert.deepEqual(
    pinnedCpusOfDomainXml(
      "<domain><cputune><vcpupin vcpu='0' cpuset='3'/><vcpupin vcpu=\"1\" cpuset=\"5-6\"/>" +
        "<emulatorpin cpuset='1'/><vcpusched vcpus='0' scheduler='fifo' priority='1'/></cputune></domain>",
    ),
    [1, 3, 5, 6],
  );
  assert.deepEqual(pinnedCpusOfDomainXml("<domain><vcpu>2</vcpu></domain>"), []);
  assert.deepEqual(ownCpus("Name:\tx\nCpus_allowed_list:\t0-2,7\n"), [0, 1, 2, 7]);
  assert.throws(() => ownCpus("Name:\tx\n"), /no Cpus_allowed_list/);
  assert.ok(ownCpus().length >= 1, "this process runs somewhere");
});

/**
 * The pod network's handler and launcher parts in real network namespaces, without a
 * guest: pods from the real CNI plugins (bridge, host-local, loopback), the bindings built
 * by {@linkcode PodNetworks} through the namespace worker, a handler that stops half-way
 * and one that finishes after it, and the launcher's DHCP servers answering a real DHCP
 * client (ISC dhclient) over DHCPv4 and DHCPv6 from a "guest" namespace joined to the
 * in-pod bridge by a veth pair (where QEMU's tap would be).
 */
import assert from "node:assert/strict";
import { NetnsRunner, type NetnsStep } from "../../ffi/mod.ts";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import {
  DhcpServers,
  hashedPodInterfaceName,
  hostTapFor,
  NetworkState,
  PodlessNetworks,
  PodNetworkError,
  podNetworkPlan,
  PodNetworks,
  type PodNetworkTarget,
  prepareGuestNetwork,
  readNetworkState,
} from "../../mod/network/mod.ts";
import { removeTestPodNetwork, testPodNetwork } from "../helpers/handler_process.ts";

function vmiFor(uid: string, iface: Record<string, unknown>): VirtualMachineInstance {
  return {
    metadata: { name: "vm1", namespace: "default", uid },
    spec: {
      domain: { devices: { interfaces: [{ name: "default", ...iface }] } },
      networks: [{ name: "default", pod: {} }],
    },
  } as unknown as VirtualMachineInstance;
}

/** Runs a program in a namespace file (nsenter, as an operator would look). */
async function inNs(netns: string, ...args: string[]): Promise<string> {
  const out = await new Deno.Command("nsenter", {
    args: [`--net=${netns}`, ...args],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout);
  if (!out.success) throw new Error(`${args.join(" ")}: ${new TextDecoder().decode(out.stderr)}`);
  return text;
}

/**
 * What a namespace holds, without what differs between two equal setups (indexes, random
 * MACs, the pod's own address, which reads as POD).
 */
async function snapshot(netns: string, podIp: string): Promise<unknown> {
  const links = JSON.parse(await inNs(netns, "ip", "-json", "-details", "address", "show")) as {
    ifname: string;
    master?: string;
    mtu: number;
    flags: string[];
    linkinfo?: { info_kind?: string };
    addr_info: { local: string; prefixlen: number; scope: string }[];
  }[];
  const text = JSON.stringify({
    links: links.map((l) => ({
      name: l.ifname,
      kind: l.linkinfo?.info_kind,
      master: l.master,
      mtu: l.mtu,
      up: l.flags.includes("UP"),
      addresses: l.addr_info.filter((a) => a.scope !== "link").map((a) =>
        `${a.local}/${a.prefixlen}`
      ),
    })).sort((a, b) => a.name.localeCompare(b.name)),
    routes: await inNs(netns, "ip", "route", "show"),
    nft: await inNs(netns, "nft", "list", "ruleset"),
    sysctl: await inNs(
      netns,
      "sh",
      "-c",
      "cat /proc/sys/net/ipv4/ip_forward /proc/sys/net/ipv4/conf/all/arp_ignore",
    ),
  });
  return JSON.parse(
    text.replaceAll(podIp, "POD").replace(/counter packets \d+ bytes \d+/g, "counter"),
  );
}

/**
 * A pod as the cluster's network plugin left it, with IPv4 forwarding off: a new namespace
 * takes the host's setting at its creation, which the other tests running beside this one
 * change, so two pods made a moment apart could differ before any setup.
 */
async function plainPod(pods: PodlessNetworks, uid: string): Promise<string> {
  const netns = await pods.ensure(uid);
  await inNs(netns, "sh", "-c", "echo 0 >/proc/sys/net/ipv4/ip_forward");
  return netns;
}

async function podIpOf(dir: string, uid: string): Promise<string> {
  return (await readNetworkState(`${dir}/cache/${uid}/default`)).podIP!;
}

/**
 * A runner that acts as a handler killed after `lines` lines of its `ip -batch` (the first
 * one, or the first that names `only`).
 */
class DyingRunner extends NetnsRunner {
  #lines: number;
  #only?: string;
  constructor(lines: number, only?: string) {
    super();
    this.#lines = lines;
    this.#only = only;
  }
  override async run(netns: string | undefined, steps: NetnsStep[]) {
    const batch = steps.find((s) =>
      s.op === "exec" && s.args[0] === "-batch" &&
      (this.#only === undefined || s.stdin?.includes(this.#only))
    );
    if (netns && batch && batch.op === "exec") {
      const cut = batch.stdin!.split("\n").slice(0, this.#lines).join("\n") + "\n";
      await super.run(netns, [{ ...batch, stdin: cut }]);
      throw new Error("the handler was killed");
    }
    return await super.run(netns, steps);
  }
}

async function withPods(
  fn: (ctx: { runner: NetnsRunner; pods: PodlessNetworks; dir: string }) => Promise<void>,
  options: { ipv6?: boolean } = {},
) {
  const dir = await Deno.makeTempDir({ prefix: "virtnode-netpod-" });
  const network = testPodNetwork(options);
  const runner = new NetnsRunner();
  const pods = new PodlessNetworks({
    runner,
    bridge: network.bridge,
    subnets: network.cidr.split(","),
    netnsDir: `${dir}/netns`,
    ipamDir: `${dir}/ipam`,
  });
  try {
    await fn({ runner, pods, dir });
  } finally {
    for (const entry of Deno.readDirSync(`${dir}/netns`)) {
      if (!entry.name.endsWith(".json")) await pods.release(entry.name).catch(() => {});
    }
    // The test's "guest" namespaces.
    for (const entry of Deno.readDirSync(dir)) {
      if (entry.name.startsWith("guest-")) {
        await runner.run(undefined, [{ op: "remove", path: `${dir}/${entry.name}` }]).catch(
          () => {},
        );
      }
    }
    runner.close();
    await removeTestPodNetwork(network);
    await Deno.remove(dir, { recursive: true });
  }
}

function target(netns: string, privateDir: string): PodNetworkTarget {
  Deno.mkdirSync(privateDir, { recursive: true });
  return { netns, owner: 0, openLauncherDir: () => ({ path: privateDir, release() {} }) };
}

for (const binding of ["bridge", "masquerade"] as const) {
  Deno.test(`pod network (${binding}): the next handler finishes a setup killed after any step, as one pass would`, async () => {
    // Whatever step the handler is killed after, the network the
    // next one finishes equals the one a single clean pass builds.
    await withPods(async ({ runner, pods, dir }) => {
      const iface = binding === "masquerade"
        ? { masquerade: {}, ports: [{ port: 80 }] }
        : { bridge: {} };
      // The reference: one pass, start to end.
      const cleanUid = crypto.randomUUID();
      const cleanNs = await plainPod(pods, cleanUid);
      const networks = new PodNetworks({ runner, cacheDir: `${dir}/cache` });
      await networks.setup(vmiFor(cleanUid, iface), target(cleanNs, `${dir}/private/${cleanUid}`));
      const reference = await snapshot(cleanNs, await podIpOf(dir, cleanUid));
      const lines = binding === "bridge" ? 17 : 7;
      for (let cut = 0; cut <= lines; cut++) {
        const uid = crypto.randomUUID();
        const netns = await plainPod(pods, uid);
        const vmi = vmiFor(uid, iface);
        const where = target(netns, `${dir}/private/${uid}`);
        const dying = new PodNetworks({ runner: new DyingRunner(cut), cacheDir: `${dir}/cache` });
        await assert.rejects(dying.setup(vmi, where), /killed/);
        const started = await readNetworkState(`${dir}/cache/${uid}/default`);
        assert.equal(started.networkState, NetworkState.Started, "marked started before the links");
        // A restarted handler: a fresh instance over the same state files.
        const again = new PodNetworks({ runner, cacheDir: `${dir}/cache` });
        await again.setup(vmi, where);
        const podIp = await podIpOf(dir, uid);
        assert.deepEqual(await snapshot(netns, podIp), reference, `killed after ${cut} lines`);
        const done = await readNetworkState(`${dir}/cache/${uid}/default`);
        assert.equal(done.networkState, NetworkState.Finished);
        assert.deepEqual((await again.addresses(vmi)).get("default")?.podIPs, started.podIPs);
        // Finished is left alone: a third pass runs nothing in the pod.
        const before = await snapshot(netns, podIp);
        await new PodNetworks({ runner: new DyingRunner(0), cacheDir: `${dir}/cache` }).setup(
          vmi,
          where,
        );
        assert.deepEqual(await snapshot(netns, podIp), before);
        await pods.release(uid);
        await again.teardown(uid);
      }
    });
  });
}

Deno.test("secondary network: a NAD's pod<hash> binding finished after a kill at any step; DEL on release", async () => {
  // As the pod network's: a handler killed anywhere in the secondary network's binding is
  // finished by the next as one pass builds it; release gives the attachment back (DEL).
  await withPods(async ({ runner, pods, dir }) => {
    const nadBridge = `vnsb${crypto.randomUUID().slice(0, 8)}`;
    const config = JSON.stringify({
      cniVersion: "0.3.1",
      name: "red",
      type: "bridge",
      bridge: nadBridge,
    });
    const vmiOf = (uid: string) => {
      const vmi = vmiFor(uid, { masquerade: {} });
      vmi.spec.domain.devices.interfaces!.push({ name: "red", bridge: {} });
      vmi.spec.networks!.push({ name: "red", multus: { networkName: "red" } });
      return vmi;
    };
    const podOf = async (uid: string) => {
      const plan = podNetworkPlan(vmiOf(uid))[1];
      assert.equal(plan.podInterface, hashedPodInterfaceName("red"));
      const netns = await pods.ensure(uid, [{
        network: "red",
        podInterface: plan.podInterface,
        config,
        hostTap: hostTapFor(uid, plan),
      }]);
      await inNs(netns, "sh", "-c", "echo 0 >/proc/sys/net/ipv4/ip_forward");
      return { netns, plan };
    };
    try {
      const cleanUid = crypto.randomUUID();
      const clean = await podOf(cleanUid);
      const networks = new PodNetworks({ runner, cacheDir: `${dir}/cache` });
      await networks.setup(vmiOf(cleanUid), target(clean.netns, `${dir}/private/${cleanUid}`));
      const reference = await snapshot(clean.netns, await podIpOf(dir, cleanUid));
      const names = (reference as { links: { name: string; master?: string; kind?: string }[] })
        .links;
      const hash = clean.plan.podInterface.slice(3);
      assert.ok(names.some((l) => l.name === `${hash}-nic` && l.master === `k6t-${hash}`));
      assert.ok(names.some((l) => l.name === `tap${hash}` && l.master === `k6t-${hash}`));
      assert.ok(names.some((l) => l.name === clean.plan.podInterface && l.kind === "bridge"));
      // No IPAM on the attachment: the launcher serves it no DHCP.
      const cache = JSON.parse(
        await Deno.readTextFile(
          `${dir}/private/${cleanUid}/vif-cache-${clean.plan.podInterface}.json`,
        ),
      );
      assert.equal(cache.IPAMDisabled, true);
      for (let cut = 0; cut <= 14; cut++) {
        const uid = crypto.randomUUID();
        const { netns } = await podOf(uid);
        const vmi = vmiOf(uid);
        const where = target(netns, `${dir}/private/${uid}`);
        const dying = new PodNetworks({
          runner: new DyingRunner(cut, `k6t-${hash}`),
          cacheDir: `${dir}/cache`,
        });
        await assert.rejects(dying.setup(vmi, where), /killed/);
        const started = await readNetworkState(`${dir}/cache/${uid}/red`);
        assert.equal(started.networkState, NetworkState.Started);
        const again = new PodNetworks({ runner, cacheDir: `${dir}/cache` });
        await again.setup(vmi, where);
        assert.deepEqual(
          await snapshot(netns, await podIpOf(dir, uid)),
          reference,
          `killed after ${cut} lines`,
        );
        assert.equal(
          (await readNetworkState(`${dir}/cache/${uid}/red`)).networkState,
          NetworkState.Finished,
        );
        await pods.release(uid);
        await again.teardown(uid);
      }
      // Released: the attachment's host side goes with the namespace (the kernel frees a
      // namespace, and the veth pairs in it, a moment after its last reference).
      await pods.release(cleanUid);
      const ports = async () =>
        new TextDecoder().decode(
          (await new Deno.Command("ip", {
            args: ["-o", "link", "show", "master", nadBridge],
            stdout: "piped",
          }).output()).stdout,
        ).trim();
      const deadline = Date.now() + 15_000;
      while ((await ports()) !== "" && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 200));
      }
      assert.equal(await ports(), "");
      assert.deepEqual(
        [...Deno.readDirSync(`${dir}/netns`)].filter((e) => e.name.startsWith(cleanUid)),
        [],
      );
    } finally {
      await new Deno.Command("ip", { args: ["link", "delete", nadBridge], stderr: "null" })
        .output();
    }
  });
});

Deno.test("secondary network: an unplugged interface's tap, bridge and placeholder go; the pod's own stays", async () => {
  await withPods(async ({ runner, pods, dir }) => {
    const nadBridge = `vnsu${crypto.randomUUID().slice(0, 8)}`;
    const config = JSON.stringify({
      cniVersion: "0.3.1",
      name: "red",
      type: "bridge",
      bridge: nadBridge,
    });
    const uid = crypto.randomUUID();
    const vmi = vmiFor(uid, { masquerade: {} });
    vmi.spec.domain.devices.interfaces!.push({ name: "red", bridge: {} });
    vmi.spec.networks!.push({ name: "red", multus: { networkName: "red" } });
    const plan = podNetworkPlan(vmi)[1];
    try {
      const netns = await pods.ensure(uid, [{
        network: "red",
        podInterface: plan.podInterface,
        config,
        hostTap: hostTapFor(uid, plan),
      }]);
      const networks = new PodNetworks({ runner, cacheDir: `${dir}/cache` });
      const where = target(netns, `${dir}/private/${uid}`);
      await networks.setup(vmi, where);
      const hash = plan.podInterface.slice(3);
      const links = async () =>
        (JSON.parse(await inNs(netns, "ip", "-j", "link", "show")) as { ifname: string }[])
          .map((l) => l.ifname).sort();
      assert.ok((await links()).includes(`k6t-${hash}`));
      // Absent now, and the domain let go of it: the binding goes, the pod network stays.
      vmi.spec.domain.devices.interfaces![1].state = "absent";
      const unplugged = [{ name: "red", podInterface: plan.podInterface }];
      assert.deepEqual(await networks.unplug(vmi, where, unplugged), ["red"]);
      const left = await links();
      for (const gone of [`k6t-${hash}`, `tap${hash}`, plan.podInterface]) {
        assert.ok(!left.includes(gone), `${gone} is gone: ${left.join(" ")}`);
      }
      assert.ok(left.includes(`${hash}-nic`), "the pod's own interface is left to Multus");
      assert.ok(left.includes("k6t-eth0"), "the pod network is untouched");
      await assert.rejects(Deno.stat(`${dir}/cache/${uid}/red`), Deno.errors.NotFound);
      // Again: nothing left to do.
      assert.deepEqual(await networks.unplug(vmi, where, unplugged), []);
      assert.equal(
        (await readNetworkState(`${dir}/cache/${uid}/default`)).networkState,
        NetworkState.Finished,
      );
      await pods.release(uid);
      await networks.teardown(uid);
    } finally {
      await new Deno.Command("ip", { args: ["link", "delete", nadBridge], stderr: "null" })
        .output();
    }
  });
});

Deno.test("secondary network: a pod Multus did not attach it to is refused, naming the definition", async () => {
  await withPods(async ({ runner, pods, dir }) => {
    const uid = crypto.randomUUID();
    const netns = await plainPod(pods, uid);
    const vmi = vmiFor(uid, { masquerade: {} });
    vmi.spec.domain.devices.interfaces!.push({ name: "red", bridge: {} });
    vmi.spec.networks!.push({ name: "red", multus: { networkName: "other/red" } });
    const networks = new PodNetworks({ runner, cacheDir: `${dir}/cache` });
    await assert.rejects(
      networks.setup(vmi, target(netns, `${dir}/private/${uid}`)),
      /"red": the pod has no interface "podb1f51a511f1" for NetworkAttachmentDefinition "other\/red" \(is Multus on the node\?\)/,
    );
    // The pod network before it was built; nothing of the secondary's.
    assert.equal(
      (await readNetworkState(`${dir}/cache/${uid}/default`)).networkState,
      NetworkState.Finished,
    );
    await pods.release(uid);
    await networks.teardown(uid);
  });
});

Deno.test("pod network: another handler's setup without a record is refused; one it finished is taken", async () => {
  // The refusal says clearly why; a setup the other handler finished is taken as finished.
  await withPods(async ({ runner, pods, dir }) => {
    const uid = crypto.randomUUID();
    const netns = await pods.ensure(uid);
    await Deno.mkdir(`${dir}/cache/${uid}`, { recursive: true });
    await Deno.writeTextFile(
      `${dir}/cache/${uid}/default`,
      JSON.stringify({ networkState: 1, podIP: "10.1.1.1" }),
    );
    const networks = new PodNetworks({ runner, cacheDir: `${dir}/cache` });
    await assert.rejects(
      networks.setup(vmiFor(uid, { bridge: {} }), target(netns, `${dir}/p1`)),
      (error: unknown) => error instanceof PodNetworkError && /restart the VMI/.test(error.message),
    );
    // Built by a handler that kept no record here (KubeVirt's, before a swap).
    const built = crypto.randomUUID();
    const builtNs = await pods.ensure(built);
    const other = new PodNetworks({ runner, cacheDir: `${dir}/other-cache` });
    await other.setup(vmiFor(built, { bridge: {} }), target(builtNs, `${dir}/p2`));
    const builtIp = (await readNetworkState(`${dir}/other-cache/${built}/default`)).podIP!;
    const before = await snapshot(builtNs, builtIp);
    await networks.setup(vmiFor(built, { bridge: {} }), target(builtNs, `${dir}/p2`));
    assert.deepEqual(await snapshot(builtNs, builtIp), before, "nothing rebuilt");
    const record = await readNetworkState(`${dir}/cache/${built}/default`);
    assert.equal(record.networkState, NetworkState.Finished);
    assert.match(record.podIP ?? "", /^10\./, "the pod IP read from the placeholder");
  });
});

/** A "guest" namespace on the pod's in-pod bridge (a veth where QEMU's tap would be). */
async function guestOn(podNs: string, dir: string, mac: string): Promise<string> {
  const guest = `${dir}/guest-${crypto.randomUUID().slice(0, 6)}`;
  const runner = new NetnsRunner();
  try {
    await runner.run(undefined, [{ op: "create", path: guest }]);
    const peer = `vg${crypto.randomUUID().slice(0, 8)}`;
    await inNs(podNs, "ip", "link", "add", "tap0", "type", "veth", "peer", "name", peer);
    await inNs(podNs, "ip", "link", "set", "tap0", "master", "k6t-eth0", "up");
    await inNs(podNs, "ip", "link", "set", peer, "netns", guest);
    await inNs(guest, "ip", "link", "set", peer, "name", "eth0");
    // A guest's first address is link-local; no duplicate detection to wait for here.
    await inNs(guest, "sh", "-c", "echo 0 > /proc/sys/net/ipv6/conf/eth0/accept_dad");
    await inNs(guest, "ip", "link", "set", "eth0", "address", mac, "up");
    await inNs(guest, "ip", "link", "set", "lo", "up");
  } finally {
    runner.close();
  }
  return guest;
}

/**
 * Runs ISC dhclient in the foreground in `guest` until its lease file holds a lease (or
 * `waitMs` passes), then ends it: it would otherwise stay to renew. Gives the lease file.
 */
async function dhclient(
  guest: string,
  dir: string,
  family: "-4" | "-6",
  waitMs = 15_000,
): Promise<string> {
  const lease = `${dir}/lease${family}-${crypto.randomUUID().slice(0, 6)}`;
  const child = new Deno.Command("nsenter", {
    args: [
      `--net=${guest}`,
      "dhclient",
      family,
      "-d",
      "-1",
      "-v",
      "-sf",
      "/bin/true",
      "-lf",
      lease,
      "-pf",
      `${lease}.pid`,
      "eth0",
    ],
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const stderr = new Response(child.stderr).text();
  const read = () => Deno.readTextFile(lease).catch(() => "");
  const deadline = Date.now() + waitMs;
  let text = await read();
  while (!/lease6? \{/.test(text) && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 200));
    text = await read();
  }
  try {
    child.kill("SIGTERM");
  } catch { /* ended already */ }
  await child.status;
  if (!/lease6? \{/.test(text)) {
    throw new Error(`dhclient ${family} got no lease:\n${await stderr}`);
  }
  return text;
}

Deno.test("DHCP: a real client gets masquerade's v4 and v6 leases, and bridge's only for the guest's MAC", async () => {
  // Masquerade answers over DHCPv4 and DHCPv6; bridge binding leases only to the guest's MAC.
  await withPods(async ({ runner, pods, dir }) => {
    const dhcp = new DhcpServers(runner);
    await Deno.writeTextFile(
      `${dir}/resolv.conf`,
      "nameserver 10.96.0.10\nnameserver fd00::a\nsearch ns1.svc.cluster.local svc.cluster.local cluster.local\n",
    );
    try {
      const networks = new PodNetworks({ runner, cacheDir: `${dir}/cache` });
      // Masquerade, dual stack; the tap is left to the test (pod-less names a host tap).
      const uid = crypto.randomUUID();
      const netns = await pods.ensure(uid);
      const vmi = vmiFor(uid, { masquerade: {} });
      await networks.setup(vmi, { ...target(netns, `${dir}/m`), hostTap: () => "vnunused0" });
      await new Deno.Command("ip", { args: ["link", "delete", "vnunused0"] }).output();
      const prepared = await prepareGuestNetwork(vmi, {
        runner,
        dhcp,
        netns,
        privateDir: `${dir}/m`,
        resolvConf: `${dir}/resolv.conf`,
      });
      assert.equal(prepared.default.mtu, 1500);
      const guest = await guestOn(netns, dir, "52:54:00:00:00:0a");
      const v4 = await dhclient(guest, dir, "-4");
      assert.match(v4, /fixed-address 10\.0\.2\.2;/);
      assert.match(v4, /option subnet-mask 255\.255\.255\.0;/);
      assert.match(v4, /option routers 10\.0\.2\.1;/);
      assert.match(v4, /option domain-name-servers 10\.96\.0\.10;/);
      assert.match(v4, /option host-name "vm1";/);
      assert.match(v4, /option interface-mtu 1500;/);
      assert.match(v4, /option dhcp-lease-time 86313600;/);
      assert.match(
        v4,
        /option domain-search "ns1\.svc\.cluster\.local\.", "svc\.cluster\.local\.", "cluster\.local\.";/,
      );
      const v6 = await dhclient(guest, dir, "-6");
      assert.match(v6, /iaaddr fd10:0:2::2 \{/);
      assert.match(v6, /option dhcp6\.name-servers fd00::a;/);
      assert.equal(dhcp.given(`${uid}/default`), 2, "an ACK and a REPLY");

      // Bridge: the pod's address, only for the MAC the guest has.
      const buid = crypto.randomUUID();
      const bns = await pods.ensure(buid);
      const bvmi = vmiFor(buid, { bridge: {} });
      const podMac = JSON.parse(await inNs(bns, "ip", "-json", "link", "show", "eth0"))[0].address;
      await networks.setup(bvmi, { ...target(bns, `${dir}/b`), hostTap: () => "vnunused1" });
      await new Deno.Command("ip", { args: ["link", "delete", "vnunused1"] }).output();
      await prepareGuestNetwork(bvmi, {
        runner,
        dhcp,
        netns: bns,
        privateDir: `${dir}/b`,
        resolvConf: `${dir}/resolv.conf`,
      });
      const stranger = await guestOn(bns, dir, "52:54:00:00:00:0b");
      await assert.rejects(
        dhclient(stranger, dir, "-4"),
        /got no lease/,
        "another MAC gets no answer",
      );
      await inNs(bns, "ip", "link", "delete", "tap0");
      const owner = await guestOn(bns, dir, podMac);
      const lease = await dhclient(owner, dir, "-4");
      const podIp = (await readNetworkState(`${dir}/cache/${buid}/default`)).podIP!;
      assert.match(lease, new RegExp(`fixed-address ${podIp.replaceAll(".", "\\.")};`));
      assert.match(lease, /option dhcp-server-identifier 169\.254\.75\.10;/);
      assert.match(lease, /option routers 10\./);
      for (const g of [guest, stranger, owner]) {
        await runner.run(undefined, [{ op: "remove", path: g }]);
      }
    } finally {
      await dhcp.close();
    }
  }, { ipv6: true });
});

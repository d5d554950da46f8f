/**
 * Pod networking end to end in pod-less mode: a real handler and launcher host, the
 * CNI plugins giving each VM a pod namespace on the test's node bridge, and the test
 * guest (Debian's kernel and busybox, a containerDisk OCI image archive in the handler's
 * image directory, stored once for all of them) under QEMU asking for its address by DHCP and
 * answering HTTP: through masquerade (every port, or only the listed ones) and with bridge
 * binding on the pod's own address. Deleting the VMIs leaves no tap, namespace, address
 * lease or network state behind. And secondary networks: two bridge
 * NetworkAttachmentDefinitions whose CNI plugins the handler calls itself.
 */
import assert from "node:assert/strict";
import { useCluster } from "../../deploy/cluster/cluster.ts";
import { hashedPodInterfaceName, hostTapName } from "../../mod/network/mod.ts";
import { applyNetworkAttachmentCrd } from "../harness/node/multus.ts";
import {
  echoedCaller,
  guestMac,
  networkAttachment,
  nodeBridges,
  secondaryNetworks,
  withSecondaryNetworks,
} from "../helpers/secondary_networks.ts";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { ensureLibvirtd } from "../helpers/libvirtd.ts";
import { guestVmi, httpGet, inGuest, installTestGuest, parseLease } from "../helpers/guest.ts";
import {
  createVmi,
  deleteVmi,
  getVmi,
  killLaunchers,
  kubeClient,
  removeTestPodNetwork,
  startHandlerProcess,
  testPodNetwork,
  waitFor,
  waitForPhase,
} from "../helpers/handler_process.ts";

/** A guest booting under software emulation takes its time on a busy 2-core machine. */
const BOOT_MS = 180_000;

function hostLinks(): string[] {
  return [...Deno.readDirSync("/sys/class/net")].map((e) => e.name);
}

async function kubectl(kubeconfig: string, ...args: string[]): Promise<string> {
  const out = await new Deno.Command("kubectl", {
    args: ["--kubeconfig", kubeconfig, ...args],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout);
  if (!out.success) {
    throw new Error(`kubectl ${args.join(" ")}: ${new TextDecoder().decode(out.stderr)}`);
  }
  return text;
}

function listDir(path: string): string[] {
  try {
    return [...Deno.readDirSync(path)].map((e) => e.name);
  } catch {
    return [];
  }
}

Deno.test("network+QEMU (pod-less): guests get DHCP addresses and answer HTTP via masquerade and bridge", async () => {
  // Masquerade is tried with all ports and with listed ports; bridge binding
  // answers on the pod IP. Deleting the guests leaves nothing behind.
  const uri = await ensureLibvirtd();
  const cluster = await useCluster();
  const client = await kubeClient(cluster.kubeconfigPath);
  const id = crypto.randomUUID().slice(0, 8);
  const ns = `net-${id}`;
  const node = `net-node-${id}`;
  const network = testPodNetwork();
  await client.request("POST", "/api/v1/namespaces", { metadata: { name: ns } });
  const dir = await Deno.makeTempDir({ prefix: "virtnode-net-" });
  await installTestGuest(`${dir}/state/images`);
  const h = await startHandlerProcess({
    kubeconfig: cluster.handlerKubeconfigPath,
    nodeName: node,
    libvirtUri: uri,
    dir,
    podNetwork: network,
  });
  let ok = false;
  try {
    const vmis = {
      masq: guestVmi("masq", node, { namespace: ns, binding: "masquerade" }),
      ports: guestVmi("ports", node, {
        namespace: ns,
        binding: "masquerade",
        ports: [{ name: "http", port: 80, protocol: "TCP" }],
      }),
      bridged: guestVmi("bridged", node, { namespace: ns, binding: "bridge" }),
    };
    for (const vmi of Object.values(vmis)) await createVmi(client, vmi);
    const running: Record<string, VirtualMachineInstance> = {};
    await Promise.all(
      Object.keys(vmis).map(async (name) => {
        running[name] = await waitForPhase(client, ns, name, "Running", 90_000);
      }),
    );
    const uids = Object.values(running).map((v) => v.metadata.uid!);

    // status.interfaces carries the pod's address, which is how the guest is reached.
    const podIp: Record<string, string> = {};
    for (const name of Object.keys(vmis)) {
      const vmi = await waitFor(`${name}'s pod IP in status.interfaces`, async () => {
        const v = await getVmi(client, ns, name);
        return v?.status?.interfaces?.[0]?.ipAddress ? v : undefined;
      });
      const iface = vmi.status!.interfaces![0];
      assert.equal(iface.name, "default");
      assert.equal(iface.infoSource, "domain");
      assert.equal(iface.podInterfaceName, "eth0");
      assert.match(
        iface.ipAddress!,
        new RegExp(`^${network.cidr.split(".").slice(0, 3).join("\\.")}\\.`),
      );
      assert.deepEqual(iface.ipAddresses, [iface.ipAddress]);
      podIp[name] = iface.ipAddress!;
    }
    // kubectl's IP column (KubeVirt's printer column: .status.interfaces[0].ipAddress).
    const table = await kubectl(cluster.kubeconfigPath, "get", "vmi", "-n", ns);
    for (const name of Object.keys(vmis)) {
      const row = table.split("\n").find((l) => l.startsWith(`${name} `));
      assert.ok(row?.includes(podIp[name]), `IP column of ${name}: ${row}`);
    }

    // Each guest got its lease by DHCP and serves it over HTTP.
    const lease: Record<string, Record<string, string>> = {};
    for (const name of Object.keys(vmis)) {
      const text = await waitFor(
        `${name}'s guest to answer HTTP on ${podIp[name]}`,
        () => httpGet(`http://${podIp[name]}/dhcp`),
        BOOT_MS,
        1_000,
      );
      lease[name] = parseLease(text);
      console.log(`  ${name}: ${JSON.stringify(lease[name])}`);
    }
    for (const name of ["masq", "ports"]) {
      assert.equal(lease[name].ip, "10.0.2.2", "masquerade: the guest is 10.0.2.2");
      assert.equal(lease[name].prefix, "24");
      assert.equal(lease[name].router, "10.0.2.1");
      assert.equal(lease[name].serverid, "10.0.2.1");
      assert.equal(lease[name].hostname, name, "the host name is the VMI's");
      assert.equal(lease[name].mtu, "1500", "the MTU of the pod interface");
      assert.ok(lease[name].dns.length > 0, "DNS servers");
    }
    const bridged = running.bridged;
    assert.equal(lease.bridged.ip, podIp.bridged, "bridge: the guest has the pod's address");
    assert.equal(lease.bridged.prefix, "24");
    assert.equal(lease.bridged.serverid, "169.254.75.10");
    assert.match(
      lease.bridged.staticroutes,
      /^0\.0\.0\.0\/0 10\./,
      "the default route, as a classless route",
    );
    assert.equal(
      lease.bridged.mac,
      bridged.status!.interfaces![0].mac,
      "the guest's MAC is the one the status reports",
    );
    const domainMac = (await getVmi(client, ns, "bridged"))!.status!.interfaces![0].mac;
    assert.equal(lease.bridged.mac, domainMac);

    // Masquerade without a port list forwards every port; with one, only those.
    assert.ok(await httpGet(`http://${podIp.masq}:8080/`), "every port reaches the guest");
    assert.ok(await httpGet(`http://${podIp.ports}:80/`), "a listed port reaches the guest");
    assert.equal(
      await httpGet(`http://${podIp.ports}:8080/`, 2_000),
      undefined,
      "an unlisted port does not",
    );
    // The guest sees the host's own address as the caller (no source NAT inbound).
    const echo = await httpGet(`http://${podIp.masq}/cgi-bin/echo`);
    assert.match(echo ?? "", /remote=.*10\./);

    // Where a pod-less pod network's time goes, from the handler's log.
    const logged = (await Deno.readTextFile(h.logFile)).split("\n").filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l));
    const ms = (msg: string) => logged.filter((l) => l.msg === msg).map((l) => l.ms as number);
    console.log(
      `  pod namespace + CNI ADD: ${ms("Pod network namespace made").join(", ")} ms; ` +
        `bindings: ${ms("Pod network set up").join(", ")} ms; ` +
        `tap into the pod: ${ms("Tap moved into the pod's network namespace").join(", ")} ms`,
    );

    // Deleting the VMIs removes their taps, namespaces, leases and network state.
    for (const name of Object.keys(vmis)) await deleteVmi(client, ns, name);
    for (const name of Object.keys(vmis)) {
      await waitFor(`${name} to be gone`, async () => !(await getVmi(client, ns, name)), 90_000);
    }
    await waitFor("the pod networks to be removed", () => {
      const links = hostLinks();
      const taps = uids.map((u) => hostTapName(u)).filter((t) => links.includes(t));
      const namespaces = listDir(`${h.runDir}/netns`);
      const state = listDir(`${h.runDir}/network-info-cache`);
      const leases = listDir(`${h.runDir}/cni-ipam/virtnode`).filter((f) =>
        /^\d/.test(f) && f !== "last_reserved_ip.0"
      );
      // The node bridge loses each VM's veth once the kernel has dismantled its namespace.
      const ports = listDir(`/sys/class/net/${network.bridge}/brif`);
      return taps.length + namespaces.length + state.length + leases.length + ports.length === 0;
    }, 60_000);
    // Nor anything else of theirs: run directories (DHCP facts), disks (overlays).
    for (const uid of uids) {
      assert.ok(!listDir(`${h.runDir}/private`).includes(uid), "the VMI's run directory is gone");
      assert.ok(!listDir(`${h.stateDir}/disks`).includes(uid), "the VMI's disks are gone");
    }
    // The three guests booted from one OCI image, stored once.
    assert.equal(
      listDir(`${h.stateDir}/containerdisks`).filter((f) => f.endsWith(".img")).length,
      1,
    );
    ok = true;
  } finally {
    if (!ok) {
      console.error(`handler log:\n${(await Deno.readTextFile(h.logFile)).slice(-8000)}`);
      for (const f of listDir(`${h.stateDir}/launchers`).filter((f) => f.endsWith(".log"))) {
        console.error(
          `${f}:\n${(await Deno.readTextFile(`${h.stateDir}/launchers/${f}`)).slice(-6000)}`,
        );
      }
    }
    const list = await client.request<{ items: { metadata: { name: string } }[] }>(
      "GET",
      `/apis/kubevirt.io/v1/namespaces/${ns}/virtualmachineinstances`,
    );
    for (const v of list.items) await deleteVmi(client, ns, v.metadata.name).catch(() => {});
    await waitFor(
      "ghost records to be cleaned up",
      () => listDir(`${h.stateDir}/ghost-records`).filter((f) => !f.startsWith(".")).length === 0,
      60_000,
    )
      .catch((e) => console.error(e.message));
    await h.kill("SIGTERM");
    killLaunchers(h.stateDir);
    await removeTestPodNetwork(network);
    await client.request("DELETE", `/api/v1/namespaces/${ns}`).catch(() => {});
    client.close();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    await cluster.stop();
  }
});

Deno.test("network+QEMU (pod-less): two bridge NADs: each guest reaches the node and the other guest", async () => {
  // No Multus on a pod-less node: the handler reads the definitions and calls their CNI
  // plugins itself. The guests take static addresses from cloud-init, as in KubeVirt.
  const uri = await ensureLibvirtd();
  const cluster = await useCluster();
  const client = await kubeClient(cluster.kubeconfigPath);
  await applyNetworkAttachmentCrd(cluster.kubeconfigPath);
  const id = crypto.randomUUID().slice(0, 6);
  const ns = `sec-${id}`;
  const node = `sec-node-${id}`;
  const network = testPodNetwork();
  const nets = secondaryNetworks(id);
  await client.request("POST", "/api/v1/namespaces", { metadata: { name: ns } });
  const bridges = await nodeBridges(nets);
  const dir = await Deno.makeTempDir({ prefix: "virtnode-sec-" });
  await installTestGuest(`${dir}/state/images`);
  const h = await startHandlerProcess({
    kubeconfig: cluster.handlerKubeconfigPath,
    nodeName: node,
    libvirtUri: uri,
    dir,
    podNetwork: network,
  });
  let ok = false;
  try {
    for (const n of nets) {
      await client.request(
        "POST",
        `/apis/k8s.cni.cncf.io/v1/namespaces/${ns}/network-attachment-definitions`,
        networkAttachment(n, ns),
      );
    }
    const guests = [{ name: "sec-a", host: 10 }, { name: "sec-b", host: 11 }];
    for (const g of guests) {
      const base = guestVmi(g.name, node, { namespace: ns, binding: "masquerade" });
      await createVmi(client, {
        ...base,
        spec: withSecondaryNetworks(
          base.spec as unknown as Parameters<typeof withSecondaryNetworks>[0],
          nets,
          g.host,
        ) as unknown as VirtualMachineInstance["spec"],
      });
    }
    const uids: string[] = [];
    for (const g of guests) {
      uids.push((await waitForPhase(client, ns, g.name, "Running", 90_000)).metadata.uid!);
    }
    // The node reaches each guest on each network, from the node's address.
    for (const g of guests) {
      for (const n of nets) {
        const answer = await waitFor(
          `${g.name} answering HTTP on ${n.subnet}.${g.host}`,
          () => httpGet(`http://${n.subnet}.${g.host}/cgi-bin/echo`),
          BOOT_MS,
          1_000,
        ).catch(async (error) => {
          // What the guest made of its cloud-init disk, through its agent.
          const seen = await inGuest(
            `${ns}_${g.name}`,
            "ip -o addr; cat /tmp/static; ls /sys/block; grep -c iso /proc/modules",
          ).catch((e) => `(no agent: ${e.message})`);
          throw new Error(`${error.message}; the guest: ${seen}`, { cause: error });
        });
        assert.match(answer, echoedCaller(n.subnet, 1));
      }
    }
    // The first guest reaches the node's server and the other guest on each network (its
    // agent runs the requests once it is connected).
    const [a, b] = guests;
    const inA = (script: string) =>
      waitFor(
        `${a.name}'s agent to run ${script}`,
        () => inGuest(`${ns}_${a.name}`, script).catch(() => undefined),
        120_000,
        1_000,
      );
    for (const n of nets) {
      const fromNode = await inA(`wget -qO- http://${n.subnet}.1:${bridges.ports.get(n.name)}/`);
      assert.equal(fromNode.trim(), `node-${n.name}`);
      const fromGuest = await inA(`wget -qO- http://${n.subnet}.${b.host}/cgi-bin/echo`);
      assert.match(
        fromGuest,
        echoedCaller(n.subnet, a.host),
      );
    }
    // status.interfaces: the pod network first, each secondary under its pod<hash> name
    // (the handler stands in for virt-controller), with the agent's address.
    let seen: unknown;
    const reported = await waitFor(
      "the secondary interfaces with the agent's addresses",
      async () => {
        const v = await getVmi(client, ns, a.name);
        const ifaces = v?.status?.interfaces ?? [];
        seen = ifaces;
        return nets.every((n) =>
            ifaces.find((i) => i.name === n.name)?.ipAddresses?.includes(`${n.subnet}.${a.host}`)
          )
          ? ifaces
          : undefined;
      },
      120_000,
    ).catch((error) => {
      throw new Error(`${error.message}: ${JSON.stringify(seen)}`, { cause: error });
    });
    assert.equal(reported[0].name, "default");
    for (const n of nets) {
      const entry = reported.find((i) => i.name === n.name)!;
      assert.equal(entry.podInterfaceName, hashedPodInterfaceName(n.name));
      assert.equal(entry.mac, guestMac(n, a.host));
    }
    // Deleting the VMIs gives every attachment back: no tap, namespace or record is left,
    // and the secondary bridges lose their ports.
    for (const g of guests) await deleteVmi(client, ns, g.name);
    for (const g of guests) {
      await waitFor(
        `${g.name} to be gone`,
        async () => !(await getVmi(client, ns, g.name)),
        90_000,
      );
    }
    await waitFor("the secondary networks to be released", () => {
      const links = hostLinks();
      const taps = uids.flatMap((u) =>
        nets.map((n) => hostTapName(`${u}/${hashedPodInterfaceName(n.name)}`))
      ).filter((t) => links.includes(t));
      const records = listDir(`${h.runDir}/netns`);
      const ports = nets.flatMap((n) => listDir(`/sys/class/net/${n.bridge}/brif`));
      return taps.length + records.length + ports.length === 0;
    }, 60_000);
    ok = true;
  } finally {
    if (!ok) console.error(`handler log:\n${(await Deno.readTextFile(h.logFile)).slice(-8000)}`);
    for (const g of ["sec-a", "sec-b"]) await deleteVmi(client, ns, g).catch(() => {});
    await waitFor(
      "ghost records to be cleaned up",
      () => listDir(`${h.stateDir}/ghost-records`).filter((f) => !f.startsWith(".")).length === 0,
      60_000,
    ).catch((e) => console.error(e.message));
    await h.kill("SIGTERM");
    killLaunchers(h.stateDir);
    await bridges.remove();
    await removeTestPodNetwork(network);
    await client.request("DELETE", `/api/v1/namespaces/${ns}`).catch(() => {});
    client.close();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    await cluster.stop();
  }
});

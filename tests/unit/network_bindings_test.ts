import assert from "node:assert/strict";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import {
  bindingSteps,
  bridgeDhcpCache,
  hostTapName,
  masqueradeAddresses,
  NetworkSpecError,
  parseBridgeDhcpCache,
  parseNamespaceState,
  type PodDiscovery,
  podNetworkPlan,
} from "../../mod/network/mod.ts";

const FIXTURES = new URL("../fixtures/network/", import.meta.url);

/** A launcher pod's namespace as the CNI left it (a real `ip -json` reading, see fixtures). */
function podState() {
  const read = (name: string) => Deno.readTextFileSync(new URL(name, FIXTURES));
  return parseNamespaceState(
    read("pod-addresses.json"),
    read("pod-routes4.json"),
    read("pod-routes6.json"),
  );
}

function vmi(iface: Record<string, unknown>, network: Record<string, unknown> = {}) {
  return {
    metadata: { name: "vm1", namespace: "default", uid: "u1" },
    spec: {
      domain: { devices: { interfaces: [{ name: "default", ...iface }] } },
      networks: [{ name: "default", pod: {}, ...network }],
    },
  } as unknown as VirtualMachineInstance;
}

function discovery(): PodDiscovery {
  const eth0 = podState().links.get("eth0")!;
  return {
    podInterface: "eth0",
    index: eth0.index,
    mac: eth0.mac,
    mtu: eth0.mtu,
    ipv4: [{ address: "10.244.1.5", prefix: 24 }],
    ipv6: [{ address: "fd00:10:244:1::5", prefix: 64 }],
    routes4: podState().routes4.filter((r) => r.device === "eth0"),
    bridgeMac: "02:aa:bb:cc:dd:ee",
  };
}

Deno.test("parseNamespaceState() reads links, addresses and routes from ip -json", () => {
  const state = podState();
  const eth0 = state.links.get("eth0")!;
  assert.equal(eth0.kind, "veth");
  assert.equal(eth0.mac, "0a:58:0a:f4:01:05");
  assert.equal(eth0.mtu, 1450);
  assert.ok(eth0.up);
  assert.deepEqual(
    eth0.addresses.filter((a) => a.scope === "global").map((a) => `${a.address}/${a.prefix}`),
    ["10.244.1.5/24", "fd00:10:244:1::5/64"],
  );
  assert.deepEqual(state.routes4.map((r) => [r.destination, r.gateway]), [
    ["default", "10.244.1.1"],
    ["10.96.0.0/12", "10.244.1.1"],
    ["10.244.1.0/24", undefined],
  ]);
});

Deno.test("podNetworkPlan() names what KubeVirt names: k6t-eth0, tap0, eth0-nic; virtio is non-transitional", () => {
  const [plan] = podNetworkPlan(vmi({ bridge: {}, macAddress: "52:54:00:AA:BB:CC" }));
  assert.equal(plan.binding, "bridge");
  assert.equal(plan.podInterface, "eth0");
  assert.equal(plan.bridge, "k6t-eth0");
  assert.equal(plan.tap, "tap0");
  assert.equal(plan.renamedPodInterface, "eth0-nic");
  assert.equal(plan.macAddress, "52:54:00:aa:bb:cc");
  assert.equal(plan.model, "virtio-non-transitional");
  const [m] = podNetworkPlan(vmi({ masquerade: {}, model: "e1000", ports: [{ port: 22 }] }));
  assert.equal(m.model, "e1000");
  assert.deepEqual(m.ports, [{ protocol: "tcp", port: 22 }], "no protocol is TCP");
  assert.equal(m.vmCidr4, "10.0.2.0/24");
  assert.equal(m.vmCidr6, "fd10:0:2::/120");
  assert.deepEqual(podNetworkPlan(vmi({ slirp: {} })), [], "slirp needs no pod network");
});

Deno.test("podNetworkPlan() builds nothing for SR-IOV on a secondary network; the pod network refuses it", () => {
  // The VF comes from the SR-IOV device plugin and KubeVirt's launcher passes it through.
  const v = vmi({ masquerade: {} });
  v.spec.domain.devices.interfaces!.push({ name: "fast", sriov: {} });
  v.spec.networks!.push({ name: "fast", multus: { networkName: "sriov-net" } });
  assert.deepEqual(podNetworkPlan(v).map((p) => p.name), ["default"]);
  assert.throws(
    () => podNetworkPlan(vmi({ sriov: {} })),
    (e: Error) =>
      e instanceof NetworkSpecError && e.path === "spec.domain.devices.interfaces[0].sriov" &&
      /secondary \(Multus\) network/.test(e.message),
  );
});

Deno.test("podNetworkPlan() builds nothing for an absent secondary bridge; other absent or bad states refused", () => {
  const v = vmi({ masquerade: {} });
  v.spec.domain.devices.interfaces!.push({ name: "red", bridge: {}, state: "absent" });
  v.spec.domain.devices.interfaces!.push({ name: "blue", bridge: {}, state: "down" });
  v.spec.networks!.push({ name: "red", multus: { networkName: "red" } });
  v.spec.networks!.push({ name: "blue", multus: { networkName: "blue" } });
  assert.deepEqual(podNetworkPlan(v).map((p) => p.name), ["default", "blue"]);
  const refused = (spec: VirtualMachineInstance, pattern: RegExp) =>
    assert.throws(
      () => podNetworkPlan(spec),
      (e: Error) =>
        e instanceof NetworkSpecError && e.path === "spec.domain.devices.interfaces[0].state" &&
        pattern.test(e.message),
    );
  refused(vmi({ bridge: {}, state: "absent" }), /only a bridge interface on a secondary/);
  refused(vmi({ masquerade: {}, state: "absent" }), /only a bridge interface on a secondary/);
  refused(vmi({ bridge: {}, state: "gone" }), /"gone" is not an interface state/);
});

Deno.test("podNetworkPlan() refuses what the node cannot serve, naming the field", () => {
  const cases: [VirtualMachineInstance, string, RegExp][] = [
    [vmi({ sriov: {} }), "spec.domain.devices.interfaces[0].sriov", /SR-IOV/],
    [
      vmi({ binding: { name: "passt" } }),
      "spec.domain.devices.interfaces[0].binding",
      /binding plugins/,
    ],
    [
      vmi({ bridge: {}, masquerade: {} }),
      "spec.domain.devices.interfaces[0]",
      /more than one binding/,
    ],
    [vmi({}), "spec.domain.devices.interfaces[0]", /has no binding/],
    [
      vmi({ masquerade: {}, ports: [{ port: 80, protocol: "ICMP" }] }),
      "spec.domain.devices.interfaces[0].ports[0].protocol",
      /TCP or UDP/,
    ],
    [
      vmi({ masquerade: {} }, { multus: { networkName: "x" }, pod: undefined }),
      "spec.domain.devices.interfaces[0].masquerade",
      /secondary \(Multus\) network takes the bridge binding only/,
    ],
    [
      vmi({ bridge: {} }, { multus: { networkName: "x", default: true }, pod: undefined }),
      "spec.networks[0].multus.default",
      /Multus default network .* not supported/,
    ],
    [
      vmi({ bridge: {} }, { multus: {}, pod: undefined }),
      "spec.networks[0].multus.networkName",
      /names no NetworkAttachmentDefinition/,
    ],
    [
      vmi({ bridge: {} }, { multus: { networkName: "x" } }),
      "spec.networks[0]",
      /two sources/,
    ],
    [
      vmi({ masquerade: {} }, { pod: { vmNetworkCIDR: "10.0.2.0/31" } }),
      "spec.networks[0].pod.vmNetworkCIDR",
      /room/,
    ],
  ];
  for (const [spec, path, message] of cases) {
    assert.throws(() => podNetworkPlan(spec), (error: unknown) => {
      assert.ok(error instanceof NetworkSpecError, String(error));
      assert.equal(error.path, path);
      assert.match(error.message, message);
      assert.match(error.message, /^Invalid network of VMI "default\/vm1": /);
      return true;
    });
  }
  const two = vmi({ masquerade: {} });
  two.spec.domain.devices.interfaces!.push({ name: "second", bridge: {} });
  two.spec.networks!.push({ name: "second", pod: {} });
  assert.throws(
    () => podNetworkPlan(two),
    /spec\.networks\[1\]\.pod: more than one network is the pod network/,
  );
});

Deno.test("podNetworkPlan() names a secondary network's pod links from its name's hash, as KubeVirt", () => {
  const spec = vmi({ masquerade: {} });
  spec.spec.domain.devices.interfaces!.push(
    { name: "red", bridge: {}, macAddress: "02:00:00:00:00:0A" },
    { name: "network1", bridge: {} },
  );
  spec.spec.networks!.push(
    { name: "red", multus: { networkName: "other/red-nad" } },
    { name: "network1", multus: { networkName: "nad1" } },
  );
  const plans = podNetworkPlan(spec);
  assert.deepEqual(
    plans.map((p) => [p.name, p.source, p.networkName, p.binding, p.podInterface, p.tap, p.bridge]),
    [
      ["default", "pod", undefined, "masquerade", "eth0", "tap0", "k6t-eth0"],
      // KubeVirt's own namescheme test: "red" is podb1f51a511f1, "network1" poda7662f44d65.
      [
        "red",
        "multus",
        "other/red-nad",
        "bridge",
        "podb1f51a511f1",
        "tapb1f51a511f1",
        "k6t-b1f51a511f1",
      ],
      [
        "network1",
        "multus",
        "nad1",
        "bridge",
        "poda7662f44d65",
        "tapa7662f44d65",
        "k6t-a7662f44d65",
      ],
    ],
  );
  assert.equal(plans[1].renamedPodInterface, "b1f51a511f1-nic");
  assert.equal(plans[1].macAddress, "02:00:00:00:00:0a");
  // Multus's ordinal names, as virt-controller reports them from the pod's network-status.
  spec.status = { interfaces: [{ name: "red", podInterfaceName: "net1" }] };
  assert.deepEqual(
    podNetworkPlan(spec).slice(1).map((p) => [p.podInterface, p.tap, p.bridge]),
    [["net1", "tap1", "k6t-net1"], ["poda7662f44d65", "tapa7662f44d65", "k6t-a7662f44d65"]],
  );
  // A reported name that is no link name (it would reach `ip` and file names) is refused.
  for (const bad of ["../../x", "..", "a/b", "pod0123456789abcdef"]) {
    spec.status = { interfaces: [{ name: "red", podInterfaceName: bad }] };
    assert.throws(() => podNetworkPlan(spec), (error: unknown) => {
      assert.ok(error instanceof NetworkSpecError);
      assert.equal(error.path, "status.interfaces[0].podInterfaceName");
      return true;
    });
  }
});

Deno.test("hostTapName() is short enough for the kernel and the same for the same VMI", () => {
  const a = hostTapName("6f1c2d3e-0000-4000-8000-000000000001");
  assert.match(a, /^vn[0-9a-f]{12}$/);
  assert.ok(a.length <= 15);
  assert.equal(hostTapName("6f1c2d3e-0000-4000-8000-000000000001"), a);
  assert.notEqual(hostTapName("6f1c2d3e-0000-4000-8000-000000000002"), a);
});

Deno.test("bridge binding: the pod interface becomes eth0-nic on k6t-eth0 behind a placeholder eth0", () => {
  // The placeholder eth0 keeps the pod interface's MAC, MTU and addresses.
  const [plan] = podNetworkPlan(vmi({ bridge: {} }));
  const steps = bindingSteps(plan, discovery(), podState(), { tapOwner: 107 });
  assert.deepEqual(steps.ip, [
    "link add name k6t-eth0 type bridge",
    "link set dev k6t-eth0 address 02:aa:bb:cc:dd:ee mtu 1450",
    "link set dev eth0 down",
    "link set dev eth0 name eth0-nic",
    "link set dev eth0-nic address 02:aa:bb:cc:dd:ee",
    "address flush dev eth0-nic",
    "link set dev eth0-nic master k6t-eth0",
    "link set dev eth0-nic type bridge_slave learning off",
    "link set dev eth0-nic up",
    "tuntap add dev tap0 mode tap user 107 group 107",
    "link set dev tap0 mtu 1450 master k6t-eth0 up",
    "link add name eth0 type bridge",
    "link set dev eth0 address 0a:58:0a:f4:01:05 mtu 1450",
    "address replace 10.244.1.5/24 dev eth0",
    "address replace fd00:10:244:1::5/64 dev eth0 nodad",
    "address replace 169.254.75.10/32 dev k6t-eth0",
    "link set dev k6t-eth0 up",
  ]);
  assert.deepEqual(steps.sysctls, [
    ["ipv6/conf/eth0-nic/disable_ipv6", "1"],
    ["ipv4/conf/all/arp_ignore", "1"],
  ]);
  assert.deepEqual(steps.txChecksumOff, ["k6t-eth0"]);
  assert.equal(steps.nft, undefined);
});

Deno.test("bridge binding on a secondary network without IPAM: its pod<hash> links, no address", () => {
  const spec = vmi({ masquerade: {} });
  spec.spec.domain.devices.interfaces!.push({ name: "red", bridge: {} });
  spec.spec.networks!.push({ name: "red", multus: { networkName: "red-nad" } });
  const plan = podNetworkPlan(spec)[1];
  const eth0 = podState().links.get("eth0")!;
  const state = podState();
  state.links.set("podb1f51a511f1", { ...eth0, name: "podb1f51a511f1", index: 7, addresses: [] });
  const d: PodDiscovery = {
    podInterface: "podb1f51a511f1",
    index: 7,
    mac: "0e:00:00:00:00:07",
    mtu: 1500,
    ipv4: [],
    ipv6: [],
    routes4: [],
    bridgeMac: "02:aa:bb:cc:dd:01",
  };
  const steps = bindingSteps(plan, d, state, { tapOwner: 107 });
  assert.deepEqual(steps.ip, [
    "link add name k6t-b1f51a511f1 type bridge",
    "link set dev k6t-b1f51a511f1 address 02:aa:bb:cc:dd:01 mtu 1500",
    "link set dev podb1f51a511f1 down",
    "link set dev podb1f51a511f1 name b1f51a511f1-nic",
    "link set dev b1f51a511f1-nic address 02:aa:bb:cc:dd:01",
    "address flush dev b1f51a511f1-nic",
    "link set dev b1f51a511f1-nic master k6t-b1f51a511f1",
    "link set dev b1f51a511f1-nic type bridge_slave learning off",
    "link set dev b1f51a511f1-nic up",
    "tuntap add dev tapb1f51a511f1 mode tap user 107 group 107",
    "link set dev tapb1f51a511f1 mtu 1500 master k6t-b1f51a511f1 up",
    "link add name podb1f51a511f1 type bridge",
    "link set dev podb1f51a511f1 address 0e:00:00:00:00:07 mtu 1500",
    "link set dev k6t-b1f51a511f1 up",
  ]);
  assert.deepEqual(steps.sysctls, [["ipv6/conf/b1f51a511f1-nic/disable_ipv6", "1"]]);
  // No IPv4 on the attachment: the launcher serves no DHCP on it, as KubeVirt's.
  assert.equal(JSON.parse(bridgeDhcpCache(d, d.mac)).IPAMDisabled, true);
});

Deno.test("bridge binding resumed after a restart: nothing is made twice, the rename is not repeated", () => {
  const [plan] = podNetworkPlan(vmi({ bridge: {} }));
  const d = discovery();
  // The first pass got as far as the rename and the bridge.
  const state = podState();
  const eth0 = state.links.get("eth0")!;
  state.links.delete("eth0");
  state.links.set("eth0-nic", { ...eth0, name: "eth0-nic", addresses: [] });
  state.links.set("k6t-eth0", { ...eth0, name: "k6t-eth0", index: 90, kind: "bridge" });
  state.links.set("eth0", { ...eth0, index: 91, kind: "bridge", up: false });
  state.links.set("tap0", { ...eth0, name: "tap0", index: 92, kind: "tun" });
  const steps = bindingSteps(plan, d, state, { tapOwner: 0 });
  for (const made of ["link add", "tuntap add", "name eth0-nic"]) {
    assert.ok(!steps.ip.some((l) => l.includes(made)), `no "${made}" the second time: ${steps.ip}`);
  }
  assert.ok(steps.ip.includes("address replace 10.244.1.5/24 dev eth0"));
});

Deno.test("masquerade: k6t-eth0 is 02:00:00:00:00:00 with 10.0.2.1/24 and fd10:0:2::1/120, forwarding on", () => {
  const [plan] = podNetworkPlan(vmi({ masquerade: {} }));
  const steps = bindingSteps(plan, discovery(), podState(), { tapOwner: 0 });
  assert.deepEqual(steps.ip, [
    "link add name k6t-eth0 type bridge",
    "link set dev k6t-eth0 address 02:00:00:00:00:00 mtu 1450",
    "address replace 10.0.2.1/24 dev k6t-eth0",
    "tuntap add dev tap0 mode tap user 0 group 0",
    "link set dev tap0 mtu 1450 master k6t-eth0 up",
    "address replace fd10:0:2::1/120 dev k6t-eth0 nodad",
    "link set dev k6t-eth0 up",
  ]);
  assert.deepEqual(steps.sysctls, [
    ["ipv4/ip_forward", "1"],
    ["ipv4/conf/k6t-eth0/route_localnet", "1"],
    ["ipv6/conf/k6t-eth0/accept_dad", "0"],
    ["ipv6/conf/all/forwarding", "1"],
  ]);
  assert.deepEqual(masqueradeAddresses("10.11.12.0/24"), {
    gateway: "10.11.12.1",
    guest: "10.11.12.2",
    prefix: 24,
  });
  assert.deepEqual(masqueradeAddresses("fd10:0:2::/120"), {
    gateway: "fd10:0:2::1",
    guest: "fd10:0:2::2",
    prefix: 120,
  });
});

Deno.test("masquerade's nft rules are KubeVirt's: every port without a list, the listed ones with one", () => {
  const [all] = podNetworkPlan(vmi({ masquerade: {} }));
  const d = { ...discovery(), ipv6: [] };
  const everything = bindingSteps(all, d, podState(), { tapOwner: 0, migrationTransport: "Unix" })
    .nft!;
  assert.equal(
    everything,
    [
      "table ip nat",
      "delete table ip nat",
      "table ip nat {",
      "  chain prerouting {",
      "    type nat hook prerouting priority -100;",
      '    iifname "eth0" counter jump KUBEVIRT_PREINBOUND',
      "  }",
      "  chain input {",
      "    type nat hook input priority 100;",
      "  }",
      "  chain output {",
      "    type nat hook output priority -100;",
      "    ip daddr { 127.0.0.1 } counter dnat to 10.0.2.2",
      "  }",
      "  chain postrouting {",
      "    type nat hook postrouting priority 100;",
      "    ip saddr 10.0.2.2 counter masquerade",
      '    oifname "k6t-eth0" counter jump KUBEVIRT_POSTINBOUND',
      "  }",
      "  chain KUBEVIRT_PREINBOUND {",
      "    counter dnat to 10.0.2.2",
      "  }",
      "  chain KUBEVIRT_POSTINBOUND {",
      "    ip saddr { 127.0.0.1 } counter snat to 10.0.2.1",
      "  }",
      "}",
      "",
    ].join("\n"),
  );
  const [listed] = podNetworkPlan(
    vmi({ masquerade: {}, ports: [{ port: 80 }, { port: 53, protocol: "UDP" }] }),
  );
  const some = bindingSteps(listed, discovery(), podState(), { tapOwner: 0 }).nft!;
  assert.match(
    some,
    /KUBEVIRT_PREINBOUND \{\n {4}tcp dport \{ 80 \} counter dnat to 10\.0\.2\.2\n {4}udp dport \{ 53 \} counter dnat to 10\.0\.2\.2\n/,
  );
  assert.ok(!/^\s+counter dnat to 10\.0\.2\.2$/m.test(some), "no catch-all DNAT with a port list");
  assert.match(some, /table ip6 nat \{/, "IPv6 too where the pod has it");
  assert.match(some, /ip6 saddr fd10:0:2::2 counter masquerade/);
  assert.match(
    some,
    /tcp dport \{ 49152, 49153 \} ip saddr 127\.0\.0\.1 counter return/,
    "legacy migration ports without the Unix transport",
  );
});

Deno.test("the bridge binding's vif-cache is KubeVirt's DHCPConfig as Go writes it, and reads back", () => {
  const text = bridgeDhcpCache(discovery(), "0a:58:0a:f4:01:05");
  const json = JSON.parse(text);
  assert.deepEqual(json.IP, {
    IP: "10.244.1.5",
    Mask: "////AA==",
    Label: "",
    Flags: 0,
    Scope: 0,
    Peer: null,
    Broadcast: "",
    PreferedLft: 0,
    ValidLft: 0,
    LinkIndex: 0,
  });
  assert.equal(json.MAC, "ClgK9AEF", "base64 of the 6 MAC bytes");
  assert.equal(json.Gateway, "10.244.1.1");
  assert.equal(json.IPAMDisabled, false);
  assert.deepEqual(json.Routes, [
    { Dst: null, Gw: "10.244.1.1" },
    { Dst: { IP: "10.96.0.0", Mask: "//AAAA==" }, Gw: "10.244.1.1" },
  ], "the local subnet's route is left out");
  assert.equal("IP" in json.IPv6, false, "no IPv6 for bridge binding");
  const facts = parseBridgeDhcpCache(text);
  assert.deepEqual(facts.address, { address: "10.244.1.5", prefix: 24 });
  assert.equal(facts.mac, "0a:58:0a:f4:01:05");
  assert.deepEqual(facts.routes, [
    { destination: "default", gateway: "10.244.1.1" },
    { destination: "10.96.0.0/12", gateway: "10.244.1.1" },
  ]);
  const none = parseBridgeDhcpCache(
    bridgeDhcpCache({ ...discovery(), ipv4: [] }, "0a:58:0a:f4:01:05"),
  );
  assert.equal(none.ipamDisabled, true, "no IPv4 on the pod: no DHCP");
});

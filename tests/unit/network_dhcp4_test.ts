/** DHCPv4 messages of the one-guest server: codec, option encodings, answers. */

import assert from "node:assert/strict";
import {
  answerDhcp4,
  decodeDhcp4,
  Dhcp4Error,
  type Dhcp4Lease,
  type Dhcp4Message,
  DhcpMessageType,
  DhcpOption,
  encodeClasslessRoutes,
  encodeDhcp4,
  encodeSearchDomains,
  LEASE_SECONDS,
  prefixMask,
} from "../../mod/network/mod.ts";

const MAC = "52:54:00:12:34:56";
const lease: Dhcp4Lease = {
  mac: MAC,
  address: "10.0.2.2",
  prefix: 24,
  serverAddress: "10.0.2.1",
  router: "10.0.2.1",
  dnsServers: ["10.96.0.10", "8.8.8.8"],
  searchDomains: ["default.svc.cluster.local", "svc.cluster.local", "cluster.local"],
  domainName: "default.svc.cluster.local",
  hostname: "vm1",
  mtu: 1450,
  routes: [{ destination: "0.0.0.0", prefix: 0, gateway: "10.0.2.1" }],
};

/** A client's message, built byte by byte as RFC 2131 lays it out (not with encodeDhcp4). */
function clientMessage(type: number, extra: number[] = [], mac = MAC, ciaddr = [0, 0, 0, 0]) {
  const b = new Uint8Array(240);
  b[0] = 1; // BOOTREQUEST
  b[1] = 1; // Ethernet
  b[2] = 6;
  b.set([0xde, 0xad, 0xbe, 0xef], 4); // xid
  b.set([0x80, 0x00], 10); // broadcast flag
  b.set(ciaddr, 12);
  b.set(mac.split(":").map((h) => parseInt(h, 16)), 28);
  b.set([99, 130, 83, 99], 236);
  // Padding and a parameter request list, as real clients send.
  return Uint8Array.from([...b, 0, 53, 1, type, 55, 3, 1, 3, 6, ...extra, 255]);
}

Deno.test("DHCPv4: a DISCOVER from the guest's MAC gets an OFFER of its one address with every option", () => {
  const request = decodeDhcp4(clientMessage(DhcpMessageType.Discover));
  assert.equal(request.xid, 0xdeadbeef);
  assert.equal(request.chaddr, MAC);
  assert.equal(request.flags, 0x8000);
  const offer = answerDhcp4(request, lease)!;
  const wire = decodeDhcp4(encodeDhcp4(offer));
  assert.equal(wire.op, 2);
  assert.equal(wire.xid, 0xdeadbeef);
  assert.equal(wire.yiaddr, "10.0.2.2");
  assert.equal(wire.siaddr, "10.0.2.1");
  assert.equal(wire.chaddr, MAC);
  assert.equal(wire.flags, 0x8000);
  const o = wire.options;
  assert.deepEqual([...o.get(DhcpOption.MessageType)!], [DhcpMessageType.Offer]);
  assert.deepEqual([...o.get(DhcpOption.ServerId)!], [10, 0, 2, 1]);
  assert.deepEqual([...o.get(DhcpOption.SubnetMask)!], [255, 255, 255, 0]);
  assert.deepEqual([...o.get(DhcpOption.Router)!], [10, 0, 2, 1]);
  assert.deepEqual([...o.get(DhcpOption.DomainNameServer)!], [10, 96, 0, 10, 8, 8, 8, 8]);
  assert.equal(new TextDecoder().decode(o.get(DhcpOption.HostName)), "vm1");
  assert.equal(new TextDecoder().decode(o.get(DhcpOption.DomainName)), "default.svc.cluster.local");
  assert.deepEqual([...o.get(DhcpOption.InterfaceMtu)!], [0x05, 0xaa]);
  assert.equal(new DataView(o.get(DhcpOption.LeaseTime)!.buffer).getUint32(0), LEASE_SECONDS);
  assert.deepEqual([...o.get(DhcpOption.ClasslessStaticRoute)!], [0, 10, 0, 2, 1]);
  assert.equal(o.get(DhcpOption.DomainSearch)!.length, 27 + 19 + 15);
});

Deno.test("DHCPv4: a REQUEST is ACKed for the lease's address, NAKed for another, ignored if not ours", () => {
  // A REQUEST for another server's offer is ignored.
  const ask = (ip: number[], server = [10, 0, 2, 1]) =>
    answerDhcp4(
      decodeDhcp4(clientMessage(DhcpMessageType.Request, [50, 4, ...ip, 54, 4, ...server])),
      lease,
    );
  const ack = ask([10, 0, 2, 2])!;
  assert.deepEqual([...ack.options.get(DhcpOption.MessageType)!], [DhcpMessageType.Ack]);
  assert.equal(ack.yiaddr, "10.0.2.2");
  const nak = ask([10, 0, 2, 9])!;
  assert.deepEqual([...nak.options.get(DhcpOption.MessageType)!], [DhcpMessageType.Nak]);
  assert.equal(nak.yiaddr, "0.0.0.0");
  assert.equal(nak.options.has(DhcpOption.SubnetMask), false);
  assert.equal(ask([10, 0, 2, 2], [10, 0, 2, 99]), undefined);
  // Renewing (no option 50, ciaddr set) keeps the address.
  const renew = answerDhcp4(
    decodeDhcp4(clientMessage(DhcpMessageType.Request, [], MAC, [10, 0, 2, 2])),
    lease,
  )!;
  assert.deepEqual([...renew.options.get(DhcpOption.MessageType)!], [DhcpMessageType.Ack]);
  assert.equal(renew.ciaddr, "10.0.2.2");
});

Deno.test("DHCPv4: other MACs, replies and RELEASE/DECLINE/INFORM get no answer", () => {
  const other = decodeDhcp4(clientMessage(DhcpMessageType.Discover, [], "52:54:00:00:00:01"));
  assert.equal(answerDhcp4(other, lease), undefined);
  for (const t of [DhcpMessageType.Release, DhcpMessageType.Decline, DhcpMessageType.Inform]) {
    assert.equal(answerDhcp4(decodeDhcp4(clientMessage(t)), lease), undefined);
  }
  const reply: Dhcp4Message = { ...decodeDhcp4(clientMessage(DhcpMessageType.Discover)), op: 2 };
  assert.equal(answerDhcp4(reply, lease), undefined);
  // The lease's MAC may be written in upper case.
  assert.ok(answerDhcp4(decodeDhcp4(clientMessage(1)), { ...lease, mac: MAC.toUpperCase() }));
});

Deno.test("DHCPv4: malformed messages from the guest are refused with a clear error", () => {
  const good = clientMessage(DhcpMessageType.Discover);
  const cases: [Uint8Array, RegExp][] = [
    [good.slice(0, 100), /shorter than a DHCP header/],
    [Uint8Array.from([...good.slice(0, 236), 1, 2, 3, 4, 255]), /no DHCP magic cookie/],
    [good.slice(0, good.length - 1), /without the end option/],
    [Uint8Array.from([...good.slice(0, 240), 53, 9, 1]), /runs past the message/],
    [Uint8Array.from([...good.slice(0, 240), 53]), /has no length/],
    [Uint8Array.from([good[0], 6, ...good.slice(2)]), /not Ethernet/],
  ];
  for (const [bytes, why] of cases) {
    assert.throws(
      () => decodeDhcp4(bytes),
      (e: unknown) => e instanceof Dhcp4Error && why.test(e.message),
    );
  }
});

Deno.test("DHCPv4 option encodings: RFC 3397 search list and RFC 3442 routes, as the RFCs' examples", () => {
  // RFC 3397's example, without compression.
  const enc = (s: string) => [s.length, ...new TextEncoder().encode(s)];
  assert.deepEqual(
    [...encodeSearchDomains(["eng.apple.com.", "marketing.apple.com"])],
    [
      ...enc("eng"),
      ...enc("apple"),
      ...enc("com"),
      0,
      ...enc("marketing"),
      ...enc("apple"),
      ...enc("com"),
      0,
    ],
  );
  // RFC 3442's table: the width decides how many destination octets follow.
  assert.deepEqual(
    [...encodeClasslessRoutes([
      { destination: "10.0.0.0", prefix: 8, gateway: "10.0.0.1" },
      { destination: "10.17.0.0", prefix: 16, gateway: "10.0.0.1" },
      { destination: "10.27.129.0", prefix: 24, gateway: "10.0.0.1" },
      { destination: "10.229.0.128", prefix: 25, gateway: "10.0.0.1" },
      { destination: "0.0.0.0", prefix: 0, gateway: "10.0.0.1" },
    ])],
    [
      8,
      10,
      10,
      0,
      0,
      1,
      16,
      10,
      17,
      10,
      0,
      0,
      1,
      24,
      10,
      27,
      129,
      10,
      0,
      0,
      1,
      25,
      10,
      229,
      0,
      128,
      10,
      0,
      0,
      1,
      0,
      10,
      0,
      0,
      1,
    ],
  );
  assert.throws(
    () => encodeClasslessRoutes([{ destination: "10.0.0.1", prefix: 8, gateway: "10.0.0.1" }]),
    /host bits set/,
  );
  assert.throws(() => encodeSearchDomains(["bad..name"]), /not a domain name/);
  assert.deepEqual(prefixMask(0), [0, 0, 0, 0]);
  assert.deepEqual(prefixMask(20), [255, 255, 240, 0]);
  assert.deepEqual(prefixMask(32), [255, 255, 255, 255]);
  assert.throws(() => prefixMask(33), /between 0 and 32/);
  assert.throws(() => answerDhcp4(decodeDhcp4(clientMessage(1)), { ...lease, mtu: 20 }), /MTU 20/);
});

Deno.test("DHCPv4: an option value over 255 bytes is split into several instances (RFC 3396)", () => {
  const domains = Array.from({ length: 20 }, (_, i) => `namespace-${i}.svc.cluster.local`);
  const offer = answerDhcp4(decodeDhcp4(clientMessage(1)), { ...lease, searchDomains: domains })!;
  const bytes = encodeDhcp4(offer);
  const value = offer.options.get(DhcpOption.DomainSearch)!;
  assert.ok(value.length > 255);
  let instances = 0;
  for (let i = 240; bytes[i] !== 255; i += 2 + bytes[i + 1]) {
    if (bytes[i] === DhcpOption.DomainSearch) instances++;
  }
  assert.equal(instances, Math.ceil(value.length / 255));
  // Read back, the instances are one value again.
  assert.deepEqual(decodeDhcp4(bytes).options.get(DhcpOption.DomainSearch), value);
});

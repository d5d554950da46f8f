import assert from "node:assert/strict";
import {
  answerDhcp6,
  decodeDhcp6,
  Dhcp6Error,
  Dhcp6MessageType,
  Dhcp6Option,
  dhcp6Option,
  duidLl,
  encodeDhcp6,
  guestHostname,
  iaNaAddress,
  LEASE_SECONDS,
  parseResolvConf,
} from "../../mod/network/mod.ts";

const LEASE = { address: "fd10:0:2::2", serverMac: "02:00:00:00:00:00", dnsServers: ["fd00::53"] };
const CLIENT_ID = Uint8Array.from([0, 1, 0, 1, 1, 2, 3, 4, 0x52, 0x54, 0, 1, 2, 3]);
const IA_NA_REQUEST = Uint8Array.from([0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0]); // IAID 7, T1 T2 0

function solicit(extra: [number, Uint8Array][] = []) {
  return decodeDhcp6(encodeDhcp6({
    type: Dhcp6MessageType.Solicit,
    transactionId: 0xabcdef,
    options: [[Dhcp6Option.ClientId, CLIENT_ID], [Dhcp6Option.IaNa, IA_NA_REQUEST], ...extra],
  }));
}

Deno.test("answerDhcp6() advertises fd10:0:2::2 for 999 days in the client's IA_NA", () => {
  // The reply carries the server's DUID-LL and the DNS servers.
  const reply = answerDhcp6(solicit(), LEASE)!;
  assert.equal(reply.type, Dhcp6MessageType.Advertise);
  assert.equal(reply.transactionId, 0xabcdef);
  assert.deepEqual(dhcp6Option(reply, Dhcp6Option.ClientId), CLIENT_ID, "the client ID echoed");
  assert.deepEqual(dhcp6Option(reply, Dhcp6Option.ServerId), duidLl("02:00:00:00:00:00"));
  const iaNa = dhcp6Option(reply, Dhcp6Option.IaNa)!;
  assert.deepEqual([...iaNa.subarray(0, 4)], [0, 0, 0, 7], "the client's IAID");
  assert.equal(iaNaAddress(iaNa), "fd10:0:2::2");
  const lifetimes = new DataView(iaNa.buffer, iaNa.byteOffset + 12 + 4 + 16, 8);
  assert.equal(lifetimes.getUint32(0), LEASE_SECONDS);
  assert.equal(lifetimes.getUint32(4), LEASE_SECONDS);
  assert.equal(dhcp6Option(reply, Dhcp6Option.DnsServers)!.length, 16);
});

Deno.test("answerDhcp6() replies at once to rapid commit and REQUEST; ignores other servers' traffic", () => {
  // Messages from servers, and requests meant for another server, get no answer.
  assert.equal(
    answerDhcp6(solicit([[Dhcp6Option.RapidCommit, new Uint8Array()]]), LEASE)!.type,
    Dhcp6MessageType.Reply,
  );
  const request = { ...solicit(), type: Dhcp6MessageType.Request };
  request.options.push([Dhcp6Option.ServerId, duidLl("02:00:00:00:00:00")]);
  assert.equal(answerDhcp6(request, LEASE)!.type, Dhcp6MessageType.Reply);
  const elsewhere = { ...solicit(), type: Dhcp6MessageType.Request };
  elsewhere.options.push([Dhcp6Option.ServerId, duidLl("02:00:00:00:00:99")]);
  assert.equal(answerDhcp6(elsewhere, LEASE), undefined);
  assert.equal(answerDhcp6({ ...solicit(), type: Dhcp6MessageType.Advertise }, LEASE), undefined);
  assert.equal(
    answerDhcp6({ type: 1, transactionId: 1, options: [] }, LEASE),
    undefined,
    "no client ID",
  );
});

Deno.test("decodeDhcp6() refuses truncated input with a clear error", () => {
  assert.throws(() => decodeDhcp6(Uint8Array.of(1, 2)), Dhcp6Error);
  assert.throws(() => decodeDhcp6(Uint8Array.of(1, 0, 0, 1, 0, 1, 0, 9, 1)), /runs past the end/);
});

Deno.test("parseResolvConf() gives servers by family, the search list and the domain, without loopback", () => {
  const dns = parseResolvConf(
    "nameserver 10.96.0.10\nnameserver fd00::a\nnameserver 127.0.0.53\n" +
      "search default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n",
    "sub",
  );
  assert.deepEqual(dns.servers4, ["10.96.0.10"]);
  assert.deepEqual(dns.servers6, ["fd00::a"]);
  assert.deepEqual(dns.search, [
    "sub.default.svc.cluster.local",
    "default.svc.cluster.local",
    "svc.cluster.local",
    "cluster.local",
  ]);
  assert.equal(dns.domain, "sub.default.svc.cluster.local");
  const empty = parseResolvConf("nameserver 127.0.0.53\n");
  assert.deepEqual(empty.servers4, ["8.8.8.8"], "KubeVirt's fallback when none is left");
  assert.deepEqual(empty.search, ["cluster.local"]);
  assert.equal(guestHostname({ metadata: { name: "vm1" }, spec: {} }), "vm1");
  assert.equal(guestHostname({ metadata: { name: "vm1" }, spec: { hostname: "web" } }), "web");
});

/**
 * The migration network's address as virt-handler finds it: the global unicast address of the
 * `migration0` interface KubeVirt's operator gives the handler's pod (mod/handler/handler.ts).
 *
 * @module
 */
import assert from "node:assert/strict";
import { migrationNetworkAddress } from "../../mod/handler/testing.ts";

function iface(name: string, address: string): Deno.NetworkInterfaceInfo {
  const v6 = address.includes(":");
  return {
    family: v6 ? "IPv6" : "IPv4",
    name,
    address,
    netmask: v6 ? "ffff:ffff:ffff:ffff::" : "255.255.255.0",
    scopeid: v6 ? 0 : null,
    cidr: `${address}/${v6 ? 64 : 24}`,
    mac: "02:00:00:00:00:01",
  };
}

Deno.test("the migration network: migration0's global address, none without it, an error if unusable", () => {
  // No migration0 interface means no address; one with no usable address is an error.
  const eth0 = iface("eth0", "10.244.0.7");
  assert.equal(migrationNetworkAddress([eth0]), undefined);
  // A link-local address first, as the kernel lists them: skipped, as Go's IsGlobalUnicast does.
  assert.equal(
    migrationNetworkAddress([
      eth0,
      iface("migration0", "fe80::1"),
      iface("migration0", "192.168.50.4"),
    ]),
    "192.168.50.4",
  );
  assert.equal(migrationNetworkAddress([iface("migration0", "fd00:50::4")]), "fd00:50::4");
  assert.throws(
    () => migrationNetworkAddress([eth0, iface("migration0", "fe80::1")]),
    /no IP found on migration0/,
  );
});

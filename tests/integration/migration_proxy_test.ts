/**
 * The migration proxy between two handlers' managers on loopback, with certificates made
 * by openssl: bytes cross it both ways whole (libvirt's socket and a direct-migration
 * port, each its own listener); a source with another CA's, an expired or another name's
 * client certificate, and a target with another CA's or a client's certificate, carry no
 * byte; stopping removes the source sockets and closes the target ports.
 */
import assert from "node:assert/strict";
import net from "node:net";
import { join } from "node:path";
import {
  LIBVIRT_DIRECT_MIGRATION_PORT,
  MigrationProxyManager,
  type ProxyTls,
  sourceUnixFile,
} from "../../mod/migration/mod.ts";
import { echoServer, proxyCertificates, roundTrip, sha } from "../helpers/migration_proxy.ts";
import type { KeyPair } from "../helpers/rest_client.ts";

Deno.test("migration proxy: libvirt's and direct-migration traffic cross whole; wrong certificates do not", async () => {
  // Both libvirt's socket and a direct-migration port carry data
  // intact both ways. A wrong certificate on either side lets no
  // byte through, and stopping the proxy leaves no socket or port.
  const dir = await Deno.makeTempDir({ prefix: "virtnode-migproxy-" });
  const { certs, server: serverPair } = await proxyCertificates(dir);
  const tlsOf = (pair: KeyPair, ca = certs.ca): ProxyTls => ({ ...pair, ca });
  const libvirt = await echoServer(join(dir, "virtqemud-sock"));
  const direct = await echoServer(join(dir, "migration-49152"));
  const managers: MigrationProxyManager[] = [];
  const manager = (server: KeyPair, client: KeyPair) => {
    const m = new MigrationProxyManager({
      serverTls: () => tlsOf(server),
      clientTls: () => tlsOf(client),
      bindAddress: "127.0.0.1",
    });
    managers.push(m);
    return m;
  };
  const uid = "4b1d2c3e-0000-4000-8000-000000000001";
  const shortDirs: string[] = [];
  const shortDir = async () => {
    const d = await Deno.makeTempDir({ dir: "/tmp", prefix: "vn-mp-" });
    shortDirs.push(d);
    return d;
  };
  try {
    const target = manager(serverPair, certs.client);
    await target.startTargetListener(uid, [
      libvirt.target(0),
      direct.target(LIBVIRT_DIRECT_MIGRATION_PORT),
    ]);
    const ports = target.targetListenerPorts(uid);
    assert.deepEqual(Object.values(ports).sort(), [0, LIBVIRT_DIRECT_MIGRATION_PORT]);
    // The same ports again: nothing new is opened.
    await target.startTargetListener(uid, [
      direct.target(LIBVIRT_DIRECT_MIGRATION_PORT),
      libvirt.target(0),
    ]);
    assert.deepEqual(target.targetListenerPorts(uid), ports);

    const source = manager(serverPair, certs.client);
    // A unix socket path holds 107 bytes: the sockets go under a short directory.
    const base = await shortDir();
    await source.startSourceListener(uid, "127.0.0.1", ports, base);
    const libvirtSock = sourceUnixFile(base, uid);
    const directSock = sourceUnixFile(base, `${uid}-${LIBVIRT_DIRECT_MIGRATION_PORT}`);
    assert.deepEqual(source.sourceListenerFiles(uid).sort(), [libvirtSock, directSock].sort());
    assert.equal(libvirtSock, join(base, "migrationproxy", `${uid}-source.sock`));
    for (const path of [libvirtSock, directSock]) {
      assert.equal(Deno.statSync(path).mode! & 0o777, 0o600, `${path} is the owner's only`);
    }

    const small = new TextEncoder().encode("virsh would say hello\n");
    assert.deepEqual(await roundTrip(libvirtSock, small), small);
    assert.equal(libvirt.state.received, small.length);
    const big = new Uint8Array(8 * 1024 * 1024);
    for (let i = 0; i < big.length; i += 65536) crypto.getRandomValues(big.subarray(i, i + 65536));
    const back = await roundTrip(directSock, big, 30_000);
    assert.equal(back.length, big.length);
    assert.equal(await sha(back), await sha(big));
    assert.equal(direct.state.received, big.length);

    // Wrong client certificates: the target lets none of them reach the launcher.
    const before = { ...libvirt.state };
    for (
      const [what, pair] of [
        ["another CA's", certs.otherCa],
        ["an expired", certs.expired],
        ["another name's", certs.wrongName],
      ] as const
    ) {
      const bad = manager(serverPair, pair);
      const badBase = await shortDir();
      await bad.startSourceListener(uid, "127.0.0.1", ports, badBase);
      const answer = await roundTrip(sourceUnixFile(badBase, uid), small, 5_000);
      assert.equal(answer.length, 0, `${what} client certificate got an answer`);
      await bad.stopSourceListener(uid);
    }
    assert.deepEqual(libvirt.state, before, "no wrong client reached the launcher's socket");

    // Wrong target certificates: the source sends nothing to them.
    for (
      const [what, pair] of [
        ["another CA's", certs.otherCa],
        ["a client's (no server use, no node name)", certs.client],
      ] as const
    ) {
      const impostor = manager(pair, certs.client);
      const key = `impostor-${managers.length}`;
      await impostor.startTargetListener(key, [libvirt.target(0)]);
      const impostorPorts = impostor.targetListenerPorts(key);
      const honest = manager(serverPair, certs.client);
      const honestBase = await shortDir();
      await honest.startSourceListener(key, "127.0.0.1", impostorPorts, honestBase);
      const answer = await roundTrip(sourceUnixFile(honestBase, key), small, 5_000);
      assert.equal(answer.length, 0, `a target with ${what} certificate got the bytes`);
      await honest.stopSourceListener(key);
      await impostor.stopTargetListener(key);
    }
    assert.deepEqual(libvirt.state, before, "no byte went to a target with a wrong certificate");

    // Stopping: the source's files go, the target's ports close.
    await source.stopSourceListener(uid);
    for (const path of [libvirtSock, directSock]) {
      assert.throws(() => Deno.statSync(path), Deno.errors.NotFound);
    }
    await target.stopTargetListener(uid);
    for (const port of Object.keys(ports)) {
      const refused = await new Promise<boolean>((resolve) => {
        const s = net.connect(Number(port), "127.0.0.1");
        s.once("connect", () => {
          s.destroy();
          resolve(false);
        });
        s.once("error", () => resolve(true));
      });
      assert.ok(refused, `port ${port} is closed`);
    }
    for (const m of managers) assert.equal(m.openListenerCount(), 0);
  } finally {
    for (const m of managers) await m.shutdown();
    await libvirt.close();
    await direct.close();
    await Deno.remove(dir, { recursive: true });
    for (const d of shortDirs) await Deno.remove(d, { recursive: true });
  }
});

Deno.test("migration proxy: connections reach the target launcher in the order the source made them", async () => {
  // QEMU's destination tells a migration's main stream from its multifd streams by the
  // order they connect in: nine connections opened one after another (the main stream and
  // KubeVirt's eight multifd threads), each saying its number first, arrive in that order,
  // five times, though the target takes longest to open the first one's way in.
  const dir = await Deno.makeTempDir({ prefix: "virtnode-migproxy-order-" });
  const { certs, server } = await proxyCertificates(dir);
  const material: ProxyTls = { ...server, ca: certs.ca };
  const options = {
    serverTls: () => material,
    clientTls: () => ({ ...certs.client, ca: certs.ca }),
    bindAddress: "127.0.0.1",
  };
  const target = new MigrationProxyManager(options);
  const source = new MigrationProxyManager(options);
  const base = await Deno.makeTempDir({ dir: "/tmp", prefix: "vn-mpo-" });
  const socketPath = join(dir, "migration-49152");
  const listener = Deno.listen({ transport: "unix", path: socketPath });
  const arrived: number[] = [];
  const accepted: Deno.Conn[] = [];
  const accepting = (async () => {
    for await (const conn of listener) {
      accepted.push(conn);
      // The number is read in the order of acceptance, before the next accept.
      const byte = new Uint8Array(1);
      arrived.push((await conn.read(byte)) === 1 ? byte[0] : -1);
    }
  })().catch(() => {});
  const uid = "4b1d2c3e-0000-4000-8000-000000000003";
  const clients: Deno.Conn[] = [];
  try {
    // Finding the launcher's socket takes its time: the first of each round's nine takes
    // longest, so a connection set up as soon as it came would overtake it.
    let opens = 0;
    await target.startTargetListener(uid, [{
      port: LIBVIRT_DIRECT_MIGRATION_PORT,
      open: async () => {
        if (opens++ % 9 === 0) await new Promise((resolve) => setTimeout(resolve, 300));
        return { path: socketPath, release: () => {} };
      },
    }]);
    await source.startSourceListener(uid, "127.0.0.1", target.targetListenerPorts(uid), base);
    const path = sourceUnixFile(base, `${uid}-${LIBVIRT_DIRECT_MIGRATION_PORT}`);
    for (let round = 0; round < 5; round++) {
      arrived.length = 0;
      // One after another, as QEMU connects them, each saying its number at once.
      for (let i = 0; i < 9; i++) {
        const conn = await Deno.connect({ transport: "unix", path });
        clients.push(conn);
        await conn.write(Uint8Array.of(i));
      }
      const deadline = Date.now() + 15_000;
      while (arrived.length < 9 && Date.now() < deadline) {
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      assert.deepEqual(arrived, [0, 1, 2, 3, 4, 5, 6, 7, 8], `round ${round}`);
      for (const conn of clients.splice(0)) conn.close();
    }
  } finally {
    for (const conn of [...clients, ...accepted]) {
      try {
        conn.close();
      } catch {
        // Closed by the proxy already.
      }
    }
    await source.shutdown();
    await target.shutdown();
    listener.close();
    await accepting;
    await Deno.remove(dir, { recursive: true });
    await Deno.remove(base, { recursive: true });
  }
});

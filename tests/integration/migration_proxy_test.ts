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
  type ProxyTarget,
  type ProxyTls,
  sourceUnixFile,
} from "../../mod/migration/mod.ts";
import { type KeyPair, makeCertificates } from "../helpers/rest_client.ts";

/** A unix socket server in the "target launcher" that echoes and counts what it got. */
async function echoServer(path: string) {
  const state = { received: 0, connections: 0 };
  const sockets = new Set<net.Socket>();
  const server = net.createServer((s) => {
    state.connections++;
    sockets.add(s);
    s.on("data", (chunk: Uint8Array) => {
      state.received += chunk.length;
      s.write(chunk);
    });
    s.on("end", () => s.end());
    s.on("error", () => {});
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(path, resolve));
  return {
    state,
    target: (port: number): ProxyTarget => ({
      port,
      open: () => Promise.resolve({ path, release: () => {} }),
    }),
    close: () => {
      for (const s of sockets) s.destroy();
      return new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** Sends `data` over the unix socket `path` and reads as much back; what came back. */
async function roundTrip(path: string, data: Uint8Array, timeoutMs = 10_000): Promise<Uint8Array> {
  const socket = net.connect({ path });
  socket.on("error", () => {});
  const chunks: Uint8Array[] = [];
  let got = 0;
  const done = new Promise<void>((resolve) => {
    socket.on("data", (c: Uint8Array) => {
      chunks.push(c);
      got += c.length;
      if (got >= data.length) resolve();
    });
    socket.on("close", () => resolve());
    setTimeout(resolve, timeoutMs);
  });
  socket.write(data);
  await done;
  socket.destroy();
  const out = new Uint8Array(got);
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.length;
  }
  return out;
}

async function sha(bytes: Uint8Array): Promise<string> {
  return Array.from(
    new Uint8Array(await crypto.subtle.digest("SHA-256", bytes as Uint8Array<ArrayBuffer>)),
  )
    .map((b) => b.toString(16).padStart(2, "0")).join("");
}

Deno.test("migration proxy: libvirt's and direct-migration traffic cross whole; wrong certificates do not", async () => {
  // Both libvirt's socket and a direct-migration port carry data
  // intact both ways. A wrong certificate on either side lets no
  // byte through, and stopping the proxy leaves no socket or port.
  const dir = await Deno.makeTempDir({ prefix: "virtnode-migproxy-" });
  const certs = await makeCertificates(dir);
  const serverPair: KeyPair = {
    cert: await Deno.readTextFile(join(certs.serverDir, "tls.crt")),
    key: await Deno.readTextFile(join(certs.serverDir, "tls.key")),
  };
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

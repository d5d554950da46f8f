/**
 * The migration target lets a client in only when its certificate chain was verified
 * against the CA bundle, not on its common name alone (issue 34, Low). The decision is
 * checked on real TLS sockets: a server that does not reject at the handshake hands it a
 * client of another CA with the allowed name; and the target listener itself refuses that
 * client end to end.
 */
import assert from "node:assert/strict";
import net from "node:net";
import tls from "node:tls";
import { join } from "node:path";
import {
  MIGRATION_CLIENT_NAMES,
  MigrationProxyManager,
  refuseMigrationClient,
} from "../../mod/migration/mod.ts";
import { type KeyPair, makeCertificates } from "../helpers/rest_client.ts";

/** The test certificates in a new directory, and the handler's server pair among them. */
async function certificates() {
  const dir = await Deno.makeTempDir({ prefix: "virtnode-mig-verified-" });
  const certs = await makeCertificates(dir);
  const serverPair: KeyPair = {
    cert: await Deno.readTextFile(join(certs.serverDir, "tls.crt")),
    key: await Deno.readTextFile(join(certs.serverDir, "tls.key")),
  };
  return { dir, certs, serverPair };
}

/** The server side of one TLS connection from a client presenting `pair`. */
async function serverSideOf(
  server: tls.Server,
  port: number,
  pair: KeyPair,
  ca: string,
): Promise<{ socket: tls.TLSSocket; close: () => void }> {
  const accepted = new Promise<tls.TLSSocket>((resolve) =>
    server.once("secureConnection", resolve)
  );
  const client = tls.connect({
    host: "127.0.0.1",
    port,
    ...pair,
    ca,
    checkServerIdentity: () => undefined,
  });
  client.on("error", () => {});
  const socket = await accepted;
  return { socket, close: () => (client.destroy(), socket.destroy()) };
}

Deno.test("a migration client with the allowed common name but another CA's chain is refused", async () => {
  // The common name alone is not enough: the client's certificate chain is verified.
  const { dir, certs, serverPair } = await certificates();
  // A TLS layer that asks for a certificate but lets the handshake finish either way.
  const server = tls.createServer({
    ...serverPair,
    ca: certs.ca,
    requestCert: true,
    rejectUnauthorized: false,
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as net.AddressInfo).port;
  try {
    const other = await serverSideOf(server, port, certs.otherCa, certs.ca);
    try {
      assert.equal(other.socket.authorized, false);
      assert.ok(
        (MIGRATION_CLIENT_NAMES as readonly string[]).includes(
          other.socket.getPeerCertificate().subject.CN as string,
        ),
        "the other CA's certificate has the allowed name",
      );
      assert.match(
        refuseMigrationClient(other.socket) ?? "",
        /^the peer certificate is not verified/,
      );
    } finally {
      other.close();
    }
    const good = await serverSideOf(server, port, certs.client, certs.ca);
    try {
      assert.equal(refuseMigrationClient(good.socket), undefined, "the CA's client is let in");
    } finally {
      good.close();
    }
  } finally {
    await new Promise((resolve) => server.close(resolve));
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("the migration target listener carries no byte for the allowed common name from another CA", async () => {
  // The client shows the allowed common name on a certificate another CA signed.
  const { dir, certs, serverPair } = await certificates();
  let reached = 0;
  const launcher = net.createServer((s) => {
    reached++;
    s.destroy();
  });
  await new Promise<void>((resolve) => launcher.listen(join(dir, "launcher.sock"), resolve));
  const manager = new MigrationProxyManager({
    serverTls: () => ({ ...serverPair, ca: certs.ca }),
    clientTls: () => ({ ...certs.client, ca: certs.ca }),
    bindAddress: "127.0.0.1",
  });
  try {
    await manager.startTargetListener("vmi", [{
      port: 0,
      open: () => Promise.resolve({ path: join(dir, "launcher.sock"), release: () => {} }),
    }]);
    const port = Number(Object.keys(manager.targetListenerPorts("vmi"))[0]);
    const outcome = await new Promise<string>((resolve) => {
      const c = tls.connect({
        host: "127.0.0.1",
        port,
        ...certs.otherCa,
        ca: certs.ca,
        checkServerIdentity: () => undefined,
      });
      c.on("secureConnect", () => c.write("libvirt RPC"));
      c.on("data", () => resolve("answered"));
      c.on("error", () => resolve("refused"));
      c.on("close", () => resolve("refused"));
      setTimeout(() => resolve("timeout"), 5_000);
    });
    assert.equal(outcome, "refused");
    assert.equal(reached, 0, "the launcher's socket was reached");
  } finally {
    await manager.shutdown();
    await new Promise((resolve) => launcher.close(resolve));
    await Deno.remove(dir, { recursive: true });
  }
});

/**
 * A stand-in target launcher and a client for migration proxy tests: a unix socket that
 * echoes what it gets, a round trip through a socket, a digest to compare bytes by, and the
 * certificates both sides use.
 *
 * @module
 */
import { join } from "node:path";
import type { ProxyTarget } from "../../mod/migration/mod.ts";
import { type KeyPair, makeCertificates } from "./rest_client.ts";

/** Certificates made by openssl in `dir`, and the handler server pair read from them. */
export async function proxyCertificates(dir: string) {
  const certs = await makeCertificates(dir);
  const server: KeyPair = {
    cert: await Deno.readTextFile(join(certs.serverDir, "tls.crt")),
    key: await Deno.readTextFile(join(certs.serverDir, "tls.key")),
  };
  return { certs, server };
}

/**
 * A unix socket server in the "target launcher" that echoes and counts what it got. Deno's
 * own sockets, here as in the proxy: node:net closes a unix socket's descriptor twice on
 * Deno 2.9.3 (docs/compatibility.md), which tests/soak/migration_proxy_fd_test.ts would catch.
 */
export async function echoServer(path: string) {
  const state = { received: 0, connections: 0 };
  const conns = new Set<Deno.Conn>();
  const listener = Deno.listen({ transport: "unix", path });
  const echo = async (conn: Deno.Conn) => {
    const buffer = new Uint8Array(64 * 1024);
    try {
      for (let n = await conn.read(buffer); n !== null; n = await conn.read(buffer)) {
        state.received += n;
        await writeAll(conn, buffer.subarray(0, n));
      }
    } catch {
      // The peer or the test closed it.
    } finally {
      conns.delete(conn);
      try {
        conn.close();
      } catch {
        // Closed already.
      }
    }
  };
  const accepting = (async () => {
    for await (const conn of listener) {
      state.connections++;
      conns.add(conn);
      echo(conn);
    }
  })().catch(() => {});
  await Promise.resolve();
  return {
    state,
    target: (port: number): ProxyTarget => ({
      port,
      open: () => Promise.resolve({ path, release: () => {} }),
    }),
    close: async () => {
      for (const c of conns) {
        try {
          c.close();
        } catch {
          // Closed already.
        }
      }
      listener.close();
      await accepting;
    },
  };
}

export async function writeAll(conn: Deno.Conn, bytes: Uint8Array): Promise<void> {
  for (let at = 0; at < bytes.length;) at += await conn.write(bytes.subarray(at));
}

/** Sends `data` over the unix socket `path` and reads as much back; what came back. */
export async function roundTrip(
  path: string,
  data: Uint8Array,
  timeoutMs = 10_000,
): Promise<Uint8Array> {
  const conn = await Deno.connect({ transport: "unix", path });
  const out = new Uint8Array(data.length);
  let got = 0;
  const timer = setTimeout(() => {
    try {
      conn.close();
    } catch {
      // Done already.
    }
  }, timeoutMs);
  try {
    const writing = writeAll(conn, data).catch(() => {});
    const buffer = new Uint8Array(64 * 1024);
    while (got < data.length) {
      const n = await conn.read(buffer);
      if (n === null) break;
      out.set(buffer.subarray(0, Math.min(n, data.length - got)), got);
      got += n;
    }
    await writing;
  } catch {
    // Closed by the timer or the proxy: what came back so far is the answer.
  } finally {
    clearTimeout(timer);
    try {
      conn.close();
    } catch {
      // Closed by the timer.
    }
  }
  return out.subarray(0, got);
}

export async function sha(bytes: Uint8Array): Promise<string> {
  return Array.from(
    new Uint8Array(await crypto.subtle.digest("SHA-256", bytes as Uint8Array<ArrayBuffer>)),
  )
    .map((b) => b.toString(16).padStart(2, "0")).join("");
}

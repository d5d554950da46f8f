/**
 * The migration proxy between two handlers, as KubeVirt's virt-handler runs it:
 *
 *     source launcher's libvirt -> unix socket (source handler) -> TCP + mutual TLS
 *       -> TCP listener (target handler) -> unix socket in the target launcher
 *
 * The target handler opens one TLS listener on a free port for each of the target
 * launcher's sockets (libvirt's own, then one per direct-migration port: 49152 for memory,
 * 49153 for block migration) and publishes `{<node port>: <launcher port>}` in the VMI's
 * `status.migrationState.targetDirectMigrationNodePorts` (0 stands for libvirt's socket).
 * The source handler opens, for each of those, a unix socket
 * `<base>/migrationproxy/<uid>[-<port>]-source.sock` whose connections it carries to the
 * target's node port. Bytes are copied both ways with backpressure; when either direction
 * of a connection reaches its end, what it carried is delivered and both sides go.
 *
 * The unix sockets are Deno's own (`Deno.listen`, `Deno.connect`), not node:net's: Deno 2.9.3's
 * node:net closes a unix socket's descriptor twice (docs/compatibility.md), and a second close
 * that lands on a migration stream's descriptor broke migrations under load ("Unable to write
 * to socket: Bad file descriptor" in the source QEMU). The TCP side stays node:tls, which
 * verifies client certificates as KubeVirt does.
 *
 * TLS follows KubeVirt's rules: the target serves the handler's server certificate and
 * lets in only a client certificate that chains to the CA bundle, is valid, allows client
 * authentication and is named `kubevirt.io:system:client:virt-handler` or
 * `...:migration`; the source presents the handler's client certificate and accepts only a
 * server certificate that chains to the bundle, allows server authentication and is named
 * `kubevirt.io:system:node:virt-handler` (no host name is checked: KubeVirt's node
 * certificates carry none). A connection that fails any of this carries no byte.
 *
 * @module
 */
import type net from "node:net";
import tls from "node:tls";
import { basename, dirname, join } from "node:path";
import { openSocketBeneath } from "../../ffi/mod.ts";
import { MAX_SOCKET_PATH } from "../api/mod.ts";
import { getLogger } from "../log/mod.ts";
import { removeIfPresent } from "../lifecycle/mod.ts";

const log = getLogger("migration", "proxy");

/** libvirt's port for the guest's memory in a direct migration (KubeVirt's). */
export const LIBVIRT_DIRECT_MIGRATION_PORT = 49152;
/** libvirt's port for the disks in a block migration (KubeVirt's). */
export const LIBVIRT_BLOCK_MIGRATION_PORT = 49153;

/** The common names a migration client may have (KubeVirt's default `--migration-cn-types`). */
export const MIGRATION_CLIENT_NAMES = [
  "kubevirt.io:system:client:virt-handler",
  "kubevirt.io:system:client:migration",
] as const;
/** The common name a target handler's certificate must have. */
export const MIGRATION_SERVER_NAME = "kubevirt.io:system:node:virt-handler";

/** The ports libvirt migrates through: memory, and the disks' too for a block migration. */
export function migrationPorts(blockMigration: boolean): number[] {
  return blockMigration
    ? [LIBVIRT_DIRECT_MIGRATION_PORT, LIBVIRT_BLOCK_MIGRATION_PORT]
    : [LIBVIRT_DIRECT_MIGRATION_PORT];
}

/** `<id>` for libvirt's connection (port 0), `<id>-<port>` for a direct-migration port. */
export function proxyKey(id: string, port: number): string {
  return port === 0 ? id : `${id}-${port}`;
}

/** The source's unix socket for `key` under `baseDir`. */
export function sourceUnixFile(baseDir: string, key: string): string {
  return join(baseDir, "migrationproxy", `${key}-source.sock`);
}

/** PEM material of one side. */
export interface ProxyTls {
  /** The certificate chain presented. */
  cert: string;
  /** Its key. */
  key: string;
  /** The CA bundle the peer is verified against. */
  ca: string;
}

/** A socket in the target launcher, opened where it lies (beneath the launcher's root). */
export interface ProxyTarget {
  /** The launcher's port this socket serves: 0 for libvirt, else a direct-migration port. */
  port: number;
  /** A path to connect to now; `release` once connected. */
  open(): Promise<{ path: string; release(): void }>;
}

/** Options of {@linkcode MigrationProxyManager}. */
export interface MigrationProxyOptions {
  /** The target side's TLS: the handler's server certificate and the client CA. */
  serverTls: () => ProxyTls;
  /** The source side's TLS: the handler's client certificate and the CA. */
  clientTls: () => ProxyTls;
  /** Address the target listeners bind; all addresses unless told. */
  bindAddress?: string;
  /** Owner of the source sockets (the user the launcher's libvirt runs as), if not root. */
  socketOwner?: { uid: number; gid: number };
  /** The common names a migration client may have; {@linkcode MIGRATION_CLIENT_NAMES} unless given. */
  clientNames?: readonly string[];
}

/** Why a peer's certificate is refused, or undefined when it is let in. */
export function refusePeer(
  peer: tls.PeerCertificate | undefined,
  names: readonly string[],
): string | undefined {
  const cn = peer?.subject?.CN;
  if (!cn) return "the peer presented no certificate";
  const name = Array.isArray(cn) ? cn[0] : cn;
  return names.includes(name)
    ? undefined
    : `the peer certificate's common name "${name}" is not allowed`;
}

/** Waits for `socket`'s write buffer to drain, or for it to close. */
function drained(socket: net.Socket): Promise<void> {
  return new Promise((resolve) => {
    const settle = () => {
      socket.off("drain", settle);
      socket.off("close", settle);
      resolve();
    };
    socket.on("drain", settle);
    socket.on("close", settle);
  });
}

/**
 * Carries bytes both ways between a unix connection and a TLS socket, with backpressure,
 * as KubeVirt's proxy copies them: when either direction reaches its end, everything it
 * read is handed on first, then both sides are closed. `done` runs once, when they are.
 * The TLS socket may be paused; it is resumed here.
 */
function carry(unix: Deno.Conn, remote: net.Socket, done: () => void): () => void {
  let closed = false;
  let writing: Promise<void> = Promise.resolve();
  const close = () => {
    if (closed) return;
    closed = true;
    try {
      unix.close();
    } catch {
      // Closed already: its read loop ended with it.
    }
    remote.destroy();
    done();
  };
  // Remote -> unix: one write at a time, the socket paused meanwhile.
  remote.on("data", (chunk: Uint8Array) => {
    remote.pause();
    writing = writing.then(async () => {
      let at = 0;
      while (at < chunk.length) at += await unix.write(chunk.subarray(at));
      if (!closed) remote.resume();
    });
    writing.catch(close);
  });
  const afterWrites = () => void writing.then(close, close);
  remote.on("end", afterWrites);
  remote.on("close", afterWrites);
  remote.on("error", close);
  // Unix -> remote: read, hand on, wait when the socket's buffer is full.
  (async () => {
    const buffer = new Uint8Array(64 * 1024);
    while (!closed) {
      const n = await unix.read(buffer);
      if (n === null) break;
      if (!remote.write(buffer.slice(0, n))) await drained(remote);
    }
    if (!closed) remote.end(close);
  })().catch(close);
  remote.resume();
  return close;
}

interface Running {
  close(): Promise<void>;
}

/**
 * Why a migration client's connection is refused, or undefined when it is let in: its
 * chain must have been verified against the CA bundle (`authorized`), not only name an
 * allowed common name, so that the check holds whatever the TLS layer was told.
 */
export function refuseMigrationClient(
  client: Pick<tls.TLSSocket, "authorized" | "authorizationError" | "getPeerCertificate">,
  names: readonly string[] = MIGRATION_CLIENT_NAMES,
): string | undefined {
  if (client.authorized !== true) {
    return `the peer certificate is not verified against the CA bundle: ${
      String(client.authorizationError ?? "no verification result")
    }`;
  }
  return refusePeer(client.getPeerCertificate(), names);
}

/**
 * The turn of the next connection once `setup` has settled. A proxy sets its connections up
 * one at a time, in the order they came: QEMU's destination (7.2, the launcher image's) tells
 * a migration's main stream from its multifd streams by the order they connect in, so
 * streams whose set-ups overtook one another (TLS handshakes of varying length) failed the
 * migration ("multifd: received packet magic 5145564d expected 11223344").
 */
function inTurn(setup: Promise<unknown>): Promise<void> {
  return setup.then(() => {}, () => {});
}

/** A target listener: TLS on a free port, each connection carried to `target`, in order. */
class TargetProxy implements Running {
  readonly server: tls.Server;
  readonly #connections = new Set<() => void>();
  /** The last connection's turn to reach the launcher (see {@linkcode inTurn}). */
  #order: Promise<void> = Promise.resolve();
  port = 0;

  constructor(
    key: string,
    readonly launcherPort: number,
    target: ProxyTarget,
    material: ProxyTls,
    clientNames: readonly string[],
  ) {
    // The material as it is when the migration begins: a listener lives for one migration.
    this.server = tls.createServer({
      requestCert: true,
      rejectUnauthorized: true,
      minVersion: "TLSv1.2",
      cert: material.cert,
      key: material.key,
      ca: material.ca,
    }, (client) => {
      const why = refuseMigrationClient(client, clientNames);
      if (why) {
        log.warn("Migration connection refused: {why}", { key, why });
        client.destroy();
        return;
      }
      const drop = () => client.destroy();
      this.#connections.add(drop);
      // As Go's sockets are: libvirt's small RPCs and QEMU's last round go out at once.
      client.setNoDelay(true);
      client.pause();
      const connecting = this.#order.then(async () => {
        if (client.destroyed) throw new Error("the peer left before its turn");
        const opened = await target.open();
        try {
          return await Deno.connect({ transport: "unix", path: opened.path });
        } finally {
          opened.release();
        }
      });
      this.#order = inTurn(connecting);
      connecting.then((inner) => {
        this.#connections.delete(drop);
        if (client.destroyed) {
          inner.close();
          return;
        }
        const close = carry(inner, client, () => this.#connections.delete(close));
        this.#connections.add(close);
      }).catch((error) => {
        log.warn("Cannot open the target launcher's socket: {error}", { key, error });
        client.destroy();
        this.#connections.delete(drop);
      });
    });
    this.server.on("tlsClientError", (error) => {
      log.warn("Migration TLS handshake refused: {error}", { key, error: error.message });
    });
  }

  async listen(host: string): Promise<number> {
    await new Promise<void>((resolve, reject) => {
      this.server.once("error", reject);
      this.server.listen(0, host, () => {
        this.server.off("error", reject);
        resolve();
      });
    });
    this.port = (this.server.address() as net.AddressInfo).port;
    return this.port;
  }

  close(): Promise<void> {
    for (const close of [...this.#connections]) close();
    this.#connections.clear();
    return new Promise((resolve) => this.server.close(() => resolve()));
  }
}

/** A source listener: a unix socket, each connection carried over TLS to `host:port`. */
class SourceProxy implements Running {
  #listener: Deno.Listener<Deno.UnixConn> | undefined;
  #accepting: Promise<void> = Promise.resolve();
  /** The last connection's turn to reach the target (see {@linkcode inTurn}). */
  #order: Promise<void> = Promise.resolve();
  readonly #connections = new Set<() => void>();

  constructor(
    readonly path: string,
    readonly host: string,
    readonly port: number,
    readonly material: () => ProxyTls,
    readonly key: string,
  ) {}

  /** Sets `local` up once the connection accepted before it has its handshake done. */
  #accepted(local: Deno.UnixConn): void {
    this.#order = inTurn(this.#order.then(() => this.#connect(local)));
  }

  /** Carries `local` to the target over TLS; resolves once the handshake has ended, either way. */
  #connect(local: Deno.UnixConn): Promise<void> {
    const { host, port, key } = this;
    let m: ProxyTls;
    try {
      m = this.material();
    } catch (error) {
      log.warn("No client certificate for the migration: {error}", { key, error });
      local.close();
      return Promise.resolve();
    }
    const remote = tls.connect({
      host,
      port,
      cert: m.cert,
      key: m.key,
      ca: m.ca,
      minVersion: "TLSv1.2",
      // The chain is verified against the CA; KubeVirt's node certificates name no host,
      // so the common name is what is checked.
      checkServerIdentity: (_host, peer) => {
        const why = refusePeer(peer, [MIGRATION_SERVER_NAME]);
        return why ? new Error(why) : undefined;
      },
    });
    remote.setNoDelay(true);
    remote.pause();
    // Until the handshake ends, nothing is read from the launcher's side.
    return new Promise<void>((settled) => {
      const refuse = (error: Error) => {
        log.warn("Migration connection to {target} failed: {error}", {
          key,
          target: `${host}:${port}`,
          error: error.message,
        });
        this.#connections.delete(drop);
        local.close();
        remote.destroy();
        settled();
      };
      const drop = () => refuse(new Error("the proxy closed"));
      this.#connections.add(drop);
      remote.once("error", refuse);
      remote.once("secureConnect", () => {
        remote.off("error", refuse);
        this.#connections.delete(drop);
        const close = carry(local, remote, () => this.#connections.delete(close));
        this.#connections.add(close);
        settled();
      });
    });
  }

  async listen(owner?: { uid: number; gid: number }, makeDir = true): Promise<void> {
    const length = new TextEncoder().encode(this.path).length;
    if (length > MAX_SOCKET_PATH) {
      throw new Error(
        `the migration socket path "${this.path}" is ${length} bytes, more than a unix socket takes (${MAX_SOCKET_PATH})`,
      );
    }
    if (makeDir) await Deno.mkdir(dirname(this.path), { recursive: true, mode: 0o755 });
    await removeIfPresent(this.path);
    const listener = Deno.listen({ transport: "unix", path: this.path });
    this.#listener = listener;
    this.#accepting = (async () => {
      for await (const local of listener) this.#accepted(local);
    })().catch(() => {
      // The listener was closed.
    });
    // The folder may be a launcher's: its entries can be swapped for a link to a host file
    // at any moment, so mode and owner change through the socket opened beneath the folder
    // (no link followed, nothing but a socket accepted), never through the path.
    const created = openSocketBeneath(dirname(this.path), basename(this.path));
    try {
      await Deno.chmod(created.path, 0o600);
      if (owner) await Deno.chown(created.path, owner.uid, owner.gid);
    } finally {
      created.release();
    }
  }

  async close(): Promise<void> {
    for (const close of [...this.#connections]) close();
    this.#connections.clear();
    try {
      this.#listener?.close();
    } catch {
      // Closed already.
    }
    await this.#accepting;
    // Closing goes on either way: the next listen() replaces a socket left behind.
    await removeIfPresent(this.path).catch((error) =>
      log.warn("Cannot remove the migration socket {path}: {error}", { path: this.path, error })
    );
  }
}

/** Every migration's proxies on this node, by key (the VMI's UID); see the module doc. */
export class MigrationProxyManager {
  readonly #o: MigrationProxyOptions;
  readonly #targets = new Map<string, { proxies: TargetProxy[]; ports: string }>();
  readonly #sources = new Map<
    string,
    { proxies: SourceProxy[]; spec: string; release: () => void }
  >();
  #shuttingDown = false;

  /** A manager with no proxy open. */
  constructor(options: MigrationProxyOptions) {
    this.#o = options;
  }

  /**
   * Opens a TLS listener for each of the target launcher's sockets (no-op when `key` has
   * them for the same ports already); all or none: a failure closes those opened.
   */
  async startTargetListener(key: string, targets: ProxyTarget[]): Promise<void> {
    if (this.#shuttingDown) throw new Error("the handler is shutting down: no new migration");
    const wanted = JSON.stringify(targets.map((t) => t.port).sort((a, b) => a - b));
    const current = this.#targets.get(key);
    if (current?.ports === wanted) return;
    if (current) await this.stopTargetListener(key);
    const material = this.#o.serverTls();
    const proxies: TargetProxy[] = [];
    try {
      for (const target of targets) {
        const proxy = new TargetProxy(
          key,
          target.port,
          target,
          material,
          this.#o.clientNames ?? MIGRATION_CLIENT_NAMES,
        );
        proxies.push(proxy);
        await proxy.listen(this.#o.bindAddress ?? "0.0.0.0");
      }
    } catch (error) {
      await Promise.all(proxies.map((p) => p.close()));
      throw error;
    }
    this.#targets.set(key, { proxies, ports: wanted });
    log.info("Migration target listeners open", {
      key,
      ports: JSON.stringify(this.targetListenerPorts(key)),
    });
  }

  /** `{<node port>: <launcher port>}` of `key`'s target listeners (empty without). */
  targetListenerPorts(key: string): Record<string, number> {
    const ports: Record<string, number> = {};
    for (const proxy of this.#targets.get(key)?.proxies ?? []) {
      ports[String(proxy.port)] = proxy.launcherPort;
    }
    return ports;
  }

  /** Closes `key`'s target listeners and their connections. */
  async stopTargetListener(key: string): Promise<void> {
    const current = this.#targets.get(key);
    if (!current) return;
    this.#targets.delete(key);
    await Promise.all(current.proxies.map((p) => p.close()));
  }

  /**
   * Opens the source's unix sockets under `baseDir` for `targetPorts` (the target's
   * `{<node port>: <launcher port>}`) to `targetAddress`; no-op when open for the same.
   * The sockets go in `<baseDir>/migrationproxy/` (made when missing), or in
   * `options.socketDir` as it is (a folder opened beneath a launcher's root, which is not
   * to be made through a path someone else controls; `options.release` lets go of it once
   * the sockets are closed and removed); `options.owner` owns them.
   */
  async startSourceListener(
    key: string,
    targetAddress: string,
    targetPorts: Record<string, number>,
    baseDir: string,
    options: {
      socketDir?: string;
      owner?: { uid: number; gid: number };
      release?: () => void;
    } = {},
  ): Promise<void> {
    const release = options.release ?? (() => {});
    if (this.#shuttingDown) {
      release();
      throw new Error("the handler is shutting down: no new migration");
    }
    const spec = JSON.stringify([targetAddress, Object.entries(targetPorts).sort(), baseDir]);
    const socketDir = options.socketDir ?? join(baseDir, "migrationproxy");
    const current = this.#sources.get(key);
    if (current?.spec === spec) {
      release();
      return;
    }
    if (current) await this.stopSourceListener(key);
    const proxies: SourceProxy[] = [];
    try {
      for (const [nodePort, launcherPort] of Object.entries(targetPorts)) {
        const port = Number(nodePort);
        if (!Number.isInteger(port) || port <= 0 || port > 65535) {
          throw new Error(`the target published an invalid port "${nodePort}"`);
        }
        const proxy = new SourceProxy(
          join(socketDir, `${proxyKey(key, launcherPort)}-source.sock`),
          targetAddress,
          port,
          this.#o.clientTls,
          key,
        );
        proxies.push(proxy);
        await proxy.listen(options.owner ?? this.#o.socketOwner, options.socketDir === undefined);
      }
    } catch (error) {
      await Promise.all(proxies.map((p) => p.close()));
      release();
      throw error;
    }
    this.#sources.set(key, { proxies, spec, release });
    log.info("Migration source sockets open", { key, target: targetAddress });
  }

  /** The source's unix sockets of `key`. */
  sourceListenerFiles(key: string): string[] {
    return (this.#sources.get(key)?.proxies ?? []).map((p) => p.path);
  }

  /** Closes `key`'s source sockets, removes their files and ends their connections. */
  async stopSourceListener(key: string): Promise<void> {
    const current = this.#sources.get(key);
    if (!current) return;
    this.#sources.delete(key);
    await Promise.all(current.proxies.map((p) => p.close()));
    // The folder's descriptor names the sockets until they are removed.
    current.release();
  }

  /** How many listeners are open, source and target. */
  openListenerCount(): number {
    let n = 0;
    for (const t of this.#targets.values()) n += t.proxies.length;
    for (const s of this.#sources.values()) n += s.proxies.length;
    return n;
  }

  /** Refuses new migrations and closes every listener. */
  async shutdown(): Promise<void> {
    this.#shuttingDown = true;
    await Promise.all([
      ...[...this.#targets.keys()].map((k) => this.stopTargetListener(k)),
      ...[...this.#sources.keys()].map((k) => this.stopSourceListener(k)),
    ]);
  }
}

/**
 * Notify pipes (KubeVirt mode): a launcher pod cannot reach the handler's notify server,
 * which lives in the handler's own filesystem. So, as KubeVirt's handler does, the
 * handler listens on `domain-notify-pipe.sock` in the pod's share directory
 * (`/var/run/kubevirt` as the pod sees it) and relays every connection a launcher makes
 * there to its own `domain-notify.sock`, byte for byte.
 *
 * Finding the pod's share directory: the handler connects to the launcher's cmd socket
 * (reached beneath the pod's directory, see {@linkcode DialResolver}), asks the kernel
 * which process listens on it (`SO_PEERCRED`), and opens `var/run/kubevirt` inside that
 * process's root (`/proc/<pid>/root`) with `RESOLVE_IN_ROOT`: the pod's own symlinks
 * (`/var/run -> /run`) resolve as the pod sees them, and none leads out of its root. The
 * socket is created through the opened directory's descriptor, set to mode 0600 and
 * given to the VMI's runtime user (non-root VMIs run their launcher as 107). A launcher
 * in the handler's own mount namespace (not in a pod) needs no pipe and gets none.
 *
 * @module
 */
import {
  type BeneathDirectory,
  listenerPid,
  mountNamespaceOf,
  openDirectoryInRoot,
  openSocketBeneath,
} from "../../ffi/mod.ts";
import { Paths, SocketNames } from "../api/mod.ts";
import { getLogger } from "../log/mod.ts";
import type { DialResolver } from "./launcher_clients.ts";

const log = getLogger("handler", "notify-pipes");

/** The share directory inside a launcher pod, relative to its root. */
const POD_SHARE_DIR = Paths.VirtShareDir.replace(/^\/+/, "");

/** One pod's pipe: its listener, the directory it is in, and the relayed connections. */
interface Pipe {
  readonly socket: string;
  readonly dir: BeneathDirectory;
  readonly listener: Deno.Listener;
  readonly conns: Set<Deno.Conn>;
  readonly accepting: Promise<void>;
}

/** Options of {@linkcode NotifyPipes}. */
export interface NotifyPipesOptions {
  /** The handler's notify server socket, where connections are relayed to. */
  notifySocket: string;
  /** How a launcher's cmd socket is reached (the pod provider's resolver). */
  dialResolver: DialResolver;
}

/** The notify pipes of this node's launcher pods, by VMI UID. */
export class NotifyPipes {
  readonly #o: NotifyPipesOptions;
  readonly #pipes = new Map<string, Pipe>();
  /** Launchers that share the handler's mount namespace and dial its socket directly. */
  readonly #direct = new Map<string, string>();

  /** No pipe until {@linkcode NotifyPipes.open}. */
  constructor(options: NotifyPipesOptions) {
    this.#o = options;
  }

  /** Whether the VMI's pipe is open for this launcher socket. */
  has(uid: string, launcherSocket: string): boolean {
    return this.#pipes.get(uid)?.socket === launcherSocket ||
      this.#direct.get(uid) === launcherSocket;
  }

  /**
   * Opens the pipe of the launcher listening on `launcherSocket` (replacing one left by
   * an earlier launcher of the VMI); `runtimeUser` owns the socket. Throws when the
   * launcher or its share directory cannot be reached.
   */
  async open(uid: string, launcherSocket: string, runtimeUser = 0): Promise<void> {
    if (this.has(uid, launcherSocket)) return;
    await this.close(uid);
    const pid = this.launcherPid(launcherSocket);
    if (mountNamespaceOf(pid) === mountNamespaceOf("self")) {
      // Not in a pod: it sees the handler's own share directory, and the notify socket in it.
      this.#direct.set(uid, launcherSocket);
      log.debug("Launcher shares the handler's mount namespace: no notify pipe", { uid, pid });
      return;
    }
    const dir = openDirectoryInRoot(`/proc/${pid}/root`, POD_SHARE_DIR);
    let listener: Deno.Listener;
    try {
      const path = `${dir.path}/${SocketNames.DomainNotifyPipe}`;
      // unlink(2) never follows the last component: a link the pod put there goes, not its target.
      await Deno.remove(path).catch((error) => {
        if (!(error instanceof Deno.errors.NotFound)) throw error;
      });
      listener = Deno.listen({ transport: "unix", path });
      try {
        const created = openSocketBeneath(dir.path, SocketNames.DomainNotifyPipe);
        try {
          await Deno.chmod(created.path, 0o600);
          if (runtimeUser !== 0) await Deno.chown(created.path, runtimeUser, runtimeUser);
        } finally {
          created.release();
        }
      } catch (error) {
        listener.close();
        throw error;
      }
    } catch (error) {
      dir.release();
      throw new Error(
        `Cannot open the notify pipe in the launcher's ${Paths.VirtShareDir}: ${
          (error as Error).message
        }`,
        { cause: error },
      );
    }
    const conns = new Set<Deno.Conn>();
    const pipe: Pipe = {
      socket: launcherSocket,
      dir,
      listener,
      conns,
      accepting: this.#accept(uid, listener, conns),
    };
    this.#pipes.set(uid, pipe);
    log.info("Notify pipe open in the launcher pod", { uid, pid });
  }

  /** Closes the VMI's pipe and its connections and removes its socket; no-op without one. */
  async close(uid: string): Promise<void> {
    this.#direct.delete(uid);
    const pipe = this.#pipes.get(uid);
    if (!pipe) return;
    this.#pipes.delete(uid);
    pipe.listener.close();
    for (const conn of pipe.conns) closeQuietly(conn);
    await pipe.accepting;
    await Deno.remove(`${pipe.dir.path}/${SocketNames.DomainNotifyPipe}`).catch(() => {});
    pipe.dir.release();
  }

  /** Closes every pipe. */
  async closeAll(): Promise<void> {
    this.#direct.clear();
    await Promise.all([...this.#pipes.keys()].map((uid) => this.close(uid)));
  }

  /** The process listening on a launcher socket (`SO_PEERCRED` of a connection to it). */
  launcherPid(launcherSocket: string): number {
    const target = this.#o.dialResolver(launcherSocket);
    try {
      return listenerPid(target.path);
    } finally {
      target.release();
    }
  }

  async #accept(uid: string, listener: Deno.Listener, conns: Set<Deno.Conn>): Promise<void> {
    // Only the relays still running are kept: a long-lived pipe sees many reconnects.
    const relays = new Set<Promise<void>>();
    try {
      for await (const conn of listener) {
        const relay = this.#relay(uid, conn, conns).finally(() => relays.delete(relay));
        relays.add(relay);
      }
    } catch (error) {
      if (!(error instanceof Deno.errors.BadResource)) {
        log.warn("Notify pipe stopped accepting: {error}", { uid, error });
      }
    }
    await Promise.all(relays);
  }

  /** Copies both ways between a launcher's connection and the notify server until one ends. */
  async #relay(uid: string, conn: Deno.Conn, conns: Set<Deno.Conn>): Promise<void> {
    conns.add(conn);
    let upstream: Deno.Conn | undefined;
    try {
      upstream = await Deno.connect({ transport: "unix", path: this.#o.notifySocket });
      conns.add(upstream);
      const up = upstream;
      await Promise.race([
        conn.readable.pipeTo(up.writable, { preventClose: true }),
        up.readable.pipeTo(conn.writable, { preventClose: true }),
      ]);
    } catch (error) {
      log.debug("Notify pipe connection ended: {error}", { uid, error });
    } finally {
      conns.delete(conn);
      closeQuietly(conn);
      if (upstream) {
        conns.delete(upstream);
        closeQuietly(upstream);
      }
    }
  }
}

function closeQuietly(conn: Deno.Conn): void {
  try {
    conn.close();
  } catch { /* closed already */ }
}

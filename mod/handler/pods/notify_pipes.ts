/**
 * Notify pipes (KubeVirt mode): a launcher pod cannot reach the handler's notify server,
 * which lives in the handler's own filesystem. So, as KubeVirt's handler does, the
 * handler listens on `domain-notify-pipe.sock` in the pod's share directory
 * (`/var/run/kubevirt` as the pod sees it) and serves the notify services there itself.
 *
 * A pipe is bound to the VMI it was opened for: each has a notify server of its own (a
 * grpc-js server fed the pipe's connections, about 10 KB each) that refuses a domain or
 * an Event about any other VMI, or a domain without the VMI's UID, so a launcher taken
 * over by its guest cannot fail another tenant's VMI. A pipe serves at most
 * {@linkcode MAX_PIPE_CONNECTIONS} connections at once (a launcher needs one).
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
import * as grpc from "@grpc/grpc-js";
import * as net from "node:net";
import {
  type BeneathDirectory,
  listenerPid,
  mountNamespaceOf,
  openDirectoryInRoot,
  openSocketBeneath,
} from "../../../ffi/mod.ts";
import { Paths, SocketNames } from "../../api/mod.ts";
import { getLogger } from "../../log/mod.ts";
import { notifyInfoService, notifyService } from "../../proto/mod.ts";
import type { DialResolver } from "../launcher_clients.ts";
import { type NotifyHandlers, notifyImplementation, type NotifySender } from "../notify_server.ts";
import { removeIfPresent } from "../../lifecycle/mod.ts";

const log = getLogger("handler", "notify-pipes");

/** The share directory inside a launcher pod, relative to its root. */
const POD_SHARE_DIR = Paths.VirtShareDir.replace(/^\/+/, "");

/**
 * Connections one pipe serves at once: a launcher keeps one, and a new one while the old
 * is closing; more are refused (closed at once).
 */
export const MAX_PIPE_CONNECTIONS = 4;

/** One pod's pipe: its listener, the directory it is in, and its own notify server. */
interface Pipe {
  readonly socket: string;
  readonly dir: BeneathDirectory;
  readonly listener: net.Server;
  readonly server: grpc.Server;
  readonly conns: Set<net.Socket>;
}

/** Options of {@linkcode NotifyPipes}. */
export interface NotifyPipesOptions {
  /** Where a pipe's messages go once they passed the pipe's VMI check. */
  handlers: NotifyHandlers;
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
   * Opens the pipe of the launcher listening on `launcherSocket` for the VMI `sender`
   * (replacing one left by an earlier launcher of the VMI); `runtimeUser` owns the
   * socket. Throws when the launcher or its share directory cannot be reached.
   */
  async open(sender: NotifySender, launcherSocket: string, runtimeUser = 0): Promise<void> {
    const uid = sender.uid;
    if (this.has(uid, launcherSocket)) return;
    await this.close(uid);
    const pid = await this.launcherPid(launcherSocket);
    if (mountNamespaceOf(pid) === mountNamespaceOf("self")) {
      // Not in a pod: it sees the handler's own share directory, and the notify socket in it.
      this.#direct.set(uid, launcherSocket);
      log.debug("Launcher shares the handler's mount namespace: no notify pipe", { uid, pid });
      return;
    }
    const dir = openDirectoryInRoot(`/proc/${pid}/root`, POD_SHARE_DIR);
    const conns = new Set<net.Socket>();
    const server = new grpc.Server();
    const implementation = notifyImplementation(this.#o.handlers, sender);
    server.addService(notifyService(), implementation.notify);
    server.addService(notifyInfoService(), implementation.info);
    const injector = server.createConnectionInjector(grpc.ServerCredentials.createInsecure());
    const listener = net.createServer((conn) => {
      if (conns.size >= MAX_PIPE_CONNECTIONS) {
        log.warn("Notify pipe refused a connection: {count} open already", {
          uid,
          count: conns.size,
        });
        conn.destroy();
        return;
      }
      conns.add(conn);
      conn.once("close", () => conns.delete(conn));
      injector.injectConnection(conn);
    });
    try {
      const path = `${dir.path}/${SocketNames.DomainNotifyPipe}`;
      // unlink(2) never follows the last component: a link the pod put there goes, not its target.
      await Deno.remove(path).catch((error) => {
        if (!(error instanceof Deno.errors.NotFound)) throw error;
      });
      await new Promise<void>((resolve, reject) => {
        listener.once("error", reject);
        listener.listen(path, () => {
          listener.off("error", reject);
          resolve();
        });
      });
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
      server.forceShutdown();
      dir.release();
      throw new Error(
        `Cannot open the notify pipe in the launcher's ${Paths.VirtShareDir}: ${
          (error as Error).message
        }`,
        { cause: error },
      );
    }
    this.#pipes.set(uid, { socket: launcherSocket, dir, listener, server, conns });
    log.info("Notify pipe open in the launcher pod", { uid, pid });
  }

  /** Closes the VMI's pipe and its connections and removes its socket; no-op without one. */
  async close(uid: string): Promise<void> {
    this.#direct.delete(uid);
    const pipe = this.#pipes.get(uid);
    if (!pipe) return;
    this.#pipes.delete(uid);
    // close() waits for open connections: they are ended right after it stops accepting.
    const closed = new Promise<void>((resolve) => pipe.listener.close(() => resolve()));
    for (const conn of pipe.conns) conn.destroy();
    pipe.server.forceShutdown();
    await closed;
    // The directory must be released either way; the pod's volume goes with the pod.
    await removeIfPresent(`${pipe.dir.path}/${SocketNames.DomainNotifyPipe}`).catch((error) =>
      log.warn("Cannot remove the notify pipe socket: {error}", { uid, error })
    );
    pipe.dir.release();
  }

  /** Closes every pipe. */
  async closeAll(): Promise<void> {
    this.#direct.clear();
    await Promise.all([...this.#pipes.keys()].map((uid) => this.close(uid)));
  }

  /**
   * The process listening on a launcher socket (`SO_PEERCRED` of a connection to it, checked
   * against its pidfd); a launcher that stopped accepting fails it after `listenerPid`'s
   * deadline, without blocking the event loop.
   */
  async launcherPid(launcherSocket: string): Promise<number> {
    const target = this.#o.dialResolver(launcherSocket);
    try {
      return await listenerPid(target.path);
    } catch (error) {
      throw new Error(
        `Cannot find the launcher listening on "${launcherSocket}": ${(error as Error).message}`,
        { cause: error },
      );
    } finally {
      target.release();
    }
  }
}

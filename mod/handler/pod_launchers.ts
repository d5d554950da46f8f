/**
 * KubeVirt mode's {@linkcode LauncherProvider}: virt-controller creates a launcher pod
 * per VMI and the kubelet runs it; the handler starts and stops nothing. It finds the
 * pod's cmd socket below the kubelet's pods directory, for the pods `status.activePods`
 * names on this node, and records it in the VMI's ghost record before the first call.
 *
 * The kubelet's pod volume paths are longer than a unix socket address allows (108
 * bytes); such a socket is reached through a short link in a handler-owned directory.
 *
 * @module
 */
import { join } from "node:path";
import { launcherSocketDirOnHost, SocketNames, type VirtualMachineInstance } from "../api/mod.ts";
import { aborted } from "../lifecycle/mod.ts";
import type { GhostRecordStore } from "./ghost_records.ts";
import {
  type LauncherProvider,
  launchersOfGhostRecords,
  type LauncherStart,
} from "./launcher_provider.ts";

/**
 * How soon a VMI whose pod socket has not appeared is looked at again, ms (nothing
 * watches the kubelet's directories for it).
 */
export const POD_SOCKET_POLL_MS = 250;

/** Longest unix socket path dialled directly (sun_path is 108 bytes with its NUL). */
const MAX_SOCKET_PATH = 100;

/** Options of {@linkcode PodLaunchers}. */
export interface PodLaunchersOptions {
  /** This node's name: only pods on it are looked at. */
  nodeName: string;
  /** The ghost record store the handler keeps. */
  ghosts: GhostRecordStore;
  /** The kubelet's pods directory (`/var/lib/kubelet/pods`). */
  podsDir: string;
  /** A short, handler-owned directory for links to long socket directories. */
  linkDir: string;
}

/** Launchers as the pods virt-controller creates. */
export class PodLaunchers implements LauncherProvider {
  /** For logs. */
  readonly name = "kubevirt";
  /** virt-controller schedules VMIs and owns `Ready` here. */
  readonly standsInForController = false;
  /** See {@linkcode POD_SOCKET_POLL_MS}. */
  readonly notReadyRequeueMs: number = POD_SOCKET_POLL_MS;
  readonly #o: PodLaunchersOptions;

  /** Creates the provider; it only looks, so nothing starts. */
  constructor(options: PodLaunchersOptions) {
    this.#o = options;
  }

  /** The ghost record's socket, else the socket of an active pod of the VMI on this node. */
  async socketOf(vmi: VirtualMachineInstance): Promise<string | undefined> {
    const ghost = this.#o.ghosts.get(vmi.metadata.uid!);
    if (ghost) return ghost.socketFile;
    for (const [podUid, node] of Object.entries(vmi.status?.activePods ?? {})) {
      if (node !== this.#o.nodeName || !/^[0-9a-zA-Z-]+$/.test(podUid)) continue;
      const dir = launcherSocketDirOnHost(podUid, this.#o.podsDir);
      const socket = join(dir, SocketNames.Launcher);
      try {
        await Deno.lstat(socket);
      } catch {
        continue; // not this pod's, or not ready yet
      }
      if (socket.length <= MAX_SOCKET_PATH) return socket;
      return join(await this.#shortLink(podUid, dir), SocketNames.Launcher);
    }
    return undefined;
  }

  async #shortLink(podUid: string, dir: string): Promise<string> {
    const link = join(this.#o.linkDir, podUid);
    await Deno.mkdir(this.#o.linkDir, { recursive: true, mode: 0o700 });
    try {
      if ((await Deno.readLink(link)) !== dir) {
        await Deno.remove(link);
        await Deno.symlink(dir, link);
      }
    } catch {
      await Deno.symlink(dir, link);
    }
    return link;
  }

  /** Finds the pod's socket and records it; starts nothing (the pod is virt-controller's). */
  async start(vmi: VirtualMachineInstance): Promise<LauncherStart> {
    const uid = vmi.metadata.uid!;
    const socket = await this.socketOf(vmi);
    if (!socket) return { absent: "the launcher pod's socket has not appeared yet" };
    if (!this.#o.ghosts.get(uid)) {
      await this.#o.ghosts.add({
        name: vmi.metadata.name,
        namespace: vmi.metadata.namespace!,
        socketFile: socket,
        uid,
      });
    }
    return { socket };
  }

  /** Nothing to stop: the pod ends with the VMI, by virt-controller and the kubelet. */
  stop(_vmi: VirtualMachineInstance): Promise<void> {
    return Promise.resolve();
  }

  /** Every ghost record's launcher. */
  adoptable(): { uid: string; socket: string; namespace: string; name: string }[] {
    return launchersOfGhostRecords(this.#o.ghosts);
  }

  /** Nothing runs in the background here; resolves when `signal` aborts. */
  run(signal: AbortSignal): Promise<void> {
    return aborted(signal);
  }
}

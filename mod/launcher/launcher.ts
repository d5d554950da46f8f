/**
 * The launcher's lifecycle: open libvirt, forward the VMI's domain events to the
 * handler, serve the cmd socket, and stop the way KubeVirt's virt-launcher stops.
 *
 * - SIGTERM (or SIGINT, or the `signal` option): the guest gets an ACPI power-button
 *   press, repeated every 5 s, and is destroyed when the grace period is over; then its
 *   definition is removed (a launcher's domain does not outlive its launcher, as in a
 *   KubeVirt pod), the last events are delivered, the socket is removed: exit code 0.
 * - The domain stops although nobody asked (no Shutdown, Kill or Delete command, no
 *   signal): the event is reported and the launcher exits, with code 0 when the guest
 *   powered itself off (Shutoff/Shutdown) and {@linkcode EXIT_DOMAIN_FAILED} otherwise
 *   (QEMU crashed or was killed). The definition is kept for the handler to inspect.
 *
 * @module
 */

import { CpuPool } from "./cpu_pool.ts";
import { type Connection, NetnsRunner, openLibvirt } from "../../ffi/mod.ts";
import { Paths } from "../api/mod.ts";
import { DhcpServers } from "../network/mod.ts";
import { getLogger } from "../log/mod.ts";
import type { LauncherOptions } from "./args/mod.ts";
import { ConnectionKeeper } from "./connection_keeper.ts";
import { type EventSink, NO_SINK } from "./event_forwarder.ts";
import { EXIT_DOMAIN_FAILED, LauncherInstance } from "./instance.ts";
import { NotifyClient, type NotifyTimeouts } from "./notify_client.ts";

const log = getLogger("launcher");

/** Exit code when the launcher could not start (libvirt, socket). */
export const EXIT_START_FAILED = 2;

/** After a stop signal, how long queued notify events may still take to be delivered. */
const FINAL_DELIVERY_MS = 3_000;

/** Extra knobs of {@linkcode runLauncher}, mostly for tests and embedding. */
export interface LauncherRuntime {
  /** Aborting it starts the graceful stop, like SIGTERM. */
  signal?: AbortSignal;
  /** Listen for SIGTERM and SIGINT; true unless told. */
  handleSignals?: boolean;
  /** Called once the socket is `launcher-sock` (ready). */
  onReady?: (socketPath: string) => void;
  /** Notify retry timing; KubeVirt's unless told. */
  notifyTimeouts?: NotifyTimeouts;
  /**
   * libvirt call workers (each is a V8 isolate of roughly 10 MB); 1 unless told. Commands
   * run one at a time anyway, so one worker only delays a GetDomain behind a start.
   */
  libvirtWorkers?: number;
}

/**
 * Runs the launcher until it is told to stop or its domain dies; resolves with the
 * process exit code (0 after a SIGTERM-driven stop). Never rejects: start-up failures
 * are logged and give {@linkcode EXIT_START_FAILED}.
 */
export async function runLauncher(
  options: LauncherOptions,
  runtime: LauncherRuntime = {},
): Promise<number> {
  const vmi = { namespace: options.namespace, name: options.name, uid: options.uid };
  let conn: Connection;
  try {
    conn = await openLibvirt(options.libvirtUri, { workers: runtime.libvirtWorkers ?? 1 });
  } catch (error) {
    log.error("Cannot start the launcher", { ...vmi, error: String(error) });
    return EXIT_START_FAILED;
  }
  // The instance is created below; the keeper calls it only after a reconnect.
  const keeper: ConnectionKeeper = new ConnectionKeeper(conn, {
    vmi,
    onRestored: (): Promise<void> => instance.resync(),
  });
  const netns = new NetnsRunner();
  const dhcp = new DhcpServers(netns);
  const sink: EventSink = options.notifySocket
    ? new NotifyClient(options.notifySocket, runtime.notifyTimeouts)
    : NO_SINK;
  const instance = new LauncherInstance({
    vmi,
    connection: conn,
    keeper,
    sink,
    socketDir: options.socketDir,
    gracePeriodSeconds: options.gracePeriodSeconds,
    migrationSocketDir: options.migrationSocketDir,
    converter: {
      runDir: options.runDir,
      diskDir: options.diskDir,
      imageDir: options.imageDir,
      hostDiskRoot: options.hostDiskRoot,
      domainType: options.domainType,
      ovmfDir: options.ovmfDir,
      // A VMI with dedicated CPUs gets the pod's (the CPU manager gave its container them).
      cpuPool: CpuPool.ofThisProcess(),
      // In its pod: its own network namespace, the handler's DHCP facts in the pod's
      // private directory, and the pod's host name for the guest.
      network: { runner: netns, dhcp, privateDir: Paths.VirtPrivateDir, hostname: Deno.hostname() },
    },
  });
  const offEvents = conn.onEvent((event) => instance.handle(event));

  const onSignal = () => instance.requestStop();
  const signals: Deno.Signal[] = runtime.handleSignals === false ? [] : ["SIGTERM", "SIGINT"];
  for (const s of signals) Deno.addSignalListener(s, onSignal);
  runtime.signal?.addEventListener("abort", onSignal, { once: true });
  if (runtime.signal?.aborted) onSignal();

  try {
    let socket: string;
    try {
      socket = await instance.serve();
    } catch (error) {
      log.error("Cannot start the launcher", { ...vmi, error: String(error) });
      return EXIT_START_FAILED;
    }
    runtime.onReady?.(socket);
    log.info("Launcher ready", { ...vmi, socket });

    const end = await instance.ended;
    const exitCode = end.kind === "stop" ? 0 : instance.reportDied(end.state);
    if (end.kind === "stop") await instance.shutdownGuest();
    // Told to stop, the launcher owes its caller a prompt exit (grace period plus a few
    // seconds): a handler that is gone gets a short last chance, not the full retry time.
    await instance.forwarder.idle();
    const delivered = end.kind === "stop"
      ? await sink.flush(FINAL_DELIVERY_MS)
      : await sink.flush();
    if (!delivered) log.warn("Some notify events were not delivered", vmi);
    return exitCode;
  } finally {
    for (const s of signals) Deno.removeSignalListener(s, onSignal);
    runtime.signal?.removeEventListener("abort", onSignal);
    // The launcher is exiting: the process takes its socket and libvirt handles with it.
    await instance.close().catch(() => {});
    await dhcp.close();
    netns.close();
    offEvents();
    sink.close();
    await keeper.stop();
    // The launcher is exiting: the connection ends with the process.
    await conn.close().catch(() => {});
  }
}

export {
  EventForwarder,
  type EventSink,
  type ForwardedDomain,
  updatesDomain,
} from "./event_forwarder.ts";
export { EXIT_DOMAIN_FAILED };

/**
 * The launcher host (`virtnode launcher-host`): pod-less mode's one long-lived process
 * that serves every VMI's launcher on this host. In pod-less mode the guest is QEMU under
 * the host's libvirtd, not a child of the launcher, so a process per VMI buys no
 * isolation and costs a Deno start (about 1 CPU-second) and 34 MB each; the host runs one
 * {@linkcode LauncherInstance} per VMI instead: the same cmd socket, paths and notify
 * events as a `virtnode launcher` process, with libvirt call workers that grow while calls
 * wait, each on a libvirt connection of its own, and the domain events on one more: a hung
 * libvirt call holds its worker and its connection, never another VMI's call or event.
 *
 * The handler drives it over a control socket (`<dir>/control.sock`, mode 0600): one JSON
 * object per line each way.
 * - `{"id":1,"op":"start","spec":{namespace,name,uid,gracePeriodSeconds,socketDir,runDir,diskDir}}`
 *   -> `{"id":1,"ok":true,"vm":{uid,state:"ready",socket}}` once the VMI's cmd socket is
 *   `launcher-sock`; for a VMI whose domain died, `state` is `exited` (restart policy none).
 *   With `"sync":"<VMI JSON>"` the host then does what a `SyncVirtualMachine` on that socket
 *   does, and answers with `"synced":{}` or `"synced":{"error":"..."}`: the handler's first
 *   sync of a VMI is one control round trip, not a control round trip, a new HTTP/2
 *   connection and a gRPC call.
 * - `{"id":2,"op":"stop","uid":...,"namespace":...,"name":...}`: the graceful stop a SIGTERM
 *   gives a launcher (ACPI within the grace period, then destroy, then undefine), or the
 *   removal of the domain a launcher that ended left; answered when done.
 * - `{"id":3,"op":"list"}` -> `{"id":3,"ok":true,"vms":[...]}`.
 * - `{"id":4,"op":"credentials","uid":...,"accessCredentials":[...],"secrets":{...}}`: a VMI's
 *   access credentials and the text of their Secrets, for its guest agent (kept in memory).
 * - pushed to every connection: `{"event":"exited","uid":...,"code":1,"why":"..."}`.
 *
 * What it serves is kept in `<dir>/vms/<uid>.json` (written before the instance starts)
 * and `<uid>.exit` (written when the domain died), so a host that crashed or was
 * restarted takes every VMI back: it serves the same sockets again (renaming the new
 * socket over the old one, so the handler never sees it missing), re-reads each domain
 * and reports it. Neither a crash nor a SIGTERM of the host stops a guest; only a `stop`
 * does.
 *
 * @module
 */

import { CpuPool } from "./cpu_pool.ts";
import { join } from "node:path";
import {
  type Connection,
  errorText,
  LIBVIRT_ERROR_CODES,
  LibvirtError,
  NetnsRunner,
  openLibvirt,
  writeFileDurably,
} from "../../ffi/mod.ts";
import { isJsonObject } from "../api/mod.ts";
import { domainNameOf } from "../domain/mod.ts";
import { DhcpServers, hostTapFor, restoreGuestNetwork } from "../network/mod.ts";
import { getLogger } from "../log/mod.ts";
import { ConnectionKeeper } from "./connection_keeper.ts";
import { launcherSocketPath } from "./cmd_server.ts";
import { type EventSink, NO_SINK } from "./event_forwarder.ts";
import { LauncherInstance } from "./instance.ts";
import { NotifyClient, type NotifyTimeouts } from "./notify_client.ts";
import {
  checkHostedVmSpec,
  type HostedVmSpec,
  HostedVmSpecError,
  type HostedVmStatus,
  type LauncherHostOptions,
  readLines,
  UID,
  writeAll,
} from "./host_protocol/mod.ts";

import { grantKvm, type QemuUser, qemuUserOfCapabilities } from "./qemu_user.ts";
import { forEachLimited, removeIfPresent } from "../lifecycle/mod.ts";

const log = getLogger("launcher", "host");

/** Extra knobs of {@linkcode runLauncherHost} for tests and embedding. */
export interface LauncherHostRuntime {
  /** Aborting it ends the host (guests keep running). */
  signal?: AbortSignal;
  /** Listen for SIGTERM and SIGINT; true unless told. */
  handleSignals?: boolean;
  /** Called once the control socket listens and every VMI is taken back. */
  onReady?: (controlSocket: string) => void;
  /** Notify retry timing; KubeVirt's unless told. */
  notifyTimeouts?: NotifyTimeouts;
}

/** Exit code when the host could not start (libvirt, control socket). */
export const EXIT_HOST_START_FAILED = 2;

/** Where libvirt keeps its QEMU guests' logs (the default `log_dir` of qemu.conf). */
const QEMU_LOG_DIR = "/var/log/libvirt/qemu";

/** VMIs taken back at once after a restart. */
const ADOPT_CONCURRENCY = 16;

interface Hosted {
  spec: HostedVmSpec;
  status: HostedVmStatus;
  instance?: LauncherInstance;
  /** Settles once the instance serves (or failed to). */
  started: Promise<void>;
  /** Settles once a `stop` finished. */
  stopping?: Promise<void>;
}

/** The stored containerDisks a VMI's domain reads, for its status (none: nothing). */
function storedDisksOf(spec: HostedVmSpec): { containerDisks?: string[] } {
  const files = Object.values(spec.containerDisks ?? {});
  return files.length > 0 ? { containerDisks: files } : {};
}

/** The launchers of one host; see the module doc. */
export class LauncherHost {
  readonly #o: LauncherHostOptions;
  readonly #conn: Connection;
  readonly #keeper: ConnectionKeeper;
  readonly #sink: EventSink;
  readonly #vms = new Map<string, Hosted>();
  readonly #byDomain = new Map<string, LauncherInstance>();
  readonly #clients = new Set<(line: string) => void>();
  readonly #vmDir: string;
  /** The user libvirt runs QEMU as, when it names one. */
  readonly #qemuUser: QemuUser | undefined;
  /** Makes the guests' DHCP sockets inside their pod namespaces. */
  readonly #netns = new NetnsRunner();
  /** Every guest's DHCP servers, on one wait. */
  readonly #dhcp = new DhcpServers(this.#netns);
  /** The CPUs the host's VMIs with dedicated CPUs get theirs from (cpu_pool.ts). */
  readonly #cpuPool = CpuPool.ofThisProcess();

  private constructor(
    options: LauncherHostOptions,
    conn: Connection,
    sink: EventSink,
    qemuUser: QemuUser | undefined,
  ) {
    this.#o = options;
    this.#qemuUser = qemuUser;
    this.#conn = conn;
    this.#sink = sink;
    this.#vmDir = join(options.dir, "vms");
    this.#keeper = new ConnectionKeeper(conn, {
      vmi: { namespace: "", name: "launcher-host", uid: "" },
      onRestored: async () => {
        await Promise.all(
          [...this.#vms.values()].map((h) =>
            h.instance?.resync().catch((error) =>
              log.warn("Cannot resync {uid} after reconnecting: {error}", {
                uid: h.spec.uid,
                error,
              })
            )
          ),
        );
      },
    });
    conn.onEvent((event) => this.#byDomain.get(event.domain.name)?.handle(event));
  }

  /** Opens libvirt and the notify client; serves nothing yet. */
  static async open(
    options: LauncherHostOptions,
    notifyTimeouts?: NotifyTimeouts,
  ): Promise<LauncherHost> {
    const conn = await openLibvirt(options.libvirtUri, {
      workers: 2,
      maxWorkers: options.maxWorkers ?? 8,
      eventConnection: true,
      connectionPerWorker: true,
    });
    const sink = options.notifySocket
      ? new NotifyClient(options.notifySocket, notifyTimeouts)
      : NO_SINK;
    // The user QEMU runs as (libvirt's qemu.conf): what QEMU opens is prepared for it.
    const qemuUser = qemuUserOfCapabilities(await conn.getCapabilities());
    if (qemuUser && qemuUser.uid !== 0) {
      log.info("QEMU runs as a user other than root", { ...qemuUser });
      try {
        grantKvm(qemuUser);
      } catch (error) {
        log.warn("Cannot let QEMU's user use /dev/kvm: {error}", { error: String(error) });
      }
    }
    return new LauncherHost(options, conn, sink, qemuUser);
  }

  /** The control socket's path. */
  get controlSocket(): string {
    return join(this.#o.dir, "control.sock");
  }

  /** Every hosted VMI. */
  list(): HostedVmStatus[] {
    return [...this.#vms.entries()].map(([uid, h]) => {
      const cpus = this.#cpuPool.held(uid);
      return { ...h.status, ...(cpus ? { dedicatedCpus: [...cpus] } : {}) };
    });
  }

  /** Takes back every VMI of `<dir>/vms` (after a crash or restart); returns how many. */
  async adoptAll(): Promise<number> {
    await Deno.mkdir(this.#vmDir, { recursive: true, mode: 0o700 });
    const specs: HostedVmSpec[] = [];
    // Read synchronously: Deno 2.9.3 may close a node:net socket's descriptor twice, and a
    // directory's read on another thread must not fall in between (docs/compatibility.md).
    for (const entry of Deno.readDirSync(this.#vmDir)) {
      if (!entry.isFile || !entry.name.endsWith(".json")) continue;
      const file = join(this.#vmDir, entry.name);
      try {
        specs.push(checkHostedVmSpec(JSON.parse(await Deno.readTextFile(file))));
      } catch (error) {
        log.error("Launcher spec set aside: {error}", { file, error: String(error) });
        // Logged above; a spec left in place fails, and is logged, again at the next start.
        await Deno.rename(file, `${file}.bad`).catch(() => {});
      }
    }
    await forEachLimited(specs, ADOPT_CONCURRENCY, (s) => this.#adopt(s));
    return specs.length;
  }

  async #adopt(spec: HostedVmSpec): Promise<void> {
    // No exit file (the usual reason it cannot be read): the VM has not ended, and is adopted.
    const exit = await Deno.readTextFile(this.#exitFile(spec.uid)).catch(() => undefined);
    if (exit !== undefined) {
      let code = 1;
      let why = "the domain stopped";
      try {
        ({ code, why } = JSON.parse(exit));
      } catch { /* keep the defaults */ }
      this.#vms.set(spec.uid, {
        spec,
        started: Promise.resolve(),
        status: {
          uid: spec.uid,
          state: "exited",
          socket: this.#socketOf(spec),
          code,
          why,
          ...storedDisksOf(spec),
        },
      });
      return;
    }
    const hosted = this.#launch(spec, true);
    await hosted.started;
  }

  #specFile(uid: string): string {
    return join(this.#vmDir, `${uid}.json`);
  }

  #exitFile(uid: string): string {
    return join(this.#vmDir, `${uid}.exit`);
  }

  #socketOf(spec: HostedVmSpec): string {
    return launcherSocketPath(spec.socketDir);
  }

  /** Serves a VMI (idempotent: a known UID gets its current status). */
  async start(raw: unknown): Promise<HostedVmStatus> {
    return (await this.#serve(raw)).status;
  }

  async #serve(raw: unknown): Promise<{ hosted: Hosted; status: HostedVmStatus }> {
    const spec = checkHostedVmSpec(raw);
    let hosted = this.#vms.get(spec.uid);
    if (!hosted) {
      await Deno.mkdir(this.#vmDir, { recursive: true, mode: 0o700 });
      await writeFileDurably(this.#specFile(spec.uid), JSON.stringify(spec));
      hosted = this.#vms.get(spec.uid) ?? this.#launch(spec, false);
    }
    await hosted.started;
    return { hosted, status: { ...hosted.status } };
  }

  /**
   * Serves a VMI, then syncs its domain as `SyncVirtualMachine` on its cmd socket would;
   * a sync that fails is reported in `synced.error` (the VMI stays served, as a launcher
   * stays up after a failed call). A launcher that is not ready syncs nothing.
   */
  async startAndSync(
    raw: unknown,
    vmiJson: string,
    options?: Record<string, unknown> | null,
  ): Promise<{ status: HostedVmStatus; synced?: { error?: string } }> {
    const { hosted, status } = await this.#serve(raw);
    const instance = hosted.instance;
    if (status.state !== "ready" || !instance) return { status };
    try {
      await instance.manager.syncVmi(vmiJson, options);
      return { status, synced: {} };
    } catch (error) {
      const message = errorText(error);
      log.warn("Command failed", {
        rpc: "SyncVirtualMachine",
        uid: hosted.spec.uid,
        error: message,
      });
      return { status, synced: { error: message } };
    }
  }

  #launch(spec: HostedVmSpec, adopting: boolean): Hosted {
    const vmi = { namespace: spec.namespace, name: spec.name, uid: spec.uid };
    const instance = new LauncherInstance({
      vmi,
      connection: this.#conn,
      keeper: this.#keeper,
      sink: this.#sink,
      socketDir: spec.socketDir,
      gracePeriodSeconds: spec.gracePeriodSeconds,
      migrationSocketDir: this.#o.migrationSocketDir,
      converter: {
        runDir: spec.runDir,
        diskDir: spec.diskDir,
        imageDir: this.#o.imageDir,
        hostDiskRoot: this.#o.hostDiskRoot,
        domainType: this.#o.domainType,
        ovmfDir: this.#o.ovmfDir,
        containerDisks: spec.containerDisks,
        qemuUser: this.#qemuUser,
        cpuPool: this.#cpuPool,
        network: spec.netns === undefined ? undefined : {
          runner: this.#netns,
          dhcp: this.#dhcp,
          netns: spec.netns,
          hostTap: (plan) => hostTapFor(spec.uid, plan),
        },
      },
    });
    const hosted: Hosted = {
      spec,
      instance,
      status: {
        uid: spec.uid,
        state: "starting",
        socket: this.#socketOf(spec),
        ...storedDisksOf(spec),
      },
      started: Promise.resolve(),
    };
    this.#vms.set(spec.uid, hosted);
    this.#byDomain.set(instance.domainName, instance);
    hosted.started = (async () => {
      try {
        await Deno.mkdir(spec.socketDir, { recursive: true, mode: 0o700 });
        await instance.serve({ replaceReady: adopting });
        if (hosted.status.state === "starting") hosted.status.state = "ready";
        if (adopting) {
          // The CPUs its domain is pinned to stay its own.
          await instance.manager.holdPinnedCpus();
          await instance.resync("adopt");
          // A running guest's DHCP servers come back (a guest that reboots asks again).
          await restoreGuestNetwork(spec.uid, { dhcp: this.#dhcp, privateDir: spec.runDir })
            .catch((error) =>
              log.warn("Cannot restore the guest's DHCP servers: {error}", { ...vmi, error })
            );
        }
        log.info(adopting ? "Launcher taken back" : "Launcher ready", {
          ...vmi,
          socket: instance.socketPath,
        });
      } catch (error) {
        log.error("Cannot serve the launcher", { ...vmi, error: String(error) });
        await this.#exited(hosted, 2, `cannot serve the cmd socket: ${String(error)}`);
      }
    })();
    instance.ended.then(async (end) => {
      if (end.kind !== "died" || hosted.stopping) return;
      const code = instance.reportDied(end.state);
      await instance.forwarder.idle();
      await this.#exited(
        hosted,
        code,
        `the domain stopped unrequested: ${end.state.status} (${end.state.reason})`,
      );
    });
    return hosted;
  }

  /** A VMI's launcher ended without being told (its domain died): as a launcher exiting. */
  async #exited(hosted: Hosted, code: number, why: string): Promise<void> {
    const instance = hosted.instance;
    hosted.instance = undefined;
    if (instance) await this.#release(instance);
    hosted.status = { ...hosted.status, state: "exited", code, why };
    await writeFileDurably(this.#exitFile(hosted.spec.uid), JSON.stringify({ code, why })).catch(
      (error) => log.warn("Cannot record the launcher's end: {error}", { error }),
    );
    log.info("Launcher ended with code {code}", { uid: hosted.spec.uid, code, why });
    this.#push({ event: "exited", uid: hosted.spec.uid, code, why });
  }

  /** Stops serving an instance's socket and stops routing its domain's events to it. */
  async #release(instance: LauncherInstance): Promise<void> {
    if (this.#byDomain.get(instance.domainName) === instance) {
      this.#byDomain.delete(instance.domainName);
    }
    await instance.close().catch((error) =>
      log.warn("Cannot close the launcher instance {domain}: {error}", {
        domain: instance.domainName,
        error,
      })
    );
  }

  /**
   * Stops a VMI's guest gracefully and forgets it (idempotent). A launcher that ended on
   * its own left its domain defined for inspection; it is removed here, as is a domain of
   * a VMI the host does not know (`vmi` names it; its records were lost).
   */
  async stop(uid: unknown, vmi?: { namespace?: unknown; name?: unknown }): Promise<void> {
    if (typeof uid !== "string" || !UID.test(uid)) {
      throw new HostedVmSpecError(`uid ${JSON.stringify(uid)} is not valid`);
    }
    const hosted = this.#vms.get(uid);
    if (!hosted) {
      if (typeof vmi?.namespace === "string" && typeof vmi.name === "string") {
        await this.#reap({ namespace: vmi.namespace, name: vmi.name, uid });
        await this.#removeQemuLogs(domainNameOf(vmi.namespace, vmi.name));
      }
      await removeIfPresent(this.#specFile(uid));
      await removeIfPresent(this.#exitFile(uid));
      return;
    }
    hosted.stopping ??= (async () => {
      // start()'s failure went to its caller; stopping goes on either way.
      await hosted.started.catch(() => {});
      const instance = hosted.instance;
      if (instance) {
        hosted.status.state = "stopping";
        instance.requestStop();
        // Its last events are handed to the notify client, which outlives the VMI here.
        await instance.shutdownGuest();
        await this.#release(instance);
        instance.manager.releaseCpus();
      } else {
        await this.#reap(hosted.spec);
      }
      await this.#removeQemuLogs(domainNameOf(hosted.spec.namespace, hosted.spec.name));
      // The VM is stopped: it is forgotten either way. A spec file left behind is read
      // again when the host restarts, so it is reported.
      for (const file of [this.#specFile(uid), this.#exitFile(uid)]) {
        await removeIfPresent(file).catch((error) =>
          log.warn("Cannot remove {file}: {error}", { uid, file, error })
        );
      }
      this.#vms.delete(uid);
      log.info("Launcher stopped", { uid });
    })();
    await hosted.stopping;
  }

  /**
   * Hands a served VMI's launcher its `spec.accessCredentials` (`credentials`) and the text
   * of the Secrets they name (`secrets`: Secret name to key to value), which it puts into
   * the guest through the agent. Kept in memory only: nothing of a Secret is written here.
   */
  async credentials(uid: unknown, credentials: unknown, secrets: unknown): Promise<void> {
    if (typeof uid !== "string" || !UID.test(uid)) {
      throw new HostedVmSpecError(`uid ${JSON.stringify(uid)} is not valid`);
    }
    const valid = isJsonObject(secrets) &&
      Object.values(secrets).every((data) =>
        isJsonObject(data) && Object.values(data).every((v) => typeof v === "string")
      );
    if (!valid) throw new HostedVmSpecError("secrets is not an object of string maps");
    const hosted = this.#vms.get(uid);
    if (!hosted || hosted.stopping) throw new HostedVmSpecError(`no launcher serves UID ${uid}`);
    // A start that failed was answered to its own caller; here it only means no instance.
    await hosted.started.catch(() => {});
    if (!hosted.instance) throw new HostedVmSpecError(`the launcher of UID ${uid} did not start`);
    hosted.instance.manager.setAccessCredentials(
      credentials,
      secrets as Record<string, Record<string, string>>,
    );
  }

  /**
   * Removes the log libvirt kept of the domain's QEMU (`<name>.log`, and the rotated
   * `<name>.log.1`, `<name>.log.2.gz`, ...), once the domain is gone: a VMI's files on the
   * host go with it, as a launcher pod's go with the pod.
   */
  async #removeQemuLogs(domainName: string): Promise<void> {
    const dir = QEMU_LOG_DIR;
    const base = `${domainName}.log`;
    const mine = (name: string) =>
      name === base ||
      (name.startsWith(`${base}.`) && /^\d+(\.gz)?$/.test(name.slice(base.length + 1)));
    try {
      // Read synchronously: Deno 2.9.3 may close a node:net socket's descriptor twice, and a
      // directory's read on another thread must not fall in between (docs/compatibility.md).
      for (const entry of Deno.readDirSync(dir)) {
        if (!entry.isFile || !mine(entry.name)) continue;
        await Deno.remove(join(dir, entry.name)).catch((error) =>
          log.warn("Cannot remove the guest's QEMU log: {error}", { file: entry.name, error })
        );
      }
    } catch (error) {
      if (!(error instanceof Deno.errors.NotFound)) {
        log.warn("Cannot read QEMU's log folder: {error}", { dir, error });
      }
    }
  }

  /** Removes the domain a VMI's ended launcher left, if it is still that VMI's (its XML has the UID). */
  async #reap(vmi: { namespace: string; name: string; uid: string }): Promise<void> {
    try {
      const domain = await this.#conn.lookupByName(domainNameOf(vmi.namespace, vmi.name));
      if (!(await domain.getXMLDesc()).includes(vmi.uid)) return; // another VMI's by now
      if ((await domain.getState()).stateName !== "Shutoff") await domain.destroy();
      await domain.undefine({ nvram: true }).catch(() => domain.undefine());
      log.warn("Removed the domain an ended launcher left", vmi);
    } catch (error) {
      if (
        !(error instanceof LibvirtError && error.code === LIBVIRT_ERROR_CODES.VIR_ERR_NO_DOMAIN)
      ) {
        throw error;
      }
    }
  }

  #push(message: Record<string, unknown>): void {
    const line = `${JSON.stringify(message)}\n`;
    for (const send of this.#clients) send(line);
  }

  /** Serves the control socket until `signal` aborts. */
  async serveControl(signal: AbortSignal, onListening?: () => void): Promise<void> {
    const path = this.controlSocket;
    await removeIfPresent(path);
    const listener = Deno.listen({ transport: "unix", path });
    await Deno.chmod(path, 0o600);
    onListening?.();
    const close = () => listener.close();
    signal.addEventListener("abort", close, { once: true });
    const connections = new Set<Deno.UnixConn>();
    try {
      for await (const conn of listener) {
        connections.add(conn);
        this.#serveClient(conn).finally(() => connections.delete(conn));
      }
    } catch (error) {
      if (!signal.aborted) throw error;
    } finally {
      signal.removeEventListener("abort", close);
      for (const conn of connections) {
        try {
          conn.close();
        } catch { /* closed already */ }
      }
    }
  }

  async #serveClient(conn: Deno.UnixConn): Promise<void> {
    const encoder = new TextEncoder();
    let writing = Promise.resolve();
    let open = true;
    const send = (line: string) => {
      writing = writing.then(async () => {
        if (open) await writeAll(conn, encoder.encode(line));
      }).catch(() => {
        open = false;
      });
    };
    this.#clients.add(send);
    try {
      for await (const line of readLines(conn.readable)) {
        if (line.trim() === "") continue;
        void this.#answer(line).then((reply) => send(`${JSON.stringify(reply)}\n`));
      }
    } catch {
      // The handler went away; it reconnects.
    } finally {
      this.#clients.delete(send);
      open = false;
      await writing;
      try {
        conn.close();
      } catch { /* closed already */ }
    }
  }

  async #answer(line: string): Promise<Record<string, unknown>> {
    let id: unknown = null;
    try {
      const request = JSON.parse(line) as Record<string, unknown>;
      id = request.id ?? null;
      switch (request.op) {
        case "start": {
          if (request.sync === undefined) {
            return { id, ok: true, vm: await this.start(request.spec) };
          }
          if (typeof request.sync !== "string") throw new HostedVmSpecError("sync is not a string");
          const options = request.options;
          if (options !== undefined && (options === null || typeof options !== "object")) {
            throw new HostedVmSpecError("options is not an object");
          }
          const { status, synced } = await this.startAndSync(
            request.spec,
            request.sync,
            options as Record<string, unknown> | undefined,
          );
          return { id, ok: true, vm: status, ...(synced ? { synced } : {}) };
        }
        case "stop":
          await this.stop(request.uid, request as { namespace?: unknown; name?: unknown });
          return { id, ok: true };
        case "list":
          return { id, ok: true, vms: this.list() };
        case "credentials":
          await this.credentials(request.uid, request.accessCredentials, request.secrets);
          return { id, ok: true };
        default:
          return { id, ok: false, error: `unknown op ${JSON.stringify(request.op)}` };
      }
    } catch (error) {
      return { id, ok: false, error: errorText(error) };
    }
  }

  /** Lets go of libvirt and the notify client; guests and socket files stay. */
  async close(): Promise<void> {
    await Promise.all(
      [...this.#vms.values()].map((h) =>
        h.instance?.close({ keepSocket: true }).catch((error) =>
          log.warn("Cannot close the launcher instance of {uid}: {error}", {
            uid: h.spec.uid,
            error,
          })
        )
      ),
    );
    this.#sink.close();
    await this.#dhcp.close();
    this.#netns.close();
    await this.#keeper.stop();
    // The host is closing: the connection ends with it, and guests keep running.
    await this.#conn.close().catch(() => {});
  }
}

/**
 * Runs the launcher host until SIGTERM/SIGINT (or `signal`); resolves with the exit code.
 * Ending the host never stops a guest: a restarted host takes every VMI back.
 */
export async function runLauncherHost(
  options: LauncherHostOptions,
  runtime: LauncherHostRuntime = {},
): Promise<number> {
  const stop = new AbortController();
  const onSignal = () => stop.abort();
  const signals: Deno.Signal[] = runtime.handleSignals === false ? [] : ["SIGTERM", "SIGINT"];
  for (const s of signals) Deno.addSignalListener(s, onSignal);
  runtime.signal?.addEventListener("abort", onSignal, { once: true });
  if (runtime.signal?.aborted) onSignal();
  let host: LauncherHost;
  try {
    await Deno.mkdir(options.dir, { recursive: true, mode: 0o700 });
    host = await LauncherHost.open(options, runtime.notifyTimeouts);
  } catch (error) {
    log.error("Cannot start the launcher host", { error: String(error) });
    return EXIT_HOST_START_FAILED;
  }
  try {
    const started = performance.now();
    const adopted = await host.adoptAll();
    await host.serveControl(stop.signal, () => {
      log.info("Launcher host ready: {adopted} launchers taken back", {
        adopted,
        startupMs: Math.round(performance.now() - started),
        control: host.controlSocket,
      });
      runtime.onReady?.(host.controlSocket);
    });
    log.info("Launcher host stopping; guests keep running");
    return 0;
  } catch (error) {
    log.error("Launcher host failed", { error: String(error) });
    return EXIT_HOST_START_FAILED;
  } finally {
    for (const s of signals) Deno.removeSignalListener(s, onSignal);
    runtime.signal?.removeEventListener("abort", onSignal);
    await host.close();
  }
}

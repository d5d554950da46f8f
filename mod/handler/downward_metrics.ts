/**
 * The node's side of each VMI's downward metrics, as virt-handler gives them:
 *
 * - the channel (the `downwardMetrics` device): QEMU listens on the channel's socket; the
 *   handler connects and answers each `GET /metrics/XML` request the guest writes to its
 *   virtio-serial port (followed by a blank line) with vhostmd's XML of the node's and the
 *   VM's metrics and a blank line, one request a second at most, `INVALID REQUEST` to
 *   anything else;
 * - the disk (a `downwardMetrics` volume, KubeVirt mode): the launcher makes a vhostmd disk
 *   the guest reads as a block device, and the handler writes the same XML into it in place
 *   every refresh, locked while it writes, as KubeVirt's scraper does.
 *
 * @module
 */
import type { VirtualMachineInstance } from "../api/mod.ts";
import type { Runnable } from "../lifecycle/mod.ts";
import { sleep } from "../lifecycle/mod.ts";
import { getLogger } from "../log/mod.ts";
import {
  downwardMetrics,
  downwardMetricsXml,
  EMPTY_DOWNWARD_METRICS,
  hostDownwardMetrics,
  INVALID_DOWNWARD_REQUEST,
  isDownwardMetricsRequest,
  readHostFacts,
  vhostmdWrite,
} from "../metrics/mod.ts";

const log = getLogger("handler", "downward-metrics");

/** How often the VMIs are looked over for channels to serve (KubeVirt's refresh). */
export const DOWNWARD_METRICS_REFRESH_MS = 5_000;
/** At most one request a second per channel, as KubeVirt's server limits them. */
const MIN_REQUEST_GAP_MS = 1_000;
/** gRPC's status code UNIMPLEMENTED. */
const GRPC_UNIMPLEMENTED = 12;
/** The longest request line read; a guest writing more is answered INVALID REQUEST. */
const MAX_LINE = 1024;

/** What the channels need from the handler. */
export interface DownwardMetricsOptions {
  /** The node's name (the `HostName` metric). */
  nodeName: string;
  /** This node's VMIs now. */
  vmis(): VirtualMachineInstance[];
  /** Opens the VMI's channel socket beneath its launcher's folder. */
  open(vmi: VirtualMachineInstance): Promise<{ path: string; release(): void }>;
  /** The VMI's launcher: its statistics and QEMU version. */
  launcher(vmi: VirtualMachineInstance): Promise<{
    getDomainStats(): Promise<Record<string, unknown> | undefined>;
    getQemuVersion(): Promise<string>;
  }>;
  /**
   * Opens the VMI's vhostmd disk for writing in place (launchers that make one); without
   * it, `downwardMetrics` volumes get nothing.
   */
  disk?(vmi: VirtualMachineInstance): Promise<Deno.FsFile>;
  /** How often VMIs are looked over; {@linkcode DOWNWARD_METRICS_REFRESH_MS} unless told. */
  refreshMs?: number;
}

/** Whether the VMI asks for downward metrics over virtio-serial. */
export function hasDownwardMetricsDevice(vmi: VirtualMachineInstance): boolean {
  return vmi.spec.domain.devices.downwardMetrics !== undefined;
}

/** Whether the VMI has a `downwardMetrics` volume (a vhostmd disk for the guest). */
export function hasDownwardMetricsVolume(vmi: VirtualMachineInstance): boolean {
  return (vmi.spec.volumes ?? []).some((v) => v.downwardMetrics !== undefined);
}

/** Serves the downward metrics channels and disks of this node's running VMIs. */
export class DownwardMetricsChannels implements Runnable {
  /** For logs. */
  readonly name = "downward-metrics";
  readonly #o: DownwardMetricsOptions;
  readonly #served = new Map<string, Deno.UnixConn>();

  /** Channels for `options`; {@linkcode run} serves them. */
  constructor(options: DownwardMetricsOptions) {
    this.#o = options;
  }

  /** The UIDs of the VMIs whose channel is connected. */
  get serving(): string[] {
    return [...this.#served.keys()];
  }

  /** Looks the VMIs over every few seconds until `signal` aborts, then closes every channel. */
  async run(signal: AbortSignal): Promise<void> {
    while (!signal.aborted) {
      await this.reconcile();
      await sleep(this.#o.refreshMs ?? DOWNWARD_METRICS_REFRESH_MS, signal);
    }
    for (const conn of this.#served.values()) conn.close();
    this.#served.clear();
  }

  /**
   * Connects the channel of each running VMI that has one and closes those of the rest,
   * then writes the disks of those with a `downwardMetrics` volume.
   */
  async reconcile(): Promise<void> {
    const running = this.#o.vmis().filter((v) => v.status?.phase === "Running");
    await this.#channels(running);
    if (this.#o.disk) {
      for (const vmi of running.filter(hasDownwardMetricsVolume)) await this.#writeDisk(vmi);
    }
  }

  /**
   * Writes the VM's metrics into its vhostmd disk as KubeVirt's scraper does: the header
   * locked first (flushed), the body, then the header unlocked. Metrics that cannot be had
   * leave the disk as it was.
   */
  async #writeDisk(vmi: VirtualMachineInstance): Promise<void> {
    const where = { namespace: vmi.metadata.namespace, name: vmi.metadata.name };
    let file: Deno.FsFile | undefined;
    try {
      const write = vhostmdWrite(await this.#collect(vmi));
      file = await this.#o.disk!(vmi);
      await writeAll(file, write.locked, 0);
      await file.syncData();
      await writeAll(file, write.body, write.locked.length);
      await writeAll(file, write.unlocked, 0);
    } catch (error) {
      log.debug("Cannot write the downward metrics disk: {error}", {
        ...where,
        error: String(error),
      });
    } finally {
      file?.close();
    }
  }

  async #channels(running: VirtualMachineInstance[]): Promise<void> {
    const wanted = new Map(
      running.filter(hasDownwardMetricsDevice).map((v) => [v.metadata.uid!, v]),
    );
    for (const [uid, conn] of this.#served) {
      if (!wanted.has(uid)) {
        this.#served.delete(uid);
        conn.close();
      }
    }
    for (const [uid, vmi] of wanted) {
      if (this.#served.has(uid)) continue;
      let conn: Deno.UnixConn;
      try {
        const opened = await this.#o.open(vmi);
        try {
          conn = await Deno.connect({ transport: "unix", path: opened.path });
        } finally {
          opened.release();
        }
      } catch (error) {
        log.debug("No downward metrics channel yet: {error}", {
          namespace: vmi.metadata.namespace,
          name: vmi.metadata.name,
          error: String(error),
        });
        continue;
      }
      this.#served.set(uid, conn);
      log.info("Serving downward metrics", {
        namespace: vmi.metadata.namespace,
        name: vmi.metadata.name,
      });
      this.#serve(vmi, conn).finally(() => {
        if (this.#served.get(uid) === conn) this.#served.delete(uid);
        try {
          conn.close();
        } catch { /* closed already */ }
      });
    }
  }

  /** Answers the guest's requests on `conn` until QEMU or the handler closes it. */
  async #serve(vmi: VirtualMachineInstance, conn: Deno.UnixConn): Promise<void> {
    const lines = readLines(conn);
    let last = -Infinity;
    try {
      for (;;) {
        const request = await lines.next();
        if (request.done) return;
        const blank = await lines.next();
        if (blank.done) return;
        const wait = last + MIN_REQUEST_GAP_MS - performance.now();
        if (wait > 0) await new Promise((r) => setTimeout(r, wait));
        last = performance.now();
        const valid = blank.value === "" && isDownwardMetricsRequest(request.value);
        const answer = valid ? `${await this.#report(vmi)}\n\n` : INVALID_DOWNWARD_REQUEST;
        await writeAll(conn, new TextEncoder().encode(answer));
      }
    } catch (error) {
      log.debug("Downward metrics channel closed: {error}", {
        namespace: vmi.metadata.namespace,
        name: vmi.metadata.name,
        error: String(error),
      });
    }
  }

  async #report(vmi: VirtualMachineInstance): Promise<string> {
    try {
      return await this.#collect(vmi);
    } catch (error) {
      log.warn("Cannot collect the downward metrics: {error}", {
        namespace: vmi.metadata.namespace,
        name: vmi.metadata.name,
        error: String(error),
      });
      return EMPTY_DOWNWARD_METRICS;
    }
  }

  /** vhostmd's XML of the node's and the VM's metrics now; throws when they cannot be had. */
  async #collect(vmi: VirtualMachineInstance): Promise<string> {
    const launcher = await this.#o.launcher(vmi);
    const stats = await launcher.getDomainStats();
    if (!stats) throw new Error("the launcher has no domain");
    // A launcher without the call is "qemu-unknown", as KubeVirt's; any other failure
    // gives the guest the empty report.
    const qemuVersion = await launcher.getQemuVersion().catch((error) => {
      if ((error as { cause?: { code?: number } })?.cause?.code === GRPC_UNIMPLEMENTED) {
        return "qemu-unknown";
      }
      throw error;
    });
    const host = hostDownwardMetrics(await readHostFacts());
    return downwardMetricsXml(
      downwardMetrics({ nodeName: this.#o.nodeName, qemuVersion, stats, host }),
    );
  }
}

/** The lines `conn` gives (`\n` or `\r\n` ended), each at most {@linkcode MAX_LINE} bytes. */
async function* readLines(conn: Deno.UnixConn): AsyncGenerator<string> {
  const buffer = new Uint8Array(4096);
  let pending = "";
  const decoder = new TextDecoder();
  for (;;) {
    const n = await conn.read(buffer);
    if (n === null) return;
    pending += decoder.decode(buffer.subarray(0, n), { stream: true });
    let at: number;
    while ((at = pending.indexOf("\n")) >= 0) {
      yield pending.slice(0, at).replace(/\r$/, "");
      pending = pending.slice(at + 1);
    }
    // An endless line is no request: answered as a bad one, and read on from here.
    if (pending.length > MAX_LINE) {
      yield pending;
      pending = "";
    }
  }
}

/** Writes all of `bytes`; to a file, from `offset` on. */
async function writeAll(
  to: Deno.UnixConn | Deno.FsFile,
  bytes: Uint8Array,
  offset?: number,
): Promise<void> {
  if (offset !== undefined) await (to as Deno.FsFile).seek(offset, Deno.SeekMode.Start);
  let at = 0;
  while (at < bytes.length) at += await to.write(bytes.subarray(at));
}

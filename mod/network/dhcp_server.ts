/**
 * The guests' DHCP servers, as KubeVirt's launcher runs them on the in-pod bridge: a
 * DHCPv4 server on port 67 that gives one guest its one lease, and for masquerade with
 * IPv6 a DHCPv6 server on port 547 (joined to `ff02::1:2`). Each server's socket is made
 * inside the VM's pod network namespace, bound to the bridge (`SO_BINDTODEVICE`); all the
 * servers of a process wait in one {@linkcode DatagramPoller}: a launcher host serving 200
 * VMs holds one blocked thread for all of them and spends no CPU while no guest asks.
 *
 * A guest asks as often as it likes, so a lease is logged (info) only the first time a key's
 * server hands it out; the others are counted, logged at debug when the count reaches a
 * power of two (a handful of lines for a million requests), and summed up when the server
 * stops. A guest cannot fill the host's disk through its DHCP client.
 *
 * @module
 */

import { DatagramPoller, type NetnsRunner } from "../../ffi/mod.ts";
import { getLogger } from "../log/mod.ts";
import {
  answerDhcp4,
  decodeDhcp4,
  type Dhcp4Lease,
  DhcpMessageType,
  DhcpOption,
  encodeDhcp4,
} from "./dhcp4.ts";
import {
  answerDhcp6,
  decodeDhcp6,
  type Dhcp6Lease,
  Dhcp6MessageType,
  Dhcp6Option,
  dhcp6Option,
  encodeDhcp6,
  iaNaAddress,
} from "./dhcp6.ts";

const log = getLogger("network", "dhcp");

/** What one guest's servers answer. */
export interface GuestLeases {
  /** The pod network namespace (none: this process's own). */
  netns?: string;
  /** The in-pod bridge the servers listen on (`k6t-eth0`). */
  device: string;
  /** The DHCPv4 lease, if the guest gets IPv4 by DHCP. */
  v4?: Dhcp4Lease;
  /** The DHCPv6 lease, if the guest gets IPv6 by DHCP. */
  v6?: Dhcp6Lease;
}

interface Running {
  fds: number[];
  leases: GuestLeases;
}

/** Leases a key's servers gave, by protocol. */
interface Given {
  v4: number;
  v6: number;
}

/** The DHCP servers of one process's guests, keyed by `<vmi uid>/<interface>`. */
export class DhcpServers {
  readonly #runner: NetnsRunner;
  readonly #poller = new DatagramPoller({
    onError: (error) => log.warn("DHCP server error: {error}", { error }),
  });
  readonly #running = new Map<string, Running>();
  /** Leases given, for logs and tests: key -> count of ACKs and REPLYs sent. */
  readonly #given = new Map<string, Given>();

  /** Uses `runner` to make sockets inside the guests' namespaces. */
  constructor(runner: NetnsRunner) {
    this.#runner = runner;
  }

  /** Whether servers run for `key`. */
  has(key: string): boolean {
    return this.#running.has(key);
  }

  /** How many leases the servers of `key` handed out (ACKs and REPLYs). */
  given(key: string): number {
    const given = this.#given.get(key);
    return given ? given.v4 + given.v6 : 0;
  }

  /**
   * Counts a lease `key`'s server gave; true when it is the first of its protocol (the one
   * logged at info).
   */
  #count(key: string, protocol: keyof Given): boolean {
    let given = this.#given.get(key);
    if (!given) this.#given.set(key, given = { v4: 0, v6: 0 });
    const n = ++given[protocol];
    if (n > 1 && (n & (n - 1)) === 0) {
      log.debug("DHCP leases given again", { key, protocol, leases: n });
    }
    return n === 1;
  }

  /** Starts (or replaces) the servers of `key`. */
  async start(key: string, leases: GuestLeases): Promise<void> {
    this.stop(key);
    const steps = [];
    if (leases.v4) {
      steps.push({ op: "udpSocket" as const, family: 4 as const, port: 67, device: leases.device });
    }
    if (leases.v6) {
      steps.push({
        op: "udpSocket" as const,
        family: 6 as const,
        port: 547,
        device: leases.device,
        joinGroup: "ff02::1:2",
      });
    }
    if (steps.length === 0) return;
    const fds = (await this.#runner.run(leases.netns, steps)) as number[];
    const running: Running = { fds, leases };
    this.#running.set(key, running);
    let i = 0;
    if (leases.v4) {
      const fd = fds[i++];
      this.#poller.add(fd, (data) => this.#answer4(key, fd, leases.v4!, data));
    }
    if (leases.v6) {
      const fd = fds[i++];
      this.#poller.add(fd, (data, from) => this.#answer6(key, fd, leases.v6!, data, from));
    }
    log.info("DHCP server started", {
      key,
      device: leases.device,
      v4: leases.v4?.address,
      v6: leases.v6?.address,
    });
  }

  #answer4(key: string, fd: number, lease: Dhcp4Lease, data: Uint8Array): void {
    let request;
    try {
      request = decodeDhcp4(data);
    } catch (error) {
      log.debug("Malformed DHCP request ignored: {error}", { key, error: String(error) });
      return;
    }
    const reply = answerDhcp4(request, lease);
    if (!reply) return;
    // A client with an address (renewing) hears back there; one without, by broadcast.
    const to = request.ciaddr !== "0.0.0.0" ? request.ciaddr : "255.255.255.255";
    this.#poller.send(fd, encodeDhcp4(reply), { address: to, port: 68 });
    const type = reply.options.get(DhcpOption.MessageType)?.[0];
    if (type === DhcpMessageType.Ack && this.#count(key, "v4")) {
      log.info("DHCP lease given", { key, mac: request.chaddr, address: lease.address });
    }
  }

  #answer6(
    key: string,
    fd: number,
    lease: Dhcp6Lease,
    data: Uint8Array,
    from: { address: string; port: number; scopeId?: number },
  ): void {
    let request;
    try {
      request = decodeDhcp6(data);
    } catch (error) {
      log.debug("Malformed DHCPv6 request ignored: {error}", { key, error: String(error) });
      return;
    }
    const reply = answerDhcp6(request, lease);
    if (!reply) return;
    this.#poller.send(fd, encodeDhcp6(reply), from);
    if (reply.type === Dhcp6MessageType.Reply && this.#count(key, "v6")) {
      const iaNa = dhcp6Option(reply, Dhcp6Option.IaNa);
      log.info("DHCPv6 lease given", { key, address: iaNa ? iaNaAddress(iaNa) : undefined });
    }
  }

  /** Stops the servers of `key` (a no-op when none run). */
  stop(key: string): void {
    const running = this.#running.get(key);
    if (!running) return;
    this.#running.delete(key);
    const given = this.#given.get(key);
    this.#given.delete(key);
    for (const fd of running.fds) this.#poller.remove(fd);
    log.info("DHCP server stopped", { key, v4Leases: given?.v4 ?? 0, v6Leases: given?.v6 ?? 0 });
  }

  /** Stops the servers of every key that starts with `prefix` (a VMI's `<uid>/`). */
  stopAll(prefix = ""): void {
    for (const key of [...this.#running.keys()]) if (key.startsWith(prefix)) this.stop(key);
  }

  /** Stops every server; resolves once the poller's wait has ended. */
  async close(): Promise<void> {
    this.stopAll();
    await this.#poller.close();
  }
}

/**
 * Sockets. Unix stream sockets: connecting without ever blocking the calling thread (a
 * listener's full backlog is waited for with timers, never in `connect(2)`), and who
 * listens: the peer's credentials and a pidfd of it ({@linkcode listenerPid}). UDP sockets
 * bound to one interface, for the DHCP servers of a VM's network namespace, with the
 * eventfd that wakes `datagram.ts`'s poller and transmit checksum offload turned off on an
 * interface. Failures throw {@linkcode ErrnoError}.
 *
 * @module
 */

import { ErrnoError } from "./errors.ts";
import { c, check, cpath, encoder, errnoError } from "./_libc.ts";
import { close, O_CLOEXEC } from "./files.ts";
import { pidfdExited, processStartTime } from "./processes.ts";

/** The credentials of a unix socket's peer (`SO_PEERCRED`). */
export interface PeerCredentials {
  /** Peer process ID. */
  pid: number;
  /** Peer user ID. */
  uid: number;
  /** Peer group ID. */
  gid: number;
}

const AF_UNIX = 1;
const SOCK_STREAM = 1;
const SOCK_NONBLOCK = 0o4000;
const SOL_SOCKET = 1;
const SO_PEERCRED = 17;
const SO_PEERPIDFD = 77;
const ESRCH = 3;
const EAGAIN = 11;
const EINVAL = 22;
const ENOPROTOOPT = 92;
const ETIMEDOUT = 110;

/**
 * How long {@linkcode connectUnix} and {@linkcode listenerPid} wait for room in a listener's
 * backlog unless told, ms.
 */
export const CONNECT_TIMEOUT_MS = 5_000;

/** Options of {@linkcode connectUnix}. */
export interface ConnectUnixOptions {
  /** Give up after this many milliseconds; {@linkcode CONNECT_TIMEOUT_MS} unless told. */
  timeoutMs?: number;
}

/**
 * Connects a unix stream socket to `path` and resolves with its file descriptor (close it
 * with {@linkcode close}), never blocking the calling thread: the socket is non-blocking, so
 * a listener whose backlog is full (one that stopped accepting) makes `connect(2)` answer
 * EAGAIN at once instead of waiting for room, and the connect is tried again, backing off,
 * until `timeoutMs` has passed. (A unix socket never answers EINPROGRESS: a connect that
 * finds room is complete.) Rejects with {@linkcode ErrnoError}: ETIMEDOUT naming the path
 * and the time waited, or the error `connect(2)` gave.
 */
export async function connectUnix(path: string, options: ConnectUnixOptions = {}): Promise<number> {
  const timeoutMs = options.timeoutMs ?? CONNECT_TIMEOUT_MS;
  const bytes = encoder.encode(path);
  if (bytes.length >= 108) {
    throw new ErrnoError(`Cannot connect to "${path}"`, 36, "File name too long");
  }
  const addr = new Uint8Array(110); // struct sockaddr_un { sa_family_t; char sun_path[108]; }
  new DataView(addr.buffer).setUint16(0, AF_UNIX, true);
  addr.set(bytes, 2);
  const fd = check(
    c().socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | O_CLOEXEC, 0),
    "Cannot create a unix socket",
  );
  try {
    const deadline = performance.now() + timeoutMs;
    for (let pause = 1;; pause = Math.min(pause * 2, 50)) {
      if (c().connect(fd, addr, addr.length) === 0) return fd;
      const error = errnoError(`Cannot connect to "${path}"`);
      if (error.errno !== EAGAIN) throw error;
      const left = deadline - performance.now();
      if (left <= 0) {
        throw new ErrnoError(
          `Cannot connect to "${path}" within ${timeoutMs} ms: its listener's backlog stayed full`,
          ETIMEDOUT,
          "Connection timed out",
          { cause: error },
        );
      }
      await new Promise((resolve) => setTimeout(resolve, Math.min(pause, left)));
    }
  } catch (error) {
    c().close(fd);
    throw error;
  }
}

/** The credentials of the peer of a connected unix socket `fd` (`getsockopt(SO_PEERCRED)`). */
export function peerCredentials(fd: number): PeerCredentials {
  const cred = new Int32Array(3); // struct ucred { pid_t pid; uid_t uid; gid_t gid; }
  const len = new Uint32Array([12]);
  check(
    c().getsockopt(
      fd,
      SOL_SOCKET,
      SO_PEERCRED,
      new Uint8Array(cred.buffer),
      new Uint8Array(len.buffer),
    ),
    `Cannot read peer credentials of file descriptor ${fd}`,
  );
  return { pid: cred[0], uid: cred[1] >>> 0, gid: cred[2] >>> 0 };
}

/**
 * A pidfd of the peer of a connected unix socket `fd` (`getsockopt(SO_PEERPIDFD)`, Linux
 * 6.5): it names the very process {@linkcode peerCredentials} gives the PID of (for a
 * connection to a listener, the process that called `listen(2)`), never a later one that
 * took its PID. Close it with {@linkcode close}. Undefined where the kernel has no
 * `SO_PEERPIDFD`. Throws {@linkcode ErrnoError}: ESRCH when that process is gone (kernels
 * before 6.16 refuse a pidfd for it; later ones give one, which {@linkcode pidfdExited} tells).
 */
export function peerPidfd(fd: number): number | undefined {
  const pidfd = new Int32Array(1);
  const len = new Uint32Array([4]);
  const rc = c().getsockopt(
    fd,
    SOL_SOCKET,
    SO_PEERPIDFD,
    new Uint8Array(pidfd.buffer),
    new Uint8Array(len.buffer),
  );
  if (rc === 0) return pidfd[0];
  const error = errnoError(`Cannot open a pidfd of the peer of file descriptor ${fd}`);
  if (error.errno === ENOPROTOOPT) return undefined;
  if (error.errno === EINVAL || error.errno === ESRCH) {
    throw new ErrnoError(
      `Cannot open a pidfd of the peer of file descriptor ${fd}: its process has exited`,
      ESRCH,
      "No such process",
      { cause: error },
    );
  }
  throw error;
}

/** Options of {@linkcode listenerPid}. */
export interface ListenerPidOptions extends ConnectUnixOptions {
  /**
   * Whether to check the PID against a pidfd of the listener (`SO_PEERPIDFD`) where the
   * kernel has one; true unless told. False checks only that the PID names a running
   * process, as on kernels before 6.5.
   */
  pidfd?: boolean;
}

/**
 * The PID of the process listening on the unix socket at `path`: the `SO_PEERCRED` of a
 * connection to it ({@linkcode connectUnix}, so a listener that stopped accepting costs at
 * most `timeoutMs` and never blocks the thread). The PID is checked to still name that
 * process: against a pidfd of it (`SO_PEERPIDFD`, Linux 6.5) where the kernel has one, so
 * a listener whose process has exited, its PID free for any other process, is refused; on
 * older kernels the PID must name a running process (its start time readable), which
 * cannot tell a process that took a freed PID from the one before it. Rejects with
 * {@linkcode ErrnoError} (ESRCH for an exited listener, ETIMEDOUT for a full backlog).
 */
export async function listenerPid(path: string, options: ListenerPidOptions = {}): Promise<number> {
  const fd = await connectUnix(path, options);
  try {
    const { pid } = peerCredentials(fd);
    const exited = (cause?: unknown) =>
      new ErrnoError(
        `Cannot find the process listening on "${path}": process ${pid}, which listens, has exited`,
        ESRCH,
        "No such process",
        { cause },
      );
    let pidfd: number | undefined;
    try {
      pidfd = options.pidfd === false ? undefined : peerPidfd(fd);
    } catch (error) {
      if (error instanceof ErrnoError && error.errno === ESRCH) throw exited(error);
      throw error;
    }
    if (pidfd === undefined) {
      if (processStartTime(pid) === undefined) throw exited();
      return pid;
    }
    try {
      if (pidfdExited(pidfd)) throw exited();
    } finally {
      close(pidfd);
    }
    return pid;
  } finally {
    close(fd);
  }
}

const AF_INET = 2;
const AF_INET6 = 10;
const SOCK_DGRAM = 2;
const SO_REUSEADDR = 2;
const SO_BROADCAST = 6;
const SO_BINDTODEVICE = 25;
const IPPROTO_IPV6 = 41;
const IPV6_JOIN_GROUP = 20;
const IPV6_V6ONLY = 26;
const MSG_DONTWAIT = 0x40;
const SIOCETHTOOL = 0x8946;
const ETHTOOL_STXCSUM = 0x17;
const EFD_NONBLOCK = 0o4000;
const IFNAMSIZ = 16;

/** A UDP peer: an IPv4 or IPv6 address (IPv6 with the interface of a link-local one) and a port. */
export interface DatagramAddress {
  /** Dotted IPv4 or textual IPv6 address. */
  address: string;
  /** UDP port. */
  port: number;
  /** IPv6 only: the interface index a link-local address belongs to. */
  scopeId?: number;
}

function ipv4ToBytes(address: string): number[] {
  const parts = address.split(".").map(Number);
  if (parts.length !== 4 || parts.some((p) => !Number.isInteger(p) || p < 0 || p > 255)) {
    throw new Error(`Invalid IPv4 address ${JSON.stringify(address)}`);
  }
  return parts;
}

/** The 16 bytes of an IPv6 address in text form (`::` shorthand allowed, no IPv4 tail). */
export function ipv6ToBytes(address: string): Uint8Array {
  const invalid = () => new Error(`Invalid IPv6 address ${JSON.stringify(address)}`);
  const halves = address.split("::");
  if (halves.length > 2) throw invalid();
  const groups = (part: string) => (part === "" ? [] : part.split(":"));
  const head = groups(halves[0]);
  const tail = halves.length === 2 ? groups(halves[1]) : [];
  const missing = 8 - head.length - tail.length;
  if ((halves.length === 1 && missing !== 0) || missing < 0) throw invalid();
  const all = [...head, ...Array(halves.length === 2 ? missing : 0).fill("0"), ...tail];
  const out = new Uint8Array(16);
  all.forEach((group, i) => {
    if (!/^[0-9a-fA-F]{1,4}$/.test(group)) throw invalid();
    const value = parseInt(group, 16);
    out[i * 2] = value >> 8;
    out[i * 2 + 1] = value & 0xff;
  });
  return out;
}

/** The text form of 16 IPv6 address bytes, shortened as RFC 5952 says. */
export function ipv6FromBytes(bytes: Uint8Array): string {
  const groups: number[] = [];
  for (let i = 0; i < 16; i += 2) groups.push((bytes[i] << 8) | bytes[i + 1]);
  // The longest run of two or more zero groups becomes "::".
  let best = -1;
  let bestLength = 1;
  for (let i = 0; i < 8;) {
    if (groups[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > bestLength) {
      best = i;
      bestLength = j - i;
    }
    i = j;
  }
  const hex = (list: number[]) => list.map((g) => g.toString(16)).join(":");
  if (best < 0) return hex(groups);
  return `${hex(groups.slice(0, best))}::${hex(groups.slice(best + bestLength))}`;
}

function sockaddr(to: DatagramAddress): Uint8Array<ArrayBuffer> {
  if (to.address.includes(":")) {
    const addr = new Uint8Array(28); // sockaddr_in6
    const view = new DataView(addr.buffer);
    view.setUint16(0, AF_INET6, true);
    view.setUint16(2, to.port, false);
    addr.set(ipv6ToBytes(to.address), 8);
    view.setUint32(24, to.scopeId ?? 0, true);
    return addr;
  }
  const addr = new Uint8Array(16); // sockaddr_in
  const view = new DataView(addr.buffer);
  view.setUint16(0, AF_INET, true);
  view.setUint16(2, to.port, false);
  addr.set(ipv4ToBytes(to.address), 4);
  return addr;
}

function fromSockaddr(addr: Uint8Array): DatagramAddress {
  const view = new DataView(addr.buffer, addr.byteOffset, addr.byteLength);
  const port = view.getUint16(2, false);
  if (view.getUint16(0, true) === AF_INET6) {
    return {
      address: ipv6FromBytes(addr.subarray(8, 24)),
      port,
      scopeId: view.getUint32(24, true),
    };
  }
  return { address: [...addr.subarray(4, 8)].join("."), port };
}

function setIntOption(fd: number, level: number, name: number, value: number, what: string) {
  const v = new Int32Array([value]);
  check(c().setsockopt(fd, level, name, new Uint8Array(v.buffer), 4), `Cannot set ${what}`);
}

/** The index of the network interface `name` in the calling thread's network namespace. */
export function interfaceIndex(name: string): number {
  const index = c().if_nametoindex(cpath(name));
  if (index === 0) throw errnoError(`Cannot find network interface "${name}"`);
  return index;
}

/** Options of {@linkcode openUdpSocket}. */
export interface UdpSocketOptions {
  /** 4 for IPv4, 6 for IPv6. */
  family: 4 | 6;
  /** The local port, bound on every address of the family. */
  port: number;
  /** The network interface the socket sends and receives on only (`SO_BINDTODEVICE`). */
  device: string;
  /** IPv6: a multicast group to join on `device`, e.g. `ff02::1:2`. */
  joinGroup?: string;
}

/**
 * A non-blocking, close-on-exec UDP socket bound to `options.port` on `options.device`,
 * in the calling thread's network namespace (it stays in that namespace whichever thread
 * uses it later). IPv4 sockets may broadcast. Returns its file descriptor.
 */
export function openUdpSocket(options: UdpSocketOptions): number {
  const family = options.family === 6 ? AF_INET6 : AF_INET;
  const what = `a UDP socket on "${options.device}" port ${options.port}`;
  const fd = check(
    c().socket(family, SOCK_DGRAM | SOCK_NONBLOCK | O_CLOEXEC, 0),
    `Cannot create ${what}`,
  );
  try {
    setIntOption(fd, SOL_SOCKET, SO_REUSEADDR, 1, `SO_REUSEADDR on ${what}`);
    const device = cpath(options.device);
    check(
      c().setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, device, device.length),
      `Cannot bind ${what} to its interface`,
    );
    if (family === AF_INET) {
      setIntOption(fd, SOL_SOCKET, SO_BROADCAST, 1, `SO_BROADCAST on ${what}`);
    } else {
      setIntOption(fd, IPPROTO_IPV6, IPV6_V6ONLY, 1, `IPV6_V6ONLY on ${what}`);
    }
    const local = sockaddr({ address: family === AF_INET6 ? "::" : "0.0.0.0", port: options.port });
    check(c().bind(fd, local, local.length), `Cannot bind ${what}`);
    if (options.joinGroup) {
      const mreq = new Uint8Array(20); // struct ipv6_mreq { in6_addr; int ifindex; }
      mreq.set(ipv6ToBytes(options.joinGroup), 0);
      new DataView(mreq.buffer).setInt32(16, interfaceIndex(options.device), true);
      check(
        c().setsockopt(fd, IPPROTO_IPV6, IPV6_JOIN_GROUP, mreq, mreq.length),
        `Cannot join ${options.joinGroup} with ${what}`,
      );
    }
    return fd;
  } catch (error) {
    c().close(fd);
    throw error;
  }
}

/**
 * Reads one waiting datagram of a non-blocking socket into `buffer`; undefined when none
 * waits. Returns the bytes read (a view of `buffer`) and the sender.
 */
export function receiveDatagram(
  fd: number,
  buffer: Uint8Array<ArrayBuffer>,
): { data: Uint8Array; from: DatagramAddress } | undefined {
  const addr = new Uint8Array(28);
  const len = new Uint32Array([addr.length]);
  const n = Number(
    c().recvfrom(fd, buffer, BigInt(buffer.length), MSG_DONTWAIT, addr, new Uint8Array(len.buffer)),
  );
  if (n < 0) {
    const error = errnoError(`Cannot receive on socket ${fd}`);
    if (error.errno === EAGAIN) return undefined;
    throw error;
  }
  return { data: buffer.subarray(0, n), from: fromSockaddr(addr) };
}

/** Sends one datagram to `to` from a socket (without waiting for room). */
export function sendDatagram(fd: number, data: Uint8Array, to: DatagramAddress): void {
  const addr = sockaddr(to);
  const bytes = new Uint8Array(data);
  check(
    Number(c().sendto(fd, bytes, BigInt(bytes.length), MSG_DONTWAIT, addr, addr.length)),
    `Cannot send to ${to.address} port ${to.port}`,
  );
}

/** A non-blocking, close-on-exec `eventfd(2)`: {@linkcode signalEventFd} makes it readable. */
export function eventFd(): number {
  return check(c().eventfd(0, EFD_NONBLOCK | O_CLOEXEC), "Cannot create an eventfd");
}

/** Adds one to an eventfd's counter, waking whoever polls it. */
export function signalEventFd(fd: number): void {
  const one = new BigUint64Array([1n]);
  check(Number(c().write(fd, new Uint8Array(one.buffer), 8n)), `Cannot signal eventfd ${fd}`);
}

/** Resets an eventfd's counter (a no-op when it is zero). */
export function drainEventFd(fd: number): void {
  const value = new Uint8Array(8);
  c().read(fd, value, 8n);
}

/**
 * Turns transmit checksum offload off on a network interface of the calling thread's
 * network namespace (`ethtool -K <device> tx off`, through `SIOCETHTOOL`): packets the
 * namespace sends through it then carry a complete checksum, which a DHCP client reading
 * a raw socket in the guest checks.
 */
export function disableTxChecksum(device: string): void {
  const fd = check(c().socket(AF_INET, SOCK_DGRAM | O_CLOEXEC, 0), "Cannot create a socket");
  try {
    const value = new Uint32Array([ETHTOOL_STXCSUM, 0]); // struct ethtool_value { cmd; data; }
    const ifreq = new Uint8Array(40); // struct ifreq { char name[16]; union { void *data; ... } }
    const name = encoder.encode(device);
    if (name.length >= IFNAMSIZ) throw new Error(`Interface name "${device}" is too long`);
    ifreq.set(name, 0);
    const pointer = Deno.UnsafePointer.value(Deno.UnsafePointer.of(value));
    new DataView(ifreq.buffer).setBigUint64(IFNAMSIZ, BigInt(pointer), true);
    check(
      c().ioctl(fd, BigInt(SIOCETHTOOL), ifreq),
      `Cannot turn transmit checksum offload off on "${device}"`,
    );
  } finally {
    c().close(fd);
  }
}

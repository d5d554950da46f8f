/**
 * QEMU guest agent replies mapped to the JSON shapes KubeVirt's clients unmarshal for
 * GetGuestInfo, GetUsers and GetFilesystems (`VirtualMachineInstanceGuestAgentInfo`,
 * `VirtualMachineInstanceGuestOSUser`, `VirtualMachineInstanceFileSystem` of
 * kubevirt.io/api core/v1).
 *
 * The replies come from the guest, so nothing here trusts them: a reply that is not the
 * agent's `{"return": ...}` or a field of the wrong type reads as absent, never as an
 * error.
 *
 * Without an agent the guest info is `{"os":{},"fsInfo":{"disks":[]}}`. KubeVirt's own
 * launcher writes `"disks":null` (a nil Go slice, which its Go types read back as our
 * `[]`) and `"timezone":", 0"` (an empty zone formatted anyway); the timezone is left out
 * here until the agent reports one.
 *
 * @module
 */

import { type GuestOsInfo, isJsonObject } from "../api/mod.ts";
import type { DomainInterfaceStatus } from "../domain/mod.ts";

/** A command the guest agent supports (`GuestAgentCommandInfo`). */
export interface GuestAgentCommandInfo {
  /** The command, e.g. `guest-ping`. */
  name: string;
  /** True for an enabled command; absent otherwise, as Go's `omitempty` leaves false out. */
  enabled?: boolean;
}

/** A user logged in to the guest (`VirtualMachineInstanceGuestOSUser`). */
export interface GuestOSUser {
  /** The user's name. */
  userName: string;
  /** The user's domain (Windows guests); absent when empty. */
  domain?: string;
  /** Earliest login, fractional seconds since the epoch; absent when zero. */
  loginTime?: number;
}

/** A disk below a guest filesystem (`VirtualMachineInstanceFileSystemDisk`). */
export interface GuestFileSystemDisk {
  /** The disk's serial; absent when empty. */
  serial?: string;
  /** E.g. `virtio`, `scsi`. */
  busType: string;
}

/** A mounted guest filesystem (`VirtualMachineInstanceFileSystem`). */
export interface GuestFileSystem {
  /** The guest's device name, e.g. `vda1`. */
  diskName: string;
  /** E.g. `/`. */
  mountPoint: string;
  /** E.g. `ext4`. */
  fileSystemType: string;
  /** Bytes in use; 0 when the agent did not say. */
  usedBytes: number;
  /** Size in bytes; 0 when the agent did not say. */
  totalBytes: number;
  /** The disks below it; absent when none. */
  disk?: GuestFileSystemDisk[];
}

/** What the guest agent reports (`VirtualMachineInstanceGuestAgentInfo`). */
export interface GuestAgentInfo {
  /** The agent's version. */
  guestAgentVersion?: string;
  /** The commands the agent supports. */
  supportedCommands?: GuestAgentCommandInfo[];
  /** The guest's host name. */
  hostname?: string;
  /**
   * The guest OS (`VirtualMachineInstanceGuestOSInfo`, as in `status.guestOSInfo`);
   * always present (Go never omits a struct), empty without an agent.
   */
  os: GuestOsInfo;
  /** `<zone>, <offset in seconds>`. */
  timezone?: string;
  /** Logged-in users, at most {@linkcode GUEST_INFO_LIST_LIMIT}. */
  userList?: GuestOSUser[];
  /** Mounted filesystems, at most {@linkcode GUEST_INFO_LIST_LIMIT}; always present. */
  fsInfo: { disks: GuestFileSystem[] };
}

/** GetGuestInfo lists at most this many users and filesystems, as KubeVirt's does. */
export const GUEST_INFO_LIST_LIMIT = 10;

/** The agent's raw replies (JSON text) that make up a guest info; absent when unanswered. */
export interface GuestAgentReplies {
  /** `guest-info`. */
  info: string;
  /** `guest-get-osinfo`. */
  osInfo?: string;
  /** `guest-get-host-name`. */
  hostName?: string;
  /** `guest-get-timezone`. */
  timezone?: string;
  /** `guest-get-users`. */
  users?: string;
  /** `guest-get-fsinfo`. */
  filesystems?: string;
}

type Json = Record<string, unknown>;

function text(value: unknown): string | undefined {
  return typeof value === "string" && value !== "" ? value : undefined;
}

function count(value: unknown): number {
  return typeof value === "number" && Number.isFinite(value) ? Math.trunc(value) : 0;
}

/** Fractional seconds kept as they are; zero or not a number reads as absent. */
function loginTime(value: unknown): number | undefined {
  return typeof value === "number" && Number.isFinite(value) && value !== 0 ? value : undefined;
}

/** Drops the keys whose value is `undefined`, as Go's `omitempty` would. */
function compact<T extends Json>(value: T): T {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined)) as T;
}

/** The `return` member of an agent reply, or `undefined` for anything else. */
export function agentReturn(reply: string | undefined): unknown {
  if (reply === undefined) return undefined;
  try {
    const parsed: unknown = JSON.parse(reply);
    return isJsonObject(parsed) ? parsed.return : undefined;
  } catch {
    return undefined;
  }
}

function arrayReturn(reply: string | undefined): Json[] {
  const value = agentReturn(reply);
  return Array.isArray(value) ? value.filter(isJsonObject) : [];
}

function objectReturn(reply: string | undefined): Json {
  const value = agentReturn(reply);
  return isJsonObject(value) ? value : {};
}

/** GetGuestInfo's answer when no agent answers. */
export function emptyGuestAgentInfo(): GuestAgentInfo {
  return { os: {}, fsInfo: { disks: [] } };
}

/** GetUsers' list from a `guest-get-users` reply; empty when it is not one. */
export function guestUsersFromAgent(reply: string | undefined): GuestOSUser[] {
  return arrayReturn(reply).map((user) =>
    compact({
      userName: text(user.user) ?? "",
      domain: text(user.domain),
      loginTime: loginTime(user["login-time"]),
    })
  );
}

/** GetFilesystems' list from a `guest-get-fsinfo` reply; empty when it is not one. */
export function guestFilesystemsFromAgent(reply: string | undefined): GuestFileSystem[] {
  return arrayReturn(reply).map((fs) => {
    const disks = (Array.isArray(fs.disk) ? fs.disk.filter(isJsonObject) : []).map((disk) =>
      compact({ serial: text(disk.serial), busType: text(disk["bus-type"]) ?? "" })
    );
    return compact({
      diskName: text(fs.name) ?? "",
      mountPoint: text(fs.mountpoint) ?? "",
      fileSystemType: text(fs.type) ?? "",
      usedBytes: count(fs["used-bytes"]),
      totalBytes: count(fs["total-bytes"]),
      disk: disks.length > 0 ? disks : undefined,
    });
  });
}

/** The guest OS from a `guest-get-osinfo` reply; empty when it is not one. */
export function guestOsInfoFromAgent(reply: string | undefined): GuestOsInfo {
  const os = objectReturn(reply);
  return compact({
    name: text(os.name),
    kernelRelease: text(os["kernel-release"]),
    version: text(os.version),
    prettyName: text(os["pretty-name"]),
    versionId: text(os["version-id"]),
    kernelVersion: text(os["kernel-version"]),
    machine: text(os.machine),
    id: text(os.id),
  });
}

/**
 * The guest's interfaces from a `guest-network-get-interfaces` reply, as KubeVirt's
 * launcher reports them: loopback left out, each with its MAC, its name in the guest, every
 * address and the first IPv4 one as its IP (else the first). Undefined when it is not such
 * a reply.
 */
export function guestInterfacesFromAgent(
  reply: string | undefined,
): DomainInterfaceStatus[] | undefined {
  const list = agentReturn(reply);
  if (!Array.isArray(list)) return undefined;
  return list.filter(isJsonObject).filter((i) => i.name !== "lo").map((i) => {
    const addresses = (Array.isArray(i["ip-addresses"]) ? i["ip-addresses"] : [])
      .filter(isJsonObject)
      .filter((a) => typeof a["ip-address"] === "string");
    const ips = addresses.map((a) => a["ip-address"] as string);
    const v4 = addresses.find((a) => a["ip-address-type"] === "ipv4")?.["ip-address"] as
      | string
      | undefined;
    return compact({
      mac: text(i["hardware-address"]),
      ip: v4 ?? ips[0],
      ips: ips.length > 0 ? ips : undefined,
      interfaceName: text(i.name),
    }) as DomainInterfaceStatus;
  });
}

/** `frozen` or `thawed` from a `guest-fsfreeze-status` reply; undefined when it is not one. */
export function fsFreezeStatusFromAgent(reply: string | undefined): string | undefined {
  const status = agentReturn(reply);
  return status === "frozen" || status === "thawed" ? status : undefined;
}

/** GetGuestInfo's object from the agent's replies; the `guest-info` reply is required. */
export function guestAgentInfoFromAgent(replies: GuestAgentReplies): GuestAgentInfo {
  const info = objectReturn(replies.info);
  const zone = objectReturn(replies.timezone);
  const commands = (Array.isArray(info.supported_commands) ? info.supported_commands : [])
    .filter(isJsonObject)
    .map((c) =>
      compact({ name: text(c.name) ?? "", enabled: c.enabled === true ? true : undefined })
    );
  const users = guestUsersFromAgent(replies.users).slice(0, GUEST_INFO_LIST_LIMIT);
  return compact({
    guestAgentVersion: text(info.version),
    supportedCommands: commands.length > 0 ? commands : undefined,
    hostname: text(objectReturn(replies.hostName)["host-name"]),
    os: guestOsInfoFromAgent(replies.osInfo),
    timezone: typeof zone.offset === "number"
      ? `${text(zone.zone) ?? ""}, ${Math.trunc(zone.offset)}`
      : undefined,
    userList: users.length > 0 ? users : undefined,
    fsInfo: {
      disks: guestFilesystemsFromAgent(replies.filesystems).slice(0, GUEST_INFO_LIST_LIMIT),
    },
  });
}

/** The process id in the agent's answer to `guest-exec`, or `undefined` without a valid one. */
export function guestExecPid(reply: string | undefined): number | undefined {
  const pid = objectReturn(reply).pid;
  return typeof pid === "number" && Number.isSafeInteger(pid) && pid > 0 ? pid : undefined;
}

/** A guest process as the agent's `guest-exec-status` answers it. */
export interface GuestExecStatus {
  /** Whether it has ended; the rest means something only then. */
  exited: boolean;
  /** Its exit code; a process a signal ended reads as 128 plus the signal, as a shell has it. */
  exitCode: number;
  /** Its standard output (`out-data`, base64), at most `outputLimit` bytes, as UTF-8. */
  stdOut: string;
}

/**
 * The agent's answer to `guest-exec-status`, or `undefined` when it is not one. Output
 * past `outputLimit` bytes is dropped (the guest writes it), as is output that is not
 * base64.
 */
export function guestExecStatus(
  reply: string | undefined,
  outputLimit: number,
): GuestExecStatus | undefined {
  const value = agentReturn(reply);
  if (!isJsonObject(value) || typeof value.exited !== "boolean") return undefined;
  let stdOut = "";
  const data = value["out-data"];
  if (typeof data === "string") {
    try {
      // Four base64 characters carry three bytes: decode no more than the limit needs.
      const head = data.slice(0, Math.ceil(outputLimit / 3) * 4);
      const bytes = Uint8Array.from(atob(head), (c) => c.charCodeAt(0)).subarray(0, outputLimit);
      stdOut = new TextDecoder().decode(bytes);
    } catch {
      stdOut = "";
    }
  }
  const signal = count(value.signal);
  const exitCode = typeof value.exitcode === "number"
    ? count(value.exitcode)
    : signal > 0
    ? 128 + signal
    : 0;
  return { exited: value.exited, exitCode, stdOut };
}

/**
 * Whether a VMI's guest agent is one KubeVirt supports, as virt-handler judges it for the
 * `AgentVersionNotSupported` condition once the agent is connected:
 *
 * - when the launcher reports the agent's commands (`supportedCommands` of GetGuestInfo, which
 *   every current launcher fills), the basic commands must all be there and enabled, and so
 *   must the public-key commands when an access credential propagates a key through the agent
 *   (the `guest-ssh-*` set, or the older file and exec set), and `guest-set-user-password`
 *   when one propagates a password;
 * - otherwise the agent's version must match one of the KubeVirt CR's
 *   `supportedGuestAgentVersions` (regular expressions, unanchored).
 *
 * The reasons are KubeVirt's words.
 *
 * @module
 */
import type { VirtualMachineInstance } from "../api/mod.ts";

/** The commands every supported agent has. */
const REQUIRED_COMMANDS = [
  "guest-ping",
  "guest-get-time",
  "guest-info",
  "guest-shutdown",
  "guest-network-get-interfaces",
  "guest-get-fsinfo",
  "guest-get-host-name",
  "guest-get-users",
  "guest-get-timezone",
  "guest-get-osinfo",
];
/** The public-key commands of current agents. */
const SSH_COMMANDS = [
  "guest-ssh-get-authorized-keys",
  "guest-ssh-add-authorized-keys",
  "guest-ssh-remove-authorized-keys",
];
/** What older agents' keys are written with instead. */
const OLD_SSH_COMMANDS = [
  "guest-exec-status",
  "guest-exec",
  "guest-file-open",
  "guest-file-close",
  "guest-file-read",
  "guest-file-write",
];
const PASSWORD_COMMANDS = ["guest-set-user-password"];

/** The fields of a `spec.accessCredentials` entry read here. */
interface AccessCredential {
  sshPublicKey?: { propagationMethod?: { qemuGuestAgent?: unknown } };
  userPassword?: { propagationMethod?: { qemuGuestAgent?: unknown } };
}

/** The verdict: supported or not, and why. */
export interface AgentSupport {
  /** Whether KubeVirt supports the agent. */
  supported: boolean;
  /** Why, in KubeVirt's words (the condition's reason when not). */
  reason: string;
}

/** What the launcher's GetGuestInfo says about the agent (the fields read here). */
export interface AgentInfo {
  /** The agent's version, e.g. `5.2.0`. */
  guestAgentVersion?: string;
  /** The agent's commands, each enabled or not. */
  supportedCommands?: { name?: string; enabled?: boolean }[];
}

/** Judges the agent of `vmi` from its launcher's guest info; see the module doc. */
export function guestAgentSupport(
  vmi: VirtualMachineInstance,
  info: AgentInfo,
  supportedVersions: readonly string[],
): AgentSupport {
  const commands = info.supportedCommands ?? [];
  if (commands.length === 0) {
    const version = info.guestAgentVersion ?? "";
    const supported = supportedVersions.some((pattern) => {
      try {
        return new RegExp(pattern).test(version);
      } catch {
        return false;
      }
    });
    return supported
      ? { supported, reason: "" }
      : { supported, reason: `Guest agent version '${version}' is not supported` };
  }
  const enabled = new Set(commands.filter((c) => c.enabled === true).map((c) => c.name));
  const all = (names: string[]) => names.every((n) => enabled.has(n));
  if (!all(REQUIRED_COMMANDS)) {
    return { supported: false, reason: "This guest agent doesn't support required basic commands" };
  }
  const raw = (vmi.spec as { accessCredentials?: unknown }).accessCredentials;
  const credentials = Array.isArray(raw) ? raw as AccessCredential[] : [];
  const keysByAgent = credentials.some((c) =>
    c.sshPublicKey?.propagationMethod?.qemuGuestAgent !== undefined
  );
  const passwordsByAgent = credentials.some((c) =>
    c.userPassword?.propagationMethod?.qemuGuestAgent !== undefined
  );
  if (keysByAgent && !all(SSH_COMMANDS) && !all(OLD_SSH_COMMANDS)) {
    return {
      supported: false,
      reason: "This guest agent doesn't support required public key commands",
    };
  }
  if (passwordsByAgent && !all(PASSWORD_COMMANDS)) {
    return {
      supported: false,
      reason: "This guest agent doesn't support required password commands",
    };
  }
  return { supported: true, reason: "This guest agent is supported" };
}

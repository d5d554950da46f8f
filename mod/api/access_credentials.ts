/**
 * The entries of a VMI's `spec.accessCredentials` that reach the guest through its agent
 * (`propagationMethod.qemuGuestAgent`), read as KubeVirt's launcher reads them.
 *
 * @module
 */

import { isJsonObject } from "./types.ts";

/** One `spec.accessCredentials` entry propagated through the agent. */
export interface AgentCredential {
  /** `ssh`: the Secret's values are public keys; `password`: its keys are users. */
  kind: "ssh" | "password";
  /** The Secret's name. */
  secret: string;
  /** For `ssh`, the users whose `authorized_keys` get the keys. */
  users: string[];
}

/**
 * The agent-propagated entries of `spec.accessCredentials` (`raw`), as KubeVirt's launcher
 * reads them: an SSH entry first, else a password entry; one without a Secret is skipped.
 */
export function agentCredentials(raw: unknown): AgentCredential[] {
  if (!Array.isArray(raw)) return [];
  const found: AgentCredential[] = [];
  for (const entry of raw) {
    if (!isJsonObject(entry)) continue;
    for (const [field, kind] of [["sshPublicKey", "ssh"], ["userPassword", "password"]] as const) {
      const credential = entry[field];
      if (!isJsonObject(credential)) continue;
      const method = isJsonObject(credential.propagationMethod) ? credential.propagationMethod : {};
      if (!isJsonObject(method.qemuGuestAgent)) continue;
      const source = isJsonObject(credential.source) ? credential.source : {};
      const secret = isJsonObject(source.secret) ? source.secret.secretName : undefined;
      if (typeof secret !== "string" || secret === "") break;
      const users = Array.isArray(method.qemuGuestAgent.users)
        ? method.qemuGuestAgent.users.filter((u): u is string => typeof u === "string")
        : [];
      found.push({ kind, secret, users });
      break;
    }
  }
  return found;
}

/** The Secrets' names the entries of `raw` read, each once. */
export function credentialSecretNames(raw: unknown): string[] {
  return [...new Set(agentCredentials(raw).map((c) => c.secret))];
}

/**
 * A VMI's `spec.accessCredentials` carried into its guest through the guest agent, as
 * KubeVirt's launcher carries them: the SSH public keys of each user's Secrets become the
 * user's whole `authorized_keys` (`guest-ssh-add-authorized-keys` with `reset`), and each
 * key of a password Secret sets that user's password (`guest-set-user-password`). The result
 * is reported as KubeVirt reports it (the domain's `AccessCredential` metadata, which the
 * handler turns into the `AccessCredentialsSynchronized` condition), in KubeVirt's words.
 *
 * KubeVirt's launcher reads the Secrets from files the kubelet mounts. In pod-less mode the
 * handler reads them and hands their contents to the launcher host over its control socket
 * (never written to disk): {@linkcode AccessCredentials.update}. The timing is KubeVirt's:
 * a change is applied at the next check (every 15 s, so changes landing together go
 * together), a failure is tried again at the next check, and everything is applied again
 * every 5 minutes.
 *
 * Only credentials propagated by `qemuGuestAgent` are handled here; the converter refuses
 * the cloud-init ones.
 *
 * @module
 */

import { errorText } from "../../ffi/mod.ts";
import { getLogger } from "../log/mod.ts";
import { type AgentCredential, agentCredentials } from "../api/mod.ts";

const log = getLogger("launcher", "access-credentials");

/** How often a change is looked for, ms (KubeVirt's launcher: 15 s). */
export const CREDENTIALS_CHECK_MS = 15_000;
/** How often everything is applied again, ms (KubeVirt's launcher: 5 minutes). */
export const CREDENTIALS_RESYNC_MS = 5 * 60_000;

/** A Secret's data as text: key to value. */
export type SecretText = Record<string, string>;

/** What the launcher reports (`AccessCredentialMetadata` of KubeVirt's domain). */
export interface AccessCredentialResult {
  /** Whether every credential reached the guest. */
  succeeded: boolean;
  /** Why not; empty on success. */
  message: string;
}

/** What to set in the guest: each user's keys, in order, and each user's password. */
export interface CredentialPlan {
  /** User to every public key of their Secrets (an empty list empties the file). */
  keys: Map<string, string[]>;
  /** User to password. */
  passwords: Map<string, string>;
  /** A Secret an entry names that was not handed over, as KubeVirt words a missing one. */
  errors: string[];
}

/**
 * What `credentials` with `secrets` ask of the guest, as KubeVirt's launcher works it out: a
 * Secret's keys in name order; each non-blank line of an SSH Secret's values is a key; each
 * non-blank (trimmed) value of a password Secret is the password of the user its key names.
 */
export function credentialPlan(
  credentials: readonly AgentCredential[],
  secrets: Readonly<Record<string, SecretText>>,
): CredentialPlan {
  const plan: CredentialPlan = { keys: new Map(), passwords: new Map(), errors: [] };
  for (const credential of credentials) {
    const data = secrets[credential.secret];
    if (credential.kind === "ssh") {
      for (const user of credential.users) {
        if (!plan.keys.has(user)) plan.keys.set(user, []);
      }
    }
    if (data === undefined) {
      plan.errors.push(`the Secret "${credential.secret}" of spec.accessCredentials is not here`);
      continue;
    }
    const values = Object.keys(data).sort().map((k) => [k, data[k]] as const);
    if (credential.kind === "ssh") {
      const keys = values.flatMap(([, v]) => v.split("\n").map((l) => l.trim()).filter(Boolean));
      for (const user of credential.users) plan.keys.get(user)!.push(...keys);
    } else {
      for (const [user, value] of values) {
        const password = value.trim();
        if (password !== "") plan.passwords.set(user, password);
      }
    }
  }
  return plan;
}

/** Options of {@linkcode AccessCredentials}. */
export interface AccessCredentialsOptions {
  /** Sends one agent command (JSON) and resolves with its reply; throws when it fails. */
  agent(command: Record<string, unknown>): Promise<string>;
  /** Hears each result. */
  report(result: AccessCredentialResult): void;
  /** The check interval, ms; {@linkcode CREDENTIALS_CHECK_MS} unless told (tests). */
  checkMs?: number;
  /** The full resync interval, ms; {@linkcode CREDENTIALS_RESYNC_MS} unless told (tests). */
  resyncMs?: number;
  /** The VMI, for the log. */
  vmi?: Record<string, unknown>;
}

function base64(text: string): string {
  const bytes = new TextEncoder().encode(text);
  let binary = "";
  for (const b of bytes) binary += String.fromCharCode(b);
  return btoa(binary);
}

/** The agent's error text of a failed command (libvirt's message). */
function why(error: unknown): string {
  return errorText(error);
}

/** One VMI's access credentials in its guest; see the module doc. */
export class AccessCredentials {
  readonly #o: AccessCredentialsOptions;
  #credentials: AgentCredential[] = [];
  #secrets: Record<string, SecretText> = {};
  #fingerprint = "";
  /** Something changed, or the last round failed: the next check applies. */
  #due = false;
  #lastApplied = 0;
  #timer: ReturnType<typeof setInterval> | undefined;
  #running: Promise<void> | undefined;
  #closed = false;

  /** Creates the manager; nothing runs until the first {@linkcode update}. */
  constructor(options: AccessCredentialsOptions) {
    this.#o = options;
  }

  /**
   * Takes the VMI's `spec.accessCredentials` (`raw`) and the contents of the Secrets they
   * name. A change is applied at the next check; the checks start with the first entries.
   */
  update(raw: unknown, secrets: Readonly<Record<string, SecretText>>): void {
    if (this.#closed) return;
    const credentials = agentCredentials(raw);
    const fingerprint = JSON.stringify([credentials, secrets]);
    if (fingerprint !== this.#fingerprint) {
      this.#fingerprint = fingerprint;
      this.#credentials = credentials;
      this.#secrets = structuredClone(secrets) as Record<string, SecretText>;
      this.#due = true;
    }
    if (this.#credentials.length > 0 && this.#timer === undefined) {
      this.#timer = setInterval(() => void this.check(), this.#o.checkMs ?? CREDENTIALS_CHECK_MS);
    }
  }

  /**
   * One check: applies when something changed, the last round failed or the resync is due;
   * resolves when done (a check while one runs waits for it).
   */
  check(): Promise<void> {
    if (this.#running) return this.#running;
    const resync = Date.now() - this.#lastApplied >= (this.#o.resyncMs ?? CREDENTIALS_RESYNC_MS);
    if (this.#closed || this.#credentials.length === 0 || (!this.#due && !resync)) {
      return Promise.resolve();
    }
    this.#due = false;
    this.#running = this.#apply().catch((error) => {
      this.#due = true;
      log.warn("Cannot apply the access credentials: {error}", { ...this.#o.vmi, error });
    }).finally(() => this.#running = undefined);
    return this.#running;
  }

  async #apply(): Promise<void> {
    this.#lastApplied = Date.now();
    try {
      await this.#o.agent({ execute: "guest-ping" });
    } catch {
      this.#due = true;
      this.#o.report({ succeeded: false, message: "Guest agent is offline" });
      return;
    }
    const plan = credentialPlan(this.#credentials, this.#secrets);
    // Each failure is reported as it happens in KubeVirt's launcher: the last one stands.
    let failure: string | undefined = plan.errors.at(-1);
    for (const [user, keys] of plan.keys) {
      try {
        await this.#o.agent({
          execute: "guest-ssh-add-authorized-keys",
          arguments: { username: user, keys, reset: true },
        });
      } catch (error) {
        failure = `Error encountered writing ssh pub key access credentials for user [${user}]: ` +
          why(error);
      }
    }
    for (const [user, password] of plan.passwords) {
      try {
        await this.#o.agent({
          execute: "guest-set-user-password",
          arguments: { username: user, password: base64(password), crypted: false },
        });
      } catch (error) {
        failure = `Error encountered setting password for user [${user}]: ${why(error)}`;
      }
    }
    if (failure !== undefined) {
      this.#due = true;
      this.#o.report({ succeeded: false, message: failure });
      return;
    }
    log.info("Access credentials set in the guest", {
      ...this.#o.vmi,
      users: [...new Set([...plan.keys.keys(), ...plan.passwords.keys()])].join(","),
    });
    this.#o.report({ succeeded: true, message: "" });
  }

  /** Stops the checks; waits for a round in progress. */
  async close(): Promise<void> {
    this.#closed = true;
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
    await this.#running;
  }
}

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
import { agentReturn } from "./guest_agent.ts";

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
  /**
   * Runs a program in the guest through the agent (`guest-exec`) and resolves with its exit
   * code and output; throws when it cannot be run or does not end in time.
   */
  exec(command: string, args: string[]): Promise<{ exitCode: number; stdOut: string }>;
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
        await this.#setAuthorizedKeys(user, keys);
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

  /**
   * Makes `keys` the whole of `user`'s `authorized_keys`: with `guest-ssh-add-authorized-keys`
   * (reset), or where the agent lacks it, as KubeVirt's launcher falls back, by writing the
   * file through the agent's file commands (`~/.ssh` made 700 and the file 600, the user's).
   */
  async #setAuthorizedKeys(user: string, keys: string[]): Promise<void> {
    let first: unknown;
    try {
      await this.#o.agent({
        execute: "guest-ssh-add-authorized-keys",
        arguments: { username: user, keys, reset: true },
      });
      return;
    } catch (error) {
      first = error;
    }
    try {
      await this.#writeAuthorizedKeysFile(user, keys.join("\n"));
    } catch (second) {
      throw new Error(
        `failed to set SSH keys: error from guest-ssh-add-authorized-keys: ${why(first)}; ` +
          `error from using guest-file-write: ${why(second)}`,
      );
    }
  }

  /** Runs `command` in the guest; a non-zero exit is an error naming it. */
  async #run(command: string, args: string[]): Promise<string> {
    const { exitCode, stdOut } = await this.#o.exec(command, args);
    if (exitCode !== 0) throw new Error(`${command} exited with ${exitCode} in the guest`);
    return stdOut;
  }

  async #writeAuthorizedKeysFile(user: string, contents: string): Promise<void> {
    const entry = (await this.#run("getent", ["passwd", user])).trim().split(":");
    if (entry.length < 6) throw new Error(`unable to detect home directory of user ${user}`);
    const [home, owner] = [entry[5], `${entry[2]}:${entry[3]}`];
    const file = `${home}/.ssh/authorized_keys`;
    let current: string | undefined;
    try {
      current = await this.#readGuestFile(file);
    } catch (error) {
      if (!/No such file or directory/.test(why(error))) throw error;
    }
    if (current === contents) return;
    const dir = `${home}/.ssh`;
    await this.#run("mkdir", ["-p", dir]);
    await this.#run("chown", [owner, dir]);
    await this.#run("chmod", ["700", dir]);
    if (current !== undefined) {
      await this.#run("chown", [owner, file]);
      await this.#run("chmod", ["600", file]);
    }
    const handle = await this.#openGuestFile(file, "w");
    await this.#o.agent({
      execute: "guest-file-write",
      arguments: { handle, "buf-b64": base64(contents) },
    });
    await this.#o.agent({ execute: "guest-file-close", arguments: { handle } });
    if (current === undefined) {
      await this.#run("chown", [owner, file]);
      await this.#run("chmod", ["600", file]);
    }
  }

  async #openGuestFile(path: string, mode: "r" | "w"): Promise<number> {
    const reply = await this.#o.agent({ execute: "guest-file-open", arguments: { path, mode } });
    const handle = agentReturn(reply);
    if (typeof handle !== "number") throw new Error(`guest-file-open of ${path} gave no handle`);
    return handle;
  }

  async #readGuestFile(path: string): Promise<string> {
    const handle = await this.#openGuestFile(path, "r");
    const read = agentReturn(
      await this.#o.agent({ execute: "guest-file-read", arguments: { handle } }),
    ) as { count?: unknown; "buf-b64"?: unknown } | undefined;
    await this.#o.agent({ execute: "guest-file-close", arguments: { handle } });
    if (typeof read?.["buf-b64"] !== "string" || read.count === 0) return "";
    return new TextDecoder().decode(
      Uint8Array.from(atob(read["buf-b64"]), (c) => c.charCodeAt(0)),
    );
  }

  /** Stops the checks; waits for a round in progress. */
  async close(): Promise<void> {
    this.#closed = true;
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
    await this.#running;
  }
}

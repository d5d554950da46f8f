/**
 * The handler server's TLS material, kept current: its certificate and key from files
 * (KubeVirt mounts them from the `kubevirt-virt-handler-server-certs` Secret), and the CA
 * bundle client certificates are verified against (KubeVirt's `kubevirt-ca` ConfigMap,
 * key `ca-bundle`, watched; or a file). Files are looked at every few seconds and a change
 * is handed on whole: a certificate without its new key is never served. A rotation caught
 * half-way (the certificate new, the key still old, or a file cut short) is not taken: the
 * server keeps the pair it has until the files hold a certificate and the key that goes
 * with it, and a listener that throws is logged, never the end of the watch.
 *
 * A client is accepted, as KubeVirt's handler accepts it, when its certificate chains to
 * the bundle, is valid now, allows client authentication, and names
 * `kubevirt.io:system:client:<type>` for an allowed type (`virt-handler`: virt-api's).
 *
 * @module
 */
import { createPrivateKey, X509Certificate } from "node:crypto";
import type { PeerCertificate } from "node:tls";
import { sleep } from "../lifecycle/mod.ts";
import { getLogger } from "../log/mod.ts";
import { errorText } from "../../ffi/mod.ts";

const log = getLogger("rest", "tls");

/** How often the files are looked at, ms. */
export const TLS_POLL_MS = 2_000;

/** The common name prefix of KubeVirt's client certificates. */
export const CLIENT_COMMON_NAME_PREFIX = "kubevirt.io:system:client:";

/** What a TLS server is configured with. */
export interface TlsContext {
  /** PEM certificate chain. */
  cert: string;
  /** PEM private key. */
  key: string;
  /** PEM CA bundle for client certificates. */
  ca: string;
}

/** The material could not be read or is incomplete. */
export class TlsMaterialError extends Error {
  /** Creates the error. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "TlsMaterialError";
  }
}

/** Options of {@linkcode TlsMaterial}. */
export interface TlsMaterialOptions {
  /** The server certificate (PEM). */
  certFile: string;
  /** Its private key (PEM). */
  keyFile: string;
  /** A CA bundle file; without it the bundle comes from {@linkcode TlsMaterial.setCaBundle}. */
  caFile?: string;
  /** Whose certificate it is, for messages: the server's unless told. */
  role?: "server" | "client";
  /** How often {@linkcode TlsMaterial.watch} looks at the files, ms; {@linkcode TLS_POLL_MS} unless told. */
  pollMs?: number;
}

async function readIfThere(path: string): Promise<string | undefined> {
  try {
    return await Deno.readTextFile(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return undefined;
    throw error;
  }
}

/** The server's certificate, key and client CA bundle; see the module doc. */
export class TlsMaterial {
  readonly #o: TlsMaterialOptions;
  #cert = "";
  #key = "";
  #fileCa = "";
  #watchedCa = "";
  #listeners: ((context: TlsContext) => void)[] = [];

  /** Material read from `options`' files by {@linkcode TlsMaterial.load}. */
  constructor(options: TlsMaterialOptions) {
    this.#o = options;
  }

  /**
   * Reads the files; throws {@linkcode TlsMaterialError} naming what is missing, cannot be
   * parsed, or does not match (a key that is not the certificate's), keeping what it had.
   */
  async load(): Promise<void> {
    const [cert, key, ca] = await Promise.all([
      readIfThere(this.#o.certFile),
      readIfThere(this.#o.keyFile),
      this.#o.caFile ? readIfThere(this.#o.caFile) : Promise.resolve(""),
    ]);
    const role = this.#o.role ?? "server";
    if (!cert) {
      throw new TlsMaterialError(`Cannot read the ${role} certificate "${this.#o.certFile}"`);
    }
    if (!key) throw new TlsMaterialError(`Cannot read the ${role} key "${this.#o.keyFile}"`);
    if (ca === undefined) {
      throw new TlsMaterialError(`Cannot read the CA bundle "${this.#o.caFile}"`);
    }
    // Parsed only when it changed: the files are read every poll.
    if (cert !== this.#cert || key !== this.#key) checkPair(cert, key, { ...this.#o, role });
    this.#cert = cert;
    this.#key = key;
    this.#fileCa = ca;
  }

  /** The CA bundle as the `kubevirt-ca` ConfigMap has it now. */
  setCaBundle(pem: string): void {
    if (pem === this.#watchedCa) return;
    this.#watchedCa = pem;
    log.info("Client CA bundle changed", { certificates: countCertificates(pem) });
    this.#changed();
  }

  /** Whether there is a CA bundle to verify clients with (no bundle: no client gets in). */
  hasCa(): boolean {
    return this.#ca() !== "";
  }

  #ca(): string {
    return this.#o.caFile ? this.#fileCa : this.#watchedCa;
  }

  /** The context now; throws {@linkcode TlsMaterialError} before a CA bundle is known. */
  context(): TlsContext {
    if (!this.hasCa()) {
      throw new TlsMaterialError("No client CA bundle yet: the server is not ready for clients");
    }
    return { cert: this.#cert, key: this.#key, ca: this.#ca() };
  }

  /**
   * The server's certificate and key alone, for a server that asks no client for one
   * (the metrics); these files change too, and {@linkcode onChange} says when.
   */
  serverMaterial(): { cert: string; key: string } {
    return { cert: this.#cert, key: this.#key };
  }

  /** Calls `listener` with each new context. */
  onChange(listener: (context: TlsContext) => void): void {
    this.#listeners.push(listener);
  }

  #changed(): void {
    const context = { cert: this.#cert, key: this.#key, ca: this.#ca() };
    for (const l of this.#listeners) {
      // One server that cannot take the new material must not stop the others from
      // getting it, nor end the watch (and with it the handler).
      try {
        l(context);
      } catch (error) {
        log.error("Cannot hand on the new TLS material: {error}", { error });
      }
    }
  }

  /**
   * Looks at the files every `pollMs` ({@linkcode TLS_POLL_MS}) until `signal` aborts; hands
   * a complete, matching change on. Never rejects: what cannot be read or does not match
   * is logged once and looked at again next time, the old material still served.
   */
  async watch(signal: AbortSignal): Promise<void> {
    const pollMs = this.#o.pollMs ?? TLS_POLL_MS;
    let problem = "";
    while (!signal.aborted) {
      // sleep() takes its abort listener off again: one per round piled up for good.
      await sleep(pollMs, signal);
      if (signal.aborted) return;
      const before = [this.#cert, this.#key, this.#fileCa];
      try {
        await this.load();
      } catch (error) {
        // A rotation in progress (a Secret's files swapped one by one): next time. Said
        // once, not every round, for a rotation that never finishes.
        const message = errorText(error);
        if (message !== problem) {
          log.warn("Cannot reload the TLS material, serving the previous one: {error}", {
            error,
          });
        }
        problem = message;
        continue;
      }
      if (problem) log.info("TLS material readable again", { certFile: this.#o.certFile });
      problem = "";
      if (before[0] !== this.#cert || before[1] !== this.#key || before[2] !== this.#fileCa) {
        log.info("TLS material changed on disk: serving the new one");
        this.#changed();
      }
    }
  }
}

/**
 * Throws {@linkcode TlsMaterialError} unless `cert` is a certificate (the first of a chain)
 * whose public key is `key`'s: TLS servers take a mismatched pair without a word and then
 * fail every handshake, or refuse to start.
 */
function checkPair(
  cert: string,
  key: string,
  o: { certFile: string; keyFile: string; role: string },
): void {
  let certificate: X509Certificate;
  try {
    certificate = new X509Certificate(cert);
  } catch (cause) {
    throw new TlsMaterialError(
      `Cannot parse the ${o.role} certificate "${o.certFile}": ${errorText(cause)}`,
      { cause },
    );
  }
  let privateKey;
  try {
    privateKey = createPrivateKey(key);
  } catch (cause) {
    throw new TlsMaterialError(
      `Cannot parse the ${o.role} key "${o.keyFile}": ${errorText(cause)}`,
      { cause },
    );
  }
  if (!certificate.checkPrivateKey(privateKey)) {
    throw new TlsMaterialError(
      `Cannot use the ${o.role} certificate "${o.certFile}" with the key "${o.keyFile}": the key is not the certificate's`,
    );
  }
}

function countCertificates(pem: string): number {
  return pem.match(/-----BEGIN CERTIFICATE-----/g)?.length ?? 0;
}

/**
 * Why a verified client certificate is still not let in (its common name), or undefined
 * when it is; `types` are the allowed `kubevirt.io:system:client:<type>` names.
 */
export function refuseClient(
  peer: PeerCertificate | undefined,
  types: string[],
): string | undefined {
  const cn = peer?.subject?.CN;
  if (!cn) return "the client presented no certificate";
  const name = Array.isArray(cn) ? cn[0] : cn;
  if (types.some((t) => name === CLIENT_COMMON_NAME_PREFIX + t)) return undefined;
  return `the client certificate's common name "${name}" is not allowed`;
}

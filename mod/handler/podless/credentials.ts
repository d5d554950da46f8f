/**
 * The Secrets of a VMI's access credentials in pod-less mode. In KubeVirt mode the kubelet
 * mounts them into the launcher pod; here no kubelet runs, so the handler reads each Secret
 * a VMI of its node names (`GET`, one by one: never a list or a watch of Secrets) and hands
 * the launcher host their text over its control socket. Nothing of a Secret is written to
 * disk. Reading needs `get` on Secrets, which deploy/podless-secrets.yaml grants; without
 * it the VMI's sync fails with the apiserver's refusal and what to apply.
 *
 * @module
 */

import { credentialSecretNames, type VirtualMachineInstance } from "../../api/mod.ts";
import { detailOf, isApiStatus } from "../../kube/mod.ts";

/** Reads one object from the apiserver (the handler's client). */
export interface SecretReader {
  /** Sends one request and returns the decoded JSON answer. */
  request<T = unknown>(method: string, path: string): Promise<T>;
}

/** A Secret of a VMI's access credentials cannot be read. */
export class CredentialSecretError extends Error {
  /** Creates the error; the message says which Secret and why. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "CredentialSecretError";
  }
}

/** Secret name to key to value (text). */
export type CredentialSecrets = Record<string, Record<string, string>>;

function decode(value: unknown): string {
  if (typeof value !== "string") return "";
  const binary = atob(value);
  return new TextDecoder().decode(Uint8Array.from(binary, (c) => c.charCodeAt(0)));
}

/** Whether `vmi` has access credentials that go through its agent (Secrets to read). */
export function hasAgentCredentials(vmi: VirtualMachineInstance): boolean {
  return credentialSecretNames(vmi.spec.accessCredentials).length > 0;
}

/**
 * The text of every Secret `vmi`'s agent-propagated access credentials name, from its
 * namespace. Throws {@linkcode CredentialSecretError} naming the Secret when one does not
 * exist or may not be read.
 */
export async function readCredentialSecrets(
  client: SecretReader,
  vmi: VirtualMachineInstance,
): Promise<CredentialSecrets> {
  const namespace = vmi.metadata.namespace ?? "default";
  const secrets: CredentialSecrets = {};
  for (const name of credentialSecretNames(vmi.spec.accessCredentials)) {
    const quoted = `"${namespace}/${name}"`;
    let secret: { data?: Record<string, unknown> };
    try {
      secret = await client.request(
        "GET",
        `/api/v1/namespaces/${encodeURIComponent(namespace)}/secrets/${encodeURIComponent(name)}`,
      );
    } catch (error) {
      if (isApiStatus(error, 404)) {
        throw new CredentialSecretError(
          `spec.accessCredentials: Secret ${quoted} does not exist`,
          { cause: error },
        );
      }
      if (isApiStatus(error, 403)) {
        throw new CredentialSecretError(
          `spec.accessCredentials: this node may not read Secret ${quoted} (${
            detailOf(error)
          }); a pod-less node reads the Secrets of its VMIs' access credentials once ` +
            "deploy/podless-secrets.yaml grants it",
          { cause: error },
        );
      }
      throw error;
    }
    try {
      secrets[name] = Object.fromEntries(
        Object.entries(secret.data ?? {}).map(([key, value]) => [key, decode(value)]),
      );
    } catch (error) {
      throw new CredentialSecretError(
        `spec.accessCredentials: Secret ${quoted} holds data that is not base64`,
        { cause: error },
      );
    }
  }
  return secrets;
}

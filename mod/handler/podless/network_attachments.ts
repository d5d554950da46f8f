/**
 * The NetworkAttachmentDefinitions of pod-less VMIs' secondary networks. In KubeVirt mode
 * Multus reads them for the launcher pod; here the handler reads each one a VMI of its node
 * names (`GET` by name) and calls its CNI configuration itself (mod/network/cni.ts). Reading
 * needs `get` on `network-attachment-definitions.k8s.cni.cncf.io`, which
 * deploy/podless-node.yaml grants.
 *
 * @module
 */

import type { SecretReader } from "./credentials.ts";

/** A NetworkAttachmentDefinition as the handler reads it. */
interface NetworkAttachmentDefinition {
  spec?: { config?: unknown };
}

/**
 * The CNI configuration (`spec.config`) of the NetworkAttachmentDefinition `name` in
 * `namespace`; throws when it cannot be read (the apiserver's refusal) or has none.
 */
export async function networkAttachmentConfig(
  client: SecretReader,
  namespace: string,
  name: string,
): Promise<string> {
  const path = `/apis/k8s.cni.cncf.io/v1/namespaces/${encodeURIComponent(namespace)}` +
    `/network-attachment-definitions/${encodeURIComponent(name)}`;
  const nad = await client.request<NetworkAttachmentDefinition>("GET", path);
  const config = nad.spec?.config;
  if (typeof config !== "string" || config.trim() === "") {
    throw new Error("it has no spec.config");
  }
  return config;
}

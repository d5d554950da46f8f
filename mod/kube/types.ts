/**
 * The small part of Kubernetes' object model this layer needs: metadata and a key.
 *
 * @module
 */
import { splitVmiKey, vmiKey } from "../api/mod.ts";

/** `metav1.ObjectMeta`, the fields we read; anything else is kept as is. */
export interface ObjectMeta {
  name?: string;
  namespace?: string;
  uid?: string;
  resourceVersion?: string;
  generation?: number;
  creationTimestamp?: string | null;
  deletionTimestamp?: string | null;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  finalizers?: string[];
}

/** Any Kubernetes object. */
export interface KubeObject {
  apiVersion?: string;
  kind?: string;
  metadata?: ObjectMeta;
}

/** A `List` response, e.g. `VirtualMachineInstanceList`. */
export interface KubeList<T extends KubeObject = KubeObject> {
  apiVersion?: string;
  kind?: string;
  metadata?: { resourceVersion?: string; continue?: string; remainingItemCount?: number };
  items: T[];
}

/** One line of a watch stream. */
export interface WatchEvent<T extends KubeObject = KubeObject> {
  type: "ADDED" | "MODIFIED" | "DELETED" | "BOOKMARK" | "ERROR";
  object: T;
}

/** The store key of an object: "namespace/name", or "name" for cluster-scoped objects. */
export function objectKey(obj: KubeObject): string {
  return vmiKey({ namespace: obj.metadata?.namespace, name: obj.metadata?.name ?? "" });
}

/** Splits a store key back into namespace ("" when cluster-scoped) and name. */
export const splitKey: (key: string) => { namespace: string; name: string } = splitVmiKey;

/** Options for {@linkcode resourcePath}. */
export interface ResourcePathOptions {
  /** API group; "" (or absent) for the core group. */
  group?: string;
  version: string;
  plural: string;
  namespace?: string;
  name?: string;
  subresource?: string;
}

/**
 * The REST path of a resource: `/api/v1/namespaces/ns/events` or
 * `/apis/kubevirt.io/v1/namespaces/ns/virtualmachineinstances/vm1/status`.
 */
export function resourcePath(options: ResourcePathOptions): string {
  const base = options.group
    ? `/apis/${options.group}/${options.version}`
    : `/api/${options.version}`;
  let path = base;
  if (options.namespace) path += `/namespaces/${encodeURIComponent(options.namespace)}`;
  path += `/${options.plural}`;
  if (options.name) path += `/${encodeURIComponent(options.name)}`;
  if (options.subresource) path += `/${options.subresource}`;
  return path;
}

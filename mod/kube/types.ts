/**
 * The small part of Kubernetes' object model this layer needs: metadata and a key.
 *
 * @module
 */
import { splitVmiKey, vmiKey } from "../api/mod.ts";

/** `metav1.ObjectMeta`, the fields we read; anything else is kept as is. */
export interface ObjectMeta {
  /** The object's name, unique within its namespace and kind. */
  name?: string;
  /** The object's namespace; absent for cluster-scoped objects. */
  namespace?: string;
  /** The unique ID the apiserver gave the object; a re-created object gets a new one. */
  uid?: string;
  /** The version of the object the apiserver stored; sent back on update. */
  resourceVersion?: string;
  /** Incremented by the apiserver on each change of the desired state. */
  generation?: number;
  /** When the object was created (RFC 3339). */
  creationTimestamp?: string | null;
  /** When deletion was asked for (RFC 3339); set while finalizers remain. */
  deletionTimestamp?: string | null;
  /** Labels, for selecting objects. */
  labels?: Record<string, string>;
  /** Annotations: non-identifying data about the object. */
  annotations?: Record<string, string>;
  /** What must be done before the apiserver deletes the object. */
  finalizers?: string[];
}

/** Any Kubernetes object. */
export interface KubeObject {
  /** The group and version, e.g. `kubevirt.io/v1`. */
  apiVersion?: string;
  /** The kind, e.g. `VirtualMachineInstance`. */
  kind?: string;
  /** The object's metadata. */
  metadata?: ObjectMeta;
}

/** A `List` response, e.g. `VirtualMachineInstanceList`. */
export interface KubeList<T extends KubeObject = KubeObject> {
  /** The group and version, e.g. `kubevirt.io/v1`. */
  apiVersion?: string;
  /** The kind, e.g. `VirtualMachineInstanceList`. */
  kind?: string;
  /** The list's `resourceVersion` to watch from, and the `continue` token of the next page. */
  metadata?: { resourceVersion?: string; continue?: string; remainingItemCount?: number };
  /** The objects. */
  items: T[];
}

/** One line of a watch stream. */
export interface WatchEvent<T extends KubeObject = KubeObject> {
  /** What happened: the object was added, modified or deleted; or a bookmark or an error. */
  type: "ADDED" | "MODIFIED" | "DELETED" | "BOOKMARK" | "ERROR";
  /** The object after the event; a `Status` for `ERROR`. */
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
  /** API version, e.g. `v1`. */
  version: string;
  /** The resource's plural name, e.g. `virtualmachineinstances`. */
  plural: string;
  /** The namespace; absent for cluster-scoped resources or all namespaces. */
  namespace?: string;
  /** The object's name; absent for the collection. */
  name?: string;
  /** A subresource of the object, e.g. `status`. */
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

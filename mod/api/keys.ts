/**
 * The `namespace/name` key that names a namespaced object everywhere in virtnode: the
 * informer's store, the work queue, ghost records, the domain store and log lines.
 * libvirt's domain name (`namespace_name`) is another rule, in `mod/domain`.
 *
 * @module
 */

/** What names a namespaced object. */
export interface ObjectRef {
  /** The namespace; absent or "" for a cluster-scoped object. */
  namespace?: string;
  /** The name. */
  name: string;
}

/** `namespace/name`, or `name` for a cluster-scoped object. */
export function vmiKey(ref: ObjectRef): string {
  return ref.namespace ? `${ref.namespace}/${ref.name}` : ref.name;
}

/** Splits a key made by {@linkcode vmiKey}; `namespace` is "" for a cluster-scoped key. */
export function splitVmiKey(key: string): { namespace: string; name: string } {
  const slash = key.indexOf("/");
  if (slash < 0) return { namespace: "", name: key };
  return { namespace: key.slice(0, slash), name: key.slice(slash + 1) };
}

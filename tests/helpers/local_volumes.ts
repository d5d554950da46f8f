/**
 * Local PersistentVolumes and their claims, as the tests give a node's directories and loop
 * devices to VMIs: class `local`, kept on release, pinned to one node by its hostname label.
 */

/** A local PersistentVolume of `path` on `node`, for `claimRef` alone when named. */
export function localVolume(o: {
  name: string;
  path: string;
  size: string;
  node: string;
  block?: boolean;
  claimRef?: { namespace: string; name: string };
}) {
  return {
    apiVersion: "v1",
    kind: "PersistentVolume",
    metadata: { name: o.name },
    spec: {
      capacity: { storage: o.size },
      accessModes: ["ReadWriteOnce"],
      persistentVolumeReclaimPolicy: "Retain",
      storageClassName: "local",
      ...(o.block ? { volumeMode: "Block" } : {}),
      local: { path: o.path },
      ...(o.claimRef ? { claimRef: o.claimRef } : {}),
      nodeAffinity: {
        required: {
          nodeSelectorTerms: [{
            matchExpressions: [{
              key: "kubernetes.io/hostname",
              operator: "In",
              values: [o.node],
            }],
          }],
        },
      },
    },
  };
}

/** A claim in `namespace` (`default` unless told) of the local volume `volumeName`. */
export function localClaim(
  o: { name: string; volumeName: string; size: string; block?: boolean; namespace?: string },
) {
  return {
    apiVersion: "v1",
    kind: "PersistentVolumeClaim",
    metadata: { name: o.name, namespace: o.namespace ?? "default" },
    spec: {
      storageClassName: "local",
      volumeName: o.volumeName,
      accessModes: ["ReadWriteOnce"],
      ...(o.block ? { volumeMode: "Block" } : {}),
      resources: { requests: { storage: o.size } },
    },
  };
}

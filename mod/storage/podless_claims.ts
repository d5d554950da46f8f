/**
 * Claims in pod-less mode. No kubelet mounts a PersistentVolumeClaim here, so a claim a
 * VMI hotplugs is found on this host through the PersistentVolume bound to it: a `local`
 * or `hostPath` volume whose path lies inside the folder of the claim's namespace in the
 * handler's host disk root (`<root>/<namespace>/`). A filesystem volume holds the guest's
 * disk as `disk.img` (as in KubeVirt, CDI or the user makes it); a block volume's path is
 * the device node itself.
 *
 * The claim counts as bound when both sides name each other (the claim's
 * `spec.volumeName`, the volume's `spec.claimRef`), which is what binding means; a host
 * without kube-controller-manager never sees the claim's phase turn `Bound`, but the
 * binding is the same.
 *
 * @module
 */
import * as path from "node:path";
import type { ClaimInfo } from "../api/mod.ts";
import { isApiStatus } from "../kube/mod.ts";
import { DISK_IMAGE } from "./host_disks.ts";

/** What the resolver needs of an apiserver client (`KubeClient` has it). */
export interface ClaimReader {
  /** Sends one request and returns the decoded JSON answer. */
  request<T = unknown>(method: string, path: string): Promise<T>;
}

/** A claim found on this host. */
export interface HostClaim {
  /**
   * The disk: `<volume path>/disk.img`, or the block device node; for a claim asked for as
   * a folder, the volume's path.
   */
  path: string;
  /** The disk is a block device. */
  block: boolean;
  /** The claim's access modes, volume mode, capacity and requests, as virt-controller writes them. */
  claimInfo: ClaimInfo;
}

/** A claim that cannot be used on this host; the message says why. */
export class HostClaimError extends Error {
  /** Creates the error. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "HostClaimError";
  }
}

interface Claim {
  metadata: { name: string; namespace: string; uid?: string };
  spec?: {
    volumeName?: string;
    volumeMode?: string;
    accessModes?: string[];
    resources?: { requests?: Record<string, string> };
  };
  status?: { capacity?: Record<string, string> };
}

interface Volume {
  spec?: {
    claimRef?: { name?: string; namespace?: string; uid?: string };
    volumeMode?: string;
    capacity?: Record<string, string>;
    local?: { path?: string };
    hostPath?: { path?: string };
    nodeAffinity?: {
      required?: {
        nodeSelectorTerms?: {
          matchExpressions?: { key?: string; operator?: string; values?: string[] }[];
        }[];
      };
    };
  };
}

/**
 * Whether a local volume's required node affinity picks `node` by its host name label: some
 * term must name it (`kubernetes.io/hostname In [...node...]`) and ask for nothing else,
 * since no other label of this host is known here.
 */
function pinnedTo(volume: Volume, node: string): boolean {
  const terms = volume.spec?.nodeAffinity?.required?.nodeSelectorTerms ?? [];
  return terms.some((term) => {
    const expressions = term.matchExpressions ?? [];
    return expressions.length > 0 &&
      expressions.every((e) =>
        e.key === "kubernetes.io/hostname" && e.operator === "In" &&
        (e.values ?? []).includes(node)
      );
  });
}

async function getOrUndefined<T>(client: ClaimReader, url: string): Promise<T | undefined> {
  try {
    return await client.request<T>("GET", url);
  } catch (error) {
    if (isApiStatus(error, 404)) return undefined;
    throw error;
  }
}

function isInside(root: string, candidate: string): boolean {
  const relative = path.relative(root, candidate);
  return relative !== "" && !relative.startsWith("..") && !path.isAbsolute(relative);
}

/**
 * Finds the claim `namespace/name` on this host (`node`) beneath `root`. Throws
 * {@linkcode HostClaimError} naming what is missing or wrong: no such claim, not bound,
 * a volume of another kind, a local volume of another node, a path outside the namespace's
 * folder of `root`, a symbolic link, no `disk.img`, no device. With `folder`, the claim is
 * a filesystem volume whose folder is used as it is (a memory dump is written into it).
 */
export async function resolveHostClaim(
  client: ClaimReader,
  ref: { namespace: string; name: string },
  host: { root: string | undefined; node: string },
  use: { folder?: boolean } = {},
): Promise<HostClaim> {
  const root = host.root;
  const quoted = `"${ref.namespace}/${ref.name}"`;
  if (!root) {
    throw new HostClaimError(
      `claim ${quoted} cannot be used: this host has no host disk root (--host-disk-root) for claims`,
    );
  }
  const claim = await getOrUndefined<Claim>(
    client,
    `/api/v1/namespaces/${encodeURIComponent(ref.namespace)}/persistentvolumeclaims/${
      encodeURIComponent(ref.name)
    }`,
  );
  if (!claim) throw new HostClaimError(`claim ${quoted} does not exist`);
  const volumeName = claim.spec?.volumeName;
  if (!volumeName) {
    throw new HostClaimError(
      `claim ${quoted} is not bound to a PersistentVolume (no spec.volumeName)`,
    );
  }
  const volume = await getOrUndefined<Volume>(
    client,
    `/api/v1/persistentvolumes/${encodeURIComponent(volumeName)}`,
  );
  if (!volume) {
    throw new HostClaimError(
      `claim ${quoted} names PersistentVolume "${volumeName}", which does not exist`,
    );
  }
  const claimRef = volume.spec?.claimRef;
  if (
    claimRef?.name !== ref.name || claimRef?.namespace !== ref.namespace ||
    (claimRef.uid !== undefined && claim.metadata.uid !== undefined &&
      claimRef.uid !== claim.metadata.uid)
  ) {
    throw new HostClaimError(
      `claim ${quoted} is not bound: PersistentVolume "${volumeName}" is reserved for ${
        claimRef?.name ? `"${claimRef.namespace}/${claimRef.name}"` : "no claim"
      }`,
    );
  }
  // A local volume is one node's disk: on another node the same path is something else.
  if (volume.spec?.local && !pinnedTo(volume, host.node)) {
    throw new HostClaimError(
      `claim ${quoted}: local PersistentVolume "${volumeName}" is not pinned to this node "${host.node}" (spec.nodeAffinity)`,
    );
  }
  const where = volume.spec?.local?.path ?? volume.spec?.hostPath?.path;
  if (!where) {
    throw new HostClaimError(
      `claim ${quoted}: PersistentVolume "${volumeName}" is neither a local nor a hostPath volume`,
    );
  }
  const normal = path.normalize(where);
  // The root holds every namespace's volumes, each in its own folder: a claim's volume must
  // be in its namespace's, as a VMI's hostDisk must.
  const allowed = path.join(root, ref.namespace);
  if (!path.isAbsolute(where) || where.split("/").includes("..") || !isInside(allowed, normal)) {
    throw new HostClaimError(
      `claim ${quoted}: the path "${where}" of PersistentVolume "${volumeName}" is outside "${allowed}/", the host disk root of namespace "${ref.namespace}"`,
    );
  }
  const mode = volume.spec?.volumeMode ?? "Filesystem";
  const block = mode === "Block";
  if (block && use.folder) {
    throw new HostClaimError(
      `claim ${quoted}: PersistentVolume "${volumeName}" is a block volume, and a folder is needed`,
    );
  }
  const disk = block || use.folder ? normal : path.join(normal, DISK_IMAGE);
  // No symlink anywhere below the root: each component is looked at, not followed.
  let at = path.normalize(root);
  for (const part of path.relative(at, disk).split("/")) {
    at = path.join(at, part);
    let info: Deno.FileInfo;
    try {
      info = await Deno.lstat(at);
    } catch (error) {
      if (error instanceof Deno.errors.NotFound) {
        throw new HostClaimError(
          block
            ? `claim ${quoted}: the block device "${disk}" does not exist`
            : use.folder
            ? `claim ${quoted}: the folder "${disk}" does not exist`
            : `claim ${quoted}: "${disk}" does not exist (a filesystem claim holds its disk as ${DISK_IMAGE})`,
        );
      }
      throw error;
    }
    if (info.isSymlink) {
      throw new HostClaimError(
        `claim ${quoted}: "${at}" is a symbolic link, which is not followed`,
      );
    }
  }
  const info = await Deno.lstat(disk);
  const [fits, kind] = block
    ? [info.isBlockDevice, "a block device"]
    : use.folder
    ? [info.isDirectory, "a folder"]
    : [info.isFile, "a regular file"];
  if (!fits) throw new HostClaimError(`claim ${quoted}: "${disk}" is not ${kind}`);
  const claimInfo: ClaimInfo = {
    claimName: ref.name,
    accessModes: claim.spec?.accessModes ?? [],
    volumeMode: mode,
    capacity: claim.status?.capacity ?? volume.spec?.capacity ?? {},
    requests: claim.spec?.resources?.requests ?? {},
  };
  return { path: disk, block, claimInfo };
}

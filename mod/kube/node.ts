/**
 * Node patching: labels and annotations by strategic merge patch (others' keys are
 * kept; a `null` value removes a key), and JSON patch with a `test` operation for
 * writes that must not race (e.g. replacing the whole set of labels we manage only if
 * the labels are still what we last read). A failed test answers 422, a stale
 * resourceVersion 409: both surface as {@linkcode PatchConflictError} so callers
 * re-read the node and retry.
 *
 * @module
 */

import type { KubeClient } from "./client.ts";
import { detailOf, isApiStatus, PatchConflictError } from "./errors.ts";
import type { KubeObject } from "./types.ts";

/** One RFC 6902 JSON patch operation. */
export interface JsonPatchOp {
  /** The operation. */
  op: "add" | "remove" | "replace" | "test" | "move" | "copy";
  /** JSON pointer the operation applies to. */
  path: string;
  /** The value for `add`, `replace` and `test`. */
  value?: unknown;
  /** The source pointer for `move` and `copy`. */
  from?: string;
}

/** Labels and annotations to set; `null` removes the key. */
export interface NodeMetadataPatch {
  /** Labels to set; `null` removes one. */
  labels?: Record<string, string | null>;
  /** Annotations to set; `null` removes one. */
  annotations?: Record<string, string | null>;
}

/** Options of node patch calls. */
export interface NodePatchOptions {
  /** Per-request timeout (default: the client's). */
  timeoutMs?: number;
}

function nodePath(name: string): string {
  return `/api/v1/nodes/${encodeURIComponent(name)}`;
}

/** Strategic-merge-patches a node's labels and annotations; returns the updated node. */
export async function patchNodeMetadata(
  client: KubeClient,
  nodeName: string,
  patch: NodeMetadataPatch,
  options?: NodePatchOptions,
): Promise<KubeObject> {
  const metadata: Record<string, unknown> = {};
  if (patch.labels) metadata.labels = patch.labels;
  if (patch.annotations) metadata.annotations = patch.annotations;
  try {
    return await client.request<KubeObject>("PATCH", nodePath(nodeName), { metadata }, {
      contentType: "application/strategic-merge-patch+json",
      timeoutMs: options?.timeoutMs,
    });
  } catch (err) {
    throw new Error(`Cannot patch node "${nodeName}": ${detailOf(err)}`, { cause: err });
  }
}

/**
 * Applies a JSON patch to a node. A failed `test` op (422) or a conflict (409) throws
 * {@linkcode PatchConflictError}; other failures throw an Error with the cause.
 */
export async function patchNodeJson(
  client: KubeClient,
  nodeName: string,
  ops: JsonPatchOp[],
  options?: NodePatchOptions,
): Promise<KubeObject> {
  try {
    return await client.request<KubeObject>("PATCH", nodePath(nodeName), ops, {
      contentType: "application/json-patch+json",
      timeoutMs: options?.timeoutMs,
    });
  } catch (err) {
    if (isApiStatus(err, 409, 422)) {
      throw new PatchConflictError(
        `Cannot patch node "${nodeName}": it changed since it was read: ${detailOf(err)}`,
        { status: err.status, cause: err },
      );
    }
    throw new Error(`Cannot patch node "${nodeName}": ${detailOf(err)}`, { cause: err });
  }
}

/** Escapes a key for a JSON pointer (RFC 6901): `~` -> `~0`, `/` -> `~1`. */
export function jsonPointerEscape(key: string): string {
  return key.replaceAll("~", "~0").replaceAll("/", "~1");
}

/**
 * JSON patch ops that replace `field` ("labels" or "annotations") with `desired`, only
 * if it still equals `observed` (what we last read). When the node had no such map the
 * map is added without a test: JSON patch cannot test that a member is absent.
 */
export function replaceMapWithTest(
  field: "labels" | "annotations",
  observed: Record<string, string> | undefined,
  desired: Record<string, string>,
): JsonPatchOp[] {
  const path = `/metadata/${field}`;
  if (observed === undefined) return [{ op: "add", path, value: desired }];
  return [
    { op: "test", path, value: observed },
    { op: "replace", path, value: desired },
  ];
}

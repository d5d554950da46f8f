/**
 * The one place that writes a custom resource's status.
 *
 * KubeVirt's VMI CRD has no status subresource: virt-handler writes a VMI by updating the
 * whole object, and so does this writer — PUT of the object's own path, never `/status`
 * (which is a 404 on KubeVirt's CRD). The body is the object as read, with only `.status`
 * replaced, so metadata and spec go back exactly as they came.
 *
 * Why PUT with resourceVersion and not a merge patch: status lists (conditions,
 * interfaces, volumeStatus, phaseTransitionTimestamps) are atomic in a JSON merge patch
 * (and CRDs do not support strategic merge), so a patch of `conditions` would replace
 * conditions another writer just set. Instead the caller gives a `mutate` function that
 * applies only its own change to a status; the writer applies it to the cached object,
 * skips the request when nothing changed, and PUTs the object with its
 * resourceVersion. On 409 Conflict it re-reads the object and applies `mutate` to the
 * fresh copy, so fields others wrote meanwhile are kept. Retries are bounded.
 *
 * @module
 */

import type { KubeClient } from "./client.ts";
import { detailOf, isApiStatus } from "./errors.ts";
import type { KubeObject } from "./types.ts";
import { vmiKey } from "../api/mod.ts";

/** Applies the caller's change to a status; may mutate in place or return a new one. */
export type StatusMutation<S> = (status: S) => S | void;

/** Options of {@linkcode StatusWriter}. */
export interface StatusWriterOptions<T = unknown> {
  /** The collection path, e.g. `/apis/kubevirt.io/v1`, namespaced objects get `/namespaces/<ns>`. */
  groupVersionPath: string;
  /** Plural resource name, e.g. `virtualmachineinstances`. */
  plural: string;
  /** Attempts after the first on 409 Conflict (default 5). */
  maxRetries?: number;
  /** Per-request timeout (default: the client's). */
  timeoutMs?: number;
  /**
   * The resource has a status subresource (a migration's does; a VMI's does not): status
   * changes go to `<object>/status`, and only they.
   */
  statusSubresource?: boolean;
  /**
   * Brings what is about to be written to the form the object's own controllers write it
   * in, before it is compared and sent (KubeVirt's JSON patches test values as Go writes
   * them: a `false` that Go leaves out fails their test).
   */
  normalize?: (object: T) => void;
}

/** Outcome of {@linkcode StatusWriter.update}. */
export interface StatusWriteResult<T> {
  /** False when the status already was as desired and no request was made. */
  written: boolean;
  /** The object as the apiserver returned it (or the input when nothing was written). */
  object: T;
  /** Requests made (PUTs and re-reads). */
  requests: number;
}

/**
 * The apiserver accepted the write but kept the old status: KubeVirt's mutating webhook
 * puts back the status of a VMI whose writer is not one of KubeVirt's own service accounts.
 */
export class StatusDroppedError extends Error {
  /** Creates the error. */
  constructor(message: string) {
    super(message);
    this.name = "StatusDroppedError";
  }
}

/** Retries ran out on conflicts. */
export class StatusConflictError extends Error {
  /** Creates the error; `cause` is the last 409. */
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "StatusConflictError";
  }
}

/**
 * Deep equality of two JSON values, treating `undefined` members as absent (as they
 * are once serialised) so `{a: undefined}` equals `{}`.
 */
export function jsonEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (a === null || b === null || typeof a !== "object" || typeof b !== "object") return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a)) {
    const bb = b as unknown[];
    if (a.length !== bb.length) return false;
    return a.every((v, i) => jsonEqual(v, bb[i]));
  }
  const ao = a as Record<string, unknown>;
  const bo = b as Record<string, unknown>;
  const ak = Object.keys(ao).filter((k) => ao[k] !== undefined);
  const bk = Object.keys(bo).filter((k) => bo[k] !== undefined);
  if (ak.length !== bk.length) return false;
  return ak.every((k) => Object.hasOwn(bo, k) && jsonEqual(ao[k], bo[k]));
}

/**
 * Applies `mutate` to a copy of `current` and returns the result, or `undefined` when
 * the result equals `current` (no write needed).
 */
export function desiredStatus<S extends object>(
  current: S | undefined,
  mutate: StatusMutation<S>,
): S | undefined {
  const before = (current ?? {}) as S;
  const copy = structuredClone(before);
  const after = mutate(copy) ?? copy;
  return jsonEqual(before, after) ? undefined : after;
}

/** Writes `.status` of objects of one resource; see the module doc. */
export class StatusWriter<S extends object, T extends KubeObject & { status?: S }> {
  readonly #client: KubeClient;
  readonly #options: StatusWriterOptions<T>;

  /** Creates a writer for one resource type. */
  constructor(client: KubeClient, options: StatusWriterOptions<T>) {
    this.#client = client;
    this.#options = options;
  }

  /**
   * Makes `object`'s status what `mutate` makes of it. `object` is usually the
   * informer's cached copy; it is not modified. Throws `KubeApiError` (404
   * when the object is gone) or {@linkcode StatusConflictError}.
   */
  async update(object: T, mutate: StatusMutation<S>): Promise<StatusWriteResult<T>> {
    return await this.updateObject(object, (o) => {
      const next = desiredStatus(o.status, mutate);
      if (next !== undefined) o.status = next;
    });
  }

  /**
   * Like {@linkcode StatusWriter.update}, for a change beyond the status: `mutate` gets a
   * copy of the whole object and may change its status, labels, annotations and
   * finalizers (a migration moves a VMI's node label with its status). Nothing is sent
   * when none of those changed.
   */
  async updateObject(object: T, mutate: (object: T) => T | void): Promise<StatusWriteResult<T>> {
    const maxRetries = this.#options.maxRetries ?? 5;
    const { namespace, name } = {
      namespace: object.metadata?.namespace,
      name: object.metadata?.name ?? "",
    };
    const path = this.#path(namespace, name);
    let current = object;
    let requests = 0;
    let written = false;
    for (let attempt = 0;; attempt++) {
      const copy = structuredClone(current);
      const desired = mutate(copy) ?? copy;
      this.#options.normalize?.(desired);
      if (!changedBeyondSpec(current, desired)) return { written, object: current, requests };
      try {
        requests++;
        const before = current.status;
        const target = this.#options.statusSubresource ? `${path}/status` : path;
        current = await this.#client.request<T>("PUT", target, desired, {
          timeoutMs: this.#options.timeoutMs,
        });
        if (
          !jsonEqual(before, desired.status) && jsonEqual(current.status, before) &&
          !jsonEqual(current.status, desired.status)
        ) {
          throw new StatusDroppedError(
            `Cannot update status of ${this.#options.plural} "${keyOf(namespace, name)}": ` +
              "the apiserver accepted the update but kept the old status. KubeVirt's " +
              "admission drops status changes from anyone but KubeVirt's own service " +
              "accounts: run the handler as kubevirt-handler of KubeVirt's namespace (a " +
              "pod-less node with a token bound to its Node, deploy/podless-node.yaml)",
          );
        }
        written = true;
        return { written, object: current, requests };
      } catch (err) {
        if (!isApiStatus(err, 409)) throw err;
        if (attempt >= maxRetries) {
          throw new StatusConflictError(
            `Cannot update status of ${this.#options.plural} "${
              keyOf(namespace, name)
            }": still conflicting after ${attempt + 1} attempts: ${detailOf(err)}`,
            { cause: err },
          );
        }
      }
      requests++;
      current = await this.#client.request<T>("GET", path, undefined, {
        timeoutMs: this.#options.timeoutMs,
      });
    }
  }

  /**
   * Removes `finalizer` from `object` (an Update of the whole object, conflict-retried
   * like status writes); true when a request removed it, false when it was not there
   * or the object is gone. virt-controller's last step for a VMI, which pod-less mode
   * stands in for.
   */
  async removeFinalizer(object: T, finalizer: string): Promise<boolean> {
    const maxRetries = this.#options.maxRetries ?? 5;
    const namespace = object.metadata?.namespace;
    const name = object.metadata?.name ?? "";
    const path = this.#path(namespace, name);
    let current = object;
    for (let attempt = 0;; attempt++) {
      const finalizers = current.metadata?.finalizers ?? [];
      if (!finalizers.includes(finalizer)) return false;
      const body = {
        ...current,
        metadata: { ...current.metadata, finalizers: finalizers.filter((f) => f !== finalizer) },
      };
      try {
        await this.#client.request<T>("PUT", path, body, { timeoutMs: this.#options.timeoutMs });
        return true;
      } catch (err) {
        if (isApiStatus(err, 404)) return false;
        if (!isApiStatus(err, 409)) throw err;
        if (attempt >= maxRetries) {
          throw new StatusConflictError(
            `Cannot remove finalizer "${finalizer}" of ${this.#options.plural} "${
              keyOf(namespace, name)
            }": still conflicting after ${attempt + 1} attempts: ${detailOf(err)}`,
            { cause: err },
          );
        }
      }
      try {
        current = await this.#client.request<T>("GET", path, undefined, {
          timeoutMs: this.#options.timeoutMs,
        });
      } catch (err) {
        if (isApiStatus(err, 404)) return false;
        throw err;
      }
    }
  }

  #path(namespace: string | undefined, name: string): string {
    let p = this.#options.groupVersionPath;
    if (namespace) p += `/namespaces/${encodeURIComponent(namespace)}`;
    return `${p}/${this.#options.plural}/${encodeURIComponent(name)}`;
  }
}

/** Whether `after` differs from `before` in what a status writer may change. */
function changedBeyondSpec<T extends KubeObject & { status?: unknown }>(
  before: T,
  after: T,
): boolean {
  const m = (o: T) => ({
    labels: o.metadata?.labels,
    annotations: o.metadata?.annotations,
    finalizers: o.metadata?.finalizers,
  });
  return !jsonEqual(before.status, after.status) || !jsonEqual(m(before), m(after));
}

function keyOf(namespace: string | undefined, name: string): string {
  return vmiKey({ namespace, name });
}

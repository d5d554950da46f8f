/**
 * Typed errors of the Kubernetes client layer. Callers branch on the class (and on
 * `KubeApiError.status`), never on message text.
 *
 * @module
 */

/** The kubeconfig (or in-cluster service account) could not be read or is unusable. */
export class KubeConfigError extends Error {
  /** The file that was being read, when there was one. */
  readonly path: string | undefined;

  /** Creates the error; `path` names the file at fault. */
  constructor(message: string, options?: { path?: string; cause?: unknown }) {
    super(message, { cause: options?.cause });
    this.name = "KubeConfigError";
    this.path = options?.path;
  }
}

/** The apiserver could not be reached, or did not answer within the timeout. */
export class KubeConnectionError extends Error {
  /** The apiserver URL the request went to. */
  readonly server: string;
  /** True when the request was aborted by its timeout rather than refused or reset. */
  readonly timedOut: boolean;

  /** Creates the error for a request to `server`. */
  constructor(message: string, options: { server: string; timedOut?: boolean; cause?: unknown }) {
    super(message, { cause: options.cause });
    this.name = "KubeConnectionError";
    this.server = options.server;
    this.timedOut = options.timedOut ?? false;
  }
}

/** The apiserver answered with a non-2xx status (a `metav1.Status` when it sent one). */
export class KubeApiError extends Error {
  /** HTTP status code, e.g. 404, 409, 410, 422. */
  readonly status: number;
  /** The Status `reason`, e.g. "NotFound", "Conflict", "Expired", "Invalid". */
  readonly reason: string;
  /** The apiserver's own message (without our prefix). */
  readonly apiMessage: string;
  /** The Status `details`, when present. */
  readonly details: unknown;

  /** Creates the error from the parts of an apiserver Status. */
  constructor(
    message: string,
    options: {
      status: number;
      reason: string;
      apiMessage: string;
      details?: unknown;
      cause?: unknown;
    },
  ) {
    super(message, { cause: options.cause });
    this.name = "KubeApiError";
    this.status = options.status;
    this.reason = options.reason;
    this.apiMessage = options.apiMessage;
    this.details = options.details;
  }
}

/** A JSON patch `test` operation failed or the write raced another one (422 or 409). */
export class PatchConflictError extends Error {
  /** HTTP status the apiserver answered with. */
  readonly status: number;

  /** Creates the error; `cause` is the underlying {@linkcode KubeApiError}. */
  constructor(message: string, options: { status: number; cause?: unknown }) {
    super(message, { cause: options.cause });
    this.name = "PatchConflictError";
    this.status = options.status;
  }
}

/** Whether `err` is an apiserver answer with one of the given HTTP statuses. */
export function isApiStatus(err: unknown, ...statuses: number[]): err is KubeApiError {
  return err instanceof KubeApiError && statuses.includes(err.status);
}

/**
 * Turns anything thrown into a one-line detail for an error message; an apiserver
 * answer becomes "<status> <reason>: <message>" without the request prefix.
 */
export function detailOf(err: unknown): string {
  if (err instanceof KubeApiError) {
    return err.reason
      ? `${err.status} ${err.reason}: ${err.apiMessage}`
      : `${err.status}: ${err.apiMessage}`;
  }
  if (err instanceof Error) {
    // Deno's fetch says only "fetch failed"; the reason (refused, TLS, reset) is in `cause`.
    const cause = err.cause instanceof Error ? err.cause.message : undefined;
    return cause && !err.message.includes(cause) ? `${err.message}: ${cause}` : err.message;
  }
  return String(err);
}

/**
 * A small typed client for the Kubernetes API: kubeconfig / in-cluster loading, auth,
 * TLS, per-request timeouts and typed errors. Everything above it (informer, status
 * writer, events, node patches) goes through {@linkcode KubeClient.request} or
 * {@linkcode KubeClient.stream}.
 *
 * Memory: `@kubernetes/client-node`'s `KubeConfig` cannot be imported without its
 * generated API (about 87 MB RSS in Deno, measured), so the common cases are handled here:
 * in-cluster service account (no YAML parser loaded at all), kubeconfig files with
 * token, token file, basic auth or client certificates. The YAML parser is js-yaml
 * (client-node's own parser), loaded lazily and only for a YAML kubeconfig: about +4 MB
 * RSS, where client-node's `dist/yaml.js` wrapper costs +15 MB. Users with `exec` or `auth-provider` credentials load the full
 * `KubeConfig` lazily and take the `Authorization` header from it.
 *
 * @module
 */

import { detailOf, KubeApiError, KubeConfigError, KubeConnectionError } from "./errors.ts";
import { Transport, type TransportResponse } from "./_https.ts";
import { restClientStats } from "./rest_stats.ts";
import { type RateLimit, TokenBucket, usableRateLimit } from "./rate_limit.ts";

const SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount";
const DEFAULT_TIMEOUT_MS = 30_000;
const TOKEN_FILE_REFRESH_MS = 60_000;
const MAX_429_ATTEMPTS = 10;

/** The delay a Retry-After header asks for (seconds), 1 s when absent, at most 10 s. */
function retryAfterMs(header: string | null): number {
  const seconds = Number(header);
  return Number.isFinite(seconds) && seconds > 0 ? Math.min(seconds, 10) * 1000 : 1000;
}

function abortableSleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal.addEventListener("abort", onAbort, { once: true });
  });
}

/** Where to find credentials; see {@linkcode loadKubeClient} for the search order. */
export interface KubeClientOptions {
  /** Explicit kubeconfig path; wins over everything else. */
  kubeconfigPath?: string;
  /** Context to use instead of the kubeconfig's current-context. */
  context?: string;
  /** Default per-request timeout in ms (30 s). */
  timeoutMs?: number;
  /** For tests: the service account directory used for in-cluster config. */
  serviceAccountDir?: string;
}

/** Options of one request. */
export interface RequestOptions {
  /** Abort the request after this many ms (default: the client's, 30 s). */
  timeoutMs?: number;
  /** Content-Type of the body (default application/json). */
  contentType?: string;
  /** Query parameters; undefined values are left out. */
  query?: Record<string, string | number | boolean | undefined>;
  /** Aborts the request early. */
  signal?: AbortSignal;
}

/** Options of a streaming request (watch). */
export interface StreamOptions {
  /** Query parameters; undefined values are left out. */
  query?: Record<string, string | number | boolean | undefined>;
  /** Time allowed until the response headers arrive (default: the client's). */
  connectTimeoutMs?: number;
  /** Aborts the request and the body stream. */
  signal?: AbortSignal;
}

/** Resolved connection parameters (what {@linkcode loadKubeClient} produces). */
export interface KubeCredentials {
  /** The apiserver's base URL. */
  server: string;
  /** "in-cluster" or the kubeconfig path, for error messages. */
  source: string;
  /** CA bundle (PEM) that signs the apiserver's certificate. */
  caPem?: string;
  /** Client certificate (PEM). */
  certPem?: string;
  /** Client certificate's private key (PEM). */
  keyPem?: string;
  /** Bearer token. */
  token?: string;
  /** File a bearer token is re-read from (rotated service account tokens). */
  tokenFile?: string;
  /** `user:password` for basic authentication. */
  basicAuth?: string;
  /** Header source for exec / auth-provider users (full client-node KubeConfig). */
  dynamicAuth?: () => Promise<string | undefined>;
}

/** A connection to one apiserver with fixed credentials. */
export class KubeClient {
  readonly #creds: KubeCredentials;
  readonly #http: Deno.HttpClient | undefined;
  readonly #transport: Transport;
  readonly #timeoutMs: number;
  #tokenCache: { value: string; readAt: number } | undefined;
  #bucket: TokenBucket | undefined;

  /** Use {@linkcode loadKubeClient}; the constructor is for tests and embedding. */
  constructor(creds: KubeCredentials, options?: { timeoutMs?: number }) {
    this.#creds = creds;
    this.#timeoutMs = options?.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const tls: Deno.CreateHttpClientOptions & Partial<Deno.TlsCertifiedKeyPem> = {};
    if (creds.caPem) tls.caCerts = [creds.caPem];
    if (creds.certPem && creds.keyPem) {
      tls.cert = creds.certPem;
      tls.key = creds.keyPem;
    }
    this.#http = Object.keys(tls).length > 0
      ? Deno.createHttpClient(tls as Deno.CreateHttpClientOptions)
      : undefined;
    this.#transport = new Transport(creds.server, creds);
  }

  /**
   * Limits the requests as client-go's token bucket does (one token per request, each retry
   * and each watch's start included); undefined: no limit (the default). The same rate again
   * keeps the bucket as it is; an unusable one (not positive) is refused with an error.
   */
  setRateLimit(limit: RateLimit | undefined): void {
    if (limit === undefined) {
      this.#bucket = undefined;
      return;
    }
    if (!usableRateLimit(limit)) {
      throw new RangeError(
        `Cannot limit apiserver requests to qps ${limit.qps}, burst ${limit.burst}: both must be positive`,
      );
    }
    const b = this.#bucket?.limit;
    if (b?.qps === limit.qps && b.burst === limit.burst) return;
    this.#bucket = new TokenBucket(limit);
  }

  /** The request rate limit in force; undefined without one. */
  get rateLimit(): RateLimit | undefined {
    return this.#bucket ? { ...this.#bucket.limit } : undefined;
  }

  /** The apiserver URL, e.g. "https://127.0.0.1:6443". */
  get server(): string {
    return this.#creds.server;
  }

  /** Where the credentials came from: a kubeconfig path or "in-cluster". */
  get source(): string {
    return this.#creds.source;
  }

  /**
   * Sends one request and returns the decoded JSON answer (undefined when empty). A 429
   * answer is retried after its Retry-After delay (up to 10 attempts, within the timeout).
   * Throws {@linkcode KubeApiError} for a non-2xx answer and
   * {@linkcode KubeConnectionError} when the apiserver cannot be reached in time.
   */
  async request<T = unknown>(
    method: string,
    path: string,
    body?: unknown,
    options?: RequestOptions,
  ): Promise<T> {
    const timeoutMs = options?.timeoutMs ?? this.#timeoutMs;
    const timeout = AbortSignal.timeout(timeoutMs);
    const signal = options?.signal ? AbortSignal.any([options.signal, timeout]) : timeout;
    const url = this.#url(path, options?.query);
    const headers = await this.#headers();
    let payload: string | undefined;
    if (body !== undefined) {
      headers.set("Content-Type", options?.contentType ?? "application/json");
      payload = typeof body === "string" ? body : JSON.stringify(body);
    }
    try {
      for (let attempt = 1;; attempt++) {
        await this.#bucket?.take(signal);
        const started = performance.now();
        let res: TransportResponse;
        try {
          res = await this.#transport.send(new URL(url), method, headers, payload, signal);
        } catch (error) {
          restClientStats.record({
            method,
            url: new URL(url),
            code: "<error>",
            seconds: (performance.now() - started) / 1000,
          });
          throw error;
        }
        restClientStats.record({
          method,
          url: new URL(url),
          code: String(res.status),
          seconds: (performance.now() - started) / 1000,
        });
        const text = res.text;
        // 429 means the request was not processed (e.g. a CRD's storage still
        // initialising): wait as told and retry within the timeout, as client-go does.
        if (res.status === 429 && attempt < MAX_429_ATTEMPTS) {
          await abortableSleep(retryAfterMs(res.header("retry-after") ?? null), signal);
          continue;
        }
        if (res.status < 200 || res.status > 299) throw apiError(method, path, res.status, text);
        return (text.length > 0 ? JSON.parse(text) : undefined) as T;
      }
    } catch (err) {
      throw this.#connectionError(method, path, err, timeout, timeoutMs);
    }
  }

  /**
   * Opens a streaming GET (a watch) and returns the response body once the headers
   * are in. The caller owns the stream and ends it with `signal`.
   */
  async stream(path: string, options?: StreamOptions): Promise<ReadableStream<Uint8Array>> {
    const timeoutMs = options?.connectTimeoutMs ?? this.#timeoutMs;
    const connect = new AbortController();
    const timer = setTimeout(
      () => connect.abort(new DOMException("connect timeout", "TimeoutError")),
      timeoutMs,
    );
    const signal = options?.signal
      ? AbortSignal.any([options.signal, connect.signal])
      : connect.signal;
    const url = this.#url(path, options?.query);
    try {
      await this.#bucket?.take(signal);
      const res = await fetch(url, { headers: await this.#headers(), signal, client: this.#http });
      if (!res.ok) throw apiError("GET", path, res.status, await res.text());
      if (!res.body) {
        throw new KubeConnectionError(`Cannot GET ${path}: empty body`, { server: this.server });
      }
      return res.body;
    } catch (err) {
      throw this.#connectionError("GET", path, err, connect.signal, timeoutMs);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Releases the HTTP connection pools. */
  close(): void {
    this.#http?.close();
    this.#transport.close();
  }

  #url(path: string, query?: RequestOptions["query"]): string {
    const url = new URL(path, this.#creds.server);
    for (const [k, v] of Object.entries(query ?? {})) {
      if (v !== undefined) url.searchParams.set(k, String(v));
    }
    return url.toString();
  }

  async #headers(): Promise<Headers> {
    const headers = new Headers({
      Accept: "application/json",
      "User-Agent": "virtnode/virt-handler",
    });
    const auth = await this.#authorization();
    if (auth) headers.set("Authorization", auth);
    return headers;
  }

  async #authorization(): Promise<string | undefined> {
    const creds = this.#creds;
    if (creds.dynamicAuth) return await creds.dynamicAuth();
    if (creds.tokenFile) {
      // Bound service account tokens rotate; re-read the file now and then.
      const now = Date.now();
      if (!this.#tokenCache || now - this.#tokenCache.readAt > TOKEN_FILE_REFRESH_MS) {
        try {
          const value = (await Deno.readTextFile(creds.tokenFile)).trim();
          this.#tokenCache = { value, readAt: now };
        } catch (err) {
          if (!this.#tokenCache) {
            throw new KubeConfigError(
              `Cannot read token file "${creds.tokenFile}": ${detailOf(err)}`,
              {
                path: creds.tokenFile,
                cause: err,
              },
            );
          }
        }
      }
      return `Bearer ${this.#tokenCache!.value}`;
    }
    if (creds.token) return `Bearer ${creds.token}`;
    if (creds.basicAuth) return `Basic ${creds.basicAuth}`;
    return undefined;
  }

  #connectionError(
    method: string,
    path: string,
    err: unknown,
    timeout: AbortSignal,
    timeoutMs: number,
  ): unknown {
    if (err instanceof KubeApiError || err instanceof KubeConnectionError) return err;
    if (err instanceof KubeConfigError) return err;
    if (timeout.aborted) {
      return new KubeConnectionError(
        `Cannot ${method} ${path}: apiserver "${this.server}" did not answer within ${timeoutMs} ms`,
        { server: this.server, timedOut: true, cause: err },
      );
    }
    if (err instanceof DOMException && err.name === "AbortError") return err;
    if (err instanceof SyntaxError) {
      return new KubeConnectionError(
        `Cannot ${method} ${path}: invalid JSON from apiserver: ${err.message}`,
        {
          server: this.server,
          cause: err,
        },
      );
    }
    return new KubeConnectionError(
      `Cannot ${method} ${path}: cannot reach apiserver "${this.server}": ${detailOf(err)}`,
      { server: this.server, cause: err },
    );
  }
}

/** Builds a KubeApiError from a non-2xx answer, using its `metav1.Status` when present. */
function apiError(method: string, path: string, status: number, text: string): KubeApiError {
  let reason = "";
  let apiMessage = text.trim().slice(0, 500);
  let details: unknown;
  try {
    const parsed = JSON.parse(text);
    if (parsed && typeof parsed === "object" && parsed.kind === "Status") {
      reason = typeof parsed.reason === "string" ? parsed.reason : "";
      apiMessage = typeof parsed.message === "string" ? parsed.message : apiMessage;
      details = parsed.details;
    }
  } catch {
    // Not a Status; keep the raw text.
  }
  const label = reason ? `${status} ${reason}` : `${status}`;
  return new KubeApiError(`Cannot ${method} ${path}: ${label}: ${apiMessage}`, {
    status,
    reason,
    apiMessage,
    details,
  });
}

/**
 * Loads credentials and returns a client. Search order (like client-go's loading rules
 * for an agent): `options.kubeconfigPath`, then `$KUBECONFIG` (first file of the list),
 * then the in-cluster service account, then `~/.kube/config`. Throws
 * {@linkcode KubeConfigError} naming the path when a kubeconfig is missing or invalid.
 */
export async function loadKubeClient(options: KubeClientOptions = {}): Promise<KubeClient> {
  const creds = await loadCredentials(options);
  return new KubeClient(creds, { timeoutMs: options.timeoutMs });
}

async function loadCredentials(options: KubeClientOptions): Promise<KubeCredentials> {
  if (options.kubeconfigPath) return await fromKubeconfig(options.kubeconfigPath, options.context);
  const env = Deno.env.get("KUBECONFIG");
  if (env) {
    const first = env.split(":").find((p) => p.length > 0);
    if (first) return await fromKubeconfig(first, options.context);
  }
  const saDir = options.serviceAccountDir ?? SERVICE_ACCOUNT_DIR;
  const host = Deno.env.get("KUBERNETES_SERVICE_HOST");
  if (host && await exists(`${saDir}/token`)) return await fromServiceAccount(host, saDir);
  const home = Deno.env.get("HOME");
  const homeConfig = home ? join(home, ".kube/config") : undefined;
  if (homeConfig && await exists(homeConfig)) {
    return await fromKubeconfig(homeConfig, options.context);
  }
  throw new KubeConfigError(
    "Cannot find a kubeconfig: give a kubeconfig path, set KUBECONFIG, or run in a pod with a " +
      `service account (looked for "${homeConfig ?? "~/.kube/config"}" and "${saDir}/token")`,
    { path: homeConfig },
  );
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch {
    return false;
  }
}

async function fromServiceAccount(host: string, dir: string): Promise<KubeCredentials> {
  const port = Deno.env.get("KUBERNETES_SERVICE_PORT") ?? "443";
  const hostPart = host.includes(":") ? `[${host}]` : host;
  let caPem: string | undefined;
  try {
    caPem = await Deno.readTextFile(`${dir}/ca.crt`);
  } catch (err) {
    throw new KubeConfigError(
      `Cannot load in-cluster config: cannot read "${dir}/ca.crt": ${detailOf(err)}`,
      {
        path: `${dir}/ca.crt`,
        cause: err,
      },
    );
  }
  return {
    server: `https://${hostPart}:${port}`,
    source: "in-cluster",
    caPem,
    tokenFile: `${dir}/token`,
  };
}

/** The kubeconfig shape we read (field names as in the file). */
interface RawKubeconfig {
  "current-context"?: string;
  clusters?: { name?: string; cluster?: Record<string, unknown> }[];
  users?: { name?: string; user?: Record<string, unknown> }[];
  contexts?: { name?: string; context?: { cluster?: string; user?: string } }[];
}

async function fromKubeconfig(path: string, context?: string): Promise<KubeCredentials> {
  const fail = (detail: string, cause?: unknown) =>
    new KubeConfigError(`Cannot load kubeconfig "${path}": ${detail}`, { path, cause });
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (err) {
    const detail = err instanceof Deno.errors.NotFound ? "no such file" : detailOf(err);
    throw fail(detail, err);
  }
  let raw: RawKubeconfig;
  try {
    raw = await parseKubeconfig(text);
  } catch (err) {
    throw fail(`not valid YAML or JSON: ${detailOf(err)}`, err);
  }
  if (!raw || typeof raw !== "object") {
    throw fail("not a kubeconfig (no clusters, users or contexts)");
  }
  const contextName = context ?? raw["current-context"];
  if (!contextName) throw fail("no current-context and no context given");
  const ctx = raw.contexts?.find((c) => c?.name === contextName)?.context;
  if (!ctx) throw fail(`context "${contextName}" not found`);
  const cluster = raw.clusters?.find((c) => c?.name === ctx.cluster)?.cluster;
  if (!cluster) throw fail(`cluster "${ctx.cluster ?? ""}" of context "${contextName}" not found`);
  const user = raw.users?.find((u) => u?.name === ctx.user)?.user ?? {};
  const server = str(cluster.server);
  if (!server) throw fail(`cluster "${ctx.cluster}" has no server`);
  try {
    new URL(server);
  } catch (err) {
    throw fail(`server "${server}" is not a URL`, err);
  }
  const base = dirname(path);
  const creds: KubeCredentials = { server: server.replace(/\/+$/, ""), source: path };
  try {
    creds.caPem = await pemFrom(
      base,
      cluster["certificate-authority-data"],
      cluster["certificate-authority"],
    );
    creds.certPem = await pemFrom(
      base,
      user["client-certificate-data"],
      user["client-certificate"],
    );
    creds.keyPem = await pemFrom(base, user["client-key-data"], user["client-key"]);
  } catch (err) {
    throw fail(detailOf(err), err);
  }
  if ((creds.certPem === undefined) !== (creds.keyPem === undefined)) {
    throw fail(
      `user "${ctx.user}" has a client certificate without a key, or a key without a certificate`,
    );
  }
  const token = str(user.token);
  const tokenFile = str(user.tokenFile) ?? str(user["token-file"]);
  if (token) creds.token = token;
  else if (tokenFile) creds.tokenFile = resolve(base, tokenFile);
  const username = str(user.username);
  if (username) creds.basicAuth = btoa(`${username}:${str(user.password) ?? ""}`);
  if (user.exec || user["auth-provider"]) {
    creds.dynamicAuth = await fullKubeConfigAuth(path, contextName);
  }
  return creds;
}

async function parseKubeconfig(text: string): Promise<RawKubeconfig> {
  if (text.trimStart().startsWith("{")) return JSON.parse(text);
  // Lazy, and js-yaml itself: client-node's yaml module drags in its serializer (+15 MB RSS).
  const { load } = await import("js-yaml");
  const doc = load(text);
  if (!doc) throw new Error("the file holds no YAML document");
  return doc as RawKubeconfig;
}

/** Exec and auth-provider plugins: delegate to client-node's full KubeConfig (lazy, heavy). */
async function fullKubeConfigAuth(
  path: string,
  context: string,
): Promise<() => Promise<string | undefined>> {
  const { KubeConfig } = await import("@kubernetes/client-node");
  const kc = new KubeConfig();
  kc.loadFromFile(path);
  kc.setCurrentContext(context);
  return async () => {
    const opts: { headers?: Record<string, string> } = {};
    // deno-lint-ignore no-explicit-any
    await kc.applyToHTTPSOptions(opts as any);
    return opts.headers?.Authorization;
  };
}

function str(v: unknown): string | undefined {
  return typeof v === "string" && v.length > 0 ? v : undefined;
}

// POSIX path helpers: node:path would pull in Node compatibility (~10 MB RSS) for three lines.
function resolve(base: string, file: string): string {
  return file.startsWith("/") ? file : join(base, file);
}

function join(dir: string, file: string): string {
  return dir.endsWith("/") ? dir + file : `${dir}/${file}`;
}

function dirname(path: string): string {
  const slash = path.replace(/\/+$/, "").lastIndexOf("/");
  if (slash < 0) return ".";
  return slash === 0 ? "/" : path.slice(0, slash);
}

async function pemFrom(base: string, data: unknown, file: unknown): Promise<string | undefined> {
  const b64 = str(data);
  if (b64) {
    try {
      return new TextDecoder().decode(
        Uint8Array.from(atob(b64.replace(/\s+/g, "")), (c) => c.charCodeAt(0)),
      );
    } catch (err) {
      throw new Error(`invalid base64 certificate or key data: ${detailOf(err)}`, { cause: err });
    }
  }
  const f = str(file);
  if (!f) return undefined;
  const full = resolve(base, f);
  try {
    return await Deno.readTextFile(full);
  } catch (err) {
    throw new Error(`cannot read "${full}": ${detailOf(err)}`, { cause: err });
  }
}

/**
 * The transport of {@linkcode KubeClient.request}: Node's HTTP client as Deno provides
 * it, with a keep-alive agent. Private to `mod/kube/`.
 *
 * Why not `fetch`: Deno's fetch client leaves Nagle's algorithm on, so a request whose
 * body does not fit the first segment (every VMI status write does not) waits for the
 * apiserver's delayed ACK — measured: a 4 KB PUT took 47 ms through fetch and 3 ms
 * through node:https, on loopback. Node's client sets TCP_NODELAY. Watches keep using
 * fetch: they send no body and are streamed.
 *
 * @module
 */
import http from "node:http";
import https from "node:https";

/** TLS material for the agent. */
export interface TransportTls {
  caPem?: string;
  certPem?: string;
  keyPem?: string;
}

/** One answer, read whole. */
export interface TransportResponse {
  status: number;
  /** A response header by lower-case name. */
  header(name: string): string | undefined;
  text: string;
}

/** A keep-alive connection pool to one apiserver. */
export class Transport {
  readonly #agent: http.Agent;
  readonly #https: boolean;

  constructor(server: string, tls: TransportTls) {
    this.#https = new URL(server).protocol === "https:";
    this.#agent = this.#https
      ? new https.Agent({
        keepAlive: true,
        maxSockets: 64,
        ca: tls.caPem,
        cert: tls.certPem,
        key: tls.keyPem,
      })
      : new http.Agent({ keepAlive: true, maxSockets: 64 });
  }

  /** Sends one request; rejects on a transport error or when `signal` aborts. */
  send(
    url: URL,
    method: string,
    headers: Headers,
    body: string | undefined,
    signal: AbortSignal,
  ): Promise<TransportResponse> {
    const plain: Record<string, string> = {};
    headers.forEach((v, k) => (plain[k] = v));
    const bytes = body === undefined ? undefined : new TextEncoder().encode(body);
    if (bytes) plain["content-length"] = String(bytes.byteLength);
    const mod = this.#https ? https : http;
    return new Promise((resolve, reject) => {
      if (signal.aborted) return reject(signal.reason);
      const req = mod.request({
        protocol: url.protocol,
        hostname: url.hostname,
        port: url.port,
        path: url.pathname + url.search,
        method,
        headers: plain,
        agent: this.#agent,
      }, (res) => {
        const chunks: Uint8Array[] = [];
        res.on("data", (c: Uint8Array) => chunks.push(c));
        res.on("error", fail);
        res.on("end", () => {
          signal.removeEventListener("abort", onAbort);
          const text = new TextDecoder().decode(concat(chunks));
          resolve({
            status: res.statusCode ?? 0,
            header: (name) => {
              const v = res.headers[name];
              return Array.isArray(v) ? v[0] : v;
            },
            text,
          });
        });
      });
      function fail(err: unknown) {
        signal.removeEventListener("abort", onAbort);
        reject(err);
      }
      function onAbort() {
        req.destroy(signal.reason instanceof Error ? signal.reason : new Error("aborted"));
      }
      signal.addEventListener("abort", onAbort, { once: true });
      req.on("error", fail);
      if (bytes) req.write(bytes);
      req.end();
    });
  }

  /** Closes idle connections. */
  close(): void {
    this.#agent.destroy();
  }
}

function concat(chunks: Uint8Array[]): Uint8Array {
  if (chunks.length === 1) return chunks[0];
  const out = new Uint8Array(chunks.reduce((n, c) => n + c.byteLength, 0));
  let off = 0;
  for (const c of chunks) {
    out.set(c, off);
    off += c.byteLength;
  }
  return out;
}

/**
 * A client of the handler's REST server for tests, playing virt-api: certificates made with
 * openssl the way KubeVirt's look (a CA, the handler's server certificate, virt-api's
 * client certificate, and the wrong ones: another CA's, an expired one, another name's),
 * plain requests, and WebSocket sessions spoken by hand over mutual TLS (Deno's own
 * WebSocket cannot present a client certificate).
 *
 * @module
 */
import https from "node:https";
import { connect, type TLSSocket } from "node:tls";
import { join } from "node:path";
import { X509Certificate } from "node:crypto";
import { runText } from "./command.ts";

/** A certificate and its key, PEM. */
export interface KeyPair {
  cert: string;
  key: string;
}

/** What {@linkcode makeCertificates} made. */
export interface TestCertificates {
  /** The directory; `server/tls.crt` and `server/tls.key` are the handler's. */
  dir: string;
  /** The CA bundle file. */
  caFile: string;
  ca: string;
  /** The handler's certificate directory (`--server-cert-dir`). */
  serverDir: string;
  /** virt-api's client certificate. */
  client: KeyPair;
  /** The same name, signed by another CA. */
  otherCa: KeyPair;
  /** The right CA and name, expired. */
  expired: KeyPair;
  /** The right CA, another common name. */
  wrongName: KeyPair;
}

async function openssl(dir: string, ...args: string[]): Promise<void> {
  // openssl's file arguments are relative to the certificate directory.
  await runText("sh", "-c", `cd "$0" && exec openssl "$@"`, dir, ...args);
}

/** Makes the test certificates in a new directory below `parent`. */
export async function makeCertificates(parent: string): Promise<TestCertificates> {
  const dir = join(parent, "certs");
  await Deno.mkdir(join(dir, "server"), { recursive: true });
  await Deno.mkdir(join(dir, "db"), { recursive: true });
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
  const ca = async (name: string) =>
    await openssl(
      dir,
      "req",
      "-x509",
      ...ec,
      "-keyout",
      `${name}.key`,
      "-out",
      `${name}.crt`,
      "-days",
      "2",
      "-subj",
      `/CN=${name}`,
    );
  await ca("ca");
  await ca("other-ca");
  await Deno.writeTextFile(
    join(dir, "server.ext"),
    "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n",
  );
  await Deno.writeTextFile(join(dir, "client.ext"), "extendedKeyUsage=clientAuth\n");
  const signed = async (name: string, cn: string, signer: string, ext: string) => {
    await openssl(
      dir,
      "req",
      ...ec,
      "-keyout",
      `${name}.key`,
      "-out",
      `${name}.csr`,
      "-subj",
      `/CN=${cn}`,
    );
    await openssl(
      dir,
      "x509",
      "-req",
      "-in",
      `${name}.csr`,
      "-CA",
      `${signer}.crt`,
      "-CAkey",
      `${signer}.key`,
      "-CAcreateserial",
      "-out",
      `${name}.crt`,
      "-days",
      "1",
      "-extfile",
      ext,
    );
  };
  await signed("server/tls", "kubevirt.io:system:node:virt-handler", "ca", "server.ext");
  await signed("client", "kubevirt.io:system:client:virt-handler", "ca", "client.ext");
  await signed("other", "kubevirt.io:system:client:virt-handler", "other-ca", "client.ext");
  await signed("wrong", "kubevirt.io:system:client:someone-else", "ca", "client.ext");
  // `openssl x509` cannot date a certificate in the past; `openssl ca` can.
  await Deno.writeTextFile(join(dir, "db", "index.txt"), "");
  await Deno.writeTextFile(join(dir, "db", "serial"), "01\n");
  await Deno.writeTextFile(
    join(dir, "ca.cnf"),
    "[ca]\ndefault_ca=x\n[x]\ndatabase=db/index.txt\nnew_certs_dir=db\nserial=db/serial\npolicy=p\ndefault_md=sha256\n[p]\ncommonName=supplied\n[ext]\nextendedKeyUsage=clientAuth\n",
  );
  await openssl(
    dir,
    "ca",
    "-batch",
    "-config",
    "ca.cnf",
    "-cert",
    "ca.crt",
    "-keyfile",
    "ca.key",
    "-in",
    "client.csr",
    "-out",
    "expired.crt",
    "-startdate",
    "20200101000000Z",
    "-enddate",
    "20200102000000Z",
    "-extensions",
    "ext",
    "-notext",
  );
  const read = (f: string) => Deno.readTextFileSync(join(dir, f));
  const pair = (name: string, key = name): KeyPair => ({
    cert: read(`${name}.crt`),
    key: read(`${key}.key`),
  });
  return {
    dir,
    caFile: join(dir, "ca.crt"),
    ca: read("ca.crt"),
    serverDir: join(dir, "server"),
    client: pair("client"),
    otherCa: pair("other"),
    expired: pair("expired", "client"),
    wrongName: pair("wrong"),
  };
}

/**
 * Issues the handler a new server certificate and key (same CA and name) and moves them
 * over the old ones in `serverDir`, as a rotated Secret's files change; returns the new
 * certificate.
 */
export async function reissueServerCertificate(certs: TestCertificates): Promise<string> {
  const next = await issueServerCertificate(certs);
  await Deno.rename(next.key, join(certs.serverDir, "tls.key"));
  await Deno.rename(next.cert, join(certs.serverDir, "tls.crt"));
  return await Deno.readTextFile(join(certs.serverDir, "tls.crt"));
}

/**
 * Issues the handler a new server certificate and key (same CA and name) in
 * `<certs.dir>/<folder>/`, left there; returns their paths.
 */
export function issueServerCertificate(
  certs: TestCertificates,
  folder = "next",
): Promise<{ cert: string; key: string }> {
  return issueCertificate(certs, folder, "kubevirt.io:system:node:virt-handler", "server.ext");
}

/**
 * Issues a new client certificate of virt-handler's name (what a handler presents to
 * another node's migration listener) and its key, of the same CA, in
 * `<certs.dir>/<folder>/`, left there; returns their paths.
 */
export function issueClientCertificate(
  certs: TestCertificates,
  folder = "next-client",
): Promise<{ cert: string; key: string }> {
  return issueCertificate(certs, folder, "kubevirt.io:system:client:virt-handler", "client.ext");
}

async function issueCertificate(
  certs: TestCertificates,
  folder: string,
  commonName: string,
  extensions: string,
): Promise<{ cert: string; key: string }> {
  const dir = certs.dir;
  await Deno.mkdir(join(dir, folder), { recursive: true });
  await openssl(
    dir,
    "req",
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:P-256",
    "-nodes",
    "-keyout",
    `${folder}/tls.key`,
    "-out",
    `${folder}/tls.csr`,
    "-subj",
    `/CN=${commonName}`,
  );
  await openssl(
    dir,
    "x509",
    "-req",
    "-in",
    `${folder}/tls.csr`,
    "-CA",
    "ca.crt",
    "-CAkey",
    "ca.key",
    "-CAcreateserial",
    "-out",
    `${folder}/tls.crt`,
    "-days",
    "1",
    "-extfile",
    extensions,
  );
  return { cert: join(dir, folder, "tls.crt"), key: join(dir, folder, "tls.key") };
}

/**
 * The SHA-256 fingerprint of the certificate a TLS server on loopback `port` presents
 * (as `AA:BB:…`), presenting `client` when given; undefined when no handshake completes.
 */
export function servedFingerprint(port: number, client?: KeyPair): Promise<string | undefined> {
  return new Promise((resolve) => {
    const socket: TLSSocket = connect({
      host: "127.0.0.1",
      port,
      cert: client?.cert,
      key: client?.key,
      rejectUnauthorized: false,
    }, () => {
      const fingerprint = socket.getPeerCertificate()?.fingerprint256;
      socket.destroy();
      resolve(fingerprint || undefined);
    });
    socket.on("error", () => resolve(undefined));
    socket.setTimeout(5_000, () => {
      socket.destroy();
      resolve(undefined);
    });
  });
}

/** The SHA-256 fingerprint of a PEM certificate, as {@linkcode servedFingerprint} has it. */
export function pemFingerprint(pem: string): string {
  return new X509Certificate(pem).fingerprint256;
}

/** The handler options that serve its REST API on loopback `port` with `certs`. */
export function restServerArgs(certs: TestCertificates, port: number): string[] {
  return [
    "--console-server-port",
    String(port),
    "--console-server-address",
    "127.0.0.1",
    "--server-cert-dir",
    certs.serverDir,
    "--client-ca-file",
    certs.caFile,
  ];
}

/** Where a REST client connects and as whom. */
export interface RestTarget {
  port: number;
  /** The CA the server's certificate is checked against. */
  ca: string;
  /** The client's certificate; none when absent. */
  client?: KeyPair;
}

/** An answer of the REST server; `status` 0 when the connection was refused or cut. */
export interface RestAnswer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: Uint8Array;
  /** Why there is no answer. */
  error?: string;
}

/** One request; never throws (a refused connection is `status: 0`). */
export function restRequest(
  target: RestTarget,
  method: string,
  path: string,
  body?: string,
): Promise<RestAnswer> {
  return new Promise((resolve) => {
    const req = https.request({
      host: "127.0.0.1",
      port: target.port,
      method,
      path,
      ca: target.ca,
      cert: target.client?.cert,
      key: target.client?.key,
      // KubeVirt's clients check the name inside, not the host: no SNI check either.
      checkServerIdentity: () => undefined,
      agent: false,
      headers: body === undefined ? {} : { "Content-Type": "application/json" },
    }, (res) => {
      const chunks: Uint8Array[] = [];
      res.on("data", (c: Uint8Array) => chunks.push(c));
      res.on("end", () => {
        const all = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
        let at = 0;
        for (const c of chunks) {
          all.set(c, at);
          at += c.length;
        }
        resolve({ status: res.statusCode ?? 0, headers: res.headers, body: all });
      });
    });
    req.on(
      "error",
      (error: Error) =>
        resolve({ status: 0, headers: {}, body: new Uint8Array(), error: error.message }),
    );
    req.end(body);
  });
}

/** A client WebSocket session over mutual TLS. */
export interface WsSession {
  /** The upgrade's HTTP status (101 when it was accepted). */
  status: number;
  /** The first line and body of a refusal. */
  refusal: string;
  /** Sends bytes in one masked binary frame. */
  send(data: Uint8Array | string): void;
  /** Waits until the bytes received so far (decoded) satisfy `match`; returns them. */
  waitFor(match: (text: string) => boolean, timeoutMs?: number): Promise<string>;
  /** Every byte received in binary frames so far. */
  received(): Uint8Array;
  /** Whether the server sent a close frame or the connection ended. */
  closed(): boolean;
  /** Whether the server sent a close frame (not only cut the connection). */
  gotCloseFrame(): boolean;
  /** Sends a close frame and ends the connection; resolves when it is closed. */
  close(): Promise<void>;
  /** Cuts the connection without a close frame (a vanished client). */
  destroy(): void;
}

function maskedFrame(opcode: number, payload: Uint8Array): Uint8Array {
  const n = payload.length;
  const head = n < 126 ? 2 : n < 65536 ? 4 : 10;
  const out = new Uint8Array(head + 4 + n);
  out[0] = 0x80 | opcode;
  if (n < 126) out[1] = 0x80 | n;
  else if (n < 65536) {
    out[1] = 0x80 | 126;
    out[2] = n >> 8;
    out[3] = n & 0xff;
  } else {
    out[1] = 0x80 | 127;
    new DataView(out.buffer).setBigUint64(2, BigInt(n));
  }
  const mask = crypto.getRandomValues(new Uint8Array(4));
  out.set(mask, head);
  for (let i = 0; i < n; i++) out[head + 4 + i] = payload[i] ^ mask[i & 3];
  return out;
}

/**
 * Opens `path` as a WebSocket offering `protocols` (KubeVirt's `plain.kubevirt.io` unless
 * told); a refused upgrade resolves with its status and no session to speak of.
 */
export function openWebSocket(
  target: RestTarget,
  path: string,
  protocols: string[] = ["plain.kubevirt.io"],
): Promise<WsSession> {
  return new Promise((resolve) => {
    const socket: TLSSocket = connect({
      host: "127.0.0.1",
      port: target.port,
      ca: target.ca,
      cert: target.client?.cert,
      key: target.client?.key,
      checkServerIdentity: () => undefined,
    });
    let header = new Uint8Array(0);
    let upgraded = false;
    let refused = 0;
    let ended = false;
    let closeFrameSeen = false;
    let frames = new Uint8Array(0);
    const data: Uint8Array[] = [];
    let size = 0;
    const waiters: (() => void)[] = [];
    const wake = () => waiters.splice(0).forEach((w) => w());
    const concat = (a: Uint8Array, b: Uint8Array) => {
      const out = new Uint8Array(a.length + b.length);
      out.set(a);
      out.set(b, a.length);
      return out;
    };
    const all = () => {
      const out = new Uint8Array(size);
      let at = 0;
      for (const c of data) {
        out.set(c, at);
        at += c.length;
      }
      return out;
    };
    const readFrames = () => {
      for (;;) {
        if (frames.length < 2) return;
        const opcode = frames[0] & 0x0f;
        let n = frames[1] & 0x7f;
        let at = 2;
        if (n === 126) {
          if (frames.length < 4) return;
          n = (frames[2] << 8) | frames[3];
          at = 4;
        } else if (n === 127) {
          if (frames.length < 10) return;
          n = Number(new DataView(frames.buffer, frames.byteOffset).getBigUint64(2));
          at = 10;
        }
        if (frames.length < at + n) return;
        const payload = frames.slice(at, at + n);
        frames = frames.subarray(at + n);
        if (opcode === 0x2 || opcode === 0x0) {
          data.push(payload);
          size += payload.length;
        } else if (opcode === 0x8) {
          ended = true;
          closeFrameSeen = true;
        }
      }
    };
    const session = (status: number, refusal: string): WsSession => ({
      status,
      refusal,
      send: (bytes) => {
        const payload = typeof bytes === "string" ? new TextEncoder().encode(bytes) : bytes;
        socket.write(maskedFrame(0x2, payload));
      },
      waitFor: (match, timeoutMs = 30_000) =>
        new Promise((ok, fail) => {
          const deadline = setTimeout(() => {
            fail(
              new Error(`Timed out; received: ${JSON.stringify(new TextDecoder().decode(all()))}`),
            );
          }, timeoutMs);
          const check = () => {
            const text = new TextDecoder().decode(all());
            if (match(text)) {
              clearTimeout(deadline);
              ok(text);
            } else if (ended) {
              clearTimeout(deadline);
              fail(new Error(`The session ended; received: ${JSON.stringify(text)}`));
            } else waiters.push(check);
          };
          check();
        }),
      received: all,
      closed: () => ended,
      gotCloseFrame: () => closeFrameSeen,
      close: () =>
        new Promise((ok) => {
          if (socket.destroyed) return ok();
          socket.once("close", () => ok());
          socket.write(maskedFrame(0x8, new Uint8Array([0x03, 0xe8])));
          socket.end();
          setTimeout(() => socket.destroy(), 2000);
        }),
      destroy: () => socket.destroy(),
    });
    socket.on("secureConnect", () => {
      const key = btoa(String.fromCharCode(...crypto.getRandomValues(new Uint8Array(16))));
      socket.write(
        [
          `GET ${path} HTTP/1.1`,
          "Host: 127.0.0.1",
          "Upgrade: websocket",
          "Connection: Upgrade",
          "Sec-WebSocket-Version: 13",
          `Sec-WebSocket-Key: ${key}`,
          ...(protocols.length ? [`Sec-WebSocket-Protocol: ${protocols.join(", ")}`] : []),
          "",
          "",
        ].join("\r\n"),
      );
    });
    socket.on("data", (chunk: Uint8Array) => {
      if (upgraded) {
        frames = concat(frames, chunk);
        readFrames();
        wake();
        return;
      }
      header = concat(header, chunk);
      if (refused) return;
      const text = new TextDecoder().decode(header);
      const end = text.indexOf("\r\n\r\n");
      if (end < 0) return;
      const status = Number(/^HTTP\/1\.1 (\d+)/.exec(text)?.[1] ?? 0);
      if (status !== 101) {
        // The refusal's body comes with it or just after: it is whole once the server closes.
        refused = status;
        return;
      }
      upgraded = true;
      frames = header.subarray(new TextEncoder().encode(text.slice(0, end + 4)).length);
      readFrames();
      resolve(session(101, ""));
    });
    socket.on("error", () => {
      ended = true;
      wake();
      if (!upgraded && !refused) resolve(session(0, "connection refused or cut"));
    });
    socket.on("close", () => {
      ended = true;
      wake();
      if (!upgraded) {
        resolve(session(refused, new TextDecoder().decode(header) || "connection closed"));
      }
    });
  });
}

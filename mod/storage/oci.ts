/**
 * OCI images on the host, read without a registry or a container runtime: an OCI image
 * layout (a directory with `oci-layout`, `index.json` and `blobs/sha256/`) or the same
 * packed in one tar (what `ctr images export` and `buildImageArchive` write). The index
 * names the manifest, the manifest the layers; a layer is a tar, plain or gzip-compressed.
 * Everything read is checked against its digest's size and media type, and a path in a
 * layer is taken only by exact name: nothing in an image can point the reader elsewhere.
 *
 * @module
 */

import { join } from "node:path";

/** An image that cannot be read, with the reason. */
export class OciImageError extends Error {
  /** Creates `Cannot read image "<ref>": <detail>`. */
  constructor(ref: string, detail: string, options?: ErrorOptions) {
    super(`Cannot read image "${ref}": ${detail}`, options);
    this.name = "OciImageError";
  }
}

/** One layer of a manifest. */
export interface OciLayer {
  /** `sha256:<hex>`. */
  digest: string;
  /** Its size in bytes. */
  size: number;
  /** Its media type (tar or tar+gzip). */
  mediaType: string;
}

/** Where an image's blobs are: a layout directory, or entries of one archive. */
export interface OciSource {
  /** Opens a blob's bytes as a stream, checking its size. */
  blob(digest: string, size?: number): Promise<ReadableStream<Uint8Array>>;
  /** Reads a small blob whole (index, manifest). */
  json(digest: string): Promise<unknown>;
  /** The manifest digest the index names (the first manifest for linux/amd64, or the first). */
  manifestDigest(): Promise<string>;
  /** Closes what the source holds open. */
  close(): void;
}

const TAR_BLOCK = 512;
const LAYER_TYPES = [
  "application/vnd.oci.image.layer.v1.tar",
  "application/vnd.oci.image.layer.v1.tar+gzip",
  "application/vnd.docker.image.rootfs.diff.tar",
  "application/vnd.docker.image.rootfs.diff.tar.gzip",
];
const MANIFEST_TYPES = [
  "application/vnd.oci.image.manifest.v1+json",
  "application/vnd.docker.distribution.manifest.v2+json",
];
const DIGEST = /^sha256:([0-9a-f]{64})$/;

/** A tar entry's name without a leading `./` or `/`. */
function normalize(name: string): string {
  return name.replace(/^(\.\/)+/, "").replace(/^\/+/, "");
}

interface TarHeader {
  name: string;
  size: number;
  type: string;
}

function parseHeader(block: Uint8Array): TarHeader | undefined {
  if (block.every((b) => b === 0)) return undefined;
  const text = (from: number, length: number) => {
    const part = block.subarray(from, from + length);
    const end = part.indexOf(0);
    return new TextDecoder().decode(end < 0 ? part : part.subarray(0, end));
  };
  const sizeField = text(124, 12).trim();
  const size = parseInt(sizeField || "0", 8);
  if (!Number.isFinite(size) || size < 0) throw new Error(`bad tar size field "${sizeField}"`);
  const prefix = text(257, 6).startsWith("ustar") ? text(345, 155) : "";
  const name = prefix ? `${prefix}/${text(0, 100)}` : text(0, 100);
  return { name, size, type: text(156, 1) || "0" };
}

function paddedSize(size: number): number {
  return Math.ceil(size / TAR_BLOCK) * TAR_BLOCK;
}

/** Reads exactly `n` bytes from a stream reader with its carry-over buffer. */
class StreamReader {
  #reader: ReadableStreamDefaultReader<Uint8Array>;
  #buffer: Uint8Array = new Uint8Array(0);
  constructor(stream: ReadableStream<Uint8Array>) {
    this.#reader = stream.getReader();
  }
  async #fill(n: number): Promise<boolean> {
    while (this.#buffer.length < n) {
      const { value, done } = await this.#reader.read();
      if (done) return false;
      const next = new Uint8Array(this.#buffer.length + value.length);
      next.set(this.#buffer);
      next.set(value, this.#buffer.length);
      this.#buffer = next;
    }
    return true;
  }
  async read(n: number): Promise<Uint8Array | undefined> {
    if (!(await this.#fill(n))) return undefined;
    const out = this.#buffer.slice(0, n);
    this.#buffer = this.#buffer.subarray(n);
    return out;
  }
  /** Passes `n` bytes to `sink` (or drops them) without holding them all. */
  async pass(n: number, sink?: (chunk: Uint8Array) => Promise<void>): Promise<void> {
    let left = n;
    while (left > 0) {
      if (this.#buffer.length === 0) {
        const { value, done } = await this.#reader.read();
        if (done) throw new Error("the tar stream ends inside an entry");
        this.#buffer = value;
      }
      const take = Math.min(left, this.#buffer.length);
      if (sink) await sink(this.#buffer.subarray(0, take));
      this.#buffer = this.#buffer.subarray(take);
      left -= take;
    }
  }
  cancel(): Promise<void> {
    return this.#reader.cancel();
  }
}

/**
 * Walks a tar stream; `visit` sees each regular file's name and size and may take its
 * content (`take(sink)`), or return false to stop. GNU long names and PAX paths are
 * honoured.
 */
export async function walkTar(
  stream: ReadableStream<Uint8Array>,
  visit: (
    entry: { name: string; size: number },
    take: (sink: (chunk: Uint8Array) => Promise<void>) => Promise<void>,
  ) => Promise<boolean | void>,
): Promise<void> {
  const reader = new StreamReader(stream);
  let longName: string | undefined;
  try {
    for (;;) {
      const block = await reader.read(TAR_BLOCK);
      if (!block) return;
      const header = parseHeader(block);
      if (!header) return;
      const padded = paddedSize(header.size);
      if (header.type === "L" || header.type === "x") {
        const data = await reader.read(padded);
        if (!data) throw new Error("the tar stream ends inside a header extension");
        const text = new TextDecoder().decode(data.subarray(0, header.size));
        if (header.type === "L") longName = text.replace(/\0+$/, "");
        else longName = /(?:^|\n)\d+ path=([^\n]*)\n/.exec(text)?.[1] ?? longName;
        continue;
      }
      const name = normalize(longName ?? header.name);
      longName = undefined;
      if (header.type !== "0" && header.type !== "\0") {
        await reader.pass(padded);
        continue;
      }
      let taken = false;
      const go = await visit({ name, size: header.size }, async (sink) => {
        taken = true;
        await reader.pass(header.size, sink);
      });
      if (go === false) return;
      await reader.pass(taken ? padded - header.size : padded);
    }
  } finally {
    // The stream may already be closed or errored; cancel() only frees it.
    await reader.cancel().catch(() => {});
  }
}

function checkedDigest(ref: string, digest: unknown): string {
  if (typeof digest !== "string" || !DIGEST.test(digest)) {
    throw new OciImageError(ref, `${JSON.stringify(digest)} is not a sha256 digest`);
  }
  return digest;
}

function pickManifest(ref: string, index: unknown): string {
  const manifests = (index as { manifests?: unknown })?.manifests;
  if (!Array.isArray(manifests) || manifests.length === 0) {
    throw new OciImageError(ref, "its index.json names no manifest");
  }
  const usable = manifests.filter((m) => MANIFEST_TYPES.includes(m?.mediaType));
  const amd64 = usable.find((m) =>
    m.platform === undefined || (m.platform?.os === "linux" && m.platform?.architecture === "amd64")
  );
  const chosen = amd64 ?? usable[0];
  if (!chosen) {
    throw new OciImageError(ref, "its index.json names no image manifest for linux/amd64");
  }
  return checkedDigest(ref, chosen.digest);
}

async function readJson(ref: string, stream: ReadableStream<Uint8Array>, what: string) {
  const text = await new Response(stream).text();
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new OciImageError(ref, `its ${what} is not JSON`, { cause: error });
  }
}

/** An OCI image layout directory. */
export async function openLayout(ref: string, dir: string): Promise<OciSource> {
  const index = await readJson(
    ref,
    (await Deno.open(join(dir, "index.json"))).readable,
    "index.json",
  );
  const path = (digest: string) =>
    join(dir, "blobs", "sha256", checkedDigest(ref, digest).slice(7));
  const blob = async (digest: string, size?: number) => {
    const file = path(digest);
    // Any failure reads as missing: the error below names the blob.
    const stat = await Deno.lstat(file).catch(() => undefined);
    if (!stat?.isFile) throw new OciImageError(ref, `blob ${digest} is missing`);
    if (size !== undefined && stat.size !== size) {
      throw new OciImageError(ref, `blob ${digest} has ${stat.size} bytes, not ${size}`);
    }
    return (await Deno.open(file)).readable;
  };
  return {
    blob,
    json: async (digest) => await readJson(ref, await blob(digest), `blob ${digest}`),
    manifestDigest: () => Promise.resolve(pickManifest(ref, index)),
    close() {},
  };
}

/** An OCI image layout packed in one tar: its entries are found by scanning the headers. */
export async function openArchive(ref: string, archive: string): Promise<OciSource> {
  const file = await Deno.open(archive);
  const entries = new Map<string, { offset: number; size: number }>();
  try {
    let offset = 0;
    let longName: string | undefined;
    const block = new Uint8Array(TAR_BLOCK);
    for (;;) {
      await file.seek(offset, Deno.SeekMode.Start);
      let got = 0;
      while (got < TAR_BLOCK) {
        const n = await file.read(block.subarray(got));
        if (n === null) break;
        got += n;
      }
      if (got < TAR_BLOCK) break;
      const header = parseHeader(block);
      if (!header) break;
      const data = offset + TAR_BLOCK;
      if (header.type === "L" || header.type === "x") {
        const ext = new Uint8Array(header.size);
        await file.seek(data, Deno.SeekMode.Start);
        let read = 0;
        while (read < header.size) {
          const n = await file.read(ext.subarray(read));
          if (n === null) break;
          read += n;
        }
        const text = new TextDecoder().decode(ext);
        longName = header.type === "L"
          ? text.replace(/\0+$/, "")
          : /(?:^|\n)\d+ path=([^\n]*)\n/.exec(text)?.[1] ?? longName;
      } else {
        if (header.type === "0" || header.type === "\0") {
          entries.set(normalize(longName ?? header.name), { offset: data, size: header.size });
        }
        longName = undefined;
      }
      offset = data + paddedSize(header.size);
    }
  } catch (error) {
    file.close();
    throw new OciImageError(ref, `"${archive}" is not a readable tar: ${String(error)}`, {
      cause: error,
    });
  }
  const range = async (name: string, expected?: number): Promise<ReadableStream<Uint8Array>> => {
    const entry = entries.get(name);
    if (!entry) throw new OciImageError(ref, `"${name}" is missing from "${archive}"`);
    if (expected !== undefined && entry.size !== expected) {
      throw new OciImageError(ref, `"${name}" has ${entry.size} bytes, not ${expected}`);
    }
    const handle = await Deno.open(archive);
    await handle.seek(entry.offset, Deno.SeekMode.Start);
    let left = entry.size;
    return new ReadableStream<Uint8Array>({
      async pull(controller) {
        if (left === 0) {
          handle.close();
          controller.close();
          return;
        }
        const chunk = new Uint8Array(Math.min(left, 1 << 20));
        const n = await handle.read(chunk);
        if (n === null) {
          handle.close();
          controller.error(new Error(`"${name}" ends early in "${archive}"`));
          return;
        }
        left -= n;
        controller.enqueue(chunk.subarray(0, n));
      },
      cancel() {
        handle.close();
      },
    });
  };
  const index = await readJson(ref, await range("index.json"), "index.json");
  const blob = (digest: string, size?: number) =>
    range(`blobs/sha256/${checkedDigest(ref, digest).slice(7)}`, size);
  return {
    blob,
    json: async (digest) => await readJson(ref, await blob(digest), `blob ${digest}`),
    manifestDigest: () => Promise.resolve(pickManifest(ref, index)),
    close: () => file.close(),
  };
}

/** The layers of an image's manifest, lowest first. */
export async function manifestLayers(
  ref: string,
  source: OciSource,
  digest: string,
): Promise<OciLayer[]> {
  const manifest = await source.json(digest) as { layers?: unknown };
  if (!Array.isArray(manifest.layers)) throw new OciImageError(ref, "its manifest has no layers");
  return manifest.layers.map((l) => {
    const layer = l as Record<string, unknown>;
    if (typeof layer.mediaType !== "string" || !LAYER_TYPES.includes(layer.mediaType)) {
      throw new OciImageError(
        ref,
        `layer media type ${JSON.stringify(layer.mediaType)} is not a tar`,
      );
    }
    if (typeof layer.size !== "number" || layer.size < 0) {
      throw new OciImageError(ref, "a layer has no size");
    }
    return {
      digest: checkedDigest(ref, layer.digest),
      size: layer.size,
      mediaType: layer.mediaType,
    };
  });
}

/** A layer's tar stream, decompressed when it is gzip. */
export async function layerTar(
  source: OciSource,
  layer: OciLayer,
): Promise<ReadableStream<Uint8Array>> {
  const stream = await source.blob(layer.digest, layer.size);
  return /gzip/.test(layer.mediaType)
    ? stream.pipeThrough(
      new DecompressionStream("gzip") as unknown as TransformStream<Uint8Array, Uint8Array>,
    )
    : stream;
}

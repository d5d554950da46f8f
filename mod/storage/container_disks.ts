/**
 * Pod-less mode's containerDisks: no kubelet pulls the image and no container-disk
 * container serves it, so the handler reads the image itself. An image is an OCI image
 * layout directory or an OCI archive in the image directory, named after the image
 * reference (`quay.io/containerdisks/fedora:39` -> `quay.io_containerdisks_fedora_39.tar`
 * or that name as a directory). Its disk is KubeVirt's: `containerDisk.path`, or the single
 * file under `/disk`, read from the topmost layer that has it.
 *
 * Disks go into a content-addressed store (`<store>/<sha256 of manifest digest and path>.img`,
 * read-only), checked by `qemu-img info` to be raw or a qcow2 without a backing file, once
 * for however many VMs use them; each VM's launcher gets the stored file to put its qcow2
 * overlay on. An image that is not there, or not a containerDisk, is refused naming the
 * volume's field and the image.
 *
 * @module
 */

import { join } from "node:path";
import { type VirtualMachineInstance, vmiKey } from "../api/mod.ts";
import { getLogger } from "../log/mod.ts";
import { writeFileDurably } from "../../ffi/mod.ts";
import {
  layerTar,
  manifestLayers,
  OciImageError,
  type OciLayer,
  type OciSource,
  openArchive,
  openLayout,
  walkTar,
} from "./oci.ts";
import { removeIfPresent } from "../lifecycle/mod.ts";

const log = getLogger("storage", "container-disks");

/** A containerDisk that cannot be prepared, naming the volume's field. */
export class ContainerDiskError extends Error {
  /** The field at fault, e.g. `spec.volumes[0].containerDisk.image`. */
  readonly path: string;
  /** Creates `Cannot prepare containerDisk of VMI "<key>": <path>: <detail>`. */
  constructor(key: string, path: string, detail: string, options?: ErrorOptions) {
    super(`Cannot prepare containerDisk of VMI "${key}": ${path}: ${detail}`, options);
    this.name = "ContainerDiskError";
    this.path = path;
  }
}

/** A stored disk. */
export interface StoredDisk {
  /** The store's read-only file. */
  file: string;
  /** Its format. */
  format: "raw" | "qcow2";
}

/** Options of {@linkcode ContainerDiskStore}. */
export interface ContainerDiskStoreOptions {
  /** Where images are found (OCI layouts and archives). */
  imageDir: string;
  /** The content-addressed store of their disks. */
  storeDir: string;
  /** qemu-img; `qemu-img` unless told. */
  qemuImg?: string;
}

/** The file name an image reference maps to (as the launcher's image directory names files). */
export function imageFileName(image: string): string {
  return image.replace(/[^A-Za-z0-9._-]/g, "_");
}

async function sha256Hex(text: string): Promise<string> {
  const digest = new Uint8Array(
    await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text)),
  );
  return [...digest].map((b) => b.toString(16).padStart(2, "0")).join("");
}

async function kind(path: string): Promise<"file" | "dir" | undefined> {
  // Not there or not readable: either way no disk to use at this path.
  const stat = await Deno.stat(path).catch(() => undefined);
  return stat?.isFile ? "file" : stat?.isDirectory ? "dir" : undefined;
}

/** Reads OCI images into the store; see the module doc. */
export class ContainerDiskStore {
  readonly #o: ContainerDiskStoreOptions;
  /** Disks being stored, so two VMs of one image read it once. */
  readonly #pending = new Map<string, Promise<StoredDisk>>();

  /** Creates the store; nothing is read until a disk is asked for. */
  constructor(options: ContainerDiskStoreOptions) {
    this.#o = options;
  }

  /** Opens the image of `image` if the image directory has it as an OCI layout or archive. */
  async #open(image: string): Promise<OciSource | undefined> {
    const base = join(this.#o.imageDir, imageFileName(image));
    if (await kind(join(base, "index.json")) === "file") return await openLayout(image, base);
    for (const archive of [`${base}.tar`, `${base}.oci.tar`]) {
      if (await kind(archive) === "file") return await openArchive(image, archive);
    }
    return undefined;
  }

  /**
   * The stored disk of `image` (at `path` in it, else the single file under `/disk`), read
   * into the store on first use; undefined when the image directory has no OCI image of
   * that name. Throws `OciImageError` for an image that is not a containerDisk.
   */
  async disk(image: string, path?: string): Promise<StoredDisk | undefined> {
    const source = await this.#open(image);
    if (!source) return undefined;
    try {
      const manifest = await source.manifestDigest();
      const key = await sha256Hex(`${manifest}\n${path ?? ""}`);
      const file = join(this.#o.storeDir, `${key}.img`);
      const meta = join(this.#o.storeDir, `${key}.json`);
      const stored = await Deno.readTextFile(meta).then(JSON.parse, () => undefined);
      if (stored && await kind(file) === "file") return { file, format: stored.format };
      let pending = this.#pending.get(key);
      if (!pending) {
        pending = this.#store(image, source, manifest, path, file, meta)
          .finally(() => this.#pending.delete(key));
        this.#pending.set(key, pending);
      }
      return await pending;
    } finally {
      source.close();
    }
  }

  async #store(
    image: string,
    source: OciSource,
    manifest: string,
    path: string | undefined,
    file: string,
    meta: string,
  ): Promise<StoredDisk> {
    const started = performance.now();
    const layers = await manifestLayers(image, source, manifest);
    const wanted = path === undefined ? undefined : path.replace(/^\/+/, "");
    await Deno.mkdir(this.#o.storeDir, { recursive: true, mode: 0o755 });
    const partial = `${file}.${crypto.randomUUID().slice(0, 8)}.partial`;
    try {
      const found = await this.#extract(image, source, layers, wanted, partial);
      const format = await this.#check(image, partial, found);
      await Deno.chmod(partial, 0o444);
      await Deno.rename(partial, file);
      await writeFileDurably(meta, JSON.stringify({ image, manifest, path: found, format }), {
        mode: 0o644,
      });
      log.info("containerDisk stored", {
        image,
        path: found,
        format,
        bytes: (await Deno.stat(file)).size,
        ms: Math.round(performance.now() - started),
      });
      return { file, format };
    } finally {
      // Gone after the rename; a throw here would hide the pull's own error.
      await removeIfPresent(partial).catch((error) =>
        log.warn("Cannot remove {partial}: {error}", { partial, error })
      );
    }
  }

  /**
   * Removes the stored disks whose image is gone from the image directory or now names
   * another manifest (the image was replaced), unless one of `inUse` (the files running
   * VMIs read) is theirs or one is being stored. A disk of an image still there is kept
   * for the next VMI, as the kubelet keeps an image. Returns the files removed.
   */
  async collect(inUse: ReadonlySet<string>): Promise<string[]> {
    const removed: string[] = [];
    let entries: Deno.DirEntry[];
    try {
      // Read synchronously: Deno 2.9.3 may close a node:net socket's descriptor twice, and a
      // directory's read on another thread must not fall in between (docs/compatibility.md).
      entries = [...Deno.readDirSync(this.#o.storeDir)];
    } catch (error) {
      if (error instanceof Deno.errors.NotFound) return removed;
      throw error;
    }
    const current = new Map<string, string | undefined>();
    for (const entry of entries) {
      const match = /^([0-9a-f]{64})\.json$/.exec(entry.name);
      if (!entry.isFile || !match || this.#pending.has(match[1])) continue;
      const meta = join(this.#o.storeDir, entry.name);
      const file = join(this.#o.storeDir, `${match[1]}.img`);
      if (inUse.has(file)) continue;
      let stored: { image?: string; manifest?: string };
      try {
        stored = JSON.parse(await Deno.readTextFile(meta));
      } catch {
        continue; // being written, or not ours: left alone
      }
      if (typeof stored.image !== "string") continue;
      if (!current.has(stored.image)) {
        // Gone: no image of that name; an image there whose manifest cannot be read is kept.
        let source: OciSource | undefined;
        try {
          source = await this.#open(stored.image);
          current.set(stored.image, source ? await source.manifestDigest() : undefined);
        } catch {
          current.set(stored.image, stored.manifest);
        } finally {
          source?.close();
        }
      }
      if (current.get(stored.image) === stored.manifest) continue;
      await removeIfPresent(file);
      await removeIfPresent(meta);
      removed.push(file);
      log.info("containerDisk removed from the store: its image is gone or replaced", {
        image: stored.image,
        file,
      });
    }
    return removed;
  }

  /** Writes the disk's bytes to `target`; returns its path in the image. */
  async #extract(
    image: string,
    source: OciSource,
    layers: OciLayer[],
    wanted: string | undefined,
    target: string,
  ): Promise<string> {
    // The topmost layer that has the disk (or any file under disk/) holds it.
    for (const layer of [...layers].reverse()) {
      const names: string[] = [];
      let whiteout = false;
      await walkTar(await layerTar(source, layer), (entry) => {
        const base = entry.name.slice(entry.name.lastIndexOf("/") + 1);
        const dir = entry.name.slice(0, entry.name.lastIndexOf("/") + 1);
        if (base.startsWith(".wh.")) {
          if (wanted !== undefined && `${dir}${base.slice(4)}` === wanted) whiteout = true;
          return Promise.resolve();
        }
        if (wanted !== undefined ? entry.name === wanted : dir === "disk/") names.push(entry.name);
        return Promise.resolve();
      });
      if (whiteout) break;
      if (names.length === 0) continue;
      if (names.length > 1) {
        throw new OciImageError(
          image,
          `it has ${names.length} files under /disk (${
            names.join(", ")
          }): name one with containerDisk.path`,
        );
      }
      const out = await Deno.open(target, { write: true, createNew: true, mode: 0o600 });
      try {
        await walkTar(await layerTar(source, layer), async (entry, take) => {
          if (entry.name !== names[0]) return;
          await take(async (chunk) => {
            for (let done = 0; done < chunk.length;) done += await out.write(chunk.subarray(done));
          });
          return false;
        });
      } finally {
        out.close();
      }
      return names[0];
    }
    throw new OciImageError(
      image,
      wanted !== undefined
        ? `it has no file "/${wanted}"`
        : "it has no file under /disk: it is not a containerDisk image",
    );
  }

  /** Checks with qemu-img that a disk is raw or a qcow2 without a backing file. */
  async #check(image: string, file: string, inImage: string): Promise<"raw" | "qcow2"> {
    const out = await new Deno.Command(this.#o.qemuImg ?? "qemu-img", {
      args: ["info", "--output=json", file],
      stdout: "piped",
      stderr: "piped",
      signal: AbortSignal.timeout(30_000),
    }).output();
    if (!out.success) {
      throw new OciImageError(
        image,
        `qemu-img cannot read "/${inImage}": ${new TextDecoder().decode(out.stderr).trim()}`,
      );
    }
    const info = JSON.parse(new TextDecoder().decode(out.stdout)) as {
      format?: string;
      "backing-filename"?: string;
    };
    if (info.format !== "raw" && info.format !== "qcow2") {
      throw new OciImageError(image, `"/${inImage}" is ${info.format}, not raw or qcow2`);
    }
    if (info["backing-filename"]) {
      throw new OciImageError(
        image,
        `"/${inImage}" is a qcow2 with a backing file; a containerDisk must stand alone`,
      );
    }
    return info.format;
  }

  /**
   * The stored disks of a VMI's containerDisk volumes that are OCI images in the image
   * directory, by volume name (volumes whose image is a plain disk file there are left to
   * the launcher, as before). Throws {@linkcode ContainerDiskError} naming the field.
   */
  async prepare(vmi: VirtualMachineInstance): Promise<Record<string, string>> {
    const out: Record<string, string> = {};
    const key = vmiKey(vmi.metadata);
    for (const [i, volume] of (vmi.spec.volumes ?? []).entries()) {
      const source = volume.containerDisk;
      if (!source?.image) continue;
      try {
        const disk = await this.disk(source.image, source.path);
        if (disk) out[volume.name] = disk.file;
      } catch (error) {
        if (!(error instanceof OciImageError)) throw error;
        const field = source.path !== undefined && /no file "/.test(error.message)
          ? "path"
          : "image";
        throw new ContainerDiskError(
          key,
          `spec.volumes[${i}].containerDisk.${field}`,
          error.message,
          {
            cause: error,
          },
        );
      }
    }
    return out;
  }
}

/**
 * The I/O half of the converter: turns a VMI's volumes into files QEMU can open
 * (containerDisk overlays, empty disks, host disks, cloud-init ISOs) and finds EFI
 * firmware. Everything it creates lives under `diskDir`, except host disks, which are
 * confined to their namespace's folder of `hostDiskRoot` (`<hostDiskRoot>/<namespace>/`).
 *
 * @module
 */

import * as path from "node:path";
import {
  type CloudInitSource,
  quantityToInteger,
  type VirtualMachineInstance,
  type Volume,
} from "../api/mod.ts";
import {
  ConversionError,
  InvalidFieldError,
  UnsupportedFieldError,
  VolumePreparationError,
} from "./converter_errors.ts";
import type { PreparedEfi, PreparedVolume } from "./converter_xml.ts";
import { vmiKey, wantsEfi, wantsSecureBoot } from "./converter_xml.ts";
import { confinePath, confineToNamespace, namespaceRoot, PathEscapeError } from "./_host_path.ts";
import { writeIso } from "./iso.ts";
import type { IsoTool } from "./iso.ts";
import { runCommand } from "./_process.ts";
import { removeIfPresent } from "../lifecycle/mod.ts";

/** Where the preparation step finds inputs and puts what it creates. */
export interface PrepareOptions {
  /** Writable per-VMI directory for overlays, empty disks, ISOs and the EFI NVRAM. */
  diskDir: string;
  /** Directory of local containerDisk images (see {@linkcode containerDiskFileName}). */
  imageDir?: string;
  /**
   * The base image of containerDisk volumes the handler prepared (pod-less mode's store of
   * OCI images), by volume name: used as it is, read-only, under the VMI's overlay.
   */
  containerDisks?: Record<string, string>;
  /**
   * The host disk root: a VMI's hostDisk paths may point only into its namespace's folder
   * of it, `<hostDiskRoot>/<namespace>/`; without it hostDisk is refused.
   */
  hostDiskRoot?: string;
  /** Directory of the OVMF firmware files. Default `/usr/share/OVMF`. */
  ovmfDir?: string;
  /** ISO writer; default: genisoimage if installed, else xorriso. */
  isoTool?: IsoTool;
  /** qemu-img binary. Default `qemu-img`. */
  qemuImg?: string;
  /** Timeout of each helper program run. Default 30 s. */
  timeoutMs?: number;
}

/** What the preparation step produced. */
export interface PreparedVolumes {
  /** Backing file of each volume, keyed by volume name. */
  volumes: Record<string, PreparedVolume>;
  /** EFI firmware files when the VMI asks for EFI. */
  efi?: PreparedEfi;
  /** Files this call created under `diskDir` (removed when the VMI goes away). */
  created: string[];
}

/** Default directory of Debian's OVMF firmware. */
export const DEFAULT_OVMF_DIR = "/usr/share/OVMF";

/**
 * The file name an image reference maps to in the image directory: every character
 * outside `[A-Za-z0-9._-]` becomes `_`, so `quay.io/containerdisks/fedora:39` is
 * `quay.io_containerdisks_fedora_39`. The image file is that name with no extension or
 * with `.qcow2`, `.img` or `.raw`; with `containerDisk.path` it is that path inside a
 * directory of that name.
 */
export function containerDiskFileName(image: string): string {
  return image.replace(/[^A-Za-z0-9._-]/g, "_");
}

const IMAGE_EXTENSIONS = ["", ".qcow2", ".img", ".raw"];
const QCOW2_MAGIC = [0x51, 0x46, 0x49, 0xfb];

async function imageFormat(file: string): Promise<"qcow2" | "raw"> {
  const handle = await Deno.open(file, { read: true });
  try {
    const head = new Uint8Array(4);
    const n = await handle.read(head);
    return n === 4 && QCOW2_MAGIC.every((byte, i) => head[i] === byte) ? "qcow2" : "raw";
  } finally {
    handle.close();
  }
}

async function exists(file: string): Promise<boolean> {
  try {
    await Deno.lstat(file);
    return true;
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return false;
    throw error;
  }
}

async function isFile(file: string): Promise<boolean> {
  try {
    return (await Deno.stat(file)).isFile;
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return false;
    throw error;
  }
}

class Preparer {
  #vmi: VirtualMachineInstance;
  #options: PrepareOptions;
  #key: string;
  #created: string[] = [];

  constructor(vmi: VirtualMachineInstance, options: PrepareOptions) {
    this.#vmi = vmi;
    this.#options = options;
    this.#key = vmiKey(vmi);
  }

  get created(): string[] {
    return this.#created;
  }

  async volume(volume: Volume, index: number): Promise<PreparedVolume> {
    const at = `spec.volumes[${index}]`;
    if (volume.containerDisk) return await this.#containerDisk(volume, at);
    if (volume.emptyDisk) return await this.#emptyDisk(volume, at);
    if (volume.hostDisk) return await this.#hostDisk(volume, at);
    if (volume.cloudInitNoCloud) {
      return await this.#cloudInit(volume.name, volume.cloudInitNoCloud, "noCloud", at);
    }
    if (volume.cloudInitConfigDrive) {
      return await this.#cloudInit(volume.name, volume.cloudInitConfigDrive, "configDrive", at);
    }
    throw new UnsupportedFieldError(this.#key, at, "no supported volume source");
  }

  async #volumeDir(name: string, at: string): Promise<string> {
    const dir = path.join(this.#options.diskDir, name);
    try {
      await Deno.mkdir(dir, { recursive: true, mode: 0o750 });
    } catch (error) {
      throw new VolumePreparationError(this.#key, at, `cannot create "${dir}"`, { cause: error });
    }
    return dir;
  }

  async #qemuImg(args: string[], at: string): Promise<void> {
    const command = [this.#options.qemuImg ?? "qemu-img", ...args];
    try {
      await runCommand(command, { timeoutMs: this.#options.timeoutMs });
    } catch (error) {
      throw new VolumePreparationError(this.#key, at, "qemu-img failed", { cause: error });
    }
  }

  /** Creates `target` through `create(partial)` then a rename, unless it exists. */
  async #createOnce(
    target: string,
    at: string,
    create: (partial: string) => Promise<void>,
  ): Promise<void> {
    if (await exists(target)) return;
    const partial = `${target}.partial`;
    await removeIfPresent(partial);
    await create(partial);
    try {
      await Deno.rename(partial, target);
    } catch (error) {
      throw new VolumePreparationError(this.#key, at, `cannot rename to "${target}"`, {
        cause: error,
      });
    }
    this.#created.push(target);
  }

  async #findImage(volume: Volume, at: string): Promise<string> {
    const prepared = this.#options.containerDisks?.[volume.name];
    if (prepared !== undefined) {
      if (!(await isFile(prepared))) {
        throw new VolumePreparationError(
          this.#key,
          `${at}.containerDisk.image`,
          `the prepared disk "${prepared}" is gone`,
        );
      }
      return prepared;
    }
    const source = volume.containerDisk!;
    const imageDir = this.#options.imageDir;
    if (!imageDir) {
      throw new UnsupportedFieldError(
        this.#key,
        `${at}.containerDisk`,
        "no containerDisk image directory is configured",
      );
    }
    const base = containerDiskFileName(source.image);
    const candidates = source.path !== undefined
      ? [path.join(base, source.path.replace(/^\/+/, ""))]
      : IMAGE_EXTENSIONS.map((ext) => base + ext);
    for (const candidate of candidates) {
      let real: string;
      try {
        real = await confinePath(imageDir, candidate);
      } catch (error) {
        if (error instanceof PathEscapeError) {
          const field = source.path !== undefined ? "path" : "image";
          throw new InvalidFieldError(
            this.#key,
            `${at}.containerDisk.${field}`,
            `escapes the image directory: ${error.message}`,
            { cause: error },
          );
        }
        if (error instanceof Deno.errors.NotFound) break; // no image directory at all
        throw error;
      }
      if (await isFile(real)) return real;
    }
    throw new VolumePreparationError(
      this.#key,
      `${at}.containerDisk.image`,
      `no image for "${source.image}" in "${imageDir}" (looked for ${
        candidates.map((c) => `"${c}"`).join(", ")
      }, and for an OCI image "${base}.tar" or "${base}/index.json")`,
    );
  }

  async #containerDisk(volume: Volume, at: string): Promise<PreparedVolume> {
    const baseImage = await this.#findImage(volume, at);
    const format = await imageFormat(baseImage);
    const overlay = path.join(await this.#volumeDir(volume.name, at), "disk.qcow2");
    await this.#createOnce(overlay, at, async (partial) => {
      await this.#qemuImg(
        ["create", "-q", "-f", "qcow2", "-b", baseImage, "-F", format, partial],
        at,
      );
    });
    return { path: overlay, format: "qcow2" };
  }

  async #emptyDisk(volume: Volume, at: string): Promise<PreparedVolume> {
    const bytes = quantityToInteger(volume.emptyDisk!.capacity);
    if (bytes < 512) {
      throw new InvalidFieldError(this.#key, `${at}.emptyDisk.capacity`, "less than 512 bytes");
    }
    const file = path.join(await this.#volumeDir(volume.name, at), "disk.qcow2");
    await this.#createOnce(file, at, async (partial) => {
      await this.#qemuImg(["create", "-q", "-f", "qcow2", partial, String(bytes)], at);
    });
    return { path: file, format: "qcow2" };
  }

  async #hostDisk(volume: Volume, at: string): Promise<PreparedVolume> {
    const hostDisk = volume.hostDisk!;
    const field = `${at}.hostDisk.path`;
    const root = this.#options.hostDiskRoot;
    // The root holds every tenant's volumes: a VMI may name only its own namespace's folder.
    const namespace = this.#vmi.metadata.namespace ?? "default";
    if (!root) {
      throw new UnsupportedFieldError(
        this.#key,
        `${at}.hostDisk`,
        "no host disk root directory is configured",
      );
    }
    if (!path.isAbsolute(hostDisk.path)) {
      throw new InvalidFieldError(this.#key, field, `"${hostDisk.path}" is not absolute`);
    }
    const confine = async () => {
      try {
        return await confineToNamespace(root, namespace, hostDisk.path);
      } catch (error) {
        if (error instanceof PathEscapeError) {
          throw new InvalidFieldError(
            this.#key,
            field,
            `must stay inside "${namespaceRoot(root, namespace)}/", the host disk root of ` +
              `namespace "${namespace}": ${error.message}`,
            { cause: error },
          );
        }
        throw new VolumePreparationError(this.#key, at, `cannot resolve "${hostDisk.path}"`, {
          cause: error,
        });
      }
    };
    const real = await confine();
    if (await exists(real)) {
      const info = await Deno.stat(real);
      // A block device node under the root (a pod-less block claim) is a raw disk too.
      if (info.isBlockDevice) return { path: real, format: "raw", block: true };
      if (!info.isFile) {
        throw new InvalidFieldError(
          this.#key,
          field,
          `"${hostDisk.path}" is not a regular file or a block device`,
        );
      }
      return { path: real, format: "raw" };
    }
    if (hostDisk.type === "Disk") {
      throw new InvalidFieldError(
        this.#key,
        field,
        `"${hostDisk.path}" does not exist (type Disk; use DiskOrCreate to create it)`,
      );
    }
    if (hostDisk.capacity === undefined) {
      throw new InvalidFieldError(
        this.#key,
        `${at}.hostDisk.capacity`,
        "is required to create a DiskOrCreate host disk",
      );
    }
    const bytes = quantityToInteger(hostDisk.capacity);
    try {
      await Deno.mkdir(path.dirname(real), { recursive: true, mode: 0o750 });
      // The directories just made could have been raced into symlinks: check again.
      const again = await confine();
      const file = await Deno.open(again, { write: true, createNew: true, mode: 0o660 });
      try {
        await file.truncate(bytes);
      } finally {
        file.close();
      }
      return { path: again, format: "raw" };
    } catch (error) {
      if (error instanceof ConversionError) throw error;
      throw new VolumePreparationError(this.#key, at, `cannot create "${real}"`, {
        cause: error,
      });
    }
  }

  #decode(source: CloudInitSource, at: string, kind: "userData" | "networkData") {
    const plain = source[kind];
    const encoded = source[`${kind}Base64`];
    if (plain !== undefined && encoded !== undefined) {
      throw new InvalidFieldError(this.#key, `${at}.${kind}Base64`, `set ${kind} or ${kind}Base64`);
    }
    if (encoded === undefined) return plain;
    try {
      return new TextDecoder("utf-8", { fatal: true }).decode(
        Uint8Array.from(atob(encoded), (ch) => ch.charCodeAt(0)),
      );
    } catch (error) {
      throw new InvalidFieldError(this.#key, `${at}.${kind}Base64`, "is not base64 of UTF-8 text", {
        cause: error,
      });
    }
  }

  async #cloudInit(
    name: string,
    source: CloudInitSource,
    kind: "noCloud" | "configDrive",
    at: string,
  ): Promise<PreparedVolume> {
    const field = `${at}.${kind === "noCloud" ? "cloudInitNoCloud" : "cloudInitConfigDrive"}`;
    const userData = this.#decode(source, field, "userData");
    const networkData = this.#decode(source, field, "networkData");
    if (userData === undefined && networkData === undefined) {
      throw new InvalidFieldError(this.#key, field, "needs userData or networkData");
    }
    const vmi = this.#vmi;
    const instanceId = `${vmi.metadata.name}.${vmi.metadata.namespace ?? "default"}`;
    const hostname = vmi.spec.hostname ?? vmi.metadata.name;
    const files: Record<string, string> = {};
    let label: string;
    let fileName: string;
    if (kind === "noCloud") {
      label = "cidata";
      fileName = "noCloud.iso";
      files["meta-data"] = JSON.stringify({
        "instance-id": instanceId,
        "local-hostname": hostname,
      }) + "\n";
      files["user-data"] = userData ?? "";
      if (networkData !== undefined) files["network-config"] = networkData;
    } else {
      label = "config-2";
      fileName = "configdrive.iso";
      const dir = "openstack/latest";
      files[`${dir}/meta_data.json`] = JSON.stringify({
        instance_id: instanceId,
        uuid: vmi.spec.domain.firmware?.uuid ?? vmi.metadata.uid,
        hostname,
      }) + "\n";
      files[`${dir}/user_data`] = userData ?? "";
      if (networkData !== undefined) files[`${dir}/network_data.json`] = networkData;
    }
    const iso = path.join(await this.#volumeDir(name, at), fileName);
    const existed = await exists(iso);
    try {
      // Rewritten every time: the data may have changed, and a running guest keeps the
      // old inode open.
      await writeIso(iso, label, files, {
        tool: this.#options.isoTool,
        timeoutMs: this.#options.timeoutMs,
      });
    } catch (error) {
      throw new VolumePreparationError(this.#key, at, "cannot write the cloud-init ISO", {
        cause: error,
      });
    }
    if (!existed) this.#created.push(iso);
    return { path: iso, format: "raw" };
  }

  async efi(): Promise<PreparedEfi | undefined> {
    const vmi = this.#vmi;
    if (!wantsEfi(vmi)) return undefined;
    const secureBoot = wantsSecureBoot(vmi);
    const dir = this.#options.ovmfDir ?? DEFAULT_OVMF_DIR;
    const code = path.join(dir, secureBoot ? "OVMF_CODE_4M.secboot.fd" : "OVMF_CODE_4M.fd");
    const vars = path.join(dir, secureBoot ? "OVMF_VARS_4M.ms.fd" : "OVMF_VARS_4M.fd");
    for (const file of [code, vars]) {
      if (!await isFile(file)) {
        throw new UnsupportedFieldError(
          this.#key,
          "spec.domain.firmware.bootloader.efi",
          `EFI firmware "${file}" is not installed (apt-get install ovmf)`,
        );
      }
    }
    const nvram = path.join(this.#options.diskDir, `${vmi.metadata.name}_VARS.fd`);
    return { code, varsTemplate: vars, nvram, secureBoot };
  }
}

/**
 * Prepares the VMI's volume `name` alone, for a disk hotplugged into its running domain:
 * nothing else of the VMI (firmware, other volumes) is touched.
 */
export async function prepareVolume(
  vmi: VirtualMachineInstance,
  name: string,
  options: PrepareOptions,
): Promise<PreparedVolume> {
  const list = vmi.spec.volumes ?? [];
  const index = list.findIndex((v) => v.name === name);
  if (index < 0) {
    throw new InvalidFieldError(vmiKey(vmi), "spec.volumes", `no volume named "${name}"`);
  }
  return await new Preparer(vmi, options).volume(list[index], index);
}

/**
 * Creates the files the VMI's volumes need under `options.diskDir` and finds its EFI
 * firmware. Idempotent: overlays and empty disks that exist are kept (they hold guest
 * writes); cloud-init ISOs are rewritten. Throws the converter's typed errors.
 */
export async function prepareVolumes(
  vmi: VirtualMachineInstance,
  options: PrepareOptions,
): Promise<PreparedVolumes> {
  const preparer = new Preparer(vmi, options);
  const efi = await preparer.efi();
  const volumes: Record<string, PreparedVolume> = {};
  const list = vmi.spec.volumes ?? [];
  for (const [index, volume] of list.entries()) {
    volumes[volume.name] = await preparer.volume(volume, index);
  }
  return { volumes, efi, created: preparer.created };
}

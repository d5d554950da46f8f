/**
 * A throw-away node layout for converter tests: image directory with small images,
 * host disk root, per-VMI disk directories. Paths in fixtures are written under
 * {@linkcode FIXTURE_ROOT} and mapped to the real temporary directory.
 *
 * @module
 */

import * as path from "node:path";
import type { ConvertOptions } from "../../mod/launcher/testing.ts";

/** The root fixtures and golden files use in place of the temporary directory. */
export const FIXTURE_ROOT = "/var/lib/virtnode-test";

/** Directory of the converter fixtures. */
export const FIXTURE_DIR = new URL("../fixtures/converter/", import.meta.url);

async function qemuImg(...args: string[]): Promise<void> {
  const output = await new Deno.Command("qemu-img", { args, stdout: "null", stderr: "piped" })
    .output();
  if (!output.success) {
    throw new Error(`qemu-img ${args.join(" ")}: ${new TextDecoder().decode(output.stderr)}`);
  }
}

/** A temporary node layout; `dispose()` removes it. */
export interface Workspace {
  root: string;
  imageDir: string;
  hostDiskRoot: string;
  /** Fixture text with {@linkcode FIXTURE_ROOT} replaced by the real root. */
  localize(text: string): string;
  /** Output text with the real root replaced by {@linkcode FIXTURE_ROOT}. */
  normalize(text: string): string;
  /** Converter options for a VMI `namespace/name`. */
  options(namespace: string, name: string, uid: string): ConvertOptions;
  dispose(): Promise<void>;
}

/** Creates the layout with the images the fixtures name. */
export async function createWorkspace(): Promise<Workspace> {
  const root = await Deno.realPath(await Deno.makeTempDir({ prefix: "virtnode-converter-" }));
  const imageDir = path.join(root, "images");
  const hostDiskRoot = path.join(root, "hostdisks");
  await Deno.mkdir(path.join(imageDir, "example.com_bundle_1", "disk"), { recursive: true });
  // The namespaces' folders of the root: the fixtures' VMIs are in "storage", the tests' in
  // "default".
  for (const namespace of ["default", "storage"]) {
    await Deno.mkdir(path.join(hostDiskRoot, namespace), { recursive: true });
  }
  await qemuImg(
    "create",
    "-q",
    "-f",
    "qcow2",
    path.join(imageDir, "quay.io_containerdisks_fedora_39.qcow2"),
    "1M",
  );
  await qemuImg(
    "create",
    "-q",
    "-f",
    "raw",
    path.join(imageDir, "registry.example.com_cirros_latest.img"),
    "1M",
  );
  await qemuImg(
    "create",
    "-q",
    "-f",
    "raw",
    path.join(imageDir, "example.com_bundle_1", "disk", "disk.img"),
    "1M",
  );
  await qemuImg(
    "create",
    "-q",
    "-f",
    "raw",
    path.join(hostDiskRoot, "storage", "shared.img"),
    "1M",
  );
  return {
    root,
    imageDir,
    hostDiskRoot,
    localize: (text) => text.replaceAll(FIXTURE_ROOT, root),
    normalize: (text) => text.replaceAll(root, FIXTURE_ROOT),
    options: (namespace, name, uid) => ({
      domainType: "qemu",
      runDir: `/var/run/kubevirt-private/${uid}`,
      diskDir: path.join(root, "disks", `${namespace}_${name}`),
      imageDir,
      hostDiskRoot,
    }),
    dispose: () => Deno.remove(root, { recursive: true }),
  };
}

/** Runs `virt-xml-validate <file> domain`; fails clearly when it is not installed. */
export async function virtXmlValidate(xml: string): Promise<{ ok: boolean; output: string }> {
  const file = await Deno.makeTempFile({ suffix: ".xml" });
  try {
    await Deno.writeTextFile(file, xml);
    let output: Deno.CommandOutput;
    try {
      output = await new Deno.Command("virt-xml-validate", {
        args: [file, "domain"],
        stdout: "piped",
        stderr: "piped",
      }).output();
    } catch (error) {
      if (error instanceof Deno.errors.NotFound) {
        throw new Error(
          "virt-xml-validate is not installed: install libvirt-clients (apt-get install libvirt-clients)",
          { cause: error },
        );
      }
      throw error;
    }
    const decoder = new TextDecoder();
    return {
      ok: output.success,
      output: decoder.decode(output.stdout) + decoder.decode(output.stderr),
    };
  } finally {
    await Deno.remove(file);
  }
}

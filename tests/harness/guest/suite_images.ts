/**
 * The substitute guest images of KubeVirt's functional test suite as OCI image archives
 * under the suite's names (`<prefix>/<name>:<tag>`), built by `suite_images.sh` from
 * Debian's packages and cached next to its output. They are look-alikes that say so.
 *
 * @module
 */
import { join } from "node:path";
import { buildImageArchive } from "../../../deploy/image/oci.ts";

const SCRIPT = new URL("./suite_images.sh", import.meta.url).pathname;

/** The registry prefix and tag the suite is run with (`-utility-container-prefix/-tag`). */
export const SUITE_PREFIX = "virtnode.local/kubevirt";
/** See {@linkcode SUITE_PREFIX}. */
export const SUITE_TAG = "v1.7.0";

/** A flavour `suite_images.sh` builds. */
export type SuiteFlavour = "cirros" | "alpine" | "fedora" | "vm-killer";

/** One image of the suite: its name there, the flavour behind it, where its disk goes. */
export interface SuiteImage {
  /** The name after the prefix, e.g. `cirros-container-disk-demo`. */
  name: string;
  /** The substitute built for it. */
  flavour: SuiteFlavour;
  /** The disk's path in a containerDisk image; none for a pod image. */
  diskPath?: string;
}

/** The images the suite's conformance specs name, and the substitute each one gets. */
export const SUITE_IMAGES: readonly SuiteImage[] = [
  { name: "cirros-container-disk-demo", flavour: "cirros", diskPath: "disk/cirros.img" },
  // KubeVirt's custom-location image holds the disk at /custom-disk/downloaded.
  {
    name: "cirros-custom-container-disk-demo",
    flavour: "cirros",
    diskPath: "custom-disk/downloaded",
  },
  { name: "alpine-container-disk-demo", flavour: "alpine", diskPath: "disk/alpine.img" },
  {
    name: "alpine-with-test-tooling-container-disk",
    flavour: "alpine",
    diskPath: "disk/alpine.img",
  },
  {
    name: "fedora-with-test-tooling-container-disk",
    flavour: "fedora",
    diskPath: "disk/fedora.img",
  },
  { name: "vm-killer", flavour: "vm-killer" },
];

/** Builds (cached) one flavour and returns its directory (`disk.img`, or `root/`). */
export async function buildSuiteFlavour(flavour: SuiteFlavour): Promise<string> {
  const out = await new Deno.Command("bash", {
    args: [SCRIPT, flavour],
    stdout: "piped",
    stderr: "piped",
  })
    .output();
  if (!out.success) {
    throw new Error(
      `Cannot build the suite's "${flavour}" substitute: ${new TextDecoder().decode(out.stderr)}`,
    );
  }
  return new TextDecoder().decode(out.stdout).trim().split("\n").at(-1)!;
}

/** What {@linkcode suiteImageArchive} returns. */
export interface SuiteImageArchive {
  /** The full reference, e.g. `virtnode.local/kubevirt/cirros-container-disk-demo:v1.7.0`. */
  ref: string;
  /** The OCI archive, for `ctr images import`. */
  archive: string;
}

/**
 * The OCI archive of `image` under `prefix` and `tag`, built once next to the flavour's
 * cached output: a containerDisk holds the disk read-only for everyone (oci.ts packs files
 * as root's); vm-killer runs as user 1001, as KubeVirt's does (its pods run as non-root).
 */
export async function suiteImageArchive(
  image: SuiteImage,
  options: { prefix?: string; tag?: string } = {},
): Promise<SuiteImageArchive> {
  const ref = `${options.prefix ?? SUITE_PREFIX}/${image.name}:${options.tag ?? SUITE_TAG}`;
  const dir = await buildSuiteFlavour(image.flavour);
  const archive = join(dir, `oci-${ref.replace(/[^A-Za-z0-9._-]/g, "_")}.tar`);
  if (await Deno.stat(archive).then(() => true, () => false)) return { ref, archive };
  const partial = `${archive}.${crypto.randomUUID().slice(0, 8)}`;
  if (image.diskPath === undefined) {
    await buildImageArchive(
      { name: ref, root: join(dir, "root"), entrypoint: ["/bin/sh"], user: "1001" },
      partial,
    );
  } else {
    const root = await Deno.makeTempDir({ prefix: "virtnode-suite-disk-" });
    try {
      const disk = join(root, image.diskPath);
      await Deno.mkdir(join(disk, ".."), { recursive: true });
      await Deno.copyFile(join(dir, "disk.img"), disk);
      await Deno.chmod(disk, 0o444);
      await buildImageArchive({ name: ref, root, entrypoint: ["/disk-has-no-program"] }, partial);
    } finally {
      await Deno.remove(root, { recursive: true });
    }
  }
  await Deno.rename(partial, archive);
  return { ref, archive };
}

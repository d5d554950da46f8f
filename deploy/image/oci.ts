/**
 * OCI image archives from directories on this machine, without a registry or a container
 * engine: `deno task image` (the virtnode image) and the test node's images, which are
 * imported into containerd (`ctr images import`). One uncompressed layer per directory
 * (packed by GNU tar with sorted names, zero mtimes and root ownership, so the same files
 * give the same digest), an image config, a manifest and an OCI image layout (`oci-layout`,
 * `index.json`, `blobs/sha256/`), with Docker's `manifest.json` beside it for `docker load`,
 * packed into one tar.
 *
 * @module
 */
import { join } from "node:path";
import { removeIfPresent } from "../../mod/lifecycle/mod.ts";

/** What goes into an image. */
export interface ImageSpec {
  /** The image reference containerd records, e.g. `virtnode.local/pause:1`. */
  name: string;
  /**
   * The directory that becomes the image's root filesystem, or the directories of its
   * layers, lowest first (a layer that rarely changes below one that often does).
   */
  root: string | string[];
  /** The command the container runs. */
  entrypoint: string[];
  /** `KEY=value` environment entries. */
  env?: string[];
  /** The working directory. */
  workingDir?: string;
  /** The user the container runs as (numeric, so that `runAsNonRoot` can be checked). */
  user?: string;
  /** The image config's labels. */
  labels?: Record<string, string>;
}

async function run(cmd: string, args: string[]): Promise<void> {
  const out = await new Deno.Command(cmd, { args, stdout: "null", stderr: "piped" }).output();
  if (!out.success) {
    throw new Error(`Cannot run ${cmd} ${args.join(" ")}: ${new TextDecoder().decode(out.stderr)}`);
  }
}

async function sha256File(path: string): Promise<string> {
  const out = await new Deno.Command("sha256sum", { args: [path], stdout: "piped" }).output();
  if (!out.success) throw new Error(`Cannot hash ${path}`);
  return new TextDecoder().decode(out.stdout).split(" ")[0];
}

async function sha256Bytes(bytes: Uint8Array<ArrayBuffer>): Promise<string> {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return [...digest].map((b) => b.toString(16).padStart(2, "0")).join("");
}

/** Packs `spec` into an OCI image archive at `archive`; returns the manifest's digest. */
export async function buildImageArchive(spec: ImageSpec, archive: string): Promise<string> {
  const layout = await Deno.makeTempDir({ prefix: "virtnode-oci-" });
  try {
    const blobs = join(layout, "blobs", "sha256");
    await Deno.mkdir(blobs, { recursive: true });
    const layers: { digest: string; size: number }[] = [];
    for (const root of typeof spec.root === "string" ? [spec.root] : spec.root) {
      const layerTar = join(layout, "layer.tar");
      await run("tar", [
        "--create",
        "--file",
        layerTar,
        "--directory",
        root,
        "--sort=name",
        "--mtime=@0",
        "--owner=0",
        "--group=0",
        "--numeric-owner",
        "--xattrs",
        ".",
      ]);
      const digest = await sha256File(layerTar);
      layers.push({ digest, size: (await Deno.stat(layerTar)).size });
      await Deno.rename(layerTar, join(blobs, digest));
    }

    const put = async (value: unknown) => {
      const bytes = new TextEncoder().encode(JSON.stringify(value));
      const digest = await sha256Bytes(bytes);
      await Deno.writeFile(join(blobs, digest), bytes);
      return { digest: `sha256:${digest}`, size: bytes.length };
    };
    const config = await put({
      architecture: "amd64",
      os: "linux",
      config: {
        Entrypoint: spec.entrypoint,
        Env: spec.env ?? ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        ...(spec.workingDir ? { WorkingDir: spec.workingDir } : {}),
        ...(spec.user ? { User: spec.user } : {}),
        ...(spec.labels ? { Labels: spec.labels } : {}),
      },
      rootfs: { type: "layers", diff_ids: layers.map((l) => `sha256:${l.digest}`) },
    });
    const manifest = await put({
      schemaVersion: 2,
      mediaType: "application/vnd.oci.image.manifest.v1+json",
      config: { mediaType: "application/vnd.oci.image.config.v1+json", ...config },
      layers: layers.map((l) => ({
        mediaType: "application/vnd.oci.image.layer.v1.tar",
        digest: `sha256:${l.digest}`,
        size: l.size,
      })),
    });
    const tag = spec.name.slice(spec.name.lastIndexOf(":") + 1);
    await Deno.writeTextFile(
      join(layout, "index.json"),
      JSON.stringify({
        schemaVersion: 2,
        manifests: [{
          mediaType: "application/vnd.oci.image.manifest.v1+json",
          ...manifest,
          annotations: {
            "io.containerd.image.name": spec.name,
            "org.opencontainers.image.ref.name": tag,
          },
        }],
      }),
    );
    await Deno.writeTextFile(join(layout, "oci-layout"), '{"imageLayoutVersion":"1.0.0"}');
    // Docker's own archive index, for a `docker load` that reads no OCI layout.
    const blob = (digest: string) => `blobs/sha256/${digest.replace(/^sha256:/, "")}`;
    await Deno.writeTextFile(
      join(layout, "manifest.json"),
      JSON.stringify([{
        Config: blob(config.digest),
        RepoTags: [spec.name],
        Layers: layers.map((l) => blob(l.digest)),
      }]),
    );
    await run("tar", [
      "--create",
      "--file",
      archive,
      "--directory",
      layout,
      "--sort=name",
      "--mtime=@0",
      "--owner=0",
      "--group=0",
      "--numeric-owner",
      "oci-layout",
      "index.json",
      "manifest.json",
      "blobs",
    ]);
    return manifest.digest;
  } finally {
    // In a finally, where a throw would hide the build's own error: only reported.
    await removeIfPresent(layout, { recursive: true }).catch((error) =>
      console.warn(`cannot remove ${layout}: ${error}`)
    );
  }
}

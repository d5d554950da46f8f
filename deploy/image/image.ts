/**
 * The virtnode image, as `deploy/daemonset.yaml` runs it, built offline from the working
 * tree (`deno task image`, deploy/image/main.ts; the test node imports the same archive).
 *
 * Two layers: Debian's libraries below (deploy/image/base.sh), the program above, in one
 * of two forms:
 * - **compiled** where this machine has Deno's runtime `denort` (`DENORT_BIN`): `deno
 *   compile`'s single binary (deploy/compile.ts) as `/usr/local/bin/virtnode`;
 * - **source** otherwise: Deno, the program's source and its npm packages (`deno install
 *   --frozen`, from `deno.lock`), with `/usr/local/bin/virtnode` running `main.ts` as `deno
 *   task virtnode` does.
 *
 * The image's `dev.virtnode.form` label says which. Each form is cached by the content of
 * what goes into it.
 *
 * @module
 */
import { join } from "node:path";
import { removeIfPresent } from "../../mod/lifecycle/mod.ts";
import { compileArgs } from "../compile.ts";
import { buildImageArchive } from "./oci.ts";

const REPO_ROOT = new URL("../../", import.meta.url).pathname;
const BASE_SCRIPT = new URL("./base.sh", import.meta.url).pathname;
/** What the source form carries of this checkout: the program and its lock. */
const IMAGE_SOURCES = ["main.ts", "deno.json", "deno.lock", "mod", "ffi"];
/** Where the source form keeps the program, and Deno's cache (npm packages) beside it. */
const IMAGE_APP_DIR = "/opt/virtnode";
const PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/** How the image runs virtnode. */
export type ImageForm = "compiled" | "source";

/** A built virtnode image. */
export interface VirtnodeImage {
  /** The name containerd, podman and docker know it by once loaded. */
  name: string;
  /** The OCI image archive (in the cache). */
  archive: string;
  /** The image manifest's digest, `sha256:...`. */
  digest: string;
  form: ImageForm;
  /** virtnode's version (deno.json), the image's tag. */
  version: string;
}

/** The image name `deploy/daemonset.yaml` refers to, for `version`. */
export function imageName(version: string): string {
  return `ghcr.io/virtnode/virtnode:${version}`;
}

/** SHA-256 over everything added, in order. */
export class ContentHash {
  #parts: Uint8Array[] = [];
  /** Adds a part. */
  add(part: string | Uint8Array): void {
    this.#parts.push(typeof part === "string" ? new TextEncoder().encode(part) : part);
  }
  /** The first 16 hex digits of the digest. */
  async hex(): Promise<string> {
    const total = this.#parts.reduce((n, p) => n + p.length, 0);
    const all = new Uint8Array(total);
    let offset = 0;
    for (const p of this.#parts) {
      all.set(p, offset);
      offset += p.length;
    }
    const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", all));
    return [...digest.slice(0, 8)].map((b) => b.toString(16).padStart(2, "0")).join("");
  }
}

/**
 * `<cache>/<prefix>-<key>/image.tar`, built once: `build` writes `image.tar` (and anything
 * else) into a staging directory, which is then renamed into place. A failed build leaves
 * nothing behind, unless a concurrent builder's archive is there by then (which then wins).
 */
export async function cachedImage(
  cache: string,
  prefix: string,
  key: string,
  build: (staging: string) => Promise<void>,
): Promise<string> {
  const dir = join(cache, `${prefix}-${key}`);
  const archive = join(dir, "image.tar");
  const built = () => Deno.stat(archive).then(() => true, () => false);
  if (await built()) return archive;
  const staging = await Deno.makeTempDir({ dir: cache, prefix: `.${prefix}-` });
  try {
    await build(staging);
    await Deno.rename(staging, dir);
  } catch (error) {
    // The build's own error is what matters here; a staging dir left behind is reported.
    await removeIfPresent(staging, { recursive: true }).catch((error) =>
      console.warn(`cannot remove ${staging}: ${error}`)
    );
    if (!await built()) throw error;
  }
  return archive;
}

/** Runs deploy/image/base.sh (a no-op when cached) and returns its directory. */
async function baseLayer(): Promise<string> {
  const out = await new Deno.Command("bash", {
    args: [BASE_SCRIPT],
    stdin: "null",
    stdout: "piped",
    stderr: "inherit",
  }).output();
  if (!out.success) {
    throw new Error(`Cannot build the image's Debian layer: base.sh exited ${out.code}`);
  }
  return new TextDecoder().decode(out.stdout).trim().split("\n").at(-1)!;
}

async function sourceFiles(): Promise<string[]> {
  const files: string[] = [];
  const walk = async (rel: string) => {
    const info = await Deno.lstat(join(REPO_ROOT, rel));
    if (info.isFile) {
      files.push(rel);
    } else if (info.isDirectory) {
      for await (const entry of Deno.readDir(join(REPO_ROOT, rel))) {
        await walk(join(rel, entry.name));
      }
    }
  };
  for (const source of IMAGE_SOURCES) await walk(source);
  return files.sort();
}

async function run(cmd: string, args: string[], options: Deno.CommandOptions = {}) {
  const out = await new Deno.Command(cmd, {
    args,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    ...options,
  }).output();
  if (!out.success) {
    const text = new TextDecoder().decode(out.stderr).trim().split("\n").slice(-20).join("\n");
    throw new Error(`Cannot run ${cmd} ${args.join(" ")}:\n${text}`);
  }
}

/** The upper layer in `root`: the source tree, Deno and the npm packages. */
async function sourceLayer(root: string, deno: string): Promise<void> {
  const app = join(root, IMAGE_APP_DIR);
  await Deno.mkdir(join(root, "usr/local/bin"), { recursive: true });
  await Deno.copyFile(deno, join(root, "usr/local/bin/deno"));
  await Deno.chmod(join(root, "usr/local/bin/deno"), 0o755);
  for (const file of await sourceFiles()) {
    await Deno.mkdir(join(app, file, ".."), { recursive: true });
    await Deno.copyFile(join(REPO_ROOT, file), join(app, file));
  }
  // The packages land in the image's node_modules and Deno cache, as the program finds
  // them at run time (its working directory and DENO_DIR).
  await run(deno, [
    "install",
    "--frozen",
    "--quiet",
    "--entrypoint",
    "main.ts",
    "ffi/_libvirt_worker.ts",
    "ffi/mntns_child.ts",
  ], { cwd: app, env: { DENO_DIR: join(app, ".deno"), DENO_NO_UPDATE_CHECK: "1" } });
  await Deno.writeTextFile(
    join(root, "usr/local/bin/virtnode"),
    `#!/bin/sh\n# virtnode from source: what \`deno task virtnode\` runs.\n` +
      `exec /usr/local/bin/deno run -A --no-prompt --cached-only ` +
      `--v8-flags=--lite-mode ${IMAGE_APP_DIR}/main.ts "$@"\n`,
  );
  await Deno.chmod(join(root, "usr/local/bin/virtnode"), 0o755);
}

/** The upper layer in `root`: `deno compile`'s single binary. */
async function compiledLayer(root: string, deno: string): Promise<void> {
  await Deno.mkdir(join(root, "usr/local/bin"), { recursive: true });
  await run(deno, compileArgs(join(root, "usr/local/bin/virtnode")), { cwd: REPO_ROOT });
}

/**
 * Builds the virtnode image from this checkout (or finds it in the cache under
 * `$VIRTNODE_CACHE/images`): compiled where `DENORT_BIN` names Deno's runtime, from
 * source otherwise.
 */
export async function buildVirtnodeImage(): Promise<VirtnodeImage> {
  const version = JSON.parse(await Deno.readTextFile(join(REPO_ROOT, "deno.json"))).version;
  const denort = Deno.env.get("DENORT_BIN");
  const form: ImageForm = denort ? "compiled" : "source";
  const base = await baseLayer();
  const deno = await Deno.realPath(Deno.execPath());
  const hash = new ContentHash();
  hash.add(`${form}\n${base}\n${Deno.version.deno}\n`);
  for (const self of ["image.ts", "oci.ts", "../compile.ts"]) {
    hash.add(await Deno.readTextFile(new URL(self, import.meta.url)));
  }
  if (denort) hash.add(await Deno.readFile(denort));
  for (const file of await sourceFiles()) {
    hash.add(`${file}\n`);
    hash.add(await Deno.readFile(join(REPO_ROOT, file)));
  }
  const key = await hash.hex();
  const name = imageName(version);
  const archive = await cachedImage(join(base, ".."), "virtnode", key, async (staging) => {
    const root = join(staging, "root");
    if (form === "compiled") await compiledLayer(root, deno);
    else await sourceLayer(root, deno);
    const digest = await buildImageArchive({
      name,
      root: [join(base, "root"), root],
      entrypoint: ["/usr/local/bin/virtnode"],
      ...(form === "source"
        ? {
          workingDir: IMAGE_APP_DIR,
          env: [PATH, `DENO_DIR=${IMAGE_APP_DIR}/.deno`, "DENO_NO_UPDATE_CHECK=1"],
        }
        : { env: [PATH] }),
      labels: {
        "org.opencontainers.image.title": "virtnode",
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.description": form === "compiled"
          ? "virtnode, deno compile's single binary"
          : `virtnode from source: Deno ${Deno.version.deno} runs ${IMAGE_APP_DIR}/main.ts`,
        "dev.virtnode.form": form,
      },
    }, join(staging, "image.tar"));
    await Deno.writeTextFile(join(staging, "digest"), `${digest}\n`);
  });
  const digest = (await Deno.readTextFile(join(archive, "..", "digest"))).trim();
  return { name, archive, digest, form, version };
}

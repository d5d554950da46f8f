/**
 * `deno task image`: builds the virtnode image from this checkout, offline
 * (deploy/image/image.ts), and puts its OCI archive at
 * `<out>/virtnode-<version>.oci.tar` (`dist/` unless `--out` says otherwise), printing its
 * name, form, digest and how to load it. `--json` prints the same as one JSON object.
 * Needs root and debootstrap (the Debian layer), as `deploy/setup.sh` leaves the machine.
 *
 *   deno task image [--out DIR] [--json]
 *
 * @module
 */
import { parseArgs } from "node:util";
import { join } from "node:path";
import { removeIfPresent } from "../../mod/lifecycle/mod.ts";
import { buildVirtnodeImage } from "./image.ts";

const USAGE = "usage: deno task image [--out DIR] [--json]";

/** A hard link to the cached archive where it can be one, a copy otherwise. */
async function place(archive: string, target: string): Promise<void> {
  await removeIfPresent(target);
  try {
    await Deno.link(archive, target);
  } catch {
    await Deno.copyFile(archive, target); // another filesystem: its own error, if any, tells
  }
}

if (import.meta.main) {
  let values;
  try {
    ({ values } = parseArgs({
      args: Deno.args,
      options: {
        out: { type: "string", default: "dist" },
        json: { type: "boolean", default: false },
        help: { type: "boolean", short: "h", default: false },
      },
      strict: true,
    }));
  } catch (error) {
    console.error(`deno task image: ${(error as Error).message}\n${USAGE}`);
    Deno.exit(2);
  }
  if (values.help) {
    console.log(USAGE);
    Deno.exit(0);
  }
  const image = await buildVirtnodeImage();
  await Deno.mkdir(values.out, { recursive: true });
  const file = join(values.out, `virtnode-${image.version}.oci.tar`);
  await place(image.archive, file);
  const size = (await Deno.stat(file)).size;
  if (values.json) {
    console.log(JSON.stringify({ ...image, file, size }));
  } else {
    const form = image.form === "compiled"
      ? "compiled: deno compile's single binary"
      : "source: Deno runs the program's source (DENORT_BIN unset, so no compiled binary)";
    console.log(
      [
        `image   ${image.name}`,
        `form    ${form}`,
        `archive ${file} (${(size / 1e6).toFixed(0)} MB)`,
        `digest  ${image.digest}`,
        `load    ctr -n k8s.io images import ${file}`,
        `        podman load -i ${file}`,
        `        docker load -i ${file}`,
      ].join("\n"),
    );
  }
}

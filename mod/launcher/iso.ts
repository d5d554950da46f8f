/**
 * ISO 9660 images for cloud-init (NoCloud `cidata`, ConfigDrive `config-2`), written with
 * genisoimage or `xorriso -as mkisofs`, whichever is installed.
 *
 * @module
 */

import * as path from "node:path";
import { CommandError, programExists, runCommand } from "./_process.ts";
import { removeIfPresent } from "../lifecycle/mod.ts";
import { getLogger } from "../log/mod.ts";

const log = getLogger("launcher", "iso");

/** Which program writes ISO images. */
export type IsoTool = "genisoimage" | "xorriso";

/** Picks the first installed ISO tool; throws {@linkcode CommandError} when none is. */
export async function findIsoTool(): Promise<IsoTool> {
  if (await programExists("genisoimage")) return "genisoimage";
  if (await programExists("xorriso")) return "xorriso";
  throw new CommandError(
    ["genisoimage"],
    "neither genisoimage nor xorriso is installed (apt-get install genisoimage)",
  );
}

/**
 * Writes an ISO with volume label `label` holding `files` (relative path -> content) to
 * `output`, atomically: a staging directory and file beside it, then a rename.
 */
export async function writeIso(
  output: string,
  label: string,
  files: Record<string, string | Uint8Array>,
  options: { tool?: IsoTool; timeoutMs?: number } = {},
): Promise<void> {
  const tool = options.tool ?? await findIsoTool();
  const dir = path.dirname(output);
  const staging = await Deno.makeTempDir({ dir, prefix: ".iso-staging-" });
  const partial = `${output}.partial`;
  try {
    for (const [name, content] of Object.entries(files)) {
      const file = path.join(staging, name);
      await Deno.mkdir(path.dirname(file), { recursive: true });
      if (typeof content === "string") await Deno.writeTextFile(file, content);
      else await Deno.writeFile(file, content);
    }
    const mkisofsArgs = ["-output", partial, "-volid", label, "-joliet", "-rock", staging];
    const command = tool === "genisoimage"
      ? ["genisoimage", "-quiet", ...mkisofsArgs]
      : ["xorriso", "-as", "mkisofs", "-quiet", ...mkisofsArgs];
    await runCommand(command, { timeoutMs: options.timeoutMs ?? 10_000 });
    await Deno.rename(partial, output);
  } finally {
    // In a finally, where a throw would hide the build's own error: only logged.
    for (const leftover of [staging, partial]) {
      await removeIfPresent(leftover, { recursive: true }).catch((error) =>
        log.warn("Cannot remove {path}: {error}", { path: leftover, error })
      );
    }
  }
}

/**
 * `deno task proto`: compiles `mod/proto/*.proto` into `mod/proto/descriptors.json`, the
 * descriptors every virtnode process loads instead of parsing the `.proto` files at start
 * (protobufjs's parser runs in V8's interpreter under lite mode). With `--check` it only
 * compares and exits 1 when the JSON is not what the `.proto` files give
 * (`tests/unit/proto_descriptors_test.ts` runs that check).
 *
 * @module
 */

import { fileURLToPath } from "node:url";
// proto-loader's own parsing step, the one `loadSync` runs: the same options, the same Root.
import { loadProtosWithOptionsSync } from "@grpc/proto-loader/build/src/util.js";

const DIR = fileURLToPath(new URL("../mod/proto/", import.meta.url));
/** The output file. */
export const DESCRIPTORS = `${DIR}descriptors.json`;

/** The `.proto` files compiled, by name. */
export const PROTO_FILES = [
  "cmd.proto",
  "cmd_info.proto",
  "notify.proto",
  "notify_info.proto",
  "deviceplugin_v1beta1.proto",
];

/** The descriptors the `.proto` files give, as written to {@linkcode DESCRIPTORS}. */
export function compileDescriptors(): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const file of PROTO_FILES) {
    const root = loadProtosWithOptionsSync(`${DIR}${file}`, { keepCase: true });
    out[file] = root.toJSON({ keepComments: false });
  }
  return out;
}

/** Whether {@linkcode DESCRIPTORS} holds what the `.proto` files give (formatting aside). */
export async function descriptorsCurrent(): Promise<boolean> {
  const current = await Deno.readTextFile(DESCRIPTORS).catch(() => "null");
  return JSON.stringify(JSON.parse(current)) === JSON.stringify(compileDescriptors());
}

if (import.meta.main) {
  if (Deno.args.includes("--check")) {
    if (!await descriptorsCurrent()) {
      console.error(`${DESCRIPTORS} is out of date: run 'deno task proto'`);
      Deno.exit(1);
    }
  } else {
    await Deno.writeTextFile(DESCRIPTORS, `${JSON.stringify(compileDescriptors(), null, 2)}\n`);
    await new Deno.Command(Deno.execPath(), { args: ["fmt", "-q", DESCRIPTORS] }).output();
    console.log(`wrote ${DESCRIPTORS}`);
  }
}

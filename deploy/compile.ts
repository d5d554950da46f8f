/**
 * `deno task compile`: virtnode as one file, `dist/virtnode` (or the path given), made by
 * `deno compile` with the protos and the FFI workers embedded. `deno compile` needs Deno's
 * runtime `denort`, which it downloads from Deno's server unless `DENORT_BIN` names one; a
 * machine that can do neither gets one line saying so, naming `DENORT_BIN`, and exit 1.
 *
 *   deno task compile [output]
 *
 * @module
 */

/** The files the binary loads at run time besides main.ts's imports. */
const INCLUDES = [
  "mod/proto",
  "ffi/_libvirt_worker.ts",
  "ffi/mntns_child.ts",
  "ffi/_netns_worker.ts",
  "mod/storage/_host_disks_worker.ts",
];

/** `deno` arguments that compile virtnode into `output` (from the repository's root). */
export function compileArgs(output: string): string[] {
  return [
    "compile",
    "-A",
    "--v8-flags=--lite-mode",
    ...INCLUDES.flatMap((file) => ["--include", file]),
    "--output",
    output,
    "main.ts",
  ];
}

if (import.meta.main) {
  const output = Deno.args[0] ?? "dist/virtnode";
  const root = new URL("../", import.meta.url).pathname;
  const denort = Deno.env.get("DENORT_BIN");
  const out = await new Deno.Command(Deno.execPath(), {
    args: compileArgs(output),
    cwd: root,
    stdin: "null",
    stdout: "inherit",
    stderr: denort ? "inherit" : "piped",
  }).output();
  if (!out.success) {
    const said = new TextDecoder().decode(out.stderr);
    if (!denort && !said.includes("denort")) {
      console.error(said.trim()); // not the runtime's download: deno's own words
    } else if (!denort) {
      console.error(
        `deno task compile: deno compile needs Deno's runtime denort ${Deno.version.deno}, ` +
          "which it could not download here: set DENORT_BIN to a denort of that version " +
          `(x86_64-unknown-linux-gnu); the image and the tests run virtnode from source`,
      );
    }
    Deno.exit(1);
  }
  console.log(`deno task compile: ${output}`);
}

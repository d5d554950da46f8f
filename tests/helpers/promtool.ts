/**
 * `promtool check metrics` (Debian's prometheus package, unpacked by `tests/harness/promtool.sh`)
 * on a scrape's text, and `promtool test rules`.
 *
 * @module
 */
import { runText } from "./command.ts";

let promtool: Promise<string> | undefined;

/** The promtool binary, unpacked once per process. */
function promtoolPath(): Promise<string> {
  promtool ??= runText("bash", new URL("../harness/promtool.sh", import.meta.url).pathname)
    .then((out) => out.trim().split("\n").at(-1)!);
  return promtool;
}

/**
 * Runs `promtool test rules` on `testFile` (which names its rule files relative to itself):
 * whether every test passed, and what promtool said.
 */
export async function promtoolTestRules(
  testFile: string,
): Promise<{ ok: boolean; output: string }> {
  const out = await new Deno.Command(await promtoolPath(), {
    args: ["test", "rules", testFile],
    stdout: "piped",
    stderr: "piped",
  }).output();
  return {
    ok: out.success,
    output: new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr),
  };
}

/** Runs `promtool check metrics` on `text`: whether it passed, and what it said. */
export async function promtoolCheck(text: string): Promise<{ ok: boolean; complaints: string }> {
  const check = new Deno.Command(await promtoolPath(), {
    args: ["check", "metrics"],
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const writer = check.stdin.getWriter();
  await writer.write(new TextEncoder().encode(text));
  await writer.close();
  const out = await check.output();
  return {
    ok: out.success,
    complaints: new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr),
  };
}

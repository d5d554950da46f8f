/**
 * `promtool check metrics` (Debian's prometheus package, unpacked by `tests/harness/promtool.sh`)
 * on a scrape's text.
 *
 * @module
 */
import { runText } from "./command.ts";

let promtool: Promise<string> | undefined;

/** Runs `promtool check metrics` on `text`: whether it passed, and what it said. */
export async function promtoolCheck(text: string): Promise<{ ok: boolean; complaints: string }> {
  promtool ??= runText("bash", new URL("../harness/promtool.sh", import.meta.url).pathname)
    .then((out) => out.trim().split("\n").at(-1)!);
  const check = new Deno.Command(await promtool, {
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

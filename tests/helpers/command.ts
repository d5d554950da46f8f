/** Running a program from a test and reading what it printed. */

/**
 * Runs `command` (program, then arguments) and returns its standard output; throws naming
 * the command line and what it wrote to standard error when it fails.
 */
export async function runText(...command: string[]): Promise<string> {
  const out = await new Deno.Command(command[0], {
    args: command.slice(1),
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) {
    throw new Error(`${command.join(" ")}: ${new TextDecoder().decode(out.stderr)}`);
  }
  return new TextDecoder().decode(out.stdout);
}

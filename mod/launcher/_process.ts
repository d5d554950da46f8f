/**
 * Running the helper programs the converter needs (qemu-img, genisoimage/xorriso), each
 * with a timeout.
 *
 * @module
 */

/** Thrown when a helper program fails, cannot start, or times out. */
export class CommandError extends Error {
  /** The program and its arguments. */
  readonly command: string[];
  /** Creates the error with the command and what went wrong. */
  constructor(command: string[], detail: string, options?: ErrorOptions) {
    super(`Cannot run "${command.join(" ")}": ${detail}`, options);
    this.name = "CommandError";
    this.command = command;
  }
}

/** Runs a program, returns its stdout; throws {@linkcode CommandError} on failure. */
export async function runCommand(
  command: string[],
  options: { timeoutMs?: number } = {},
): Promise<string> {
  const [program, ...args] = command;
  let output: Deno.CommandOutput;
  try {
    output = await new Deno.Command(program, {
      args,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
      signal: AbortSignal.timeout(options.timeoutMs ?? 30_000),
    }).output();
  } catch (error) {
    const detail = error instanceof Deno.errors.NotFound
      ? "program not found"
      : error instanceof DOMException && error.name === "TimeoutError"
      ? "timed out"
      : String(error);
    throw new CommandError(command, detail, { cause: error });
  }
  if (!output.success) {
    const stderr = new TextDecoder().decode(output.stderr).trim();
    const how = output.signal ? `killed by ${output.signal} (timed out?)` : `exit ${output.code}`;
    throw new CommandError(command, `${how}${stderr ? `: ${stderr}` : ""}`);
  }
  return new TextDecoder().decode(output.stdout);
}

/** Whether a program can be found on PATH (or at an absolute path). */
export async function programExists(program: string): Promise<boolean> {
  if (program.includes("/")) {
    try {
      return (await Deno.stat(program)).isFile;
    } catch {
      return false;
    }
  }
  for (const dir of (Deno.env.get("PATH") ?? "/usr/bin:/bin").split(":")) {
    try {
      if ((await Deno.stat(`${dir}/${program}`)).isFile) return true;
    } catch {
      // not in this directory
    }
  }
  return false;
}

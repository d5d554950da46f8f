/**
 * The size-bounded log file every log virtnode writes goes through (issue 34, H4): fed far
 * more than its bound it stays within it, keeps the newest lines, and a second descriptor
 * appending to the same file (a launcher's standard error) keeps landing in the live file
 * after each rotation.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { rotateLogFileIfFull, RotatingFile } from "../../mod/log/mod.ts";

function sizeOr0(path: string): number {
  try {
    return Deno.statSync(path).size;
  } catch {
    return 0;
  }
}

Deno.test("RotatingFile fed 40 times its bound keeps each file within it and the newest lines, in order", () => {
  const dir = Deno.makeTempDirSync({ prefix: "vn-rotating-" });
  try {
    const path = join(dir, "host.log");
    const maxBytes = 64 * 1024;
    const file = new RotatingFile(path, { maxBytes, keep: 2 });
    let n = 0;
    let written = 0;
    while (written < 40 * maxBytes) {
      const line = `line ${++n} ${"x".repeat(n % 300)}\n`;
      file.write(line);
      written += line.length;
      assert.ok(sizeOr0(path) <= maxBytes, `after line ${n}: ${sizeOr0(path)} bytes`);
    }
    file.close();
    for (const copy of [`${path}.1`, `${path}.2`]) {
      assert.ok(sizeOr0(copy) > 0 && sizeOr0(copy) <= maxBytes, `${copy}: ${sizeOr0(copy)} bytes`);
    }
    assert.equal(sizeOr0(`${path}.3`), 0, "two copies kept, no more");
    const kept = [`${path}.2`, `${path}.1`, path]
      .map((f) => Deno.readTextFileSync(f))
      .join("")
      .trimEnd()
      .split("\n")
      .map((line) => Number(line.split(" ")[1]));
    assert.equal(kept.at(-1), n, "the newest line is kept");
    assert.deepEqual(kept, kept.map((_, i) => n - kept.length + 1 + i), "no line lost between");
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("RotatingFile cuts a record longer than its bound to the bound", () => {
  const dir = Deno.makeTempDirSync({ prefix: "vn-rotating-" });
  try {
    const path = join(dir, "host.log");
    const file = new RotatingFile(path, { maxBytes: 1024, keep: 1 });
    file.write("first\n");
    file.write("y".repeat(5000));
    file.close();
    assert.equal(sizeOr0(path), 1024);
    assert.equal(Deno.readTextFileSync(`${path}.1`), "first\n");
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("a process appending to the same log file keeps writing to the live file across rotations", () => {
  const dir = Deno.makeTempDirSync({ prefix: "vn-rotating-" });
  try {
    const path = join(dir, "host.log");
    // Standard error as the shell opens it for a launcher: `>>` before the writer exists.
    const stderr = Deno.openSync(path, { append: true, create: true });
    const file = new RotatingFile(path, { maxBytes: 4096, keep: 2 });
    for (let i = 0; i < 200; i++) file.write(`${"z".repeat(99)}\n`);
    stderr.writeSync(new TextEncoder().encode("panic: the last words\n"));
    stderr.close();
    assert.match(Deno.readTextFileSync(path), /panic: the last words\n$/);
    // The writer counts what others appended: the next rotation keeps the file in bound.
    for (let i = 0; i < 100; i++) file.write(`${"z".repeat(99)}\n`);
    file.close();
    assert.ok(sizeOr0(path) <= 4096, `${sizeOr0(path)} bytes`);
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("rotateLogFileIfFull() rotates a file that reached its bound and leaves a smaller one", () => {
  const dir = Deno.makeTempDirSync({ prefix: "vn-rotating-" });
  try {
    const path = join(dir, "launcher.log");
    Deno.writeTextFileSync(path, "a".repeat(100));
    assert.equal(rotateLogFileIfFull(path, { maxBytes: 200 }), false);
    assert.equal(sizeOr0(path), 100);
    Deno.writeTextFileSync(path, "b".repeat(200), { append: true });
    assert.equal(rotateLogFileIfFull(path, { maxBytes: 200 }), true);
    assert.equal(sizeOr0(path), 0);
    assert.equal(sizeOr0(`${path}.1`), 300);
    assert.equal(rotateLogFileIfFull(join(dir, "absent.log")), false, "no file, nothing to do");
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

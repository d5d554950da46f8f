import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { formatViolation, lintDeps, parseImports, type Rule } from "../lint_deps.ts";

const FIXTURES = new URL("../fixtures/lint_deps/", import.meta.url);
const LINTER = fileURLToPath(new URL("../lint_deps.ts", import.meta.url));

function tree(name: string): string {
  return fileURLToPath(new URL(name, FIXTURES));
}

async function lintTree(name: string): Promise<{ rules: Rule[]; lines: string[] }> {
  const result = await lintDeps(tree(name));
  return {
    rules: result.violations.map((v) => v.rule),
    lines: result.violations.map(formatViolation),
  };
}

Deno.test("lint:deps passes a tree that keeps every rule", async () => {
  const result = await lintDeps(tree("clean"));
  assert.deepEqual(result.violations.map(formatViolation), []);
  assert.equal(result.files, 16);
  assert.equal(result.imports, 18);
});

Deno.test("lint:deps fails on ffi/ importing mod/ (layering)", async () => {
  const { rules, lines } = await lintTree("layering");
  assert.deepEqual(rules, ["layering"]);
  assert.equal(
    lines[0],
    'ffi/libc.ts:1: import "../mod/a/mod.ts": layering: ffi/ imports only ffi/',
  );
});

Deno.test("lint:deps fails on an import cycle and names its files", async () => {
  const { rules, lines } = await lintTree("cycle");
  assert.deepEqual(rules, ["cycle"]);
  assert.match(lines[0], /^mod\/a\/a\.ts:1: import "\.\/b\.ts": cycle: /);
  assert.match(lines[0], /mod\/a\/a\.ts -> mod\/a\/b\.ts -> mod\/a\/a\.ts$/);
});

Deno.test("lint:deps fails on a reach into another folder's files past its mod.ts", async () => {
  const { rules, lines } = await lintTree("private");
  assert.deepEqual(rules, ["private"]);
  assert.equal(
    lines[0],
    'mod/b/b.ts:1: import "../a/a.ts": private: from outside mod/a/ import only mod/a/mod.ts',
  );
});

Deno.test("lint:deps fails on a mod.ts that hands on an underscore file", async () => {
  const { rules, lines } = await lintTree("reexport");
  assert.deepEqual(rules, ["private"]);
  assert.match(
    lines[0],
    /^mod\/c\/mod\.ts:1: import "\.\/_hidden\.ts": private: a mod\.ts does not/,
  );
});

Deno.test("lint:deps fails on the handler's two modes importing each other", async () => {
  const { rules, lines } = await lintTree("apart");
  assert.deepEqual(rules, ["apart"]);
  assert.match(
    lines[0],
    /^mod\/handler\/pods\/p\.ts:1: .*pods\/ and mod\/handler\/podless\/ are two modes/,
  );
});

Deno.test("lint:deps keeps testing.ts for tests and tests to the faces", async () => {
  const { rules, lines } = await lintTree("testing");
  assert.deepEqual(rules, ["private", "private"]);
  assert.match(lines[0], /^mod\/b\/b\.ts:1: .*mod\/a\/testing\.ts is for tests/);
  assert.match(
    lines[1],
    /^tests\/a_check\.ts:2: .*from tests import only mod\/a\/mod\.ts or mod\/a\/testing\.ts/,
  );
});

Deno.test("lint:deps fails on code in a folder's mod.ts", async () => {
  const { rules, lines } = await lintTree("face");
  assert.deepEqual(rules, ["face"]);
  assert.match(lines[0], /^mod\/a\/mod\.ts:4: face: holds code/);
});

Deno.test("lint:deps fails on deploy/ importing tests/", async () => {
  const { rules, lines } = await lintTree("deploy");
  assert.deepEqual(rules, ["layering"]);
  assert.match(lines[0], /^deploy\/local\.ts:1: .*deploy\/ imports nothing from tests\//);
});

Deno.test("lint:deps as a command prints each violation and a summary, and exits 1", async () => {
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", LINTER, tree("cycle")],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const lines = new TextDecoder().decode(output.stdout).trim().split("\n");
  assert.equal(output.code, 1);
  assert.equal(lines.length, 2);
  assert.match(lines[0], /cycle: /);
  assert.equal(lines[1], "lint:deps: 3 files, 3 imports, 1 violations");
});

Deno.test("parseImports() finds static, type-only, re-export and literal dynamic imports only", () => {
  const source = [
    '/** `import { x } from "./in_comment.ts"` */',
    'import { a } from "./a.ts";',
    'import type { B } from "./b.ts";',
    'import "./side_effect.ts";',
    'export { c } from "./c.ts";',
    'export * from "./d.ts";',
    'const re = /"[^"]*"/g;',
    'const s = "import(\\"./in_string.ts\\")";',
    'const t = `${await import("./in_template.ts")}`;',
    'const u = await import(\n  "./dynamic.ts"\n);',
    "const v = await import(name);",
    'new URL("./worker.ts", import.meta.url);',
  ].join("\n");
  assert.deepEqual(parseImports(source), [
    { specifier: "./a.ts", line: 2, kind: "static" },
    { specifier: "./b.ts", line: 3, kind: "static" },
    { specifier: "./side_effect.ts", line: 4, kind: "static" },
    { specifier: "./c.ts", line: 5, kind: "static" },
    { specifier: "./d.ts", line: 6, kind: "static" },
    { specifier: "./in_template.ts", line: 9, kind: "dynamic" },
    { specifier: "./dynamic.ts", line: 11, kind: "dynamic" },
  ]);
});

/**
 * `deno task lint:deps`: checks the import graph of virtnode's own files against the
 * rules that keep its modules apart.
 *
 * - layering: `main.ts -> mod/* -> ffi/`. `ffi/` imports only `ffi/`; `mod/` imports only
 *   `mod/` and `ffi/`; `mod/api` and `mod/domain` import nothing of ours outside themselves
 *   but each other; only `tests/` imports `main.ts`; `deploy/` imports nothing of `tests/`.
 * - cycle: no cycle among static imports (type-only imports and re-exports included,
 *   dynamic `import()` left out, as it does not run at load time).
 * - private: from outside a folder (`mod/<name>`, a nested folder with a `mod.ts` of its
 *   own, or `ffi`), `main.ts`, `mod/`, `ffi/` and `deploy/` import only its `mod.ts`;
 *   tests import its `mod.ts` or its `testing.ts`, the face that re-exports what only
 *   tests reach. A `testing.ts` is imported only by tests and by other `testing.ts` faces.
 *   An underscore file is imported only from its own directory and the ones below it,
 *   and no `mod.ts` hands it on.
 * - face: a folder's `mod.ts` and `testing.ts` hold comments and re-exports
 *   (`export ... from`), no code.
 * - apart: folders that hold the two modes of one part (the handler's `pods/` and
 *   `podless/`) import nothing from each other.
 *
 * Usage: `deno run -A tests/lint_deps.ts [root]` (root defaults to the repository). Prints
 * one line per violation and a summary, and exits 1 when there is any violation.
 *
 * @module
 */

import { dirname, isAbsolute, join, relative, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";

/** The rule a violation breaks. */
export type Rule = "layering" | "cycle" | "private" | "face" | "apart";

/** One relative import found in a file. */
export interface ImportRef {
  /** The specifier as written, e.g. `../api/mod.ts`. */
  specifier: string;
  /** 1-based line of the specifier. */
  line: number;
  /** `static` for `import`/`export ... from`, `dynamic` for `import("...")`. */
  kind: "static" | "dynamic";
}

/** One broken rule. */
export interface Violation {
  /** The importing file, relative to the root, `/`-separated. */
  file: string;
  /** 1-based line in `file`. */
  line: number;
  /** The import's specifier; empty for a face that holds code. */
  specifier: string;
  /** The rule broken. */
  rule: Rule;
  /** What is wrong, in words. */
  message: string;
}

/** What {@linkcode lintDeps} found. */
export interface LintResult {
  /** Files read. */
  files: number;
  /** Relative imports found in them. */
  imports: number;
  /** Broken rules, in file order (cycles last). */
  violations: Violation[];
}

/** The top-level entries whose `.ts` files are read. */
const SOURCES = ["main.ts", "mod", "ffi", "deploy", "tests"];
/** Directory names never read. */
const SKIPPED_DIRS = new Set(["node_modules", "dist"]);
/** Pairs of folders that import nothing from each other: a part's two modes. */
const APART: readonly (readonly [string, string])[] = [["mod/handler/pods", "mod/handler/podless"]];
/** This linter's own fixture trees, which break the rules on purpose. */
const FIXTURES_DIR = "tests/fixtures/lint_deps";

// ---- a small lexer: enough of TypeScript to find import specifiers ----

type Token =
  | { type: "word"; value: string; line: number }
  | { type: "string"; value: string; line: number }
  | { type: "template"; line: number }
  | { type: "punct"; value: string; line: number };

const WORD = /[A-Za-z0-9_$\u0080-\uffff]/;
/** Keywords after which a `/` starts a regular expression rather than a division. */
const REGEX_AFTER_WORDS = new Set([
  "return",
  "typeof",
  "instanceof",
  "in",
  "of",
  "new",
  "delete",
  "void",
  "throw",
  "case",
  "do",
  "else",
  "yield",
  "await",
]);

/**
 * Splits `source` into words, string literals and punctuation; comments and the insides of
 * template literals and regular expressions are skipped (a `${...}` inside a template is
 * lexed, so an `import()` there is still seen).
 */
export function tokenize(source: string): Token[] {
  const tokens: Token[] = [];
  /** Brace depth at which each open template's `${` started. */
  const templates: number[] = [];
  let braces = 0;
  let line = 1;
  let i = 0;
  const n = source.length;

  const regexAllowed = (): boolean => {
    const prev = tokens[tokens.length - 1];
    if (!prev) return true;
    if (prev.type === "word") return REGEX_AFTER_WORDS.has(prev.value);
    if (prev.type === "punct") {
      return !(prev.value === ")" || prev.value === "]" || prev.value === "regex");
    }
    return false; // after a string or template, `/` divides
  };

  /** Skips template text from `i` to its end or to a `${`; returns true at `${`. */
  const skipTemplateText = (): boolean => {
    while (i < n) {
      const c = source[i];
      if (c === "\\") {
        if (source[i + 1] === "\n") line++;
        i += 2;
      } else if (c === "`") {
        i++;
        return false;
      } else if (c === "$" && source[i + 1] === "{") {
        i += 2;
        return true;
      } else {
        if (c === "\n") line++;
        i++;
      }
    }
    return false;
  };

  while (i < n) {
    const c = source[i];
    if (c === "\n") {
      line++;
      i++;
    } else if (c === " " || c === "\t" || c === "\r") {
      i++;
    } else if (c === "/" && source[i + 1] === "/") {
      while (i < n && source[i] !== "\n") i++;
    } else if (c === "/" && source[i + 1] === "*") {
      const end = source.indexOf("*/", i + 2);
      const stop = end === -1 ? n : end + 2;
      for (let j = i; j < stop; j++) if (source[j] === "\n") line++;
      i = stop;
    } else if (c === '"' || c === "'") {
      const start = line;
      let value = "";
      i++;
      while (i < n && source[i] !== c && source[i] !== "\n") {
        if (source[i] === "\\") {
          value += source[i + 1] ?? "";
          i += 2;
        } else {
          value += source[i++];
        }
      }
      i++;
      tokens.push({ type: "string", value, line: start });
    } else if (c === "`") {
      const start = line;
      i++;
      if (skipTemplateText()) templates.push(braces);
      tokens.push({ type: "template", line: start });
    } else if (c === "/" && regexAllowed()) {
      let inClass = false;
      i++;
      while (i < n && source[i] !== "\n") {
        const r = source[i];
        if (r === "\\") {
          i += 2;
          continue;
        }
        i++;
        if (r === "[") inClass = true;
        else if (r === "]") inClass = false;
        else if (r === "/" && !inClass) break;
      }
      while (i < n && WORD.test(source[i])) i++; // flags
      tokens.push({ type: "punct", value: "regex", line });
    } else if (WORD.test(c)) {
      const start = i;
      while (i < n && WORD.test(source[i])) i++;
      tokens.push({ type: "word", value: source.slice(start, i), line });
    } else {
      if (c === "{") braces++;
      if (c === "}") {
        if (templates.length > 0 && templates[templates.length - 1] === braces) {
          templates.pop();
          i++;
          if (skipTemplateText()) templates.push(braces);
          continue;
        }
        braces--;
      }
      tokens.push({ type: "punct", value: c, line });
      i++;
    }
  }
  return tokens;
}

function isWord(token: Token | undefined, value: string): boolean {
  return token?.type === "word" && token.value === value;
}

function isPunct(token: Token | undefined, value: string): boolean {
  return token?.type === "punct" && token.value === value;
}

/** True when `index` starts a statement (nothing before it, or `;`, `{`, `}` before it). */
function startsStatement(tokens: Token[], index: number): boolean {
  const prev = tokens[index - 1];
  return prev === undefined ||
    (prev.type === "punct" && (prev.value === ";" || prev.value === "{" || prev.value === "}"));
}

/** The index of the `from` string of an `import`/`export` statement starting at `index`. */
function fromSpecifier(tokens: Token[], index: number): number | undefined {
  let depth = 0;
  for (let j = index + 1; j < tokens.length; j++) {
    const t = tokens[j];
    if (t.type === "punct") {
      if (t.value === "{") depth++;
      else if (t.value === "}") depth--;
      else if (t.value === ";" && depth === 0) return undefined;
      else if (t.value === "(" || t.value === "=") return undefined;
    }
    if (depth === 0 && isWord(t, "from") && tokens[j + 1]?.type === "string") return j + 1;
    if (depth === 0 && j > index + 1 && t.type === "word" && startsStatement(tokens, j)) {
      return undefined;
    }
  }
  return undefined;
}

/** Every import specifier of `source`: static, type-only, re-exports and literal `import()`. */
export function parseImports(source: string): ImportRef[] {
  const tokens = tokenize(source);
  const out: ImportRef[] = [];
  for (let i = 0; i < tokens.length; i++) {
    const t = tokens[i];
    if (isWord(t, "import")) {
      const next = tokens[i + 1];
      if (isPunct(next, "(")) {
        const arg = tokens[i + 2];
        const after = tokens[i + 3];
        if (arg?.type === "string" && (isPunct(after, ")") || isPunct(after, ","))) {
          out.push({ specifier: arg.value, line: arg.line, kind: "dynamic" });
        }
      } else if (next?.type === "string" && startsStatement(tokens, i)) {
        out.push({ specifier: next.value, line: next.line, kind: "static" });
      } else if (!isPunct(next, ".") && startsStatement(tokens, i)) {
        const s = fromSpecifier(tokens, i);
        if (s !== undefined) {
          const spec = tokens[s] as { value: string; line: number };
          out.push({ specifier: spec.value, line: spec.line, kind: "static" });
        }
      }
    } else if (isWord(t, "export") && startsStatement(tokens, i)) {
      const s = fromSpecifier(tokens, i);
      if (s !== undefined) {
        const spec = tokens[s] as { value: string; line: number };
        out.push({ specifier: spec.value, line: spec.line, kind: "static" });
      }
    }
  }
  return out;
}

/**
 * The lines of a `mod.ts` that are neither comments nor re-exports (`export * from`,
 * `export * as name from`, `export { ... } from`, `export type { ... } from`), as the
 * 1-based line each offending statement starts on.
 */
export function faceCodeLines(source: string): number[] {
  const tokens = tokenize(source);
  const lines: number[] = [];
  let i = 0;
  while (i < tokens.length) {
    const start = tokens[i];
    const end = reExportEnd(tokens, i);
    if (end !== undefined) {
      i = end;
      continue;
    }
    lines.push(start.line);
    // Skip to the end of this statement: the next `;` at depth 0, or a new line's statement.
    let depth = 0;
    i++;
    while (i < tokens.length) {
      const t = tokens[i];
      if (t.type === "punct" && "{([".includes(t.value)) depth++;
      if (t.type === "punct" && "})]".includes(t.value)) depth--;
      if (depth <= 0 && isPunct(t, ";")) {
        i++;
        break;
      }
      if (depth <= 0 && t.line !== tokens[i - 1].line && isWord(t, "export")) break;
      i++;
    }
  }
  return lines;
}

/** The index after a re-export statement starting at `i`, or undefined if it is not one. */
function reExportEnd(tokens: Token[], i: number): number | undefined {
  if (!isWord(tokens[i], "export")) return undefined;
  let j = i + 1;
  if (isWord(tokens[j], "type")) j++;
  if (isPunct(tokens[j], "*")) {
    j++;
    if (isWord(tokens[j], "as")) j += 2;
  } else if (isPunct(tokens[j], "{")) {
    while (j < tokens.length && !isPunct(tokens[j], "}")) j++;
    j++;
  } else {
    return undefined;
  }
  if (!isWord(tokens[j], "from") || tokens[j + 1]?.type !== "string") return undefined;
  j += 2;
  if (isWord(tokens[j], "with")) {
    while (j < tokens.length && !isPunct(tokens[j], "}")) j++;
    j++;
  }
  if (isPunct(tokens[j], ";")) j++;
  return j;
}

// ---- the rules ----

interface SourceFile {
  /** Relative to the root, `/`-separated. */
  path: string;
  imports: ImportRef[];
  text: string;
}

interface Edge {
  from: string;
  to: string;
  ref: ImportRef;
}

function toPosix(path: string): string {
  return sep === "/" ? path : path.split(sep).join("/");
}

async function collectFiles(root: string): Promise<string[]> {
  const out: string[] = [];
  async function walk(rel: string): Promise<void> {
    if (rel === FIXTURES_DIR) return;
    for await (const entry of Deno.readDir(join(root, rel))) {
      const child = rel === "" ? entry.name : `${rel}/${entry.name}`;
      if (entry.isDirectory && !SKIPPED_DIRS.has(entry.name)) await walk(child);
      else if (entry.isFile && entry.name.endsWith(".ts")) out.push(child);
    }
  }
  for (const source of SOURCES) {
    let info: Deno.FileInfo;
    try {
      info = await Deno.stat(join(root, source));
    } catch (error) {
      if (error instanceof Deno.errors.NotFound) continue;
      throw error;
    }
    if (info.isDirectory) await walk(source);
    else if (source.endsWith(".ts")) out.push(source);
  }
  return out.sort();
}

/** The top-level area of a file: `main`, `mod`, `ffi`, `deploy` or `tests`. */
function areaOf(path: string): string {
  return path === "main.ts" ? "main" : path.split("/")[0];
}

/** The top-level module folder a file belongs to (`mod/<name>` or `ffi`), if any. */
function topFolderOf(path: string): string | undefined {
  const parts = path.split("/");
  if (parts[0] === "ffi" && parts.length > 1) return "ffi";
  if (parts[0] === "mod" && parts.length > 2) return `mod/${parts[1]}`;
  return undefined;
}

/**
 * The module folder a file belongs to: the deepest directory under `mod/<name>` or `ffi`
 * that has a `mod.ts` of its own (a nested folder such as `mod/launcher/args`), else the
 * top-level folder.
 */
function folderOf(path: string, faceDirs: ReadonlySet<string>): string | undefined {
  const top = topFolderOf(path);
  if (top === undefined) return undefined;
  for (let dir = dirOf(path); dir.length > top.length; dir = dirOf(dir)) {
    if (faceDirs.has(dir)) return dir;
  }
  return top;
}

/** True for a folder's face: a `mod.ts` anywhere under `mod/<name>` or `ffi`. */
function isFace(path: string): boolean {
  return baseName(path) === "mod.ts" && topFolderOf(path) !== undefined;
}

/** True for a folder's face for tests: a `testing.ts` under `mod/<name>` or `ffi`. */
function isTestingFace(path: string): boolean {
  return baseName(path) === "testing.ts" && topFolderOf(path) !== undefined;
}

function baseName(path: string): string {
  return path.slice(path.lastIndexOf("/") + 1);
}

function dirOf(path: string): string {
  const slash = path.lastIndexOf("/");
  return slash === -1 ? "" : path.slice(0, slash);
}

/** The layering rule `edge` breaks, in words, or undefined. */
function layeringProblem(from: string, to: string): string | undefined {
  const src = areaOf(from);
  const dst = areaOf(to);
  if (dst === "main" && src !== "tests") return "only tests/ imports main.ts";
  if (src === "ffi" && dst !== "ffi") return "ffi/ imports only ffi/";
  if (src === "mod") {
    if (dst !== "mod" && dst !== "ffi") return "mod/ imports only mod/ and ffi/";
    const self = topFolderOf(from);
    const other = topFolderOf(to);
    const base = new Set(["mod/api", "mod/domain"]);
    if (self !== undefined && base.has(self) && other !== self && !base.has(other ?? "")) {
      return "mod/api and mod/domain import only themselves and each other";
    }
  }
  if (src === "main" && dst !== "mod" && dst !== "ffi") return "main.ts imports only mod/ and ffi/";
  if (src === "deploy" && dst === "tests") return "deploy/ imports nothing from tests/";
  return undefined;
}

/** The private-file rule `edge` breaks, in words, or undefined. */
function privateProblem(
  from: string,
  to: string,
  faceDirs: ReadonlySet<string>,
): string | undefined {
  const home = dirOf(to);
  if (baseName(to).startsWith("_") && dirOf(from) !== home && !from.startsWith(`${home}/`)) {
    return `an underscore file is private to ${home || "the root"}/`;
  }
  if (baseName(to).startsWith("_") && isFace(from)) {
    return "a mod.ts does not hand on an underscore file: drop the underscore, or keep the name inside";
  }
  const tests = areaOf(from) === "tests";
  if (isTestingFace(to) && !tests && !isTestingFace(from)) {
    return `${to} is for tests: only tests/ and testing.ts faces import it`;
  }
  const folder = folderOf(to, faceDirs);
  if (folder === undefined) return undefined;
  // Inside a folder (its nested folders included) a file imports what it likes.
  if (from.startsWith(`${folder}/`)) return undefined;
  if (to === `${folder}/mod.ts` || isTestingFace(to)) return undefined;
  return tests
    ? `from tests import only ${folder}/mod.ts or ${folder}/testing.ts`
    : `from outside ${folder}/ import only ${folder}/mod.ts`;
}

/** The apart rule `edge` breaks, in words, or undefined. */
function apartProblem(from: string, to: string): string | undefined {
  for (const [a, b] of APART) {
    for (const [self, other] of [[a, b], [b, a]]) {
      if (from.startsWith(`${self}/`) && to.startsWith(`${other}/`)) {
        return `${self}/ and ${other}/ are two modes of one part: neither imports the other`;
      }
    }
  }
  return undefined;
}

/** One cycle through each strongly connected component of more than one file (or a self-import). */
function findCycles(files: string[], edges: Edge[]): Edge[][] {
  const out = new Map<string, Edge[]>();
  for (const edge of edges) {
    const list = out.get(edge.from) ?? [];
    list.push(edge);
    out.set(edge.from, list);
  }
  // Tarjan's algorithm, iterative so deep graphs cannot overflow the stack.
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const onStack = new Set<string>();
  const stack: string[] = [];
  const components: string[][] = [];
  let counter = 0;
  for (const start of files) {
    if (index.has(start)) continue;
    const work: { node: string; next: number }[] = [{ node: start, next: 0 }];
    index.set(start, counter);
    low.set(start, counter++);
    stack.push(start);
    onStack.add(start);
    while (work.length > 0) {
      const frame = work[work.length - 1];
      const successors = out.get(frame.node) ?? [];
      if (frame.next < successors.length) {
        const to = successors[frame.next++].to;
        if (!index.has(to)) {
          index.set(to, counter);
          low.set(to, counter++);
          stack.push(to);
          onStack.add(to);
          work.push({ node: to, next: 0 });
        } else if (onStack.has(to)) {
          low.set(frame.node, Math.min(low.get(frame.node)!, index.get(to)!));
        }
        continue;
      }
      work.pop();
      const parent = work[work.length - 1];
      if (parent) low.set(parent.node, Math.min(low.get(parent.node)!, low.get(frame.node)!));
      if (low.get(frame.node) === index.get(frame.node)) {
        const component: string[] = [];
        let member: string;
        do {
          member = stack.pop()!;
          onStack.delete(member);
          component.push(member);
        } while (member !== frame.node);
        components.push(component);
      }
    }
  }
  const cycles: Edge[][] = [];
  for (const component of components) {
    const members = new Set(component);
    const first = component.sort()[0];
    const selfLoop = (out.get(first) ?? []).find((e) => e.to === first);
    if (component.length === 1) {
      if (selfLoop) cycles.push([selfLoop]);
      continue;
    }
    // Breadth-first from `first` back to itself inside the component: a shortest cycle.
    const via = new Map<string, Edge>();
    const queue = [first];
    let closing: Edge | undefined;
    while (queue.length > 0 && !closing) {
      const node = queue.shift()!;
      for (const edge of out.get(node) ?? []) {
        if (!members.has(edge.to)) continue;
        if (edge.to === first) {
          closing = edge;
          break;
        }
        if (!via.has(edge.to)) {
          via.set(edge.to, edge);
          queue.push(edge.to);
        }
      }
    }
    const path: Edge[] = [closing!];
    for (let node = closing!.from; node !== first; node = via.get(node)!.from) {
      path.unshift(via.get(node)!);
    }
    cycles.push(path);
  }
  return cycles;
}

/** Reads the `.ts` files under `root` and checks their imports against the rules. */
export async function lintDeps(root: string): Promise<LintResult> {
  const paths = await collectFiles(root);
  const known = new Set(paths);
  const faceDirs = new Set(paths.filter(isFace).map(dirOf));
  const files: SourceFile[] = [];
  for (const path of paths) {
    const text = await Deno.readTextFile(join(root, path));
    const imports = parseImports(text).filter((ref) => ref.specifier.startsWith("."));
    files.push({ path, imports, text });
  }
  const violations: Violation[] = [];
  const staticEdges: Edge[] = [];
  let imports = 0;
  for (const file of files) {
    if (isFace(file.path) || isTestingFace(file.path)) {
      const lines = faceCodeLines(file.text);
      if (lines.length > 0) {
        const more = lines.length > 1 ? ` (and ${lines.length - 1} more statements)` : "";
        violations.push({
          file: file.path,
          line: lines[0],
          specifier: "",
          rule: "face",
          message: `holds code${more}; a face holds only comments and re-exports`,
        });
      }
    }
    for (const ref of file.imports) {
      imports++;
      const target = toPosix(relative(root, resolve(root, dirname(file.path), ref.specifier)));
      if (target.startsWith("..") || isAbsolute(target)) continue; // outside the tree
      if (!target.endsWith(".ts")) continue; // JSON and other assets
      if (ref.kind === "static" && known.has(target)) {
        staticEdges.push({ from: file.path, to: target, ref });
      }
      const problems: [Rule, string | undefined][] = [
        ["layering", layeringProblem(file.path, target)],
        ["private", privateProblem(file.path, target, faceDirs)],
        ["apart", apartProblem(file.path, target)],
      ];
      for (const [rule, message] of problems) {
        if (message === undefined) continue;
        violations.push({
          file: file.path,
          line: ref.line,
          specifier: ref.specifier,
          rule,
          message,
        });
      }
    }
  }
  for (const cycle of findCycles(paths, staticEdges)) {
    const names = [...cycle.map((e) => e.from), cycle[0].from].join(" -> ");
    violations.push({
      file: cycle[0].from,
      line: cycle[0].ref.line,
      specifier: cycle[0].ref.specifier,
      rule: "cycle",
      message: names,
    });
  }
  return { files: files.length, imports, violations };
}

/** One violation as one line: `file:line: import "spec": rule: message`. */
export function formatViolation(v: Violation): string {
  const what = v.specifier === "" ? "" : ` import "${v.specifier}":`;
  return `${v.file}:${v.line}:${what} ${v.rule}: ${v.message}`;
}

if (import.meta.main) {
  const root = resolve(Deno.args[0] ?? fileURLToPath(new URL("..", import.meta.url)));
  const result = await lintDeps(root);
  for (const v of result.violations) console.log(formatViolation(v));
  console.log(
    `lint:deps: ${result.files} files, ${result.imports} imports, ` +
      `${result.violations.length} violations`,
  );
  if (result.violations.length > 0) Deno.exit(1);
}

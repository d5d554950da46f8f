/**
 * Test names stay short enough to read in a list: every `Deno.test` name written as a literal
 * in a `*_test.ts` file below `tests/` (fixtures aside) is at most {@linkcode MAX_NAME}
 * characters. Detail that does not fit belongs in a comment at the top of the test.
 *
 * The scan is static: a small tokenizer that knows comments, strings, template literals and
 * regular expressions finds `Deno.test(` calls and reads the name given first, as a string, a
 * template or a `+` of them, or as the `name` of an options object. A template's substitutions
 * count for nothing, so its static text is a lower bound; names built otherwise are skipped.
 */
import assert from "node:assert/strict";
import { join, relative } from "node:path";

/** The longest test name allowed, in characters as the test runner prints them. */
const MAX_NAME = 100;

const TESTS = new URL("..", import.meta.url).pathname;

interface Token {
  kind: "string" | "word" | "punct";
  /** A string's value (a template's static text), a word, or one punctuation character. */
  text: string;
  /** Whether a string's value is all of it (false for a template with substitutions). */
  whole: boolean;
  offset: number;
}

/** A test name found in a source text. */
interface FoundName {
  line: number;
  name: string;
  /** False when substitutions were left out, so the name is at least this long. */
  whole: boolean;
}

const ESCAPES: Record<string, string> = {
  n: "\n",
  t: "\t",
  r: "\r",
  b: "\b",
  f: "\f",
  v: "\v",
  "0": "\0",
};

/** The value of a string literal's body, escapes resolved. */
function cook(raw: string): string {
  return raw.replace(
    /\\(u\{[0-9a-fA-F]+\}|u[0-9a-fA-F]{4}|x[0-9a-fA-F]{2}|\r?\n|[\s\S])/g,
    (_, e: string) => {
      if (e.startsWith("u{")) return String.fromCodePoint(parseInt(e.slice(2, -1), 16));
      if (/^[ux][0-9a-fA-F]/.test(e)) return String.fromCharCode(parseInt(e.slice(1), 16));
      if (e.endsWith("\n")) return "";
      return ESCAPES[e] ?? e;
    },
  );
}

/** Words after which a `/` starts a regular expression, not a division. */
const BEFORE_REGEX = new Set([
  "return",
  "typeof",
  "case",
  "do",
  "else",
  "in",
  "of",
  "new",
  "delete",
  "void",
  "throw",
  "instanceof",
  "yield",
  "await",
]);

/**
 * Tokens of `src` from `start`. With `inside` set (a template's substitution), it stops at
 * the `}` that closes it and returns that position in `end`.
 */
function tokenize(src: string, start = 0, inside = false): { tokens: Token[]; end: number } {
  const tokens: Token[] = [];
  let i = start;
  let depth = 0;
  const regexMayStart = () => {
    const last = tokens.at(-1);
    if (!last) return true;
    if (last.kind === "string") return false;
    if (last.kind === "word") return BEFORE_REGEX.has(last.text);
    return !")]}".includes(last.text);
  };
  while (i < src.length) {
    const c = src[i];
    const offset = i;
    if (/\s/.test(c)) {
      i++;
    } else if (src.startsWith("//", i)) {
      const eol = src.indexOf("\n", i);
      i = eol < 0 ? src.length : eol;
    } else if (src.startsWith("/*", i)) {
      const close = src.indexOf("*/", i + 2);
      i = close < 0 ? src.length : close + 2;
    } else if (c === '"' || c === "'") {
      i++;
      while (i < src.length && src[i] !== c && src[i] !== "\n") i += src[i] === "\\" ? 2 : 1;
      tokens.push({ kind: "string", text: cook(src.slice(offset + 1, i)), whole: true, offset });
      i++;
    } else if (c === "`") {
      let text = "";
      let whole = true;
      let from = ++i;
      while (i < src.length && src[i] !== "`") {
        if (src[i] === "\\") {
          i += 2;
        } else if (src.startsWith("${", i)) {
          text += cook(src.slice(from, i));
          i = tokenize(src, i + 2, true).end + 1;
          from = i;
          whole = false;
        } else {
          i++;
        }
      }
      text += cook(src.slice(from, i));
      tokens.push({ kind: "string", text, whole, offset });
      i++;
    } else if (c === "/" && regexMayStart()) {
      let inClass = false;
      i++;
      while (i < src.length && src[i] !== "\n" && (src[i] !== "/" || inClass)) {
        if (src[i] === "[") inClass = true;
        else if (src[i] === "]") inClass = false;
        i += src[i] === "\\" ? 2 : 1;
      }
      i++;
      while (/[a-z]/.test(src[i] ?? "")) i++;
      // A regular expression stands where a value does; a word token says so to what follows.
      tokens.push({ kind: "word", text: "/regex/", whole: true, offset });
    } else if (/[\w$]/.test(c)) {
      while (/[\w$]/.test(src[i] ?? "")) i++;
      tokens.push({ kind: "word", text: src.slice(offset, i), whole: true, offset });
    } else {
      if (c === "{") depth++;
      if (c === "}") {
        if (inside && depth === 0) return { tokens, end: i };
        depth--;
      }
      tokens.push({ kind: "punct", text: c, whole: true, offset });
      i++;
    }
  }
  return { tokens, end: i };
}

const is = (t: Token | undefined, kind: Token["kind"], text?: string) =>
  t !== undefined && t.kind === kind && (text === undefined || t.text === text);

/** Strings joined by `+` from `tokens[at]`, if what follows them ends the value. */
function literalAt(tokens: Token[], at: number): { name: string; whole: boolean } | undefined {
  let name = "";
  let whole = true;
  for (let i = at;; i += 2) {
    if (!is(tokens[i], "string")) return undefined;
    name += tokens[i].text;
    whole &&= tokens[i].whole;
    if (is(tokens[i + 1], "punct", "+")) continue;
    return [",", ")", "}"].some((p) => is(tokens[i + 1], "punct", p)) ? { name, whole } : undefined;
  }
}

/** The names of the `Deno.test` calls in `src` that are given as literals. */
function testNames(src: string): FoundName[] {
  const { tokens } = tokenize(src);
  const lineOf = (offset: number) => src.slice(0, offset).split("\n").length;
  const found: FoundName[] = [];
  for (let i = 0; i < tokens.length; i++) {
    if (!is(tokens[i], "word", "Deno") || !is(tokens[i + 1], "punct", ".")) continue;
    if (!is(tokens[i + 2], "word", "test")) continue;
    let at = i + 3;
    if (is(tokens[at], "punct", ".")) at += 2; // Deno.test.ignore, Deno.test.only
    if (!is(tokens[at], "punct", "(")) continue;
    at++;
    if (is(tokens[at], "punct", "{")) {
      // The options form: the object's own `name`, not one nested deeper.
      let depth = 0;
      for (; at < tokens.length; at++) {
        const t = tokens[at];
        if (t.kind === "punct" && "{([".includes(t.text)) depth++;
        if (t.kind === "punct" && "})]".includes(t.text) && --depth === 0) break;
        if (depth === 1 && is(t, "word", "name") && is(tokens[at + 1], "punct", ":")) {
          at += 2;
          break;
        }
      }
    }
    const literal = literalAt(tokens, at);
    if (literal) found.push({ line: lineOf(tokens[at].offset), ...literal });
  }
  return found;
}

/** Length as the test runner prints a name: in characters, not UTF-16 units. */
const length = (name: string) => [...name].length;

/** `file:line`, length and name of each name in `src` longer than {@linkcode MAX_NAME}. */
function longNames(src: string, file: string): string[] {
  return testNames(src)
    .filter((n) => length(n.name) > MAX_NAME)
    .map((n) => {
      const size = `${n.whole ? "" : "at least "}${length(n.name)} characters`;
      return `${file}:${n.line} (${size}): ${n.name}`;
    });
}

function testFiles(dir: string): string[] {
  const files: string[] = [];
  for (const entry of Deno.readDirSync(dir)) {
    const path = join(dir, entry.name);
    if (entry.isDirectory && path !== join(TESTS, "fixtures")) files.push(...testFiles(path));
    else if (entry.isFile && entry.name.endsWith("_test.ts")) files.push(path);
  }
  return files.sort();
}

Deno.test("every literal Deno.test name in tests/ is at most 100 characters", () => {
  const files = testFiles(TESTS);
  assert.ok(files.length > 100, `only ${files.length} test files found below ${TESTS}`);
  let names = 0;
  const long: string[] = [];
  for (const file of files) {
    const src = Deno.readTextFileSync(file);
    names += testNames(src).length;
    long.push(...longNames(src, relative(join(TESTS, ".."), file)));
  }
  assert.ok(names > 500, `only ${names} test names read: the scanner lost its way`);
  assert.deepEqual(long, [], `test names over ${MAX_NAME} characters:\n${long.join("\n")}`);
});

Deno.test("the test-name scanner reports 101 characters in any literal form, and passes 100", () => {
  const long = "a".repeat(MAX_NAME + 1);
  const fits = "b".repeat(MAX_NAME);
  const src = [
    `// Deno.test("${long}", () => {}); in a comment is no test`,
    `const s = "Deno.test('${long}')", r = /"/g, t = \`\${s}\`;`,
    `Deno.test("${fits}", () => {});`,
    `Deno.test("${long}", () => {});`,
    `Deno.test(`,
    `  "${long.slice(0, 50)}" +`,
    `    '${long.slice(50)}',`,
    `  { sanitizeOps: false },`,
    `  async () => {},`,
    `);`,
    `Deno.test({ name: \`${long}\`, fn: () => {} });`,
    `Deno.test({ sanitizeOps: false, name: \`${fits.slice(1)}\${x}\u00e9\`, fn() {} });`,
    `Deno.test.ignore(\`${long.slice(1)}\${x}\\u00e9\`, () => {});`,
  ].join("\n");
  assert.deepEqual(testNames(src).map((n) => [n.line, length(n.name), n.whole]), [
    [3, 100, true],
    [4, 101, true],
    [6, 101, true],
    [11, 101, true],
    [12, 100, false],
    [13, 101, false],
  ]);
  assert.deepEqual(longNames(src, "x_test.ts").map((l) => l.split(": ")[0]), [
    "x_test.ts:4 (101 characters)",
    "x_test.ts:6 (101 characters)",
    "x_test.ts:11 (101 characters)",
    "x_test.ts:13 (at least 101 characters)",
  ]);
});

/**
 * A small fuzzing harness for the security tier: a seeded PRNG, byte mutations of valid
 * messages, and a runner that stops after a time budget and watches the process's memory.
 *
 * Every case draws from a PRNG of its own, seeded from the run's seed and the case's
 * number, so one failing case replays alone: the failure names both, and
 * `VIRTNODE_FUZZ_SEED=<seed> VIRTNODE_FUZZ_CASE=<n> deno test -A <file>` runs only it.
 * `VIRTNODE_FUZZ_MS` changes every test's time budget (longer runs outside CI).
 *
 * @module
 */

import v8 from "node:v8";
import vm from "node:vm";

// A full collection before each look at the memory, so that it measures what is held, not
// garbage not yet collected: V8's gc() exposed at run time (the tier runs plain deno test).
v8.setFlagsFromString("--expose-gc");
const collect = vm.runInNewContext("gc") as () => void;

/** The seed a run uses unless `VIRTNODE_FUZZ_SEED` names another. */
export const DEFAULT_SEED = 34_0034;

/** A seeded source of random numbers. */
export interface Rand {
  /** A float in [0, 1). */
  (): number;
  /** An integer in [0, n). */
  int(n: number): number;
  /** One element of `items`. */
  pick<T>(items: readonly T[]): T;
  /** True with probability `p`. */
  chance(p: number): boolean;
  /** `n` random bytes. */
  bytes(n: number): Uint8Array;
}

/** A PRNG (splitmix32) seeded with `seed`; the same seed gives the same sequence. */
export function prng(seed: number): Rand {
  let state = seed >>> 0;
  const next = () => {
    state = (state + 0x9e3779b9) >>> 0;
    let z = state;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
    return ((z ^ (z >>> 16)) >>> 0) / 4294967296;
  };
  const rand = next as Rand;
  rand.int = (n) => Math.floor(next() * n);
  rand.pick = (items) => items[Math.floor(next() * items.length)];
  rand.chance = (p) => next() < p;
  rand.bytes = (n) => {
    const out = new Uint8Array(n);
    for (let i = 0; i < n; i++) out[i] = Math.floor(next() * 256);
    return out;
  };
  return rand;
}

function envNumber(name: string): number | undefined {
  const text = Deno.env.get(name);
  if (text === undefined || text === "") return undefined;
  const value = Number(text);
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new Error(`Cannot read ${name}: "${text}" is not a non-negative integer`);
  }
  return value;
}

/** The run's seed: `VIRTNODE_FUZZ_SEED`, or {@linkcode DEFAULT_SEED}. */
export function fuzzSeed(): number {
  return envNumber("VIRTNODE_FUZZ_SEED") ?? DEFAULT_SEED;
}

/** Whether this run replays one case (`VIRTNODE_FUZZ_CASE`): totals over a run mean nothing. */
export function replaying(): boolean {
  return envNumber("VIRTNODE_FUZZ_CASE") !== undefined;
}

/** One case of a run: its number, its PRNG, and what it tells a failure to show. */
export interface FuzzCase {
  /** The case's number in the run. */
  readonly index: number;
  /** The case's own PRNG. */
  readonly rand: Rand;
  /** Shown with a failure: what the case sent (mutations, a hex dump). */
  note: string;
}

/** Options of {@linkcode fuzz}. */
export interface FuzzOptions {
  /** How long the run goes on (`VIRTNODE_FUZZ_MS` overrides it). */
  budgetMs: number;
  /** At most this many cases. */
  maxCases?: number;
  /**
   * At least this many cases, or the run fails: a run that tried too little proves
   * nothing (a replay of one case is exempt).
   */
  minCases?: number;
  /** Milliseconds between two looks at the memory, each after a full collection (default 500). */
  memoryEveryMs?: number;
  /**
   * How far RSS may grow over the run's start, after a full collection (default 192 MiB;
   * the allocator keeps some freed memory, so this catches growth, not a few MiB).
   */
  rssLimitBytes?: number;
  /**
   * How far external memory (ArrayBuffers, counted when allocated, touched or not) may grow
   * after a full collection (default 64 MiB): a length field of 2^31 believed shows here.
   */
  externalLimitBytes?: number;
}

/** What a run did. */
export interface FuzzStats {
  /** The run's seed. */
  seed: number;
  /** Cases run. */
  cases: number;
  /** How long they took. */
  ms: number;
  /** The highest RSS seen over the run's start, bytes. */
  rssGrowth: number;
  /** The highest external memory seen over the run's start, bytes. */
  externalGrowth: number;
}

const MIB = 1024 * 1024;

function memoryNow(): { rss: number; external: number } {
  collect();
  const m = Deno.memoryUsage();
  return { rss: m.rss, external: m.external };
}

/**
 * Runs `body` for case after case until the time budget or `maxCases` is spent. A case
 * that throws ends the run with an error naming the seed, the case and the case's note;
 * so does memory grown past the limit. Prints one line of numbers at the end.
 */
export async function fuzz(
  name: string,
  options: FuzzOptions,
  body: (c: FuzzCase) => void | Promise<void>,
): Promise<FuzzStats> {
  const seed = fuzzSeed();
  const only = envNumber("VIRTNODE_FUZZ_CASE");
  const budgetMs = envNumber("VIRTNODE_FUZZ_MS") ?? options.budgetMs;
  const maxCases = options.maxCases ?? Infinity;
  const every = options.memoryEveryMs ?? 500;
  let looked = performance.now();
  const rssLimit = options.rssLimitBytes ?? 192 * MIB;
  const externalLimit = options.externalLimitBytes ?? 64 * MIB;
  const start = memoryNow();
  let rssGrowth = 0;
  let externalGrowth = 0;
  const t0 = performance.now();
  let cases = 0;
  const replay = (index: number) =>
    `(seed ${seed}, case ${index}; replay: VIRTNODE_FUZZ_SEED=${seed} VIRTNODE_FUZZ_CASE=${index})`;
  for (let index = only ?? 0;; index++) {
    if (only !== undefined ? index > only : cases >= maxCases) break;
    if (only === undefined && performance.now() - t0 >= budgetMs) break;
    // Cases seeded apart: the case's number mixed into the run's seed.
    const c: FuzzCase = { index, rand: prng(seed ^ Math.imul(index + 1, 0x9e3779b1)), note: "" };
    try {
      await body(c);
    } catch (error) {
      const detail = error instanceof Error ? error.message : String(error);
      throw new Error(`Fuzz ${name} failed ${replay(index)}: ${detail}\n  input: ${c.note}`, {
        cause: error,
      });
    }
    cases++;
    if (performance.now() - looked >= every) {
      const now = memoryNow();
      looked = performance.now();
      rssGrowth = Math.max(rssGrowth, now.rss - start.rss);
      externalGrowth = Math.max(externalGrowth, now.external - start.external);
      if (rssGrowth > rssLimit || externalGrowth > externalLimit) {
        throw new Error(
          `Fuzz ${name} failed ${replay(index)}: memory grew past its bound ` +
            `(RSS +${(rssGrowth / MIB).toFixed(1)} MiB of ${rssLimit / MIB}, external +${
              (externalGrowth / MIB).toFixed(1)
            } MiB of ${externalLimit / MIB})\n  input: ${c.note}`,
        );
      }
    }
  }
  const ms = Math.round(performance.now() - t0);
  if (only === undefined && cases < (options.minCases ?? 0)) {
    throw new Error(`Fuzz ${name} ran ${cases} cases in ${ms} ms, fewer than ${options.minCases}`);
  }
  console.log(
    `fuzz ${name}: seed ${seed}, ${cases} cases in ${ms} ms, RSS +${
      (rssGrowth / MIB).toFixed(1)
    } MiB, external +${(externalGrowth / MIB).toFixed(1)} MiB`,
  );
  return { seed, cases, ms, rssGrowth, externalGrowth };
}

/** A byte mutation: its name (for notes) and what it does to a copy of the input. */
export interface ByteMutation {
  /** Short name, shown in failure notes. */
  name: string;
  /** Returns the mutated bytes (may be the same array, changed). */
  apply(bytes: Uint8Array, rand: Rand): Uint8Array;
}

/** Values that sit on the edges of 8-, 16- and 32-bit length fields. */
export const EDGE_VALUES = [
  0,
  1,
  0x7f,
  0x80,
  0xff,
  0x100,
  0x7fff,
  0x8000,
  0xffff,
  0x10000,
  0x7fffffff,
  0x80000000,
  0xffffffff,
] as const;

/** One copy of `parts` end to end. */
export function concatBytes(parts: readonly Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/**
 * `bytes` with `times` more copies of `bytes[from, to)` right after it, as many of them
 * as fit in `maxLength`: repeated options, frames, events.
 */
export function repeatRange(
  bytes: Uint8Array,
  from: number,
  to: number,
  times: number,
  maxLength: number,
): Uint8Array {
  const piece = bytes.slice(from, to);
  if (piece.length === 0) return bytes;
  const fit = Math.max(0, Math.floor((maxLength - bytes.length) / piece.length));
  return concatBytes([
    bytes.subarray(0, to),
    ...Array<Uint8Array>(Math.min(times, fit)).fill(piece),
    bytes.subarray(to),
  ]);
}

/** Writes `value` big-endian in `size` bytes at `at` (cut at the end of `bytes`). */
export function writeBigEndian(bytes: Uint8Array, at: number, size: number, value: number): void {
  for (let i = 0; i < size && at + i < bytes.length; i++) {
    bytes[at + i] = Math.floor(value / 2 ** (8 * (size - 1 - i))) & 0xff;
  }
}

/** Format-blind mutations: flips, edge values, cuts, growth, repeats. */
export function genericMutations(maxLength: number): ByteMutation[] {
  const at = (bytes: Uint8Array, rand: Rand) => rand.int(Math.max(bytes.length, 1));
  return [
    {
      name: "flip",
      apply: (b, rand) => {
        if (b.length) b[at(b, rand)] ^= 1 << rand.int(8);
        return b;
      },
    },
    {
      name: "byte",
      apply: (b, rand) => {
        if (b.length) b[at(b, rand)] = rand.pick([0, 0xff, 0x7f, 0x80, rand.int(256)]);
        return b;
      },
    },
    {
      name: "edge16/32",
      apply: (b, rand) => {
        writeBigEndian(b, at(b, rand), rand.pick([2, 4]), rand.pick(EDGE_VALUES));
        return b;
      },
    },
    { name: "truncate", apply: (b, rand) => b.slice(0, rand.int(b.length + 1)) },
    {
      name: "append",
      apply: (b, rand) =>
        concatBytes([b, rand.bytes(Math.max(0, Math.min(rand.int(64) + 1, maxLength - b.length)))])
          .slice(
            0,
            maxLength,
          ),
    },
    {
      name: "delete",
      apply: (b, rand) => {
        const from = at(b, rand);
        return concatBytes([b.subarray(0, from), b.subarray(from + 1 + rand.int(16))]);
      },
    },
    {
      name: "repeat",
      apply: (b, rand) => {
        // A few bytes repeated, a few times or up to the size limit.
        const from = at(b, rand);
        const times = rand.chance(0.5) ? rand.int(16) + 1 : maxLength;
        return repeatRange(b, from, from + 1 + rand.int(8), times, maxLength);
      },
    },
  ];
}

/**
 * Applies one to four mutations picked from `mutations` to a copy of `input`; returns the
 * result and the names applied.
 */
export function mutate(
  input: Uint8Array,
  rand: Rand,
  mutations: readonly ByteMutation[],
): { bytes: Uint8Array; applied: string[] } {
  let bytes: Uint8Array = input.slice();
  const applied: string[] = [];
  const n = 1 + rand.int(4);
  for (let i = 0; i < n; i++) {
    const m = rand.pick(mutations);
    bytes = m.apply(bytes, rand);
    applied.push(m.name);
  }
  return { bytes, applied };
}

/** Hex of the first `max` bytes, for failure notes. */
export function hex(bytes: Uint8Array, max = 96): string {
  const shown = Array.from(bytes.subarray(0, max), (b) => b.toString(16).padStart(2, "0")).join(
    "",
  );
  return bytes.length > max ? `${shown}… (${bytes.length} bytes)` : shown;
}

/** Parses hex (as {@linkcode hex} writes it, without the cut) back into bytes. */
export function fromHex(text: string): Uint8Array {
  const clean = text.replace(/\s+/g, "");
  const out = new Uint8Array(clean.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(clean.slice(2 * i, 2 * i + 2), 16);
  return out;
}

/** A JSON value. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** Values a broken or hostile peer might put anywhere in a JSON message. */
export const WEIRD_JSON: readonly Json[] = [
  null,
  true,
  0,
  -1,
  1e308,
  2 ** 53 + 1,
  0.5,
  "",
  " ",
  "\u0000",
  "\ud800",
  "💣",
  "../../etc/passwd",
  "x".repeat(65_536),
  [],
  {},
  [1, "a", null],
  { "__proto__": { polluted: true } },
];

function jsonPaths(value: Json, at: (string | number)[] = []): (string | number)[][] {
  const out: (string | number)[][] = [at];
  if (Array.isArray(value)) value.forEach((v, i) => out.push(...jsonPaths(v, [...at, i])));
  else if (value !== null && typeof value === "object") {
    for (const [k, v] of Object.entries(value)) out.push(...jsonPaths(v, [...at, k]));
  }
  return out;
}

/**
 * Applies one structural mutation to a copy of `value` (a field deleted, set to null, to
 * another type or to an edge value; an object made an array or back; an array element
 * repeated) and returns the copy and the mutation's name.
 */
export function mutateJson(value: Json, rand: Rand): { value: Json; applied: string } {
  const root = structuredClone(value);
  const paths = jsonPaths(root).filter((p) => p.length > 0);
  if (paths.length === 0) return { value: rand.pick(WEIRD_JSON), applied: "root" };
  const path = rand.pick(paths);
  let parent: Json = root;
  for (const key of path.slice(0, -1)) parent = (parent as Record<string, Json>)[key as string];
  const key = path.at(-1)!;
  const slot = parent as Record<string | number, Json>;
  const op = rand.pick(["delete", "weird", "array", "object", "repeat"] as const);
  switch (op) {
    case "delete":
      if (Array.isArray(parent)) parent.splice(key as number, 1);
      else delete slot[key];
      break;
    case "weird":
      // defineProperty: an assignment to "__proto__" would not make a field.
      Object.defineProperty(slot, key, {
        value: structuredClone(rand.pick(WEIRD_JSON)),
        enumerable: true,
        writable: true,
        configurable: true,
      });
      break;
    case "array":
      slot[key] = [slot[key]];
      break;
    case "object":
      slot[key] = Array.isArray(slot[key]) ? { ...(slot[key] as Json[]) } : { value: slot[key] };
      break;
    case "repeat": {
      const target = slot[key];
      if (Array.isArray(target) && target.length > 0) {
        for (let i = 0, n = 1 + rand.int(64); i < n; i++) target.push(structuredClone(target[0]));
      } else slot[key] = [target, target];
      break;
    }
  }
  return { value: root, applied: `${op}@${path.join(".")}` };
}

/** How the cases of a fuzz run against a server ended, and its slowest answer. */
export class Outcomes {
  readonly #counts = new Map<string, number>();
  #slowestMs = 0;

  /** Counts one case that ended as `what`. */
  count(what: string): void {
    this.#counts.set(what, (this.#counts.get(what) ?? 0) + 1);
  }

  /** Notes how long one answer took. */
  timed(ms: number): void {
    this.#slowestMs = Math.max(this.#slowestMs, ms);
  }

  /** Prints the tally and asserts each of `expected` happened, unless one case is replayed. */
  report(...expected: string[]): void {
    const tally = [...this.#counts].map(([k, v]) => `${k} ${v}`).join(", ");
    console.log(`  outcomes: ${tally}; slowest ${this.#slowestMs.toFixed(0)} ms`);
    // Both kinds of answer, or the run did not reach past the decoding.
    if (replaying()) return;
    for (const what of expected) {
      if (!this.#counts.get(what)) throw new Error(`No case ended "${what}": ${tally}`);
    }
  }
}

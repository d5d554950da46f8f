/**
 * Fuzzing the informer's decoding of what the apiserver streams: real VMIs (the
 * converter's fixtures) in watch events and lists, mutated as JSON (objects that are
 * numbers, metadata without a name, resourceVersions that are not strings, unknown event
 * types, ERROR events of any code) and as bytes (flips, cuts, repeats), sent in random
 * pieces by a local HTTP server to the real {@linkcode KubeClient} and {@linkcode Informer}.
 *
 * The informer keeps running; every error it reports names the failed action ("Cannot
 * watch ..." / "Cannot list ..."); its store and its handlers see only objects with a
 * name; its resourceVersion stays a string; a line without an end is refused at a bound
 * instead of buffered for ever.
 */
import assert from "node:assert/strict";
import { Informer } from "../../mod/kube/mod.ts";
import { KubeClient } from "../../mod/kube/mod.ts";
import type { KubeObject } from "../../mod/kube/mod.ts";
import { fuzz, genericMutations, hex, mutate, prng, type Rand } from "./_fuzz.ts";

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

const RESOURCE = "virtualmachineinstances";
const PATH = `/apis/kubevirt.io/v1/${RESOURCE}`;
const FIXTURES: Json[] = [];
for await (const entry of Deno.readDir(new URL("../fixtures/converter/", import.meta.url))) {
  if (!entry.name.endsWith(".vmi.json")) continue;
  FIXTURES.push(
    JSON.parse(
      await Deno.readTextFile(new URL(`../fixtures/converter/${entry.name}`, import.meta.url)),
    ),
  );
}
FIXTURES.sort((a, b) => JSON.stringify(a).localeCompare(JSON.stringify(b)));

let version = 1000;
/** A fixture VMI named `name`, with a fresh resourceVersion and some non-ASCII text. */
function vmi(rand: Rand, name: string): { [key: string]: Json } {
  const copy = structuredClone(rand.pick(FIXTURES)) as { [key: string]: Json };
  const meta = copy.metadata as { [key: string]: Json };
  meta.name = name;
  meta.resourceVersion = String(++version);
  meta.annotations = { "note": rand.pick(["é", "日本語", "💣", "plain"]) };
  return copy;
}

/** The value an ill-formed apiserver (or a broken proxy) might put in place of any field. */
const WEIRD: Json[] = [5, -1, "", "x", null, true, [], {}, [1, "a"], { a: {} }, "410"];

/** One JSON-level mutation of a watch event, in place; returns its name. */
function mutateEvent(event: { [key: string]: Json }, rand: Rand): string {
  const object = event.object as { [key: string]: Json } | undefined;
  const meta = object?.metadata as { [key: string]: Json } | undefined;
  switch (rand.int(8)) {
    case 0:
      event.object = rand.pick(WEIRD);
      return "object";
    case 1:
      if (object) delete object.metadata;
      return "no-metadata";
    case 2:
      if (object) object.metadata = rand.pick(WEIRD);
      return "metadata";
    case 3:
      if (meta) meta.name = rand.pick(WEIRD);
      return "name";
    case 4:
      if (meta) meta.namespace = rand.pick(WEIRD);
      return "namespace";
    case 5:
      if (meta) meta.resourceVersion = rand.pick(WEIRD);
      return "resourceVersion";
    case 6:
      event.type = rand.pick(["added", "UNKNOWN", 5, null, "", "ERROR", "BOOKMARK", "DELETED"]);
      return "type";
    default:
      event.type = "ERROR";
      event.object = rand.pick([
        {
          kind: "Status",
          code: rand.pick([500, 429, 404, 403, 0, -1, 1e308]),
          reason: "x",
          message: "y",
        },
        { kind: "Status", code: "410" },
        { kind: "Status" },
        rand.pick(WEIRD),
      ]);
      return "error-event";
  }
}

/** A watch stream: events of fixture VMIs, some mutated as JSON, the whole maybe as bytes. */
function watchBody(rand: Rand): { bytes: Uint8Array; applied: string[] } {
  const applied: string[] = [];
  const lines: string[] = [];
  const n = 1 + rand.int(12);
  for (let i = 0; i < n; i++) {
    const type = rand.pick(["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]);
    const object = type === "BOOKMARK"
      ? {
        kind: "VirtualMachineInstance",
        apiVersion: "kubevirt.io/v1",
        metadata: { resourceVersion: String(++version) },
      }
      : vmi(rand, `vm-${rand.int(6)}`);
    const event: { [key: string]: Json } = { type, object };
    if (rand.chance(0.3)) applied.push(mutateEvent(event, rand));
    lines.push(JSON.stringify(event));
  }
  const text = lines.join("\n") + (rand.chance(0.8) ? "\n" : "");
  let bytes = new TextEncoder().encode(text);
  if (rand.chance(0.4)) {
    const m = mutate(bytes, rand, genericMutations(256 * 1024));
    bytes = m.bytes as Uint8Array<ArrayBuffer>;
    applied.push(...m.applied);
  }
  return { bytes, applied };
}

function validList(rand: Rand): Uint8Array<ArrayBuffer> {
  const items = Array.from({ length: rand.int(4) }, (_, i) => vmi(rand, `vm-${i}`));
  return new TextEncoder().encode(JSON.stringify({
    kind: "VirtualMachineInstanceList",
    apiVersion: "kubevirt.io/v1",
    metadata: { resourceVersion: String(++version) },
    items,
  }));
}

/** A list answer, mutated as JSON or as bytes. */
function listBody(rand: Rand): { bytes: Uint8Array; applied: string[] } {
  const list = JSON.parse(new TextDecoder().decode(validList(rand))) as { [key: string]: Json };
  const applied: string[] = [];
  switch (rand.int(5)) {
    case 0:
      list.items = rand.pick(WEIRD);
      applied.push("items");
      break;
    case 1:
      list.items = [rand.pick(WEIRD), vmi(rand, "vm-ok")];
      applied.push("item");
      break;
    case 2:
      list.metadata = rand.pick(WEIRD);
      applied.push("list-metadata");
      break;
    case 3:
      list.metadata = { resourceVersion: rand.pick(WEIRD) };
      applied.push("list-resourceVersion");
      break;
    default: {
      const item = vmi(rand, "vm-x");
      (item.metadata as { [key: string]: Json }).name = rand.pick(WEIRD);
      list.items = [item];
      applied.push("item-name");
    }
  }
  let bytes = new TextEncoder().encode(JSON.stringify(list));
  if (rand.chance(0.3)) {
    const m = mutate(bytes, rand, genericMutations(256 * 1024));
    bytes = m.bytes as Uint8Array<ArrayBuffer>;
    applied.push(...m.applied);
  }
  return { bytes, applied };
}

/** `bytes` cut at random points, sometimes inside a UTF-8 sequence. */
function pieces(bytes: Uint8Array, rand: Rand): Uint8Array[] {
  const out: Uint8Array[] = [];
  for (let at = 0; at < bytes.length;) {
    const size = 1 + rand.int(rand.chance(0.3) ? 8 : 4096);
    out.push(bytes.slice(at, at + size));
    at += size;
  }
  return out;
}

/** What one case serves: a watch stream, and maybe a list after it (an ERROR 410 asks for one). */
interface Plan {
  watch: Uint8Array[];
  list?: Uint8Array;
  stage: "watch" | "list" | "finishing";
  finished: () => void;
}

/** The apiserver side: one case's plan at a time; between cases, valid lists and a quiet watch. */
class FakeWatchServer {
  readonly #server: Deno.HttpServer<Deno.NetAddr>;
  readonly #rand: Rand;
  #plan: Plan | undefined;
  #held: ReadableStreamDefaultController<Uint8Array> | undefined;
  /** Every resourceVersion a watch asked for. */
  readonly watchVersions: string[] = [];
  /** Bytes the informer read of the cases' watch streams. */
  bytesServed = 0;

  constructor(rand: Rand) {
    this.#rand = rand;
    this.#server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      (req) => this.#answer(req),
    );
  }

  get url(): string {
    return `http://127.0.0.1:${this.#server.addr.port}`;
  }

  /** Serves `plan` and resolves once the informer comes back after it (it read it all). */
  serve(watch: Uint8Array[], list?: Uint8Array): Promise<void> {
    return new Promise((resolve) => {
      this.#plan = { watch, list, stage: "watch", finished: resolve };
      // A quiet watch that is open ends, so that the informer asks again.
      try {
        this.#held?.close();
      } catch {
        // Cancelled by the informer already.
      }
      this.#held = undefined;
    });
  }

  #answer(req: Request): Response {
    const url = new URL(req.url);
    const watching = url.searchParams.has("watch");
    if (watching) this.watchVersions.push(url.searchParams.get("resourceVersion") ?? "");
    const plan = this.#plan;
    if (plan?.stage === "finishing") {
      this.#plan = undefined;
      plan.finished();
    } else if (plan?.stage === "watch" && watching) {
      plan.stage = plan.list ? "list" : "finishing";
      const chunks = [...plan.watch];
      return new Response(
        new ReadableStream({
          pull: (controller) => {
            const next = chunks.shift();
            if (next) {
              this.bytesServed += next.length;
              controller.enqueue(next);
            } else controller.close();
          },
        }),
        { headers: { "content-type": "application/json" } },
      );
    } else if (plan?.stage === "list" && !watching) {
      plan.stage = "finishing";
      return new Response(new Uint8Array(plan.list!), {
        headers: { "content-type": "application/json" },
      });
    }
    if (!watching) {
      return new Response(validList(this.#rand), {
        headers: { "content-type": "application/json" },
      });
    }
    return new Response(
      new ReadableStream({ start: (controller) => void (this.#held = controller) }),
      { headers: { "content-type": "application/json" } },
    );
  }

  async close(): Promise<void> {
    try {
      this.#held?.close();
    } catch {
      // Cancelled already.
    }
    await this.#server.shutdown();
  }
}

/** An object the informer may store or hand out: a plain object whose metadata names it. */
function checkObject(obj: unknown, where: string): void {
  assert.ok(
    obj !== null && typeof obj === "object" && !Array.isArray(obj),
    `${where}: ${JSON.stringify(obj)} is not an object`,
  );
  const meta = (obj as KubeObject).metadata;
  assert.ok(
    meta !== null && typeof meta === "object" && !Array.isArray(meta),
    `${where}: metadata ${JSON.stringify(meta)}`,
  );
  assert.ok(
    typeof meta.name === "string" && meta.name !== "",
    `${where}: name ${JSON.stringify(meta.name)}`,
  );
  assert.ok(
    meta.namespace === undefined || typeof meta.namespace === "string",
    `${where}: namespace ${JSON.stringify(meta.namespace)}`,
  );
}

/** A running informer against a {@linkcode FakeWatchServer}, with what it reported. */
async function withInformer(
  rand: Rand,
  body: (ctx: {
    server: FakeWatchServer;
    informer: Informer;
    errors: Error[];
    seen: { where: string; obj: unknown }[];
    state: { settled?: string };
  }) => Promise<void>,
): Promise<void> {
  const server = new FakeWatchServer(rand);
  const client = new KubeClient({ server: server.url, source: "fuzz", token: "fuzz" }, {
    timeoutMs: 5_000,
  });
  const errors: Error[] = [];
  const seen: { where: string; obj: unknown }[] = [];
  // Short waits: a case is one watch (or list) answer. goneMaxMs is a newer option.
  const backoff = { initialMs: 1, maxMs: 5, resetAfterMs: 0, goneMaxMs: 5 };
  const informer = new Informer(client, {
    path: PATH,
    resource: RESOURCE,
    watchTimeoutSeconds: 300,
    backoff,
    onError: (error) => errors.push(error),
  });
  informer.addHandlers({
    onAdd: (obj) => seen.push({ where: "onAdd", obj }),
    onUpdate: (old, obj) =>
      seen.push({ where: "onUpdate(old)", obj: old }, { where: "onUpdate", obj }),
    onDelete: (obj) => seen.push({ where: "onDelete", obj }),
  });
  const abort = new AbortController();
  const state: { settled?: string } = {};
  const running = informer.run(abort.signal).then(
    () => void (state.settled = "resolved"),
    (error) => void (state.settled = `rejected: ${error}`),
  );
  try {
    await informer.waitForSync();
    await body({ server, informer, errors, seen, state });
  } finally {
    abort.abort();
    await running;
    client.close();
    await server.close();
  }
}

function withDeadline<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  return Promise.race([
    promise.finally(() => clearTimeout(timer)),
    new Promise<T>((_, reject) =>
      timer = setTimeout(() => reject(new Error(`${what} within ${ms} ms`)), ms)
    ),
  ]);
}

const sanitize = { sanitizeOps: false, sanitizeResources: false };

Deno.test(
  "informer: mutated watch streams and lists never stop it and leave only named objects stored",
  sanitize,
  async () => {
    // Each bad stream or list is reported as a failed watch or list.
    await withInformer(
      // The server's own valid lists between cases: their randomness is not the cases'.
      prng(1),
      async ({ server, informer, errors, seen, state }) => {
        await fuzz("informer", { budgetMs: 10_000, minCases: 50 }, async (c) => {
          const watch = c.rand.chance(0.15) ? undefined : watchBody(c.rand);
          const list = watch ? undefined : listBody(c.rand);
          const watchBytes = watch?.bytes ??
            new TextEncoder().encode(
              JSON.stringify({
                type: "ERROR",
                object: { kind: "Status", code: 410, reason: "Expired", message: "too old" },
              }) +
                "\n",
            );
          c.note = watch
            ? `watch ${watch.applied.join("+")} ${hex(watch.bytes, 400)}`
            : `list ${list!.applied.join("+")} ${hex(list!.bytes, 400)}`;
          errors.length = 0;
          seen.length = 0;
          await withDeadline(
            server.serve(pieces(watchBytes, c.rand), list?.bytes),
            5_000,
            "the informer came back",
          );
          assert.equal(state.settled, undefined, "the informer stopped");
          assert.equal(
            typeof informer.resourceVersion,
            "string",
            `resourceVersion ${JSON.stringify(informer.resourceVersion)}`,
          );
          for (const error of errors) {
            assert.ok(error instanceof Error);
            assert.match(
              error.message,
              new RegExp(`^Cannot (watch|list) ${RESOURCE}: `),
              `reported: ${error.message}`,
            );
          }
          for (const { where, obj } of seen) checkObject(obj, where);
          for (const obj of informer.list()) checkObject(obj, "store");
        });
        // A resourceVersion that was not a string shows as its String() in the query.
        const bad = server.watchVersions.filter((v) =>
          /^\[object |^(undefined|null|true|false|-1)$/.test(v)
        );
        assert.deepEqual(bad, [], "watches from resourceVersions that were not strings");
      },
    );
  },
);

Deno.test(
  "informer regression: a watch event whose object is a number is refused, not stored",
  sanitize,
  async () => {
    // Found by the fuzzer on c1d8a68 ("object"): the event was taken, the number stored
    // under the key "" and handed to onAdd.
    await withInformer(prng(2), async ({ server, informer, errors, seen }) => {
      const line = new TextEncoder().encode(JSON.stringify({ type: "ADDED", object: 5 }) + "\n");
      await withDeadline(server.serve([line]), 5_000, "the informer came back");
      for (const { where, obj } of seen) checkObject(obj, where);
      for (const obj of informer.list()) checkObject(obj, "store");
      assert.ok(
        errors.some((e) =>
          /^Cannot watch virtualmachineinstances: malformed watch event/.test(e.message)
        ),
      );
    });
  },
);

Deno.test(
  "informer: a watch line that never ends is refused at a bound, not read for ever",
  sanitize,
  async () => {
    await withInformer(prng(3), async ({ server, errors }) => {
      const MIB = 1024 * 1024;
      const chunk = new TextEncoder().encode("a".repeat(MIB));
      const start = new TextEncoder().encode('{"type":"ADDED","object":{"metadata":{"name":"');
      // 128 MiB without a newline, unless the informer gives the stream up first.
      const served = server.serve([start, ...Array.from({ length: 128 }, () => chunk)]);
      const before = Deno.memoryUsage().rss;
      const deadline = Date.now() + 30_000;
      let peak = 0;
      while (!errors.some((e) => /watch/.test(e.message)) && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 50));
        peak = Math.max(peak, Deno.memoryUsage().rss - before);
      }
      const error = errors.find((e) => /watch/.test(e.message));
      console.log(
        `a line without an end: ${error ? `refused (${error.message})` : "not refused"} after ` +
          `${(server.bytesServed / MIB).toFixed(0)} MiB, RSS +${(peak / MIB).toFixed(0)} MiB`,
      );
      assert.ok(
        error,
        `no error for an endless line within 30 s (${server.bytesServed} bytes read)`,
      );
      assert.match(error.message, /^Cannot watch virtualmachineinstances: .*line/);
      assert.ok(
        server.bytesServed <= 32 * MIB,
        `${server.bytesServed} bytes read before the refusal`,
      );
      await withDeadline(served, 10_000, "the informer came back");
    });
  },
);

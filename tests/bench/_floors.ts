/**
 * The floors the benchmark prints beside virtnode's figures, measured in the same
 * run with nothing of virtnode in between:
 * (a) the apiserver's own create -> watch ADDED delivery,
 * (b) a raw libvirt define+start through `ffi/`,
 * (c) a status write (merge patch of the VMI: KubeVirt's CRD has no status
 *     subresource) -> watch MODIFIED round trip,
 * (d) a bare Deno process's RSS and PSS,
 * (e) a bare Deno process's start-up (spawn -> exit of `deno eval`).
 *
 * @module
 */
import { kvmUsable } from "../../mod/host/mod.ts";
import type { KubeClient } from "../../mod/kube/mod.ts";
import { openLibvirt } from "../../ffi/mod.ts";
import { V8_FLAGS } from "../../mod/config/mod.ts";
import { tinyGuestXml } from "../helpers/libvirtd.ts";
import { testVmi } from "../helpers/handler_process.ts";
import { type SeenEvent, vmiCollection, type VmiWatch } from "./_watch.ts";
import { mapLimit, pollUntil, procMemory, sleep } from "./_util.ts";

/** A node name no handler serves: floor VMIs are never synced. */
export const FLOOR_NODE = "virtnode-bench-floor-node";

/** Where floor objects live and how long a single wait may take. */
export interface FloorContext {
  client: KubeClient;
  watch: VmiWatch;
  namespace: string;
  /** Prefix of every object and domain name this run creates. */
  prefix: string;
  timeoutMs: number;
}

function vmiPath(ns: string, name: string): string {
  return `${vmiCollection(ns)}/${name}`;
}

/** Creates `name` (a VMI for the floor node) and returns ms until the watch saw it ADDED. */
async function createOnce(ctx: FloorContext, name: string): Promise<number> {
  const seen = ctx.watch.waitFor(
    `floor VMI ${name} ADDED`,
    (e) => e.type === "ADDED" && e.object.metadata.name === name,
    ctx.timeoutMs,
  );
  const t0 = performance.now();
  await ctx.client.request(
    "POST",
    vmiCollection(ctx.namespace),
    testVmi(name, FLOOR_NODE, {
      namespace: ctx.namespace,
    }),
  );
  return (await seen) - t0;
}

/** Merge-patches `name`'s status and returns ms until the watch saw the new status. */
async function patchOnce(ctx: FloorContext, name: string, i: number): Promise<number> {
  const marker = `bench-${i}-${performance.now()}`;
  const match = (e: SeenEvent) =>
    e.type === "MODIFIED" && e.object.metadata.name === name &&
    e.object.status?.reason === marker;
  const seen = ctx.watch.waitFor(`floor VMI ${name} status`, match, ctx.timeoutMs);
  const t0 = performance.now();
  await ctx.client.request(
    "PATCH",
    vmiPath(ctx.namespace, name),
    { status: { phase: "Scheduled", reason: marker, nodeName: FLOOR_NODE } },
    { contentType: "application/merge-patch+json" },
  );
  return (await seen) - t0;
}

async function deleteAll(ctx: FloorContext, names: string[]): Promise<void> {
  await mapLimit(names, 20, async (name) => {
    const gone = ctx.watch.waitFor(
      `floor VMI ${name} deleted`,
      (e) => e.type === "DELETED" && e.object.metadata.name === name,
      ctx.timeoutMs,
    );
    await ctx.client.request("DELETE", vmiPath(ctx.namespace, name)).catch(() => {});
    await gone.catch(() => {});
  });
}

/** Floors (a) and (c), `n` sequential samples each, in ms. */
export async function apiserverFloors(
  ctx: FloorContext,
  n: number,
): Promise<{ create: number[]; statusPatch: number[] }> {
  // A fresh apiserver answers the first writes of a new CRD slowly (its storage is
  // still starting); a few objects first keep that out of the floor.
  const warm = Array.from({ length: 3 }, (_, i) => `${ctx.prefix}-floor-warm-${i}`);
  try {
    for (const [i, name] of warm.entries()) {
      await createOnce(ctx, name);
      await patchOnce(ctx, name, i);
    }
  } finally {
    await deleteAll(ctx, warm);
  }
  const names = Array.from({ length: n }, (_, i) => `${ctx.prefix}-floor-${i}`);
  const create: number[] = [];
  const statusPatch: number[] = [];
  try {
    for (const name of names) create.push(await createOnce(ctx, name));
    for (const [i, name] of names.entries()) statusPatch.push(await patchOnce(ctx, name, i));
  } finally {
    await deleteAll(ctx, names);
  }
  return { create, statusPatch };
}

/**
 * The apiserver part of a burst's floor: `n` VMIs created with `concurrency` requests
 * in flight until the watch saw all of them, then one status write each until the
 * watch saw all of those; wall times in ms.
 */
export async function apiserverBurstFloor(
  ctx: FloorContext,
  n: number,
  concurrency: number,
): Promise<{ createAllMs: number; statusAllMs: number }> {
  const names = Array.from({ length: n }, (_, i) => `${ctx.prefix}-floorburst-${i}`);
  try {
    const t0 = performance.now();
    await mapLimit(names, concurrency, (name) => createOnce(ctx, name));
    const createAllMs = performance.now() - t0;
    const t1 = performance.now();
    await mapLimit(names, concurrency, (name, i) => patchOnce(ctx, name, i));
    const statusAllMs = performance.now() - t1;
    return { createAllMs, statusAllMs };
  } finally {
    await deleteAll(ctx, names);
  }
}

/** Raw libvirt timings of one URI, ms. */
export interface LibvirtFloor {
  /** Opening a connection (what each launcher pays once). */
  open: number[];
  /** defineXML + start of one domain. */
  defineStart: number[];
  /** suspend of a running domain (the call only). */
  suspend: number[];
  /** Wall time of `burst` define+start with `concurrency` in flight (0 when not asked). */
  burstMs: number;
  /** libvirt's library version, e.g. "9.0.0". */
  version: string;
  /** The domain type the guests were defined with. */
  domainType: string;
}

/** Whether guests run under KVM here (what the launcher checks: `kvmUsable`). */
export function kvmDevice(): boolean {
  return kvmUsable();
}

/**
 * Floor (b) on `uri`: `n` sequential define+start (+ suspend) of a tiny guest, each
 * destroyed and undefined after, and optionally a burst of `burst` define+start.
 */
export async function libvirtFloor(
  uri: string,
  prefix: string,
  options: { n: number; burst?: number; concurrency?: number; domainType: string },
): Promise<LibvirtFloor> {
  const open: number[] = [];
  for (let i = 0; i < 3; i++) {
    const t = performance.now();
    const c = await openLibvirt(uri, { events: false, workers: 1 });
    open.push(performance.now() - t);
    await c.close();
  }
  const conn = await openLibvirt(uri, { events: false });
  const xml = (name: string) =>
    tinyGuestXml(name).replace("<domain type='qemu'>", `<domain type='${options.domainType}'>`);
  const defined: string[] = [];
  const removeAll = async () => {
    for (const name of defined.splice(0)) {
      try {
        const d = await conn.lookupByName(name);
        if ((await d.getState()).stateName !== "Shutoff") await d.destroy();
        await d.undefine();
      } catch {
        // Already gone.
      }
    }
  };
  try {
    const v = await conn.getLibVersion();
    const defineStart: number[] = [];
    const suspend: number[] = [];
    for (let i = 0; i < options.n; i++) {
      const name = `${prefix}-floor-dom-${i}`;
      const t = performance.now();
      defined.push(name);
      const d = await conn.defineXML(xml(name));
      await d.start();
      defineStart.push(performance.now() - t);
      const s = performance.now();
      await d.suspend();
      suspend.push(performance.now() - s);
      await removeAll();
    }
    let burstMs = 0;
    if (options.burst) {
      const names = Array.from({ length: options.burst }, (_, i) => `${prefix}-floor-burst-${i}`);
      const t = performance.now();
      await mapLimit(names, options.concurrency ?? 1, async (name) => {
        defined.push(name);
        const d = await conn.defineXML(xml(name));
        await d.start();
      });
      burstMs = performance.now() - t;
      await removeAll();
    }
    return {
      open,
      defineStart,
      suspend,
      burstMs,
      version: `${v.major}.${v.minor}.${v.release}`,
      domainType: options.domainType,
    };
  } finally {
    await removeAll();
    await conn.close();
  }
}

/**
 * Floors (d) and (e): a bare Deno process's RSS/PSS when idle, and its start-to-exit time,
 * with the V8 flags virtnode's processes run with.
 */
export async function denoFloor(
  startSamples: number,
): Promise<{ rss: number; pss?: number; startMs: number[] }> {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["eval", `--v8-flags=${V8_FLAGS}`, "await new Promise((r) => setTimeout(r, 30_000))"],
    stdin: "null",
    stdout: "null",
    stderr: "null",
  }).spawn();
  let mem;
  try {
    await sleep(1_500);
    mem = await pollUntil("a bare Deno process's memory", () => procMemory(child.pid), {
      timeoutMs: 5_000,
    });
  } finally {
    try {
      child.kill("SIGKILL");
    } catch { /* gone */ }
    await child.status;
  }
  const startMs: number[] = [];
  for (let i = 0; i < startSamples; i++) {
    const t = performance.now();
    await new Deno.Command(Deno.execPath(), {
      args: ["eval", `--v8-flags=${V8_FLAGS}`, "0"],
      stdin: "null",
      stdout: "null",
      stderr: "null",
    }).output();
    startMs.push(performance.now() - t);
  }
  return { rss: mem.rss, pss: mem.pss, startMs };
}

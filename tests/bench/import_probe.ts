/**
 * Prints this process's memory after importing the module specifiers given as arguments
 * (e.g. `deno run -A tests/bench/import_probe.ts @grpc/grpc-js`): RSS, anonymous and file
 * RSS, PSS and V8's heap, in MB. With no arguments it shows the bare-Deno floor.
 *
 * @module
 */

function field(text: string, key: string): number {
  const m = new RegExp(`^${key}:\\s+(\\d+) kB`, "m").exec(text);
  return m ? Number(m[1]) / 1024 : NaN;
}

/** Memory figures of a process in MB, from /proc. */
export function procMemory(pid: number | "self" = "self") {
  const status = Deno.readTextFileSync(`/proc/${pid}/status`);
  const rollup = Deno.readTextFileSync(`/proc/${pid}/smaps_rollup`);
  return {
    rss: field(status, "VmRSS"),
    anon: field(status, "RssAnon"),
    file: field(status, "RssFile"),
    pss: field(rollup, "Pss"),
    threads: Number(/^Threads:\s+(\d+)/m.exec(status)?.[1]),
  };
}

if (import.meta.main) {
  for (const spec of Deno.args) {
    const resolved = spec.startsWith(".") ? new URL(spec, `file://${Deno.cwd()}/`).href : spec;
    await import(resolved);
  }
  // Let lazy initialisation and GC settle like an idle process would.
  await new Promise((r) => setTimeout(r, 1500));
  const m = procMemory();
  const heap = Deno.memoryUsage();
  console.log(JSON.stringify({
    modules: Deno.args,
    ...Object.fromEntries(Object.entries(m).map(([k, v]) => [k, Math.round(v * 10) / 10])),
    heapUsed: Math.round(heap.heapUsed / 1e5) / 10,
    heapTotal: Math.round(heap.heapTotal / 1e5) / 10,
    external: Math.round(heap.external / 1e5) / 10,
  }));
}

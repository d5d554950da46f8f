/**
 * Linux CPU lists (`0-3,8,10-11`), the form sysfs, `/proc/<pid>/status` and libvirt's
 * `cpuset` attributes write CPU sets in.
 *
 * @module
 */

/** A CPU list as ascending, distinct numbers; throws on anything else. */
export function parseCpuList(list: string): number[] {
  const out = new Set<number>();
  for (const raw of list.trim().split(",")) {
    const part = raw.trim();
    if (part === "") continue;
    const m = /^(\d+)(?:-(\d+))?$/.exec(part);
    const first = Number(m?.[1]);
    const last = m?.[2] === undefined ? first : Number(m[2]);
    if (!m || last < first) throw new Error(`Cannot read the CPU list "${list.trim()}"`);
    for (let cpu = first; cpu <= last; cpu++) out.add(cpu);
  }
  return [...out].sort((a, b) => a - b);
}

/** Numbers as the shortest CPU list (`0-2,5`). */
export function formatCpuList(cpus: Iterable<number>): string {
  const sorted = [...new Set(cpus)].sort((a, b) => a - b);
  const parts: string[] = [];
  for (let i = 0; i < sorted.length;) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j] + 1) j++;
    parts.push(j === i ? `${sorted[i]}` : `${sorted[i]}-${sorted[j]}`);
    i = j + 1;
  }
  return parts.join(",");
}

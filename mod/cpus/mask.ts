/**
 * KubeVirt's realtime vCPU mask (`spec.domain.cpu.realtime.mask`), read as virt-handler
 * reads it (libvirt's vCPU set syntax): vCPUs and ranges add, `^n` takes one out wherever
 * it stands, and an empty mask selects every vCPU.
 *
 * @module
 */

/** Thrown for a mask that is not one. */
export class RealtimeMaskError extends Error {
  /** Creates the error with KubeVirt's words for the bad part. */
  constructor(message: string) {
    super(message);
    this.name = "RealtimeMaskError";
  }
}

/** Whether the mask selects a vCPU, as a function of its ID; throws {@linkcode RealtimeMaskError}. */
export function realtimeMask(mask: string | undefined): (vcpu: number) => boolean {
  if (mask === undefined || mask.trim() === "") return () => true;
  const added = new Set<number>();
  const removed = new Set<number>();
  for (const raw of mask.split(",")) {
    const part = raw.trim();
    const m = /^(\^)?(\d+)(?:-(\d+))?$/.exec(part);
    if (!m || (m[1] && m[3] !== undefined) || (m[3] !== undefined && Number(m[3]) < Number(m[2]))) {
      throw new RealtimeMaskError(`invalid mask value '${part}' in '${mask}'`);
    }
    const first = Number(m[2]);
    const last = m[3] === undefined ? first : Number(m[3]);
    for (let id = first; id <= last; id++) (m[1] ? removed : added).add(id);
  }
  return (vcpu) => added.has(vcpu) && !removed.has(vcpu);
}

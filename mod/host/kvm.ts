/**
 * Facts of the host the agent runs on that decide how guests run.
 *
 * @module
 */

/**
 * Whether guests can run under KVM here: `/dev/kvm` exists and a hardware KVM module
 * (`kvm_intel`, `kvm_amd`) drives it. Some nested hosts offer `/dev/kvm` through
 * `kvm-pvm` alone, which runs only guest kernels made for it: a BIOS guest stops there at
 * once with an emulation failure (the kernel logs "kvm-pvm: INTERNAL_ERROR in batch
 * emul"), so such a host emulates guests in software instead.
 */
export function kvmUsable(sysModules = "/sys/module", device = "/dev/kvm"): boolean {
  try {
    if (Deno.statSync(device).isCharDevice !== true) return false;
  } catch {
    return false;
  }
  return ["kvm_intel", "kvm_amd"].some((m) => {
    try {
      Deno.statSync(`${sysModules}/${m}`);
      return true;
    } catch {
      return false;
    }
  });
}

/**
 * The CPU features the example and test guests ask for beside their model.
 *
 * Nested KVM on some hosts cannot set the guest's IA32_ARCH_CAPABILITIES register (MSR
 * 0x10a): seen on an AMD EPYC machine of the kind this project runs on, where libvirt's
 * `host-model` and `host-passthrough` CPUs both include `arch-capabilities` and QEMU then
 * aborts at start ("failed to set MSR 0x10a"). These guests need none of it, so they turn
 * it off (KubeVirt's `spec.domain.cpu.features` with policy `disable`), which every host
 * accepts, KVM or software emulation. A production VMI on such a host needs the same line.
 *
 * @module
 */

/** `spec.domain.cpu.features` of the example and test guests. */
export const GUEST_CPU_FEATURES: { name: string; policy: string }[] = [
  { name: "arch-capabilities", policy: "disable" },
];

/**
 * A launcher's device rules under cgroup v2, where the devices controller is gone: a cgroup's
 * devices are allowed by an eBPF program of type `BPF_PROG_TYPE_CGROUP_DEVICE` attached to
 * it (the container runtime attaches one per container). Letting the launcher open a
 * hotplugged block device means replacing that program by one that allows the same set
 * plus the device, as KubeVirt's handler does: the set is KubeVirt's default rules for a
 * launcher (with the container runtime's usual character devices) and the block devices
 * handed to it; the program is generated here, one compare-and-allow block per rule.
 *
 * @module
 */
import {
  attachDeviceProgram,
  BPF_F_ALLOW_MULTI,
  BPF_F_REPLACE,
  close,
  detachDeviceProgram,
  deviceProgramFd,
  loadDeviceProgram,
  O_DIRECTORY,
  O_RDONLY,
  open,
  queryDevicePrograms,
} from "../../../ffi/mod.ts";

/** One allow rule: a device type, its numbers (`*` for any) and the access allowed. */
export interface DeviceRule {
  /** `b` block, `c` character, `a` either. */
  type: "a" | "b" | "c";
  /** The major number, or any. */
  major: number | "*";
  /** The minor number, or any. */
  minor: number | "*";
  /** A subset of `rwm`: read, write, mknod. */
  access: string;
}

/**
 * The rules every launcher gets: `/dev/null`, `zero`, `full`, `random`, `urandom`, `tty`,
 * `console`, `ptmx` and the pseudo-terminals, and the devices KubeVirt's device plugins give
 * a launcher (`/dev/kvm`, `/dev/net/tun`, `/dev/vhost-net`, `/dev/vhost-vsock`). As in
 * KubeVirt's rules, no mknod: the handler makes the launcher's device nodes from outside,
 * and a launcher that could make any node could point one at a host disk.
 */
export const LAUNCHER_DEVICE_RULES: readonly DeviceRule[] = [
  ...[3, 5, 7, 8, 9].map((minor) => ({ type: "c" as const, major: 1, minor, access: "rwm" })),
  ...[0, 1, 2].map((minor) => ({ type: "c" as const, major: 5, minor, access: "rwm" })),
  ...[232, 200, 238, 241].map((minor) => ({
    type: "c" as const,
    major: 10,
    minor,
    access: "rwm",
  })),
  ...Array.from({ length: 16 }, (_, i) => ({
    type: "c" as const,
    major: 136 + i,
    minor: "*" as const,
    access: "rwm",
  })),
];

// eBPF opcodes (linux/bpf.h), the few a device filter needs.
const LDX_MEM_W = 0x61;
const ALU32_AND_K = 0x54;
const ALU32_RSH_K = 0x74;
const ALU32_MOV_X = 0xbc;
const JNE_K = 0x55;
const JNE_X = 0x5d;
const ALU64_MOV_K = 0xb7;
const EXIT = 0x95;
// bpf_cgroup_dev_ctx.access_type: the type in the low 16 bits, the access above.
const DEV_BLOCK = 1;
const DEV_CHAR = 2;
const ACCESS_BITS: Record<string, number> = { m: 1, r: 2, w: 4 };

interface Insn {
  code: number;
  dst: number;
  src: number;
  off: number;
  imm: number;
}

const insn = (code: number, dst: number, src: number, off: number, imm: number): Insn => ({
  code,
  dst,
  src,
  off,
  imm,
});

/** The accesses of `rwm`-style text as the kernel's bits. */
function accessMask(access: string): number {
  let mask = 0;
  for (const ch of access) {
    const bit = ACCESS_BITS[ch];
    if (bit === undefined) throw new Error(`Cannot make a device rule: access "${access}"`);
    mask |= bit;
  }
  return mask;
}

/**
 * The program allowing exactly `rules` (anything else is denied), as instructions of 8
 * bytes: r2 = type, r3 = access, r4 = major, r5 = minor from the context; per rule, any
 * mismatch jumps to the next rule, a full match returns 1.
 */
export function deviceFilterProgram(rules: readonly DeviceRule[]): Uint8Array {
  const out: Insn[] = [
    insn(LDX_MEM_W, 2, 1, 0, 0),
    insn(ALU32_AND_K, 2, 0, 0, 0xffff),
    insn(LDX_MEM_W, 3, 1, 0, 0),
    insn(ALU32_RSH_K, 3, 0, 0, 16),
    insn(LDX_MEM_W, 4, 1, 4, 0),
    insn(LDX_MEM_W, 5, 1, 8, 0),
  ];
  for (const rule of rules) {
    // Jumps hold -1 until the block's length is known.
    const block: Insn[] = [];
    if (rule.type !== "a") {
      block.push(insn(JNE_K, 2, 0, -1, rule.type === "b" ? DEV_BLOCK : DEV_CHAR));
    }
    const mask = accessMask(rule.access);
    if (mask !== 7) {
      // Allowed only when every access asked for is in the rule's.
      block.push(insn(ALU32_MOV_X, 1, 3, 0, 0), insn(ALU32_AND_K, 1, 0, 0, mask));
      block.push(insn(JNE_X, 1, 3, -1, 0));
    }
    if (rule.major !== "*") block.push(insn(JNE_K, 4, 0, -1, rule.major));
    if (rule.minor !== "*") block.push(insn(JNE_K, 5, 0, -1, rule.minor));
    block.push(insn(ALU64_MOV_K, 0, 0, 0, 1), insn(EXIT, 0, 0, 0, 0));
    block.forEach((ins, i) => {
      if (ins.off === -1) ins.off = block.length - i - 1;
    });
    out.push(...block);
  }
  out.push(insn(ALU64_MOV_K, 0, 0, 0, 0), insn(EXIT, 0, 0, 0, 0));
  const bytes = new Uint8Array(out.length * 8);
  const view = new DataView(bytes.buffer);
  out.forEach((ins, i) => {
    view.setUint8(8 * i, ins.code);
    view.setUint8(8 * i + 1, (ins.src << 4) | ins.dst);
    view.setInt16(8 * i + 2, ins.off, true);
    view.setInt32(8 * i + 4, ins.imm, true);
  });
  return bytes;
}

/**
 * Makes `rules` the device rules of the cgroup v2 directory `cgroupDir`: a program of
 * them replaces the one attached there (at once where the kernel can, `BPF_F_REPLACE`), or
 * is attached where none is. Programs of other attach modes are replaced the way they were
 * attached.
 */
export function setDeviceRules(cgroupDir: string, rules: readonly DeviceRule[]): void {
  const cgroupFd = open(cgroupDir, O_RDONLY | O_DIRECTORY);
  try {
    const programFd = loadDeviceProgram(deviceFilterProgram(rules));
    try {
      const { ids, flags } = queryDevicePrograms(cgroupFd);
      if (ids.length === 0) {
        attachDeviceProgram(cgroupFd, programFd, { flags: BPF_F_ALLOW_MULTI });
      } else if ((flags & BPF_F_ALLOW_MULTI) === 0) {
        // A single program attached without ALLOW_MULTI: attaching another replaces it.
        attachDeviceProgram(cgroupFd, programFd, { flags });
      } else {
        const old = ids.map((id) => deviceProgramFd(id));
        try {
          attachDeviceProgram(cgroupFd, programFd, {
            flags: BPF_F_ALLOW_MULTI | BPF_F_REPLACE,
            replaceFd: old[0],
          });
          // More than one (not a runtime's layout): each must allow, so the rest go too.
          for (const fd of old.slice(1)) detachDeviceProgram(cgroupFd, fd);
        } finally {
          for (const fd of old) close(fd);
        }
      }
    } finally {
      close(programFd);
    }
  } finally {
    close(cgroupFd);
  }
}

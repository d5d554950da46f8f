/**
 * cgroup v2 device programs: loading an eBPF program of type `BPF_PROG_TYPE_CGROUP_DEVICE`,
 * listing the ones a cgroup has, and attaching, replacing and detaching them (`bpf(2)`), for
 * the device rules of a launcher with no v1 devices cgroup. Failures throw
 * {@linkcode ErrnoError}.
 *
 * @module
 */

import { ErrnoError } from "./errors.ts";
import { c, check, cpath } from "./_libc.ts";

const SYS_BPF_X86_64 = 321;
const BPF_PROG_LOAD = 5;
const BPF_PROG_ATTACH = 8;
const BPF_PROG_DETACH = 9;
const BPF_PROG_GET_FD_BY_ID = 13;
const BPF_PROG_QUERY = 16;
const BPF_PROG_TYPE_CGROUP_DEVICE = 15;
/** `BPF_CGROUP_DEVICE`: the attach type of device programs. */
const BPF_CGROUP_DEVICE = 6;
/** `BPF_F_ALLOW_MULTI`: programs of descendants run too, each must allow. */
export const BPF_F_ALLOW_MULTI = 1 << 1;
/** `BPF_F_REPLACE`: the attach replaces the program named by its `replace_bpf_fd`. */
export const BPF_F_REPLACE = 1 << 2;
/** The size of `union bpf_attr` passed (the kernel checks the rest is zero). */
const BPF_ATTR_SIZE = 128;

function bpf(cmd: number, attr: Uint8Array<ArrayBuffer>, action: string): number {
  const rc = c().bpf(BigInt(SYS_BPF_X86_64), BigInt(cmd), attr, BigInt(attr.byteLength));
  return check(Number(rc), action);
}

/** Holds buffers whose addresses a call was given until the call is over. */
function keepAlive(..._buffers: Uint8Array[]): void {}

function pointerOf(buf: Uint8Array<ArrayBuffer>): bigint {
  return BigInt(Deno.UnsafePointer.value(Deno.UnsafePointer.of(buf)));
}

/**
 * Loads a cgroup device program (`BPF_PROG_LOAD`, `BPF_PROG_TYPE_CGROUP_DEVICE`) of
 * `instructions` (8 bytes each); returns its descriptor. A program the verifier refuses is
 * loaded once more with its log, which the error then carries (a log asked for always could
 * fill up, ENOSPC, on a long program the verifier accepts).
 */
export function loadDeviceProgram(instructions: Uint8Array): number {
  const insns = new Uint8Array(instructions);
  const license = cpath("Apache-2.0");
  const load = (log?: Uint8Array<ArrayBuffer>) => {
    const attr = new Uint8Array(BPF_ATTR_SIZE);
    const view = new DataView(attr.buffer);
    view.setUint32(0, BPF_PROG_TYPE_CGROUP_DEVICE, true);
    view.setUint32(4, insns.byteLength / 8, true);
    view.setBigUint64(8, pointerOf(insns), true);
    view.setBigUint64(16, pointerOf(license), true);
    if (log) {
      view.setUint32(24, 1, true); // log_level
      view.setUint32(28, log.byteLength, true);
      view.setBigUint64(32, pointerOf(log), true);
    }
    view.setUint32(68, BPF_CGROUP_DEVICE, true); // expected_attach_type
    try {
      return bpf(BPF_PROG_LOAD, attr, "Cannot load a cgroup device program");
    } finally {
      keepAlive(insns, license, ...(log ? [log] : []));
    }
  };
  try {
    return load();
  } catch (error) {
    if (!(error instanceof ErrnoError) || error.code !== "EACCES" && error.code !== "EINVAL") {
      throw error;
    }
    const log = new Uint8Array(65_536);
    try {
      return load(log);
    } catch (again) {
      const text = new TextDecoder().decode(log.subarray(0, log.indexOf(0))).trim();
      if (again instanceof ErrnoError && text) {
        throw new ErrnoError(
          `${again.action}: ${text.slice(-2000)}`,
          again.errno,
          again.description,
        );
      }
      throw again;
    }
  }
}

/** The device programs attached to the cgroup `cgroupFd` and their attach flags (`BPF_PROG_QUERY`). */
export function queryDevicePrograms(cgroupFd: number): { ids: number[]; flags: number } {
  const ids = new Uint32Array(64);
  const attr = new Uint8Array(BPF_ATTR_SIZE);
  const view = new DataView(attr.buffer);
  view.setUint32(0, cgroupFd, true);
  view.setUint32(4, BPF_CGROUP_DEVICE, true);
  view.setUint32(24, ids.length, true);
  const idBytes = new Uint8Array(ids.buffer);
  view.setBigUint64(16, pointerOf(idBytes), true);
  bpf(BPF_PROG_QUERY, attr, "Cannot list the cgroup's device programs");
  keepAlive(idBytes);
  const count = view.getUint32(24, true);
  return { ids: [...ids.subarray(0, count)], flags: view.getUint32(12, true) };
}

/** A descriptor of the loaded program `id` (`BPF_PROG_GET_FD_BY_ID`). */
export function deviceProgramFd(id: number): number {
  const attr = new Uint8Array(BPF_ATTR_SIZE);
  new DataView(attr.buffer).setUint32(0, id, true);
  return bpf(BPF_PROG_GET_FD_BY_ID, attr, `Cannot open device program ${id}`);
}

/**
 * Attaches the device program `programFd` to the cgroup `cgroupFd` (`BPF_PROG_ATTACH`) with
 * `flags`; with {@linkcode BPF_F_REPLACE}, in place of the program `replaceFd`, at once.
 */
export function attachDeviceProgram(
  cgroupFd: number,
  programFd: number,
  options: { flags: number; replaceFd?: number },
): void {
  const attr = new Uint8Array(BPF_ATTR_SIZE);
  const view = new DataView(attr.buffer);
  view.setUint32(0, cgroupFd, true);
  view.setUint32(4, programFd, true);
  view.setUint32(8, BPF_CGROUP_DEVICE, true);
  view.setUint32(12, options.flags, true);
  view.setUint32(16, options.replaceFd ?? 0, true);
  bpf(BPF_PROG_ATTACH, attr, "Cannot attach a device program to the cgroup");
}

/** Detaches the device program `programFd` from the cgroup `cgroupFd` (`BPF_PROG_DETACH`). */
export function detachDeviceProgram(cgroupFd: number, programFd: number): void {
  const attr = new Uint8Array(BPF_ATTR_SIZE);
  const view = new DataView(attr.buffer);
  view.setUint32(0, cgroupFd, true);
  view.setUint32(4, programFd, true);
  view.setUint32(8, BPF_CGROUP_DEVICE, true);
  bpf(BPF_PROG_DETACH, attr, "Cannot detach a device program from the cgroup");
}

/**
 * QEMU as a user other than root (KubeVirt's images run it as 107): libvirt's DAC driver
 * hands each disk, ISO and NVRAM file to that user when the domain starts, but the folders
 * on the way to them, the VMI's own folders (where QEMU makes its console and VNC sockets)
 * and `/dev/kvm` are the launcher's to prepare, as KubeVirt's non-root mode prepares them.
 *
 * @module
 */
import { dirname } from "node:path";
import { grantUserAccess, modeAllows } from "../host/mod.ts";
import { getLogger } from "../log/mod.ts";

const log = getLogger("launcher", "qemu-user");

/** The user and group QEMU runs as. */
export interface QemuUser {
  /** Its uid. */
  uid: number;
  /** Its primary gid. */
  gid: number;
}

/**
 * The user libvirt runs QEMU as, from its host capabilities: the DAC security model's base
 * label (`+107:+107`). Undefined when libvirt names none (QEMU as libvirt's own user).
 */
export function qemuUserOfCapabilities(capabilitiesXml: string): QemuUser | undefined {
  for (const secmodel of capabilitiesXml.matchAll(/<secmodel>([\s\S]*?)<\/secmodel>/g)) {
    if (!/<model>dac<\/model>/.test(secmodel[1])) continue;
    const label = /<baselabel type='(?:kvm|qemu)'>\+?(\d+):\+?(\d+)<\/baselabel>/.exec(secmodel[1]);
    if (label) return { uid: Number(label[1]), gid: Number(label[2]) };
  }
  return undefined;
}

/** Lets `user` search every folder above `path` (an ACL entry where the mode does not). */
function grantSearchAbove(path: string, user: QemuUser): void {
  // The folders QEMU passes through are those of the real path (a symlink on the way is
  // followed by QEMU too, and is not what gets the entry).
  for (let dir = dirname(Deno.realPathSync(path));; dir = dirname(dir)) {
    const info = Deno.statSync(dir);
    if (!modeAllows(info, user.uid, user.gid, 1) && grantUserAccess(dir, user, 1)) {
      log.info("QEMU's user may search a folder above its files", { path: dir, uid: user.uid });
    }
    if (dir === "/") return;
  }
}

/**
 * Prepares a VMI's folders for QEMU's `user`: each becomes the user's group's, `writable`
 * ones open to that group (QEMU makes its console and VNC sockets in the run folder) and
 * `readable` ones searchable and readable only (in the disk folder libvirt hands QEMU each
 * file; another VM's QEMU, the same user, must not add or remove files there); every
 * folder above them and above `files` (a containerDisk's stored image) lets the user
 * search. Nothing for root.
 */
export function prepareForQemuUser(
  user: QemuUser | undefined,
  paths: { writable: readonly string[]; readable: readonly string[]; files?: readonly string[] },
): void {
  if (!user || user.uid === 0) return;
  const prepare = (dir: string, mode: number) => {
    const info = Deno.lstatSync(dir);
    if (!info.isDirectory) throw new Error(`Cannot prepare "${dir}" for QEMU: not a folder`);
    if (info.gid !== user.gid) Deno.chownSync(dir, null, user.gid);
    if (((info.mode ?? 0) & 0o777) !== mode) Deno.chmodSync(dir, mode);
    grantSearchAbove(dir, user);
  };
  for (const dir of paths.writable) prepare(dir, 0o770);
  for (const dir of paths.readable) prepare(dir, 0o750);
  for (const file of paths.files ?? []) grantSearchAbove(file, user);
}

/**
 * Lets QEMU's `user` search every folder above each of `files` (the disks, ISOs and NVRAM
 * a conversion prepared, in folders of their own): libvirt hands the files themselves to
 * that user, not the folders on the way. Nothing for root.
 */
export function letQemuReach(user: QemuUser | undefined, files: readonly string[]): void {
  if (!user || user.uid === 0) return;
  for (const file of files) grantSearchAbove(file, user);
}

/**
 * Lets QEMU's `user` open `/dev/kvm` (read and write) by an ACL entry, where the device's
 * mode keeps it out: without it a guest of that user cannot use KVM. Nothing for root,
 * or on a host without the device.
 */
export function grantKvm(user: QemuUser | undefined, device = "/dev/kvm"): void {
  if (!user || user.uid === 0) return;
  try {
    Deno.lstatSync(device);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return;
    throw error;
  }
  if (grantUserAccess(device, user, 6)) {
    log.info("QEMU's user may use KVM", { device, uid: user.uid });
  }
}

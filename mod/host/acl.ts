/**
 * Access for QEMU's user on the host, given as one POSIX ACL entry (`user:<uid>:<perm>`)
 * added to a file's access ACL: nobody else gains anything, the file's owner, group and
 * mode stay as they are (a pod-less host's `/dev/kvm`, or a folder on the way to a VM's
 * disks). The ACL is read and written as the kernel's `system.posix_acl_access` attribute.
 *
 * @module
 */
import { getXattrBytes, setXattrBytes } from "../../ffi/mod.ts";

const ACL_ATTR = "system.posix_acl_access";
const ACL_VERSION = 2;
const USER_OBJ = 0x01;
const USER = 0x02;
const GROUP_OBJ = 0x04;
const GROUP = 0x08;
const MASK = 0x10;
const OTHER = 0x20;
const UNDEFINED_ID = 0xffffffff;

/** One ACL entry: its tag, its permission bits (r=4, w=2, x=1) and the user or group it names. */
export interface AclEntry {
  /** `ACL_USER_OBJ`, `ACL_USER`, `ACL_GROUP_OBJ`, `ACL_GROUP`, `ACL_MASK` or `ACL_OTHER`. */
  tag: number;
  /** Permission bits. */
  perm: number;
  /** The uid or gid of a USER or GROUP entry. */
  id: number;
}

/** The entries of an ACL attribute's bytes. */
export function decodeAcl(bytes: Uint8Array): AclEntry[] {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (bytes.byteLength < 4 || view.getUint32(0, true) !== ACL_VERSION) {
    throw new Error("Cannot read an ACL: not a version 2 ACL");
  }
  const entries: AclEntry[] = [];
  for (let at = 4; at + 8 <= bytes.byteLength; at += 8) {
    entries.push({
      tag: view.getUint16(at, true),
      perm: view.getUint16(at + 2, true),
      id: view.getUint32(at + 4, true),
    });
  }
  return entries;
}

/** An ACL attribute's bytes, its entries in the order the kernel wants (by tag, then id). */
export function encodeAcl(entries: readonly AclEntry[]): Uint8Array {
  const sorted = [...entries].sort((a, b) => a.tag - b.tag || a.id - b.id);
  const bytes = new Uint8Array(4 + 8 * sorted.length);
  const view = new DataView(bytes.buffer);
  view.setUint32(0, ACL_VERSION, true);
  sorted.forEach((e, i) => {
    view.setUint16(4 + 8 * i, e.tag, true);
    view.setUint16(6 + 8 * i, e.perm, true);
    view.setUint32(8 + 8 * i, e.tag === USER || e.tag === GROUP ? e.id : UNDEFINED_ID, true);
  });
  return bytes;
}

/** The ACL a plain mode stands for: owner, group, other. */
function aclOfMode(mode: number): AclEntry[] {
  return [
    { tag: USER_OBJ, perm: (mode >> 6) & 7, id: UNDEFINED_ID },
    { tag: GROUP_OBJ, perm: (mode >> 3) & 7, id: UNDEFINED_ID },
    { tag: OTHER, perm: mode & 7, id: UNDEFINED_ID },
  ];
}

/**
 * The ACL with `perm` granted to user `uid`: its USER entry gets the bits it lacked, and the
 * mask (made from the group's bits when the ACL had none) lets them through. Undefined when
 * the ACL grants them already.
 */
export function withUserAccess(
  entries: readonly AclEntry[],
  uid: number,
  perm: number,
): AclEntry[] | undefined {
  const user = entries.find((e) => e.tag === USER && e.id === uid);
  const mask = entries.find((e) => e.tag === MASK);
  if (user && (user.perm & perm) === perm && mask && (mask.perm & perm) === perm) {
    return undefined;
  }
  const next = entries.filter((e) => e !== user && e !== mask);
  next.push({ tag: USER, perm: (user?.perm ?? 0) | perm, id: uid });
  const others = entries.filter((e) =>
    e.tag === GROUP_OBJ || e.tag === GROUP || (e.tag === USER && e !== user)
  ).reduce((bits, e) => bits | e.perm, 0);
  // The mask limits every entry of the group class: widening it past the ACL's own mask
  // would widen another entry's access too, which is refused.
  if (mask && (perm & ~mask.perm & others) !== 0) {
    throw new Error(
      `Cannot grant user ${uid} access by ACL: the mask would let other entries through too`,
    );
  }
  next.push({ tag: MASK, perm: (mask?.perm ?? others) | perm, id: UNDEFINED_ID });
  return next;
}

/** Whether `uid` (primary group `gid`) has the `perm` bits on a file of this mode and owner. */
export function modeAllows(info: Deno.FileInfo, uid: number, gid: number, perm: number): boolean {
  const mode = info.mode ?? 0;
  if (info.uid === uid) return ((mode >> 6) & perm) === perm;
  if (info.gid === gid) return ((mode >> 3) & perm) === perm;
  return (mode & perm) === perm;
}

/**
 * Gives user `uid` the `perm` bits on `path` itself (no final symlink followed) by an ACL
 * entry, unless its mode or ACL lets that user (with primary group `gid`) in already.
 * Returns whether the ACL changed.
 */
export function grantUserAccess(
  path: string,
  ids: { uid: number; gid: number },
  perm: number,
): boolean {
  const info = Deno.lstatSync(path);
  if (info.isSymlink) throw new Error(`Cannot grant access to "${path}": it is a symbolic link`);
  const existing = getXattrBytes(path, ACL_ATTR);
  if (!existing && modeAllows(info, ids.uid, ids.gid, perm)) return false;
  const entries = existing ? decodeAcl(existing) : aclOfMode(info.mode ?? 0);
  const next = withUserAccess(entries, ids.uid, perm);
  if (!next) return false;
  setXattrBytes(path, ACL_ATTR, encodeAcl(next));
  return true;
}

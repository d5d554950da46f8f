import assert from "node:assert/strict";
import { getXattrBytes } from "../../ffi/mod.ts";
import {
  decodeAcl,
  encodeAcl,
  grantUserAccess,
  modeAllows,
  withUserAccess,
} from "../../mod/host/mod.ts";
import { prepareForQemuUser, qemuUserOfCapabilities } from "../../mod/launcher/testing.ts";

const U = 0xffffffff;

Deno.test("encodeAcl() writes the kernel's version 2 layout, sorted, and decodeAcl() reads it back", () => {
  // Entries are sorted by tag, then by id.
  const entries = [
    { tag: 0x20, perm: 0, id: U },
    { tag: 0x02, perm: 6, id: 107 },
    { tag: 0x01, perm: 6, id: U },
    { tag: 0x10, perm: 6, id: U },
    { tag: 0x04, perm: 0, id: U },
  ];
  const bytes = encodeAcl(entries);
  assert.equal(
    Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join(""),
    "02000000" + "01000600ffffffff" + "020006006b000000" + "04000000ffffffff" +
      "10000600ffffffff" + "20000000ffffffff",
  );
  assert.deepEqual(decodeAcl(bytes).map((e) => e.tag), [1, 2, 4, 16, 32]);
  assert.throws(() => decodeAcl(new Uint8Array([1, 0, 0, 0])), /not a version 2 ACL/);
});

Deno.test("withUserAccess() adds the user's bits and a mask letting them through, unless granted already", () => {
  // Access granted already changes nothing.
  const plain = [{ tag: 1, perm: 6, id: U }, { tag: 4, perm: 4, id: U }, {
    tag: 0x20,
    perm: 0,
    id: U,
  }];
  const granted = withUserAccess(plain, 107, 6)!;
  assert.deepEqual(granted.find((e) => e.tag === 2), { tag: 2, perm: 6, id: 107 });
  assert.deepEqual(granted.find((e) => e.tag === 0x10), { tag: 0x10, perm: 6, id: U });
  assert.equal(granted.find((e) => e.tag === 4)!.perm, 4, "the owning group keeps its bits");
  assert.equal(withUserAccess(granted, 107, 6), undefined);
  const more = withUserAccess(granted, 107, 1)!;
  assert.equal(more.find((e) => e.tag === 2)!.perm, 7);
  // A mask that holds another entry back is not widened for us.
  const held = [
    { tag: 1, perm: 6, id: U },
    { tag: 8, perm: 6, id: 50 },
    { tag: 4, perm: 0, id: U },
    { tag: 0x10, perm: 4, id: U },
    { tag: 0x20, perm: 0, id: U },
  ];
  assert.throws(() => withUserAccess(held, 107, 6), /mask would let other entries through/);
  assert.ok(withUserAccess(held, 107, 4), "what the mask lets through already is fine");
});

Deno.test("grantUserAccess() lets only that user in by an ACL entry and refuses a symlink", async () => {
  // The file's owner and group stay as they were.
  const dir = await Deno.makeTempDir();
  try {
    const file = `${dir}/f`;
    await Deno.writeTextFile(file, "");
    await Deno.chmod(file, 0o600);
    assert.equal(grantUserAccess(file, { uid: 107, gid: 107 }, 6), true);
    const acl = decodeAcl(getXattrBytes(file, "system.posix_acl_access")!);
    assert.ok(acl.some((e) => e.tag === 2 && e.id === 107 && e.perm === 6));
    assert.equal(acl.find((e) => e.tag === 4)!.perm, 0);
    assert.equal(acl.find((e) => e.tag === 0x20)!.perm, 0);
    assert.equal(grantUserAccess(file, { uid: 107, gid: 107 }, 6), false, "once is enough");
    const open = `${dir}/open`;
    await Deno.writeTextFile(open, "");
    await Deno.chmod(open, 0o666);
    assert.equal(grantUserAccess(open, { uid: 107, gid: 107 }, 6), false, "the mode lets it in");
    assert.equal(getXattrBytes(open, "system.posix_acl_access"), undefined);
    await Deno.symlink(file, `${dir}/link`);
    assert.throws(() => grantUserAccess(`${dir}/link`, { uid: 107, gid: 107 }, 6), /symbolic link/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("modeAllows() reads the owner's, the group's or the others' bits, as the kernel picks them", () => {
  const info = (mode: number, uid: number, gid: number) => ({ mode, uid, gid }) as Deno.FileInfo;
  assert.equal(modeAllows(info(0o700, 107, 0), 107, 107, 1), true);
  assert.equal(modeAllows(info(0o070, 107, 107), 107, 107, 1), false, "the owner's bits decide");
  assert.equal(modeAllows(info(0o750, 0, 107), 107, 107, 1), true);
  assert.equal(modeAllows(info(0o701, 0, 0), 107, 107, 1), true);
  assert.equal(modeAllows(info(0o770, 0, 0), 107, 107, 1), false);
});

Deno.test("qemuUserOfCapabilities() reads the DAC base label libvirt runs QEMU with", () => {
  const caps = (label: string) =>
    `<capabilities><host><secmodel><model>none</model><doi>0</doi></secmodel>` +
    `<secmodel><model>dac</model><doi>0</doi><baselabel type='kvm'>${label}</baselabel>` +
    `<baselabel type='qemu'>${label}</baselabel></secmodel></host></capabilities>`;
  assert.deepEqual(qemuUserOfCapabilities(caps("+107:+107")), { uid: 107, gid: 107 });
  assert.deepEqual(qemuUserOfCapabilities(caps("+0:+0")), { uid: 0, gid: 0 });
  assert.equal(qemuUserOfCapabilities("<capabilities><host/></capabilities>"), undefined);
});

Deno.test("prepareForQemuUser() gives the VMI's folders to QEMU's group, with search on the folders above", async () => {
  // When QEMU runs as root it does nothing.
  const top = await Deno.makeTempDir(); // 0700, as a temporary directory is
  try {
    const run = `${top}/a/run`;
    await Deno.mkdir(run, { recursive: true, mode: 0o750 });
    await Deno.chmod(`${top}/a`, 0o700);
    const disks = `${top}/a/disks`;
    await Deno.mkdir(disks, { mode: 0o750 });
    prepareForQemuUser({ uid: 0, gid: 0 }, { writable: [run], readable: [disks] });
    assert.equal(Deno.statSync(run).mode! & 0o777, 0o750, "root: untouched");
    prepareForQemuUser({ uid: 107, gid: 107 }, { writable: [run], readable: [disks] });
    const info = Deno.statSync(run);
    assert.deepEqual([info.gid, info.mode! & 0o777], [107, 0o770]);
    const disksInfo = Deno.statSync(disks);
    assert.deepEqual([disksInfo.gid, disksInfo.mode! & 0o777], [107, 0o750], "no writes there");
    for (const above of [`${top}/a`, top]) {
      const acl = decodeAcl(getXattrBytes(above, "system.posix_acl_access")!);
      assert.ok(acl.some((e) => e.tag === 2 && e.id === 107 && (e.perm & 1) === 1), above);
    }
    assert.equal(
      getXattrBytes("/tmp", "system.posix_acl_access"),
      undefined,
      "/tmp lets all search",
    );
  } finally {
    await Deno.remove(top, { recursive: true });
  }
});

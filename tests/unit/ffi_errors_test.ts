/** Pure parts of the FFI layer: error messages, names and version parsing. */

import assert from "node:assert/strict";
import {
  domainStateInfo,
  ErrnoError,
  LibvirtError,
  LibvirtLoadError,
  parseLibvirtVersion,
} from "../../ffi/mod.ts";

Deno.test("LibvirtError names the action, then libvirt's message, and keeps the fields", () => {
  const cause = new Error("inner");
  const e = new LibvirtError(
    'Cannot start domain "vm1"',
    { code: 42, domain: 10, level: 2, message: "Domain not found" },
    { cause },
  );
  assert.equal(e.message, 'Cannot start domain "vm1": libvirt: Domain not found');
  assert.equal(e.codeName, "VIR_ERR_NO_DOMAIN");
  assert.deepEqual([e.code, e.domain, e.level], [42, 10, 2]);
  assert.equal(e.cause, cause);
  assert.equal(e.name, "LibvirtError");
});

Deno.test("LibvirtLoadError names the library and the Debian package", () => {
  const e = new LibvirtLoadError("libvirt.so.0", "libvirt0", new Error("no such file"));
  assert.equal(
    e.message,
    'Cannot load libvirt.so.0: install the Debian package "libvirt0": no such file',
  );
});

Deno.test("ErrnoError carries the errno name and the action", () => {
  const e = new ErrnoError(
    'Cannot open "x" beneath its root',
    40,
    "Too many levels of symbolic links",
  );
  assert.equal(e.code, "ELOOP");
  assert.equal(
    e.message,
    'Cannot open "x" beneath its root: ELOOP: Too many levels of symbolic links',
  );
  assert.equal(new ErrnoError("a", 999, "b").code, "E999");
});

Deno.test("domainStateInfo() names states and reasons, and tolerates unknown numbers", () => {
  assert.deepEqual(domainStateInfo(5, 2), {
    state: 5,
    reason: 2,
    stateName: "Shutoff",
    reasonName: "Destroyed",
  });
  assert.equal(domainStateInfo(3, 5).reasonName, "IOError");
  assert.equal(domainStateInfo(42, 0).stateName, "Unknown(42)");
});

Deno.test("parseLibvirtVersion() splits libvirt's encoding", () => {
  assert.deepEqual(parseLibvirtVersion(9_000_000), {
    major: 9,
    minor: 0,
    release: 0,
    raw: 9_000_000,
  });
  assert.deepEqual(parseLibvirtVersion(7_002_001), {
    major: 7,
    minor: 2,
    release: 1,
    raw: 7_002_001,
  });
});

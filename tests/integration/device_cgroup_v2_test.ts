/**
 * cgroup v2 device rules with the kernel itself: a cgroup of the machine's cgroup2
 * hierarchy (the unified one of a hybrid host, or the only one), a device program attached
 * to it the way a container runtime attaches one, and processes inside it trying to open
 * devices. The handler's program replaces the runtime's (one program attached before and
 * after) and lets exactly its rules through.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  attachDeviceProgram,
  close,
  loadDeviceProgram,
  O_DIRECTORY,
  O_RDONLY,
  open,
  queryDevicePrograms,
} from "../../ffi/mod.ts";
import {
  deviceFilterProgram,
  LAUNCHER_DEVICE_RULES,
  setDeviceRules,
} from "../../mod/handler/testing.ts";
import { runText as run } from "../helpers/command.ts";

/** Where the machine mounts cgroup2 (from the mount table). */
function cgroup2Mount(): string {
  for (const line of Deno.readTextFileSync("/proc/self/mountinfo").split("\n")) {
    const [left, right] = line.split(" - ");
    if (right?.startsWith("cgroup2 ")) return left.split(" ")[4];
  }
  throw new Error("this machine mounts no cgroup2 hierarchy (checked /proc/self/mountinfo)");
}

/** Whether a process that joins `cgroup` first may open `device` for reading, or writing. */
async function opens(cgroup: string, device: string, mode: "<" | ">" = "<"): Promise<boolean> {
  const out = await new Deno.Command("sh", {
    args: ["-c", `echo $$ > '${cgroup}/cgroup.procs' && exec 3${mode}'${device}'`],
    stdout: "null",
    stderr: "piped",
  }).output();
  const stderr = new TextDecoder().decode(out.stderr);
  if (!out.success && !/Operation not permitted/.test(stderr)) {
    throw new Error(`opening ${device} failed otherwise: ${stderr}`);
  }
  return out.success;
}

function programCount(cgroup: string): number {
  const fd = open(cgroup, O_RDONLY | O_DIRECTORY);
  try {
    return queryDevicePrograms(fd).ids.length;
  } finally {
    close(fd);
  }
}

Deno.test("deviceFilterProgram() is one compare block per rule between a prologue and a deny", () => {
  const insns = (bytes: Uint8Array) => bytes.length / 8;
  assert.equal(insns(deviceFilterProgram([])), 6 + 2);
  // Type, major, minor and the return of an rwm rule; access adds three.
  assert.equal(insns(deviceFilterProgram([{ type: "b", major: 7, minor: 1, access: "rwm" }])), 13);
  assert.equal(insns(deviceFilterProgram([{ type: "c", major: 1, minor: 5, access: "r" }])), 16);
  assert.throws(
    () => deviceFilterProgram([{ type: "c", major: 1, minor: 5, access: "x" }]),
    /access "x"/,
  );
});

Deno.test("setDeviceRules() replaces a cgroup's device program and the kernel lets exactly its rules through", async () => {
  const cgroup = join(cgroup2Mount(), `virtnode-test-${crypto.randomUUID().slice(0, 8)}`);
  await Deno.mkdir(cgroup);
  const backing = await Deno.makeTempFile({ prefix: "virtnode-blk-" });
  let loop: string | undefined;
  try {
    await run("truncate", "-s", "1M", backing);
    loop = (await run("losetup", "--find", "--show", backing)).trim();
    const rdev = BigInt(Deno.statSync(loop).rdev!);
    const major = Number(((rdev >> 8n) & 0xfffn) | ((rdev >> 32n) & ~0xfffn));
    const minor = Number((rdev & 0xffn) | ((rdev >> 12n) & ~0xffn));
    // As a container runtime may leave it: one program, /dev/null only, attached without
    // ALLOW_MULTI (the old way; runc's is ALLOW_MULTI, which the later steps replace).
    const first = loadDeviceProgram(
      deviceFilterProgram([{ type: "c", major: 1, minor: 3, access: "rwm" }]),
    );
    const cgroupFd = open(cgroup, O_RDONLY | O_DIRECTORY);
    try {
      attachDeviceProgram(cgroupFd, first, { flags: 0 });
    } finally {
      close(cgroupFd);
      close(first);
    }
    assert.equal(programCount(cgroup), 1);
    assert.equal(await opens(cgroup, "/dev/null"), true);
    assert.equal(await opens(cgroup, loop), false, "the block device is shut out");
    assert.equal(await opens(cgroup, "/dev/zero"), false);

    // Replacing one attached without ALLOW_MULTI keeps it that way: still one program.
    setDeviceRules(cgroup, [{ type: "c", major: 1, minor: 3, access: "rwm" }]);
    assert.equal(programCount(cgroup), 1);
    assert.equal(await opens(cgroup, "/dev/null"), true);

    // The launcher's rules and the hotplugged block device.
    const block = { type: "b" as const, major, minor, access: "rwm" };
    setDeviceRules(cgroup, [...LAUNCHER_DEVICE_RULES, block]);
    assert.equal(programCount(cgroup), 1, "replaced, not added");
    assert.equal(await opens(cgroup, loop), true, "the hotplugged device opens");
    assert.equal(await opens(cgroup, loop, ">"), true);
    assert.equal(await opens(cgroup, "/dev/zero"), true);

    // Taken back; and an access the rule does not give is refused.
    setDeviceRules(cgroup, [
      ...LAUNCHER_DEVICE_RULES.filter((r) => !(r.major === 1 && r.minor === 5)),
      { type: "c", major: 1, minor: 5, access: "r" },
    ]);
    assert.equal(programCount(cgroup), 1);
    assert.equal(await opens(cgroup, loop), false, "shut out again");
    assert.equal(await opens(cgroup, "/dev/zero"), true, "read");
    assert.equal(await opens(cgroup, "/dev/zero", ">"), false, "no write");
  } finally {
    if (loop) await run("losetup", "-d", loop).catch(() => {});
    await Deno.remove(backing).catch(() => {});
    // The probes have ended, so the cgroup is empty and goes (its program with it).
    await Deno.remove(cgroup);
  }
});

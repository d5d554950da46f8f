/**
 * M4: pod-less QEMUs all run under the host's libvirtd, so only a security driver that
 * labels each QEMU apart (SELinux or AppArmor) keeps one escaped guest from every other
 * guest's disks. `virtnode check` fails where libvirt has none, naming the fix, except in
 * local mode, which warns. Run against libvirt's test driver, whose capabilities list only
 * its placeholder model: no driver that confines anything.
 */
import assert from "node:assert/strict";

const MAIN = new URL("../../main.ts", import.meta.url).pathname;

/** `virtnode <global flags> check <args>` on the test driver; its exit code and output. */
async function check(args: string[]): Promise<{ code: number; stdout: string }> {
  const dir = await Deno.makeTempDir({ prefix: "virtnode-secdriver-" });
  try {
    const out = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        MAIN,
        "--libvirt-uri",
        "test:///default",
        "--state-dir",
        `${dir}/state`,
        "--run-dir",
        `${dir}/run`,
        "check",
        ...args,
      ],
      env: { NO_COLOR: "1" },
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).output();
    return { code: out.code, stdout: new TextDecoder().decode(out.stdout) };
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("virtnode check fails against a libvirt without a confining security driver, naming the fix", async () => {
  const r = await check([]);
  assert.match(
    r.stdout,
    /^FAIL {2}libvirt security driver +test:\/\/\/default has security model\(s\) "testSecurity": .*set security_driver = "selinux" or "apparmor" in \/etc\/libvirt\/qemu\.conf/m,
  );
  assert.equal(r.code, 1);
});

Deno.test("virtnode check --local only warns that guests run unconfined", async () => {
  const r = await check(["--local"]);
  assert.match(
    r.stdout,
    /^WARN {2}libvirt security driver +local mode: .*runs unconfined, as one user.*run only guests you trust/m,
  );
  assert.doesNotMatch(r.stdout, /^FAIL {2}libvirt security driver/m);
});

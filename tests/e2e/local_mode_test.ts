import assert from "node:assert/strict";

Deno.test("local mode (deno task start) brings every example VMI to Running and stops cleanly", async () => {
  const root = new URL("../../", import.meta.url).pathname;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", `${root}deploy/local.ts`, "--until-running"],
    cwd: root,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
  assert.equal(out.code, 0, text);
  assert.match(text, /kubeconfig: \/.*kubeconfig/);
  assert.match(text, /libvirt: (qemu:\/\/\/system|test:\/\/\/default)/);
  for (const name of ["vmi-cirros", "vmi-efi", "vmi-minimal"]) {
    assert.match(text, new RegExp(`${name} +Running`), `${name} reached Running`);
  }
  assert.match(text, /every example VMI is Running/);
  assert.match(text, /kubevirt\.io\/schedulable=true, [1-9]\d* labels from libvirt's capabilities/);
  assert.match(text, /handler exited with code 0/);
  assert.match(text, /\[local\] done/);
  const left = await new Deno.Command("virsh", {
    args: ["-c", "qemu:///system", "list", "--all", "--name"],
    stdout: "piped",
    stderr: "null",
  }).output();
  const domains = new TextDecoder().decode(left.stdout);
  assert.doesNotMatch(domains, /default_vmi-(cirros|efi|minimal)/, "no guest left behind");
});

import assert from "node:assert/strict";
import { checkSecurityDriver, securityModels } from "../../mod/preflight/mod.ts";

/** A host capabilities document with these `<secmodel>`s, as libvirt writes them. */
function capabilities(...models: string[]): string {
  const secmodels = models.map((m) =>
    `    <secmodel>\n      <model>${m}</model>\n      <doi>0</doi>\n    </secmodel>\n`
  ).join("");
  return `<capabilities>\n  <host>\n    <uuid>00000000-0000-0000-0000-000000000000</uuid>\n` +
    `    <cpu><arch>x86_64</arch></cpu>\n${secmodels}  </host>\n` +
    `  <guest><os_type>hvm</os_type></guest>\n</capabilities>\n`;
}

Deno.test("securityModels() lists the host's secmodels, none when there are none", () => {
  assert.deepEqual(securityModels(capabilities("apparmor", "dac")), ["apparmor", "dac"]);
  assert.deepEqual(securityModels(capabilities()), []);
});

Deno.test("checkSecurityDriver() passes SELinux and AppArmor, fails none, DAC alone and nothing", () => {
  const uri = "qemu:///system";
  assert.equal(checkSecurityDriver(uri, ["selinux", "dac"]).verdict, "PASS");
  assert.equal(checkSecurityDriver(uri, ["apparmor", "dac"]).verdict, "PASS");
  for (const models of [["none", "dac"], ["dac"], []]) {
    const r = checkSecurityDriver(uri, models);
    assert.equal(r.verdict, "FAIL", models.join(","));
    assert.match(r.detail, /security_driver = "selinux" or "apparmor"/);
  }
  assert.match(checkSecurityDriver(uri, []).detail, /no <secmodel> in its capabilities/);
  const local = checkSecurityDriver(uri, ["none", "dac"], { local: true });
  assert.equal(local.verdict, "WARN");
  assert.match(
    local.detail,
    /^local mode: qemu:\/\/\/system has security model\(s\) "none", "dac"/,
  );
});

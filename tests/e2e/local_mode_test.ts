/**
 * Local mode as a user runs it: `deno task start` until every example VMI runs, and
 * Ctrl-C from a terminal (SIGINT to the whole foreground process group).
 */
import assert from "node:assert/strict";
import { QEMU_CONF, QEMU_CONF_LINES } from "../../deploy/libvirtd.ts";

const root = new URL("../../", import.meta.url).pathname;
const EXAMPLES = ["vmi-cirros", "vmi-efi", "vmi-minimal"];

async function domainsLeft(): Promise<string[]> {
  const out = await new Deno.Command("virsh", {
    args: ["-c", "qemu:///system", "list", "--all", "--name"],
    stdout: "piped",
    stderr: "null",
  }).output();
  const names = new TextDecoder().decode(out.stdout).split("\n").map((l) => l.trim());
  return names.filter((n) => EXAMPLES.some((e) => n === `default_${e}`));
}

/** Launcher host processes of a local mode's directory. */
function localHosts(): number[] {
  const pids: number[] = [];
  for (const e of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(e.name)) continue;
    try {
      const cmdline = Deno.readTextFileSync(`/proc/${e.name}/cmdline`).split("\0");
      if (
        cmdline.includes("launcher-host") && cmdline.some((a) => a.includes("/virtnode-local-"))
      ) pids.push(Number(e.name));
    } catch { /* gone */ }
  }
  return pids;
}

/**
 * After a failed run: ends local mode's launcher host and removes the examples' domains, so
 * that what this test started does not outlive it or break the next run.
 */
async function removeExamples(): Promise<void> {
  for (const e of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(e.name)) continue;
    try {
      const cmdline = Deno.readTextFileSync(`/proc/${e.name}/cmdline`).split("\0");
      const at = cmdline.indexOf("--name");
      const localHost = cmdline.includes("launcher-host") &&
        cmdline.some((a) => a.includes("/virtnode-local-"));
      if (localHost || (cmdline.includes("launcher") && EXAMPLES.includes(cmdline[at + 1]))) {
        Deno.kill(Number(e.name), "SIGKILL");
      }
    } catch { /* gone */ }
  }
  for (const domain of await domainsLeft()) {
    for (const args of [["destroy", domain], ["undefine", domain, "--nvram"]]) {
      await new Deno.Command("virsh", {
        args: ["-c", "qemu:///system", ...args],
        stdout: "null",
        stderr: "null",
      }).output();
    }
  }
}

Deno.test("local mode (deno task start) brings every example VMI to Running under QEMU and stops cleanly", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", `${root}deploy/local.ts`, "--until-running"],
    cwd: root,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
  if (out.code !== 0) await removeExamples();
  assert.equal(out.code, 0, text);
  assert.match(text, /kubeconfig: \/.*kubeconfig/);
  // libvirtd runs on every machine of this kind: a fallback to the test driver is a failure.
  assert.match(text, /libvirt: qemu:\/\/\/system/, text);
  assert.doesNotMatch(text, /TEST DRIVER/);
  for (const name of EXAMPLES) {
    assert.match(text, new RegExp(`${name} +Running`), `${name} reached Running`);
  }
  assert.match(text, /every example VMI is Running/);
  // vmi-cirros has a NIC on the pod network: its pod IP from the handler's default range.
  assert.match(text, /vmi-cirros +Running .*ip=10\.245\./);
  assert.match(text, /kubevirt\.io\/schedulable=true, [1-9]\d* labels from libvirt's capabilities/);
  assert.match(text, /handler exited with code 0/);
  assert.match(text, /stopping the launcher host/);
  assert.deepEqual(localHosts(), [], "no launcher host left running");
  assert.match(text, /\[local\] done/);
  assert.deepEqual(await domainsLeft(), [], "no guest left behind");
});

Deno.test("local mode: Ctrl-C deletes the VMIs through the running control plane, leaves no domain and restores qemu.conf", async () => {
  const original = await Deno.readTextFile(QEMU_CONF);
  // As on a host that never ran virtnode: qemu.conf without virtnode's lines.
  const pristine = original.replace(QEMU_CONF_LINES, "");
  await Deno.writeTextFile(QEMU_CONF, pristine);
  // Its own session, so that SIGINT to its process group is what a terminal's Ctrl-C does
  // to `deno task start` and everything it started in the foreground.
  const child = new Deno.Command("setsid", {
    args: [Deno.execPath(), "task", "start"],
    cwd: root,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let text = "";
  const decoder = new TextDecoder();
  const read = (async () => {
    for await (const chunk of child.stdout) text += decoder.decode(chunk);
  })();
  const readErr = (async () => {
    for await (const chunk of child.stderr) text += decoder.decode(chunk);
  })();
  try {
    const deadline = Date.now() + 180_000;
    while (!EXAMPLES.every((n) => new RegExp(`${n} +Running`).test(text))) {
      assert.ok(Date.now() < deadline, `examples never all Running:\n${text}`);
      await new Promise((r) => setTimeout(r, 200));
    }
    assert.match(text, /added virtnode's lines to qemu\.conf/);
    Deno.kill(-child.pid, "SIGINT");
    const status = await child.status;
    await Promise.all([read, readErr]);
    assert.equal(status.code, 0, text);
    const afterCtrlC = text.slice(text.indexOf("Ctrl-C: stopping"));
    assert.ok(afterCtrlC.length > 0, text);
    assert.match(afterCtrlC, /deleting the example VMIs/);
    assert.doesNotMatch(afterCtrlC, /refused/i, "the control plane outlived the deletion");
    assert.match(text, /handler exited with code 0/);
    assert.doesNotMatch(text, /domains left behind/);
    assert.deepEqual(localHosts(), [], "no launcher host left running");
    assert.match(text, /the host's configuration is as it was/);
    assert.deepEqual(await domainsLeft(), [], "no domain definition left behind");
    assert.equal(await Deno.readTextFile(QEMU_CONF), pristine, "qemu.conf restored");
  } finally {
    try {
      Deno.kill(-child.pid, "SIGKILL");
    } catch { /* ended */ }
    await child.status;
    await removeExamples();
    await Deno.writeTextFile(QEMU_CONF, original);
  }
});

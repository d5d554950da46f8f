import assert from "node:assert/strict";
import { useCluster } from "../../deploy/cluster/cluster.ts";

const main = new URL("../../main.ts", import.meta.url).pathname;

async function virtnode(args: string[], env: Record<string, string> = {}) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", main, ...args],
    env: { NO_COLOR: "1", ...env },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

Deno.test("virtnode --help lists the global flags and the subcommands", async () => {
  const r = await virtnode(["--help"]);
  assert.equal(r.code, 0);
  for (const word of ["--node-name", "--kubeconfig", "--libvirt-uri", "--log-level", "check"]) {
    assert.ok(r.stdout.includes(word), `help lacks ${word}`);
  }
});

Deno.test("virtnode version prints virtnode's, Deno's and libvirt's versions", async () => {
  const r = await virtnode(["version"]);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /^virtnode \d+\.\d+\.\d+$/m);
  assert.match(r.stdout, new RegExp(`^deno ${Deno.version.deno}$`, "m"));
  assert.match(r.stdout, /^libvirt \d+\.\d+\.\d+$/m);
});

Deno.test("a bad flag value exits 2 with a message naming the flag, the value and what is allowed", async () => {
  const r = await virtnode(["--log-level", "loud", "check"]);
  assert.equal(r.code, 2);
  assert.match(r.stderr, /Invalid value "loud" for --log-level: allowed: trace, debug, info/);
  const fromEnv = await virtnode(["check"], { VIRTNODE_LIBVIRT_URI: "xen:///" });
  assert.equal(fromEnv.code, 2);
  assert.match(fromEnv.stderr, /--libvirt-uri \(from VIRTNODE_LIBVIRT_URI\)/);
  const unknown = await virtnode(["--bogus"]);
  assert.equal(unknown.code, 2);
  assert.match(unknown.stderr, /unknown option '--bogus'/);
});

Deno.test("each subcommand's usage error exits 2 with 'virtnode <command>: <what>'", async () => {
  // One path for all of them (main.ts's UsageError): the handler, the launcher host and the
  // launcher each refuse a bad value of their own flags before they start anything.
  const host = await virtnode([
    "launcher-host",
    "--dir=/nonexistent/host",
    "--host-id=h",
    "--image-dir=/nonexistent/images",
    "--domain-type=xen",
  ]);
  assert.equal(host.code, 2, host.stderr);
  assert.equal(
    host.stderr.trim(),
    'virtnode launcher-host: --domain-type must be kvm or qemu, not "xen"',
  );
  const handler = await virtnode(["handler", "--migration-ip", "nowhere"]);
  assert.equal(handler.code, 2, handler.stderr);
  assert.match(
    handler.stderr,
    /^virtnode handler: --migration-ip "nowhere": expected an IP address$/m,
  );
  const launcher = await virtnode(["launcher", "--bogus"]);
  assert.equal(launcher.code, 2, launcher.stderr);
  assert.match(launcher.stderr, /^virtnode launcher: .*--bogus/m);
});

Deno.test("every subcommand answers --help with its flags and exits 0", async () => {
  const flags: Record<string, string> = {
    version: "--help",
    check: "--local",
    handler: "--podless",
    heartbeat: "--show",
    labeller: "--apply",
    launcher: "--socket-dir",
    "launcher-host": "--host-id",
  };
  const listed = (await virtnode(["--help"])).stdout;
  for (const [command, flag] of Object.entries(flags)) {
    assert.ok(listed.includes(`  ${command}`), `virtnode --help does not list ${command}`);
    for (const help of ["--help", "-h"]) {
      const r = await virtnode([command, help]);
      assert.equal(r.code, 0, `${command} ${help}: ${r.stderr}`);
      assert.match(r.stdout, new RegExp(`^Usage: virtnode ${command} `, "m"));
      assert.ok(r.stdout.includes(flag), `${command} ${help} lacks ${flag}:\n${r.stdout}`);
    }
  }
});

Deno.test("an unknown flag of any subcommand exits 2 naming the flag and that subcommand's usage", async () => {
  for (const command of ["version", "check", "handler", "heartbeat", "labeller", "launcher"]) {
    const r = await virtnode([command, "--bogus"]);
    assert.equal(r.code, 2, `${command}: ${r.stderr}`);
    assert.match(r.stderr, /'?--bogus'?/);
    assert.ok(
      r.stderr.includes(`(run 'virtnode ${command} --help' for usage)`),
      `${command}: ${r.stderr}`,
    );
  }
});

Deno.test("local mode (deno task start) answers --help with its flags and refuses an unknown one with exit 2", async () => {
  const local = (flag: string) =>
    new Deno.Command(Deno.execPath(), {
      args: ["task", "start", flag],
      cwd: new URL("../../", import.meta.url).pathname,
      env: { NO_COLOR: "1" },
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).output();
  const dec = new TextDecoder();
  const help = await local("--help");
  assert.equal(help.code, 0, dec.decode(help.stderr));
  for (const flag of ["--virtctl", "--until-running", "--test-driver"]) {
    assert.ok(dec.decode(help.stdout).includes(`  ${flag} `), `--help lacks ${flag}`);
  }
  const bogus = await local("--bogus");
  assert.equal(bogus.code, 2, dec.decode(bogus.stderr));
  assert.match(
    dec.decode(bogus.stderr),
    /unknown flag '--bogus' \(run 'deno task start --help' for usage\)/,
  );
});

Deno.test("a pod-less handler exits 2 naming --run-dir or --state-dir when its socket paths would not fit", async () => {
  // Unix socket paths are limited in length; a directory too long for the sockets
  // below it is refused at start, with the flag named and how much to shorten it.
  const long = `/tmp/${"d".repeat(40)}`;
  const run = await virtnode(["--run-dir", long, "handler", "--podless"]);
  assert.equal(run.code, 2, run.stderr);
  assert.match(
    run.stderr,
    /--run-dir: sockets below it would be 109 bytes long .*unix sockets allow 107: shorten --run-dir by 2 characters/,
  );
  const state = await virtnode(["--state-dir", `/tmp/${"s".repeat(80)}`, "handler", "--podless"]);
  assert.equal(state.code, 2, state.stderr);
  assert.match(state.stderr, /--state-dir: sockets below it would be 112 bytes long/);
});

Deno.test("virtnode check passes against a real apiserver and libvirt, and fails naming a missing kubeconfig", async () => {
  const cluster = await useCluster();
  const dir = await Deno.makeTempDir();
  try {
    const common = [
      "--libvirt-uri",
      "test:///default",
      "--state-dir",
      `${dir}/state`,
      "--run-dir",
      `${dir}/run`,
    ];
    // The test driver has no security driver that confines QEMU: local mode only warns.
    const ok = await virtnode([
      "--kubeconfig",
      cluster.kubeconfigPath,
      ...common,
      "check",
      "--local",
    ]);
    assert.match(ok.stdout, /^PASS {2}libvirt library +libvirt\.so\.0 loaded/m);
    assert.match(ok.stdout, /^PASS {2}apiserver +reached with .*Kubernetes v1\.\d+/m);
    assert.match(ok.stdout, /^PASS {2}state directory/m);
    assert.match(ok.stdout, /^(PASS|WARN) {2}kvm/m);
    assert.match(ok.stdout, /^WARN {2}libvirt security driver +local mode: /m);
    assert.equal(ok.code, 0, ok.stdout + ok.stderr);

    const missing = await virtnode([
      "--kubeconfig",
      `${dir}/nope.yaml`,
      ...common,
      "check",
      "--local",
    ]);
    assert.equal(missing.code, 1);
    assert.match(missing.stdout, /^FAIL {2}apiserver .*nope\.yaml/m);
    assert.match(missing.stdout, /1 check\(s\) failed/);

    await Deno.writeTextFile(`${dir}/ro`, "");
    const unwritable = await virtnode([
      "--kubeconfig",
      cluster.kubeconfigPath,
      "--libvirt-uri",
      "test:///default",
      "--state-dir",
      `${dir}/ro/state`,
      // Its own run directory too: check makes the one it tests, and the default is the host's.
      "--run-dir",
      `${dir}/run`,
      "check",
    ]);
    assert.equal(unwritable.code, 1);
    assert.match(unwritable.stdout, /^FAIL {2}state directory/m);
  } finally {
    await Deno.remove(dir, { recursive: true });
    await cluster.stop();
  }
});

Deno.test("deno task compile makes one file where it has denort, and says DENORT_BIN in one line where not", async () => {
  const dir = await Deno.makeTempDir({ prefix: "virtnode-compile-" });
  try {
    const output = `${dir}/virtnode`;
    const r = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", new URL("../../deploy/compile.ts", import.meta.url).pathname, output],
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).output();
    const stderr = new TextDecoder().decode(r.stderr).trim();
    if (r.code === 0) {
      // DENORT_BIN set, or a machine that downloads denort: the binary runs on its own.
      const version = await new Deno.Command(output, {
        args: ["version"],
        stdout: "piped",
        stderr: "piped",
      }).output();
      assert.equal(version.code, 0, new TextDecoder().decode(version.stderr));
      assert.match(new TextDecoder().decode(version.stdout), /^virtnode \d+\.\d+\.\d+$/m);
    } else {
      assert.equal(Deno.env.get("DENORT_BIN"), undefined, stderr);
      assert.equal(r.code, 1);
      assert.equal(stderr.split("\n").length, 1, stderr);
      assert.match(stderr, /^deno task compile: .*set DENORT_BIN to a denort of that version/);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

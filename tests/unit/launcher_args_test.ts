import assert from "node:assert/strict";
import {
  formatLauncherArgs,
  LauncherArgsError,
  type LauncherOptions,
  parseLauncherArgs,
} from "../../mod/launcher/args/mod.ts";

const base = [
  "--namespace",
  "default",
  "--name",
  "vm1",
  "--uid",
  "1234-abcd",
  "--socket-dir",
  "/var/run/kubevirt/sockets/1234-abcd",
];

function argError(args: string[]): LauncherArgsError {
  try {
    parseLauncherArgs(args);
  } catch (error) {
    assert.ok(error instanceof LauncherArgsError);
    return error;
  }
  assert.fail("expected a LauncherArgsError");
}

Deno.test("parseLauncherArgs() fills KubeVirt's defaults", () => {
  const options = parseLauncherArgs(base);
  assert.equal(options.namespace, "default");
  assert.equal(options.name, "vm1");
  assert.equal(options.uid, "1234-abcd");
  assert.equal(options.socketDir, "/var/run/kubevirt/sockets/1234-abcd");
  assert.equal(options.libvirtUri, "qemu:///system");
  assert.equal(options.gracePeriodSeconds, 30);
  assert.equal(options.notifySocket, undefined);
  assert.equal(options.runDir, "/var/run/kubevirt-private/1234-abcd");
  assert.equal(options.diskDir, "/var/run/kubevirt-ephemeral-disks/1234-abcd");
  assert.equal(options.imageDir, "/var/run/kubevirt/container-disks");
});

Deno.test("parseLauncherArgs() takes --flag=value and --flag value", () => {
  const options = parseLauncherArgs([
    ...base,
    "--libvirt-uri=test:///default",
    "--notify-socket",
    "/var/run/kubevirt/domain-notify-pipe.sock",
    "--grace-period=0",
    "--domain-type=qemu",
    "--host-disk-root=/srv/disks/",
  ]);
  assert.equal(options.libvirtUri, "test:///default");
  assert.equal(options.notifySocket, "/var/run/kubevirt/domain-notify-pipe.sock");
  assert.equal(options.gracePeriodSeconds, 0);
  assert.equal(options.domainType, "qemu");
  assert.equal(options.hostDiskRoot, "/srv/disks");
});

Deno.test("parseLauncherArgs() names the bad argument", () => {
  assert.equal(argError(base.slice(2)).argument, "--namespace");
  assert.equal(argError([...base, "--grace-period", "-1"]).argument, "--grace-period");
  assert.equal(argError([...base, "--grace-period=soon"]).argument, "--grace-period");
  assert.equal(argError([...base, "--socket-dir=relative"]).argument, "--socket-dir");
  assert.equal(argError([...base, "--bogus=1"]).argument, "--bogus");
  assert.equal(argError([...base, "--name", "Bad_Name"]).argument, "--name");
  assert.equal(argError([...base, "--name", "vm2"]).argument, "--name");
  assert.equal(argError([...base, "--domain-type=xen"]).argument, "--domain-type");
  assert.equal(argError([...base, "--host-disk-root=/srv/../etc"]).argument, "--host-disk-root");
  assert.equal(argError([...base, "--notify-socket"]).argument, "--notify-socket");
  assert.match(
    argError([...base, "--grace-period=soon"]).message,
    /^Invalid argument "--grace-period": "soon" is not a whole number of seconds$/,
  );
});

/** Every option set, each to a value other than its default. */
const everyOption: LauncherOptions = {
  namespace: "team-a",
  name: "vm.one",
  uid: "5f0c-77aa",
  socketDir: "/run/virtnode/sockets/5f0c-77aa",
  libvirtUri: "test:///default",
  notifySocket: "/run/virtnode/domain-notify.sock",
  gracePeriodSeconds: 7,
  runDir: "/run/virtnode/private/5f0c-77aa",
  diskDir: "/var/lib/virtnode/disks/5f0c-77aa",
  imageDir: "/var/lib/virtnode/images",
  hostDiskRoot: "/srv/disks",
  domainType: "qemu",
  ovmfDir: "/usr/share/OVMF",
  migrationSocketDir: "/var/run/kubevirt-test",
};

Deno.test("formatLauncherArgs() round-trips every option through parseLauncherArgs()", () => {
  const args = formatLauncherArgs(everyOption);
  assert.deepEqual(parseLauncherArgs(args), everyOption);
  // Each option is on the command line once, as its own flag.
  assert.equal(args.filter((a) => a.startsWith("--")).length, Object.keys(everyOption).length);
});

Deno.test("formatLauncherArgs() round-trips the defaults the parser fills in", () => {
  const parsed = parseLauncherArgs(base);
  assert.deepEqual(parseLauncherArgs(formatLauncherArgs(parsed)), parsed);
});

Deno.test("formatLauncherArgs() leaves out options that are not set", () => {
  const {
    hostDiskRoot: _h,
    domainType: _d,
    ovmfDir: _o,
    notifySocket: _n,
    migrationSocketDir: _m,
    ...rest
  } = everyOption;
  const args = formatLauncherArgs(rest);
  for (
    const flag of [
      "--host-disk-root",
      "--domain-type",
      "--ovmf-dir",
      "--notify-socket",
      "--migration-socket-dir",
    ]
  ) {
    assert.ok(!args.includes(flag), `${flag} in ${args.join(" ")}`);
  }
  assert.deepEqual(parseLauncherArgs(args), {
    ...rest,
    hostDiskRoot: undefined,
    domainType: undefined,
    ovmfDir: undefined,
    notifySocket: undefined,
    migrationSocketDir: undefined,
  });
});

Deno.test("formatLauncherArgs() refuses what the launcher would refuse, naming the flag", () => {
  assert.throws(
    () => formatLauncherArgs({ ...everyOption, name: "Not A Name" }),
    (e: unknown) => e instanceof LauncherArgsError && e.argument === "--name",
  );
  assert.throws(
    () => formatLauncherArgs({ ...everyOption, diskDir: "relative/dir" }),
    (e: unknown) => e instanceof LauncherArgsError && e.argument === "--disk-dir",
  );
});

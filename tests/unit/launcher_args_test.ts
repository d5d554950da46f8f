import assert from "node:assert/strict";
import { LauncherArgsError, parseLauncherArgs } from "../../mod/launcher/mod.ts";

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

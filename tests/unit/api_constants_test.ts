import assert from "node:assert/strict";
import {
  Annotations,
  ConditionType,
  isFinalPhase,
  Labels,
  launcherSocketDirOnHost,
  Paths,
  SocketNames,
  VmiPhase,
  vmiPrivateDir,
} from "../../mod/api/mod.ts";

Deno.test("api constants carry KubeVirt's names", () => {
  assert.equal(Labels.NodeName, "kubevirt.io/nodeName");
  assert.equal(Labels.NodeSchedulable, "kubevirt.io/schedulable");
  assert.equal(Annotations.Heartbeat, "kubevirt.io/heartbeat");
  assert.equal(ConditionType.LiveMigratable, "LiveMigratable");
  assert.equal(Paths.GhostRecordDir, "/var/run/kubevirt-private/ghost-records");
  assert.equal(SocketNames.Launcher, "launcher-sock");
  assert.equal(SocketNames.LauncherInit, "launcher-init-sock");
});

Deno.test("isFinalPhase() is true for Succeeded and Failed only", () => {
  assert.equal(isFinalPhase(VmiPhase.Succeeded), true);
  assert.equal(isFinalPhase(VmiPhase.Failed), true);
  assert.equal(isFinalPhase(VmiPhase.Running), false);
  assert.equal(isFinalPhase(undefined), false);
});

Deno.test("path helpers build KubeVirt's layouts", () => {
  assert.equal(vmiPrivateDir("abc"), "/var/run/kubevirt-private/abc");
  assert.equal(
    launcherSocketDirOnHost("p1"),
    "/var/lib/kubelet/pods/p1/volumes/kubernetes.io~empty-dir/sockets",
  );
});

import assert from "node:assert/strict";
import { deviceCgroupOf } from "../../mod/handler/testing.ts";

Deno.test("deviceCgroupOf() prefers the devices controller's cgroup to v2's; refuses one outside the namespace", () => {
  // v1 or hybrid hosts give the devices controller's cgroup; v2 is used only where there is none.
  const hybrid = [
    "12:devices:/kubepods/besteffort/pod1/abc",
    "11:cpu,cpuacct:/kubepods/besteffort/pod1/abc",
    "0::/kubepods/besteffort/pod1/abc",
  ].join("\n");
  assert.deepEqual(deviceCgroupOf(hybrid), { version: 1, path: "/kubepods/besteffort/pod1/abc" });
  assert.deepEqual(
    deviceCgroupOf("0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope\n"),
    {
      version: 2,
      path: "/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope",
    },
  );
  assert.throws(
    () => deviceCgroupOf("0::/../../kubepods.slice/x\n"),
    /outside the handler's cgroup namespace/,
  );
  assert.throws(() => deviceCgroupOf("1:name=systemd:/\n"), /no devices cgroup/);
});

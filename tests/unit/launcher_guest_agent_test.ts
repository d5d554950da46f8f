import assert from "node:assert/strict";
import {
  agentReturn,
  emptyGuestAgentInfo,
  fsFreezeStatusFromAgent,
  GUEST_INFO_LIST_LIMIT,
  guestAgentInfoFromAgent,
  guestExecPid,
  guestExecStatus,
  guestFilesystemsFromAgent,
  guestInterfacesFromAgent,
  guestOsInfoFromAgent,
  guestUsersFromAgent,
} from "../../mod/launcher/testing.ts";

// Replies as qemu-ga 8.x sends them (a Fedora guest, one root disk on virtio).
const GUEST_INFO = JSON.stringify({
  return: {
    version: "8.2.2",
    supported_commands: [
      { name: "guest-ping", enabled: true, "success-response": true },
      { name: "guest-exec", enabled: false, "success-response": true },
    ],
  },
});
const OS_INFO = JSON.stringify({
  return: {
    name: "Fedora Linux",
    "kernel-release": "6.8.5-301.fc40.x86_64",
    version: "40 (Cloud Edition)",
    "pretty-name": "Fedora Linux 40 (Cloud Edition)",
    "version-id": "40",
    "kernel-version": "#1 SMP PREEMPT_DYNAMIC Thu Apr 11 18:25:26 UTC 2024",
    machine: "x86_64",
    id: "fedora",
    "variant-id": "cloud",
  },
});
const HOST_NAME = JSON.stringify({ return: { "host-name": "vm1.example" } });
const TIMEZONE = JSON.stringify({ return: { zone: "CET", offset: 3600 } });
const USERS = JSON.stringify({
  return: [
    { user: "fedora", "login-time": 1714000000.25 },
    { user: "Administrator", domain: "CORP", "login-time": 1714000100 },
  ],
});
const FSINFO = JSON.stringify({
  return: [
    {
      name: "vda4",
      mountpoint: "/",
      type: "btrfs",
      "used-bytes": 1234567890,
      "total-bytes": 5368709120,
      disk: [{
        "bus-type": "virtio",
        bus: 0,
        unit: 0,
        target: 0,
        serial: "rootdisk",
        dev: "/dev/vda4",
        "pci-controller": { domain: 0, bus: 7, slot: 0, function: 0 },
      }],
    },
    { name: "tmpfs", mountpoint: "/tmp", type: "tmpfs", disk: [] },
  ],
});

Deno.test("guestUsersFromAgent() maps guest-get-users to KubeVirt's user list", () => {
  assert.deepEqual(guestUsersFromAgent(USERS), [
    { userName: "fedora", loginTime: 1714000000.25 },
    { userName: "Administrator", domain: "CORP", loginTime: 1714000100 },
  ]);
});

Deno.test("guestFilesystemsFromAgent() maps guest-get-fsinfo to KubeVirt's filesystem list", () => {
  assert.deepEqual(guestFilesystemsFromAgent(FSINFO), [
    {
      diskName: "vda4",
      mountPoint: "/",
      fileSystemType: "btrfs",
      usedBytes: 1234567890,
      totalBytes: 5368709120,
      disk: [{ serial: "rootdisk", busType: "virtio" }],
    },
    // No sizes and no disks: zero sizes (KubeVirt's are plain ints) and no disk key.
    { diskName: "tmpfs", mountPoint: "/tmp", fileSystemType: "tmpfs", usedBytes: 0, totalBytes: 0 },
  ]);
});

Deno.test("guestAgentInfoFromAgent() combines the replies into KubeVirt's guest agent info", () => {
  assert.deepEqual(
    guestAgentInfoFromAgent({
      info: GUEST_INFO,
      osInfo: OS_INFO,
      hostName: HOST_NAME,
      timezone: TIMEZONE,
      users: USERS,
      filesystems: FSINFO,
    }),
    {
      guestAgentVersion: "8.2.2",
      supportedCommands: [{ name: "guest-ping", enabled: true }, { name: "guest-exec" }],
      hostname: "vm1.example",
      os: {
        name: "Fedora Linux",
        kernelRelease: "6.8.5-301.fc40.x86_64",
        version: "40 (Cloud Edition)",
        prettyName: "Fedora Linux 40 (Cloud Edition)",
        versionId: "40",
        kernelVersion: "#1 SMP PREEMPT_DYNAMIC Thu Apr 11 18:25:26 UTC 2024",
        machine: "x86_64",
        id: "fedora",
      },
      timezone: "CET, 3600",
      userList: guestUsersFromAgent(USERS),
      fsInfo: { disks: guestFilesystemsFromAgent(FSINFO) },
    },
  );
});

Deno.test("guestAgentInfoFromAgent() leaves out what an older agent did not answer", () => {
  const info = guestAgentInfoFromAgent({ info: JSON.stringify({ return: { version: "2.5.0" } }) });
  assert.deepEqual(info, { guestAgentVersion: "2.5.0", os: {}, fsInfo: { disks: [] } });
});

Deno.test("guestAgentInfoFromAgent() lists at most 10 users and filesystems, as KubeVirt", () => {
  const many = (entry: (i: number) => unknown) =>
    JSON.stringify({ return: Array.from({ length: 12 }, (_, i) => entry(i)) });
  const info = guestAgentInfoFromAgent({
    info: GUEST_INFO,
    users: many((i) => ({ user: `u${i}`, "login-time": i + 1 })),
    filesystems: many((i) => ({ name: `d${i}`, mountpoint: `/m${i}`, type: "xfs" })),
  });
  assert.equal(info.userList?.length, GUEST_INFO_LIST_LIMIT);
  assert.equal(info.fsInfo.disks.length, GUEST_INFO_LIST_LIMIT);
  assert.equal(guestUsersFromAgent(many((i) => ({ user: `u${i}` }))).length, 12);
});

Deno.test("a reply that is not the agent's {return} reads as absent, not as an error", () => {
  for (const reply of [undefined, "", "not json", "[]", '{"error":{"class":"x"}}', "null"]) {
    assert.equal(agentReturn(reply), undefined, String(reply));
    assert.deepEqual(guestUsersFromAgent(reply), []);
    assert.deepEqual(guestFilesystemsFromAgent(reply), []);
  }
  assert.deepEqual(guestUsersFromAgent('{"return":{"user":"not-a-list"}}'), []);
  assert.deepEqual(guestFilesystemsFromAgent('{"return":[42,{"name":7}]}'), [
    { diskName: "", mountPoint: "", fileSystemType: "", usedBytes: 0, totalBytes: 0 },
  ]);
});

Deno.test("emptyGuestAgentInfo() keeps the keys Go always writes: an empty os, fsInfo without disks", () => {
  assert.equal(JSON.stringify(emptyGuestAgentInfo()), '{"os":{},"fsInfo":{"disks":[]}}');
});

Deno.test("guestOsInfoFromAgent() maps guest-get-osinfo; fsFreezeStatusFromAgent() knows frozen and thawed only", () => {
  const os = JSON.stringify({
    return: {
      name: "virtnode test guest",
      "kernel-release": "6.1.0-28-amd64",
      "pretty-name": "virtnode test guest",
      "version-id": "1",
      machine: "x86_64",
      id: "virtnode-guest",
      version: "",
    },
  });
  assert.deepEqual(guestOsInfoFromAgent(os), {
    name: "virtnode test guest",
    kernelRelease: "6.1.0-28-amd64",
    prettyName: "virtnode test guest",
    versionId: "1",
    machine: "x86_64",
    id: "virtnode-guest",
  });
  assert.deepEqual(guestOsInfoFromAgent(undefined), {});
  assert.equal(fsFreezeStatusFromAgent('{"return":"frozen"}'), "frozen");
  assert.equal(fsFreezeStatusFromAgent('{"return":"thawed"}'), "thawed");
  assert.equal(fsFreezeStatusFromAgent('{"return":"melting"}'), undefined);
  assert.equal(fsFreezeStatusFromAgent('{"error":{"class":"GenericError"}}'), undefined);
  assert.equal(fsFreezeStatusFromAgent(undefined), undefined);
});

Deno.test("guest-exec's answer gives its process id only when it is a positive integer", () => {
  assert.equal(guestExecPid('{"return":{"pid":4711}}'), 4711);
  for (const reply of ['{"return":{"pid":0}}', '{"return":{"pid":"7"}}', '{"return":{}}', "x"]) {
    assert.equal(guestExecPid(reply), undefined, reply);
  }
  assert.equal(guestExecPid(undefined), undefined);
});

Deno.test("guest-exec-status: running, exited with its code and output, or ended by a signal", () => {
  assert.deepEqual(guestExecStatus('{"return":{"exited":false}}', 64), {
    exited: false,
    exitCode: 0,
    stdOut: "",
  });
  // As qemu-ga 7.2 answers `cat /etc/hostname` (out-data is base64).
  const done = JSON.stringify({
    return: { exited: true, exitcode: 3, "out-data": btoa("guest-1\n") },
  });
  assert.deepEqual(guestExecStatus(done, 64), { exited: true, exitCode: 3, stdOut: "guest-1\n" });
  // A signal leaves exitcode out: a shell's 128 + signal, never a success.
  assert.equal(guestExecStatus('{"return":{"exited":true,"signal":9}}', 64)?.exitCode, 137);
});

Deno.test("guest-exec-status: output past the limit and answers that are not one are dropped", () => {
  const long = JSON.stringify({
    return: { exited: true, exitcode: 0, "out-data": btoa("a".repeat(1000)) },
  });
  assert.equal(guestExecStatus(long, 10)?.stdOut, "a".repeat(10));
  const garbled = '{"return":{"exited":true,"exitcode":0,"out-data":"%%%"}}';
  assert.equal(guestExecStatus(garbled, 10)?.stdOut, "");
  for (const reply of ['{"return":{}}', '{"error":{"class":"GenericError"}}', "[]", undefined]) {
    assert.equal(guestExecStatus(reply, 10), undefined, String(reply));
  }
});

Deno.test("guestInterfacesFromAgent() reports interfaces as KubeVirt's launcher: no lo, IPv4 first", () => {
  const reply = JSON.stringify({
    return: [
      {
        name: "lo",
        "hardware-address": "00:00:00:00:00:00",
        "ip-addresses": [{ "ip-address-type": "ipv4", "ip-address": "127.0.0.1", prefix: 8 }],
      },
      {
        name: "eth1",
        "hardware-address": "02:00:00:0a:96:0a",
        "ip-addresses": [
          { "ip-address-type": "ipv6", "ip-address": "fe80::ff:fe0a:960a", prefix: 64 },
          { "ip-address-type": "ipv4", "ip-address": "172.30.1.10", prefix: 24 },
        ],
        statistics: { "rx-bytes": 1 },
      },
      { name: "eth2", "hardware-address": "02:00:00:0a:97:0a" },
    ],
  });
  assert.deepEqual(guestInterfacesFromAgent(reply), [
    {
      mac: "02:00:00:0a:96:0a",
      ip: "172.30.1.10",
      ips: ["fe80::ff:fe0a:960a", "172.30.1.10"],
      interfaceName: "eth1",
    },
    { mac: "02:00:00:0a:97:0a", interfaceName: "eth2" },
  ]);
  assert.equal(guestInterfacesFromAgent(JSON.stringify({ error: { class: "x" } })), undefined);
  assert.equal(guestInterfacesFromAgent(undefined), undefined);
});

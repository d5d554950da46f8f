/**
 * The handler's records survive a kill at any moment (issue 34, M6): every record is
 * written through one helper (temporary file, fsync, rename, fsync of the directory), so a
 * writer killed mid-write leaves the old record or the new one, whole; and a record torn by
 * an older version's plain write does not block the VMI's cleanup for ever.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { GhostRecordStore, PodLaunchers } from "../../mod/handler/testing.ts";

/** Bytes of padding in each record the killed writer writes: large enough to take a while. */
const PAD_BYTES = 4 * 1024 * 1024;
const ROUNDS = 20;

/** The writer: writes records 0, 1, 2, ... over one path with the shared helper, for ever. */
function writerSource(): string {
  const helper = new URL("../../ffi/mod.ts", import.meta.url).href;
  return `
import { writeFileDurably } from ${JSON.stringify(helper)};
const [path, first] = Deno.args;
// Two pads made once: the loop's time goes to writing, where the kills are meant to land.
const pads = ["a".repeat(${PAD_BYTES}), "b".repeat(${PAD_BYTES})];
for (let seq = Number(first); ; seq++) {
  await writeFileDurably(path, '{"seq":' + seq + ',"pad":"' + pads[seq % 2] + '"}');
  if (seq === Number(first)) console.log("written");
}
`;
}

/** Why `text` is not one whole record as the writer writes them, or undefined. */
function notWhole(text: string): string | undefined {
  let record: { seq?: unknown; pad?: unknown };
  try {
    record = JSON.parse(text);
  } catch (error) {
    return `not JSON (${text.length} bytes): ${(error as Error).message}`;
  }
  if (typeof record.seq !== "number" || typeof record.pad !== "string") return "fields missing";
  const expected = record.seq % 2 === 0 ? "a" : "b";
  if (record.pad.length !== PAD_BYTES || record.pad !== expected.repeat(PAD_BYTES)) {
    return `record ${record.seq} has a wrong pad`;
  }
  return undefined;
}

Deno.test("a record writer SIGKILLed mid-write leaves the old or the new record whole, every time", async () => {
  const dir = await Deno.makeTempDir({ prefix: "virtnode-atomic-" });
  const script = join(dir, "writer.ts");
  await Deno.writeTextFile(script, writerSource());
  const path = join(dir, "records", "record.json");
  await Deno.mkdir(join(dir, "records"));
  let seq = 0;
  let cutMidWrite = 0;
  try {
    for (let round = 0; round < ROUNDS; round++) {
      const child = new Deno.Command(Deno.execPath(), {
        args: ["run", "-A", "--no-check", script, path, String(seq)],
        stdout: "piped",
        stderr: "inherit",
      }).spawn();
      try {
        // Its first record is down; then a kill at a random moment of the writes that follow.
        const reader = child.stdout.getReader();
        const { value } = await reader.read();
        assert.match(new TextDecoder().decode(value), /written/);
        reader.releaseLock();
        await new Promise((resolve) => setTimeout(resolve, Math.random() * 150));
      } finally {
        child.kill("SIGKILL");
        await child.status;
        await child.stdout.cancel().catch(() => {});
      }
      const leftovers = [...Deno.readDirSync(join(dir, "records"))].map((e) => e.name)
        .filter((name) => name !== "record.json");
      if (leftovers.length > 0) cutMidWrite++;
      const text = await Deno.readTextFile(path);
      const why = notWhole(text);
      assert.equal(why, undefined, `round ${round}: the record is torn: ${why}`);
      seq = JSON.parse(text).seq + 1;
    }
    // The kills did land inside writes (a temporary file was left), or nothing was tried.
    assert.ok(cutMidWrite > 0, "no kill landed in the middle of a write");
    console.log(`${cutMidWrite} of ${ROUNDS} kills landed mid-write; ${seq} records written`);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

const POD = "9a3e1c2d-1111-4222-8333-444455556666";
const POD_VOLUMES = `${POD}/volumes/kubernetes.io~empty-dir`;
const UID = "5c0ffee0-aaaa-4bbb-8ccc-000000000034";

Deno.test("a torn containerDisk or hotplug mount record does not block the VMI's cleanup", async () => {
  // The sockets of the spec's container disks still go.
  const dir = await Deno.makeTempDir({ prefix: "virtnode-torn-" });
  const podsDir = join(dir, "pods");
  const listeners: Deno.Listener[] = [];
  try {
    await Deno.mkdir(join(podsDir, POD_VOLUMES, "sockets"), { recursive: true });
    await Deno.mkdir(join(podsDir, POD_VOLUMES, "container-disks"), { recursive: true });
    // The container-disk server's socket: it ends when its socket is removed (KubeVirt's).
    const diskSocket = join(podsDir, POD_VOLUMES, "container-disks", "disk_0.sock");
    listeners.push(Deno.listen({ transport: "unix", path: join(dir, "d") }));
    await Deno.rename(join(dir, "d"), diskSocket);
    const ghosts = new GhostRecordStore(join(dir, "ghosts"));
    await ghosts.load();
    await ghosts.add({
      name: "vm1",
      namespace: "default",
      uid: UID,
      socketFile: join(podsDir, POD_VOLUMES, "sockets", "launcher-sock"),
    });
    // What a kill mid-write left with the old plain writes: JSON cut off in the middle.
    const mountRecords = join(dir, "mounts");
    const hotplugRecords = join(dir, "hotplug");
    await Deno.mkdir(mountRecords);
    await Deno.mkdir(hotplugRecords);
    const whole = JSON.stringify({
      launcherPid: 4242,
      launcherStart: "12345",
      targets: ["disk_0.img"],
      sockets: [{ podDir: join(podsDir, POD), path: "volumes/kubernetes.io~empty-dir/x" }],
    });
    await Deno.writeTextFile(join(mountRecords, `${UID}.json`), whole.slice(0, 60));
    await Deno.writeTextFile(join(hotplugRecords, `${UID}.json`), '{"launcherPid":4242,"vol');
    const pods = new PodLaunchers({
      nodeName: "node1",
      ghosts,
      podsDir,
      notify: { onDomainEvent: () => {}, onK8sEvent: () => {} },
      mountRecordDir: mountRecords,
      hotplugRecordDir: hotplugRecords,
    });
    const vmi = {
      metadata: { namespace: "default", name: "vm1", uid: UID },
      spec: {
        domain: { devices: {} },
        volumes: [{ name: "rootdisk", containerDisk: { image: "example/disk:1" } }],
      },
      status: { phase: "Succeeded", activePods: { [POD]: "node1" } },
    } as unknown as VirtualMachineInstance;

    await assert.doesNotReject(pods.stop(vmi), "the cleanup went through the torn records");
    assert.throws(
      () => Deno.lstatSync(diskSocket),
      Deno.errors.NotFound,
      "the spec's container-disk socket was removed, so its server ends",
    );
    for (const records of [mountRecords, hotplugRecords]) {
      assert.throws(() => Deno.lstatSync(join(records, `${UID}.json`)), Deno.errors.NotFound);
      const kept = [...Deno.readDirSync(join(records, ".set-aside"))].map((e) => e.name);
      assert.equal(kept.length, 1, `the torn record is kept aside in ${records} for a human`);
      assert.ok(kept[0].startsWith(`${UID}.json.`));
    }
    // A second cleanup (a requeue) finds nothing left to do.
    await pods.stop(vmi);
  } finally {
    for (const l of listeners) l.close();
    await Deno.remove(dir, { recursive: true });
  }
});

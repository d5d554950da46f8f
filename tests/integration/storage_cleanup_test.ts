/**
 * Per-VMI cleanup in pod-less mode: 50 VMIs, each with a containerDisk from an OCI image
 * (its qcow2 overlay), an emptyDisk and a cloud-init ISO that holds its user data, are
 * created and deleted; afterwards nothing of theirs is left under the handler's state and
 * run directories (only the image store the next VMI reuses, and only while its image is
 * there), and no mount of theirs in the host's mount table. A handler killed after it began
 * the teardown of ten deleted VMIs (shutdowns asked of a launcher host that cannot answer;
 * guests, files, ghost records and finalizers all still there) is started again and
 * finishes it. libvirt's test
 * driver stands in for QEMU: every file is still made and removed by the handler and its
 * launcher host.
 */
import assert from "node:assert/strict";
import { join, relative } from "node:path";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import {
  createVmi,
  deleteVmi,
  getVmi,
  type HandlerProcess,
  hostedUids,
  hostPid,
  startHandlerProcess,
  testVmi,
  waitFor,
  withHandler,
} from "../helpers/handler_process.ts";
import type { KubeClient } from "../../mod/kube/mod.ts";
import { GUEST_IMAGE, installTestGuest } from "../helpers/guest.ts";

const COUNT = 50;

/** Every path below `dir`, relative to it. */
async function tree(dir: string): Promise<string[]> {
  const out: string[] = [];
  const walk = async (d: string) => {
    let entries: Deno.DirEntry[];
    try {
      entries = await Array.fromAsync(Deno.readDir(d));
    } catch (error) {
      if (error instanceof Deno.errors.NotFound) return;
      throw error;
    }
    for (const e of entries) {
      const path = join(d, e.name);
      out.push(relative(dir, path));
      if (e.isDirectory) await walk(path);
    }
  };
  await walk(dir);
  return out.sort();
}

function mountsBelow(dir: string): string[] {
  return Deno.readTextFileSync("/proc/self/mountinfo").split("\n")
    .map((line) => line.split(" ")[4])
    .filter((point) => point && point.startsWith(dir));
}

/** A VMI with a containerDisk, an emptyDisk and a cloud-init ISO holding a secret. */
function diskVmi(name: string, node: string): VirtualMachineInstance {
  const vmi = testVmi(name, node, {
    extra: {
      disks: [
        { name: "root", disk: { bus: "virtio" } },
        { name: "scratch", disk: { bus: "virtio" } },
        { name: "ci", disk: { bus: "virtio" } },
      ],
    },
  });
  vmi.spec.volumes = [
    { name: "root", containerDisk: { image: GUEST_IMAGE } },
    { name: "scratch", emptyDisk: { capacity: "16Mi" } },
    { name: "ci", cloudInitNoCloud: { userData: `#cloud-config\npassword: secret-${name}\n` } },
  ];
  return vmi as VirtualMachineInstance;
}

async function waitRunning(client: KubeClient, names: string[]): Promise<void> {
  await waitFor(
    `${names.length} VMIs Running`,
    async () => {
      const phases = await Promise.all(
        names.map(async (n) => (await getVmi(client, "default", n))?.status?.phase),
      );
      if (phases.includes("Failed")) throw new Error(`a VMI failed: ${phases}`);
      return phases.every((p) => p === "Running");
    },
    240_000,
    500,
  );
}

async function waitGone(client: KubeClient, names: string[]): Promise<void> {
  await waitFor(
    "every VMI gone",
    async () => {
      const left = await Promise.all(names.map((n) => getVmi(client, "default", n)));
      return left.every((v) => v === undefined);
    },
    // Generous: beside the soak tier's 20 guests the restarted handler's teardown of 10
    // took 4 minutes in one full run (48 s alone); what is checked is that it finishes.
    480_000,
    500,
  );
}

/** Every path under the handler's state and run directories. */
async function handlerFiles(h: HandlerProcess): Promise<string[]> {
  return [
    ...(await tree(h.stateDir)).map((p) => join(h.stateDir, p)),
    ...(await tree(h.runDir)).map((p) => join(h.runDir, p)),
  ];
}

/**
 * What the deleted VMIs left, waited for up to 30 s: every file new since `before` but what
 * all VMIs share (the image store, the launcher host's control socket and its own files, the
 * pod network's address store lock), and every directory named for one of them (the
 * directories that hold them all stay).
 */
async function leftoversOf(
  h: HandlerProcess,
  before: Set<string>,
  uids: string[],
  names: string[],
): Promise<string[]> {
  const shared = (p: string) =>
    p.startsWith(join(h.stateDir, "containerdisks")) ||
    p === join(h.stateDir, "launcher-host", "control.sock") ||
    // The launcher host's own log, PID and start time: a handler that finds its host hung
    // (30 s without an answer: here, while it is stopped) starts another.
    p.startsWith(join(h.stateDir, "launchers", "host-")) ||
    /\/cni-ipam\/[^/]+\/lock$/.test(p);
  const ours = (p: string) => uids.some((u) => p.includes(u)) || names.some((n) => p.includes(n));
  const leftovers = async () =>
    (await handlerFiles(h)).filter((p) =>
      !before.has(p) && !shared(p) && (!Deno.lstatSync(p).isDirectory || ours(p))
    );
  let left = await leftovers();
  for (const deadline = Date.now() + 30_000; left.length > 0 && Date.now() < deadline;) {
    await new Promise((r) => setTimeout(r, 500));
    left = await leftovers();
  }
  return left;
}

Deno.test("storage cleanup: 50 VMIs created and deleted leave no file of theirs and no mount", async () => {
  // Each VMI has a containerDisk, an emptyDisk and cloud-init; once
  // deleted, nothing of theirs remains in the state or run directories.
  await withHandler("cleanup", async ({ h, node, client }) => {
    const names = Array.from({ length: COUNT }, (_, i) => `vm-${node}-${i}`);
    // Read when the first VMI needs it: installed now, with the handler running.
    await installTestGuest(join(h.stateDir, "images"));
    const before = new Set(await handlerFiles(h));
    const uids: string[] = [];
    await Promise.all(names.map(async (name) => {
      uids.push((await createVmi(client, diskVmi(name, node))).metadata.uid!);
    }));
    await waitRunning(client, names);
    const during = await tree(h.stateDir);
    assert.ok(
      uids.every((uid) => during.some((p) => p.includes(uid))),
      "each VMI had files of its own (the check below can fail)",
    );
    const storedDisks = async () =>
      (await tree(join(h.stateDir, "containerdisks"))).filter((p) => p.endsWith(".img"));
    assert.equal((await storedDisks()).length, 1, `one stored disk for all ${COUNT} VMIs`);
    // The user removes the image: its stored disk stays while a VMI reads it, and goes with
    // the last of them.
    for (const entry of Deno.readDirSync(join(h.stateDir, "images"))) {
      await Deno.remove(join(h.stateDir, "images", entry.name), { recursive: true });
    }
    await deleteVmi(client, "default", names[0]);
    await waitFor("the first VMI gone", async () => !(await getVmi(client, "default", names[0])));
    assert.equal((await storedDisks()).length, 1, "kept: 49 VMIs still read it");
    await Promise.all(names.slice(1).map((n) => deleteVmi(client, "default", n)));
    await waitGone(client, names);
    // The VMI objects go once the handler has finished with them (its finalizer); what it
    // removes after that, it removes within seconds.
    const left = await leftoversOf(h, before, uids, names);
    assert.deepEqual(left, [], "files left by deleted VMIs");
    assert.deepEqual(mountsBelow(h.dir), [], "mounts left below the handler's directories");
    assert.deepEqual(await storedDisks(), [], "its image is gone and no VMI reads it");
  });
});

Deno.test("storage cleanup: a handler killed mid-teardown of 10 VMIs finishes it once started again", async () => {
  // In the end no guest, file, ghost record or VMI of the deleted ones is left.
  await withHandler("cleanup-restart", async ({ h, node, client, kubeconfig }) => {
    const names = Array.from({ length: 10 }, (_, i) => `vm-${node}-${i}`);
    await installTestGuest(join(h.stateDir, "images"));
    const before = new Set(await handlerFiles(h));
    const uids: string[] = [];
    for (const name of names) {
      uids.push((await createVmi(client, diskVmi(name, node))).metadata.uid!);
    }
    await waitRunning(client, names);
    const host = hostPid(h.stateDir);
    assert.ok(host, "a launcher host runs");

    // The launcher host is stopped (SIGSTOP), so the handler's requests to shut the guests
    // down go unanswered. Once the handler has begun every VMI's teardown, it is killed
    // (the requests die with its connections) and the host goes on: the guests still run,
    // and all the handler does after the shutdown (the launchers' end, the VMIs' files,
    // ghost records, finalizers) is undone.
    const logStart = (await Deno.readTextFile(h.logFile)).length;
    Deno.kill(host, "SIGSTOP");
    let restarted: HandlerProcess | undefined;
    try {
      await Promise.all(names.map((n) => deleteVmi(client, "default", n)));
      await waitFor("the handler to begin every VMI's teardown", async () => {
        const lines = (await Deno.readTextFile(h.logFile)).slice(logStart).split("\n")
          .filter((l) => /"msg":"Sync: (shutdown|cleanup)/.test(l));
        return uids.every((uid) => lines.some((l) => l.includes(uid)));
      });
      await h.kill("SIGKILL");
    } finally {
      try {
        Deno.kill(host, "SIGCONT");
      } catch {
        // Killed already by the handler, which took it for hung.
      }
    }
    const half = (await handlerFiles(h)).filter((p) => uids.some((u) => p.includes(u)));
    assert.ok(
      uids.every((u) => half.some((p) => p.includes(u))),
      "each VMI's cleanup was left unfinished (the check below can fail)",
    );
    assert.equal(
      (await Promise.all(names.map((n) => getVmi(client, "default", n)))).filter(Boolean).length,
      names.length,
      "every VMI is still there, held by the handler's finalizer",
    );

    try {
      restarted = await startHandlerProcess({
        kubeconfig,
        nodeName: node,
        libvirtUri: "test:///default",
        dir: h.dir,
      });
      await waitGone(client, names);
      const left = await leftoversOf(h, before, uids, names);
      assert.deepEqual(left, [], "files left by the VMIs whose cleanup was cut off");
      assert.deepEqual(mountsBelow(h.dir), [], "mounts left below the handler's directories");
      await waitFor("the launcher host to forget them", () => hostedUids(h.stateDir).length === 0);
    } finally {
      await restarted?.kill("SIGTERM");
    }
  });
});

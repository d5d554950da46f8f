/**
 * Pod-less containerDisks from OCI images built here (`buildImageArchive`, GNU tar, gzip):
 * archives and layout directories, the disk at `/disk` or `containerDisk.path`, stored
 * once by content, and every image that is not a usable containerDisk refused naming the
 * image and the reason (qemu-img judges the disk).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { buildImageArchive } from "../../deploy/image/oci.ts";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { ContainerDiskError, ContainerDiskStore, imageFileName } from "../../mod/storage/mod.ts";

async function run(cmd: string, ...args: string[]): Promise<void> {
  const out = await new Deno.Command(cmd, { args, stdout: "null", stderr: "piped" }).output();
  if (!out.success) {
    throw new Error(`${cmd} ${args.join(" ")}: ${new TextDecoder().decode(out.stderr)}`);
  }
}

/** An image whose root holds `files` (path -> qemu-img create arguments or text). */
async function image(
  dir: string,
  name: string,
  files: Record<string, string[] | string>,
  options: { layout?: boolean; gzip?: boolean } = {},
): Promise<void> {
  const root = await Deno.makeTempDir({ dir });
  for (const [path, content] of Object.entries(files)) {
    await Deno.mkdir(join(root, path, ".."), { recursive: true });
    if (typeof content === "string") await Deno.writeTextFile(join(root, path), content);
    else {await run(
        "qemu-img",
        "create",
        "-q",
        ...content.map((c) => c.replace("@", join(root, path))),
      );}
  }
  const archive = join(dir, "images", `${imageFileName(name)}.tar`);
  await Deno.mkdir(join(dir, "images"), { recursive: true });
  await buildImageArchive({ name, root, entrypoint: ["/none"] }, archive);
  if (options.gzip || options.layout) {
    // Unpack into a layout directory (and gzip its layer, as registries' images are).
    const layout = join(dir, "images", imageFileName(name));
    await Deno.mkdir(layout);
    await run("tar", "-x", "-f", archive, "-C", layout);
    await Deno.remove(archive);
    if (options.gzip) {
      const index = JSON.parse(await Deno.readTextFile(join(layout, "index.json")));
      const manifestFile = join(layout, "blobs", index.manifests[0].digest.replace(":", "/"));
      const manifest = JSON.parse(await Deno.readTextFile(manifestFile));
      const layer = manifest.layers[0];
      const plain = join(layout, "blobs", layer.digest.replace(":", "/"));
      await run("gzip", "-n", plain);
      const bytes = await Deno.readFile(`${plain}.gz`);
      const digest = [...new Uint8Array(await crypto.subtle.digest("SHA-256", bytes))]
        .map((b) => b.toString(16).padStart(2, "0")).join("");
      await Deno.rename(`${plain}.gz`, join(layout, "blobs", "sha256", digest));
      manifest.layers[0] = {
        mediaType: "application/vnd.oci.image.layer.v1.tar+gzip",
        digest: `sha256:${digest}`,
        size: bytes.length,
      };
      const text = new TextEncoder().encode(JSON.stringify(manifest));
      const mdigest = [...new Uint8Array(await crypto.subtle.digest("SHA-256", text))]
        .map((b) => b.toString(16).padStart(2, "0")).join("");
      await Deno.writeFile(join(layout, "blobs", "sha256", mdigest), text);
      index.manifests[0] = {
        ...index.manifests[0],
        digest: `sha256:${mdigest}`,
        size: text.length,
      };
      await Deno.writeTextFile(join(layout, "index.json"), JSON.stringify(index));
    }
  }
  await Deno.remove(root, { recursive: true });
}

function vmi(volumes: Record<string, unknown>[]): VirtualMachineInstance {
  return {
    metadata: { name: "vm1", namespace: "default", uid: "u1" },
    spec: { domain: { devices: {} }, volumes },
  } as unknown as VirtualMachineInstance;
}

async function withStore(fn: (dir: string, store: ContainerDiskStore) => Promise<void>) {
  const dir = await Deno.makeTempDir({ prefix: "virtnode-cdisk-" });
  try {
    await fn(
      dir,
      new ContainerDiskStore({ imageDir: join(dir, "images"), storeDir: join(dir, "store") }),
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("containerDisk store: archives, gzip layers and named paths are each stored once, read-only", async () => {
  // The inputs: an OCI archive with a /disk file, a layout whose layer is
  // gzip-compressed, and an image whose disk is found at a named path.
  await withStore(async (dir, store) => {
    await image(dir, "example.org/raw:1", { "disk/root.img": ["-f", "raw", "@", "1M"] });
    await image(dir, "example.org/qcow:1", { "disk/root.qcow2": ["-f", "qcow2", "@", "2M"] }, {
      gzip: true,
    });
    await image(dir, "example.org/named:1", {
      "images/a.img": ["-f", "raw", "@", "1M"],
      "images/b.img": ["-f", "raw", "@", "3M"],
    }, { layout: true });
    const raw = await store.disk("example.org/raw:1");
    assert.equal(raw?.format, "raw");
    assert.equal((await Deno.stat(raw!.file)).size, 1 << 20);
    assert.equal((await Deno.stat(raw!.file)).mode! & 0o777, 0o444, "stored read-only");
    const qcow = await store.disk("example.org/qcow:1");
    assert.equal(qcow?.format, "qcow2");
    const named = await store.disk("example.org/named:1", "/images/b.img");
    assert.equal((await Deno.stat(named!.file)).size, 3 << 20);
    // Many VMs, one copy.
    const prepared = await store.prepare(vmi([
      { name: "a", containerDisk: { image: "example.org/raw:1" } },
      { name: "b", containerDisk: { image: "example.org/raw:1" } },
      { name: "c", containerDisk: { image: "example.org/qcow:1" } },
      { name: "plain", containerDisk: { image: "not/an-oci-image" } },
    ]));
    assert.equal(prepared.a, raw!.file);
    assert.equal(prepared.b, raw!.file);
    assert.equal(prepared.c, qcow!.file);
    assert.equal(prepared.plain, undefined, "no OCI image: left to the launcher's image directory");
    const stored = [...Deno.readDirSync(join(dir, "store"))].filter((e) => e.name.endsWith(".img"));
    assert.equal(stored.length, 3);
  });
});

Deno.test("containerDisk store: unusable images are refused, naming the field and the image", async () => {
  // Among them: no disk at all, two disks, and a disk in a format that is not accepted.
  await withStore(async (dir, store) => {
    await image(dir, "bad/none:1", { "etc/motd": "hello" });
    await image(dir, "bad/two:1", {
      "disk/a.img": ["-f", "raw", "@", "1M"],
      "disk/b.img": ["-f", "raw", "@", "1M"],
    });
    await image(dir, "bad/vmdk:1", { "disk/a.vmdk": ["-f", "vmdk", "@", "1M"] });
    await run("qemu-img", "create", "-q", "-f", "raw", join(dir, "base.img"), "1M");
    await image(dir, "bad/backing:1", {
      "disk/a.qcow2": ["-f", "qcow2", "-b", join(dir, "base.img"), "-F", "raw", "@"],
    });
    const cases: [string, string | undefined, RegExp, string][] = [
      ["bad/none:1", undefined, /no file under \/disk: it is not a containerDisk image/, "image"],
      ["bad/two:1", undefined, /2 files under \/disk .*containerDisk\.path/, "image"],
      ["bad/vmdk:1", undefined, /is vmdk, not raw or qcow2/, "image"],
      ["bad/backing:1", undefined, /with a backing file/, "image"],
      ["bad/two:1", "/disk/c.img", /no file "\/disk\/c\.img"/, "path"],
    ];
    for (const [ref, path, message, field] of cases) {
      await assert.rejects(
        store.prepare(
          vmi([{ name: "d", containerDisk: { image: ref, ...(path ? { path } : {}) } }]),
        ),
        (error: unknown) => {
          assert.ok(error instanceof ContainerDiskError, String(error));
          assert.equal(error.path, `spec.volumes[0].containerDisk.${field}`);
          assert.match(error.message, new RegExp(`Cannot read image "${ref.replace("/", "\\/")}"`));
          assert.match(error.message, message);
          return true;
        },
      );
    }
    assert.deepEqual(
      [...Deno.readDirSync(join(dir, "store"))].filter((e) => !e.name.endsWith(".json")),
      [],
      "nothing half-written stays in the store",
    );
  });
});

Deno.test("containerDisk store: collect() removes disks of replaced or removed images no VMI reads", async () => {
  // Disks a VMI still reads, and those of images still present, are kept.
  await withStore(async (dir, store) => {
    await image(dir, "example.org/kept:1", { "disk/root.img": ["-f", "raw", "@", "1M"] });
    await image(dir, "example.org/replaced:1", { "disk/root.img": ["-f", "raw", "@", "1M"] });
    await image(dir, "example.org/removed:1", { "disk/root.img": ["-f", "raw", "@", "1M"] });
    await image(dir, "example.org/read:1", { "disk/root.img": ["-f", "raw", "@", "1M"] });
    const kept = (await store.disk("example.org/kept:1"))!.file;
    const replaced = (await store.disk("example.org/replaced:1"))!.file;
    const removed = (await store.disk("example.org/removed:1"))!.file;
    const read = (await store.disk("example.org/read:1"))!.file;
    // A new version under the same name (a different manifest), one image gone, and one
    // gone while a VMI still reads its disk.
    const archive = (name: string) => join(dir, "images", `${imageFileName(name)}.tar`);
    await Deno.remove(archive("example.org/replaced:1"));
    await image(dir, "example.org/replaced:1", { "disk/root.img": ["-f", "raw", "@", "2M"] });
    await Deno.remove(archive("example.org/removed:1"));
    await Deno.remove(archive("example.org/read:1"));
    const gone = await store.collect(new Set([read]));
    assert.deepEqual(gone.sort(), [removed, replaced].sort());
    const exists = (f: string) => Deno.stat(f).then(() => true, () => false);
    assert.equal(await exists(kept), true, "its image is still there: kept for the next VMI");
    assert.equal(await exists(read), true, "a VMI reads it");
    assert.equal(await exists(replaced), false);
    assert.equal(await exists(replaced.replace(/\.img$/, ".json")), false);
    assert.deepEqual(await store.collect(new Set()), [read], "once no VMI reads it, it goes");
    const again = await store.disk("example.org/replaced:1");
    assert.equal((await Deno.stat(again!.file)).size, 2 << 20, "the new version is stored anew");
  });
});

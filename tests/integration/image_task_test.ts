/**
 * `deno task image`, as a user runs it: the virtnode image archive under the folder given,
 * named as deploy/daemonset.yaml names it, with the form it says (compiled or source) in its
 * labels and the digest it prints in the archive's index. The node tier imports the same
 * archive into a real containerd (`ctr images import`) and runs the DaemonSet from it.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { imageName } from "../../deploy/image/image.ts";

const ROOT = new URL("../../", import.meta.url).pathname;

async function task(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["task", "--quiet", "image", ...args],
    cwd: ROOT,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = (b: Uint8Array) => new TextDecoder().decode(b);
  return { code: out.code, stdout: text(out.stdout), stderr: text(out.stderr) };
}

/** A file of the archive, as text. */
async function member(archive: string, path: string): Promise<string> {
  const out = await new Deno.Command("tar", {
    args: ["-xOf", archive, path],
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.ok(out.success, `${path}: ${new TextDecoder().decode(out.stderr)}`);
  return new TextDecoder().decode(out.stdout);
}

Deno.test("deno task image writes the DaemonSet's image as an OCI archive and prints its digest", async () => {
  const dir = await Deno.makeTempDir({ prefix: "virtnode-image-" });
  try {
    const { version } = JSON.parse(await Deno.readTextFile(join(ROOT, "deno.json")));
    const r = await task(["--out", dir]);
    assert.equal(r.code, 0, r.stderr);
    const file = join(dir, `virtnode-${version}.oci.tar`);
    const printed = (label: string) => r.stdout.match(new RegExp(`^${label} +(\\S+)`, "m"))?.[1];
    assert.equal(printed("image"), imageName(version));
    assert.equal(printed("archive"), file);
    const form = Deno.env.get("DENORT_BIN") ? "compiled" : "source";
    assert.equal(printed("form"), `${form}:`);
    assert.match(r.stdout, new RegExp(`ctr -n k8s.io images import ${file}`));

    const index = JSON.parse(await member(file, "index.json"));
    const [entry] = index.manifests;
    assert.equal(entry.digest, printed("digest"));
    assert.equal(entry.annotations["io.containerd.image.name"], imageName(version));
    const manifest = JSON.parse(await member(file, `blobs/sha256/${entry.digest.slice(7)}`));
    assert.equal(manifest.layers.length, 2); // Debian's libraries, then virtnode
    const config = JSON.parse(
      await member(file, `blobs/sha256/${manifest.config.digest.slice(7)}`),
    );
    assert.deepEqual(config.config.Entrypoint, ["/usr/local/bin/virtnode"]);
    assert.equal(config.config.Labels["dev.virtnode.form"], form);
    assert.equal(config.config.Labels["org.opencontainers.image.version"], version);
    // Docker's index beside the OCI one, for a `docker load` that reads no OCI layout.
    const [docker] = JSON.parse(await member(file, "manifest.json"));
    assert.deepEqual(docker.RepoTags, [imageName(version)]);
    assert.equal(docker.Layers.length, 2);

    // --json says the same, for scripts (the test node's harness reads it).
    const json = await task(["--out", dir, "--json"]);
    assert.equal(json.code, 0, json.stderr);
    const built = JSON.parse(json.stdout.trim().split("\n").at(-1)!);
    assert.equal(built.file, file);
    assert.equal(built.digest, entry.digest);
    assert.equal(built.form, form);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("deno task image refuses an unknown flag with its usage, exit 2", async () => {
  const r = await task(["--bogus"]);
  assert.equal(r.code, 2);
  assert.match(r.stderr, /^deno task image: .*bogus/m);
  assert.match(r.stderr, /usage: deno task image \[--out DIR\] \[--json\]/);
});

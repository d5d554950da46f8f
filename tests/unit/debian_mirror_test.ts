/**
 * deploy/build_lib.sh's debian_mirror: the builds take the Debian archive from the machine's
 * own apt sources (both formats), so that a local mirror or proxy serves them too.
 */
import assert from "node:assert/strict";
import { join } from "node:path";

const LIB = new URL("../../deploy/build_lib.sh", import.meta.url).pathname;

/** Runs debian_mirror with `files` (paths below etc/apt) as the machine's apt sources. */
async function mirror(
  files: Record<string, string>,
  suite = "bookworm",
  env: Record<string, string> = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  const root = await Deno.makeTempDir({ prefix: "virtnode-apt-" });
  try {
    await Deno.mkdir(join(root, "etc/apt/sources.list.d"), { recursive: true });
    for (const [path, text] of Object.entries(files)) {
      await Deno.writeTextFile(join(root, "etc/apt", path), text);
    }
    const out = await new Deno.Command("bash", {
      args: ["-c", `source "${LIB}" && debian_mirror "$1"`, "bash", suite],
      env: { VIRTNODE_APT_ROOT: root, ...env },
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = (b: Uint8Array) => new TextDecoder().decode(b).trim();
    return { code: out.code, stdout: text(out.stdout), stderr: text(out.stderr) };
  } finally {
    await Deno.remove(root, { recursive: true });
  }
}

Deno.test("debian_mirror reads a deb822 .sources file: the enabled stanza of the suite", async () => {
  const sources = [
    "Types: deb",
    "URIs: http://disabled.example/debian",
    "Suites: bookworm",
    "Components: main",
    "Enabled: no",
    "",
    "Types: deb-src deb",
    "# a comment inside the stanza",
    "URIs: http://mirror.example/debian/ http://second.example/debian",
    "Suites: bookworm bookworm-updates",
    "Components: main",
    "",
    "Types: deb",
    "URIs: http://mirror.example/debian-security",
    "Suites: bookworm-security",
    "Components: main",
  ].join("\n");
  const r = await mirror({ "sources.list.d/debian.sources": sources });
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.stdout, "http://mirror.example/debian");
  const security = await mirror({ "sources.list.d/debian.sources": sources }, "bookworm-security");
  assert.equal(security.stdout, "http://mirror.example/debian-security");
});

Deno.test("debian_mirror reads one-line entries, options in brackets and deb-src skipped", async () => {
  const list = [
    "# deb http://commented.example/debian bookworm main",
    "deb-src http://source.example/debian bookworm main",
    "deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://proxy:3142/sec bookworm-security main",
    "deb [ arch=amd64 ] http://proxy:3142/debian bookworm main contrib",
  ].join("\n");
  const r = await mirror({ "sources.list": list });
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.stdout, "http://proxy:3142/debian");
});

Deno.test("debian_mirror fails naming the files it read when no entry has the suite", async () => {
  const r = await mirror({ "sources.list": "deb http://deb.example/debian trixie main\n" });
  assert.equal(r.code, 1);
  assert.equal(r.stdout, "");
  assert.match(r.stderr, /Cannot find a Debian archive for bookworm/);
  assert.match(r.stderr, /etc\/apt\/sources\.list /);
  assert.match(r.stderr, /VIRTNODE_DEBIAN_MIRROR/);
  const none = await mirror({});
  assert.equal(none.code, 1);
  assert.match(none.stderr, /sources\.list\.d/);
});

Deno.test("VIRTNODE_DEBIAN_MIRROR overrides the machine's sources", async () => {
  const r = await mirror({}, "bookworm", { VIRTNODE_DEBIAN_MIRROR: "http://given.example/debian" });
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.stdout, "http://given.example/debian");
});

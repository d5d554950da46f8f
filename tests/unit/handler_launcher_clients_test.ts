import assert from "node:assert/strict";
import { LauncherClients } from "../../mod/handler/testing.ts";

Deno.test("LauncherClients marks a launcher unresponsive after 30 s without a dial, writing the marker", async () => {
  // Failed dials within the first 30 s do not mark it yet.
  const dir = await Deno.makeTempDir();
  const socket = `${dir}/launcher-sock`;
  let now = 1_000_000;
  const gone: string[] = [];
  const markerDir = `${dir}/state/unresponsive`;
  const pool = new LauncherClients({
    now: () => now,
    onUnresponsive: (uid) => gone.push(uid),
    markerDir,
  });
  let listener: Deno.Listener | undefined = Deno.listen({ transport: "unix", path: socket });
  try {
    pool.getOrCreate("u1", socket);
    assert.equal(await pool.state("u1"), "responsive");
    await pool.monitorOnce();
    assert.deepEqual(gone, []);

    // The launcher dies without unlinking its socket, as after a SIGKILL: the file stays,
    // nobody listens (Deno's close() unlinks, so bind a dead socket file with python).
    listener.close();
    listener = undefined;
    const bind = await new Deno.Command("python3", {
      args: ["-c", "import socket,sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])", socket],
    }).output();
    assert.ok(bind.success);
    now += 11_000;
    await pool.monitorOnce();
    now += 11_000;
    await pool.monitorOnce();
    assert.deepEqual(gone, [], "22 s without an answer is not yet unresponsive");
    assert.equal(await pool.state("u1"), "responsive");
    now += 11_000;
    await pool.monitorOnce();
    assert.deepEqual(gone, ["u1"]);
    assert.equal(await pool.state("u1"), "unresponsive");
    assert.match(await Deno.readTextFile(`${markerDir}/u1`), /no answer for 33 s/);

    // The marker survives a handler restart: a fresh pool reads it.
    const fresh = new LauncherClients({ markerDir });
    fresh.getOrCreate("u1", socket);
    assert.equal(await fresh.state("u1"), "unresponsive");
    fresh.close();
  } finally {
    listener?.close();
    pool.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("LauncherClients never writes into the launcher's directory: a planted symlink redirects nothing", async () => {
  const dir = await Deno.makeTempDir();
  const socketDir = `${dir}/pod-sockets`;
  await Deno.mkdir(socketDir);
  const victim = `${dir}/host-file`;
  await Deno.writeTextFile(victim, "precious\n");
  // What KubeVirt names the mark beside the socket, pointed by a hostile pod at a host file.
  await Deno.symlink(victim, `${socketDir}/launcher-unresponsive`);
  const pool = new LauncherClients({ markerDir: `${dir}/state/unresponsive` });
  try {
    pool.getOrCreate("u2", `${socketDir}/launcher-sock`);
    await pool.markUnresponsive("u2", "launcher exited (code 1, signal null)");
    assert.equal(await Deno.readTextFile(victim), "precious\n");
    assert.equal(await pool.state("u2"), "unresponsive");
    assert.match(await Deno.readTextFile(`${dir}/state/unresponsive/u2`), /launcher exited/);
    await pool.forgetMark("u2");
    await assert.rejects(Deno.lstat(`${dir}/state/unresponsive/u2`));
  } finally {
    pool.close();
    await Deno.remove(dir, { recursive: true });
  }
});

/**
 * Connected unix sockets bound below `dir`: a server's accepted ends show the path it bound
 * (the cmd server binds `launcher-init-sock` and renames it).
 */
function acceptedConnections(dir: string): string[] {
  const lines = Deno.readTextFileSync("/proc/self/net/unix").split("\n").slice(1);
  // Columns: Num RefCount Protocol Flags Type St Inode Path; St 03 is connected.
  return lines.map((l) => l.trim().split(/\s+/))
    .filter((f) => f[5] === "03" && f[7]?.startsWith(`${dir}/`))
    .map((f) => f[6]);
}

Deno.test(
  "LauncherClient reuses one connection to its launcher across calls, also after a pause",
  {
    sanitizeOps: false,
    sanitizeResources: false,
  },
  async () => {
    // Deno 2.9 never frees the memory of a closed HTTP/2 session, so a session per call would leak.
    const { CmdServer } = await import("../../mod/launcher/mod.ts");
    const { LauncherClient } = await import("../../mod/handler/testing.ts");
    const dir = await Deno.makeTempDir();
    let calls = 0;
    const backend = {
      vmiKey: "default/vm",
      getDomain: () => {
        calls++;
        return Promise.resolve(undefined);
      },
    } as unknown as ConstructorParameters<typeof Object>[0];
    const server = await CmdServer.start({ socketDir: dir, backend: backend as never });
    await server.markReady();
    const client = new LauncherClient(server.socketPath);
    try {
      assert.equal(await client.getDomain(), undefined);
      const first = acceptedConnections(dir);
      assert.equal(first.length, 1, "one connection");
      // Longer than the 1 s a channel's idle timeout can be at least.
      await new Promise((r) => setTimeout(r, 1_500));
      assert.equal(await client.getDomain(), undefined);
      assert.equal(await client.getDomain(), undefined);
      assert.equal(calls, 3);
      assert.deepEqual(acceptedConnections(dir), first, "the same connection (socket inode)");
    } finally {
      client.close();
      await server.stop(100);
      await Deno.remove(dir, { recursive: true });
    }
  },
);

Deno.test("LauncherClients: a launcher reported ended before its client exists starts unresponsive", async () => {
  // No marker file is written for that early mark, and a cleanup forgets it.
  const dir = await Deno.makeTempDir();
  const markerDir = `${dir}/unresponsive`;
  const gone: string[] = [];
  const pool = new LauncherClients({ markerDir, onUnresponsive: (uid) => gone.push(uid) });
  try {
    await pool.markUnresponsive("u1", "cannot serve the cmd socket");
    await pool.markUnresponsive("u1", "reported again");
    assert.deepEqual(gone, ["u1"], "told once");
    pool.getOrCreate("u1", `${dir}/never-sock`);
    assert.equal(await pool.state("u1"), "unresponsive", "not notReady for 3 min");
    await assert.rejects(Deno.lstat(`${markerDir}/u1`), Deno.errors.NotFound);

    // Cleaned up before its client came: a later VMI's client under the same key is fresh.
    await pool.markUnresponsive("u2", "ended");
    await pool.forgetMark("u2");
    pool.getOrCreate("u2", `${dir}/never-sock-2`);
    assert.equal(await pool.state("u2"), "notReady");
  } finally {
    pool.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test(
  "LauncherClient: a launcher that exits during a call is a disconnect, not a refusal",
  { sanitizeOps: false, sanitizeResources: false },
  async () => {
    // KubeVirt's launcher exits once its domain is gone, sometimes before it answers the
    // handler's delete; virt-handler counts that disconnect as the delete done. The
    // launcher here is a process of its own that exits inside the call.
    const { LauncherClient, LauncherCallError } = await import("../../mod/handler/testing.ts");
    const dir = await Deno.makeTempDir();
    const script = `${dir}/launcher.ts`;
    const launcherMod = new URL("../../mod/launcher/mod.ts", import.meta.url).href;
    await Deno.writeTextFile(
      script,
      `import { CmdServer } from ${JSON.stringify(launcherMod)};
const backend = {
  vmiKey: "default/vm",
  getDomain: () => Promise.resolve(undefined),
  deleteDomain: () => Deno.exit(0),
};
const server = await CmdServer.start({ socketDir: Deno.args[0], backend });
await server.markReady();
console.log(server.socketPath);
`,
    );
    const child = new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        "--config",
        new URL("../../deno.json", import.meta.url).pathname,
        script,
        dir,
      ],
      stdout: "piped",
      stderr: "inherit",
    }).spawn();
    const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
    let socket = "";
    while (!socket.includes("\n")) {
      const { value, done } = await reader.read();
      if (done) break;
      socket += value;
    }
    const client = new LauncherClient(socket.trim());
    try {
      assert.equal(await client.getDomain(), undefined);
      const vmi = { metadata: { name: "vm", namespace: "default", uid: "u1" } };
      const error = await client.deleteVirtualMachine(vmi as never).then(
        () => assert.fail("the delete answered"),
        (e: unknown) => e,
      );
      assert.ok(error instanceof LauncherCallError, String(error));
      assert.equal(error.disconnected, true, error.message);
      // A launcher that answers and refuses is no disconnect.
      const refused = new LauncherCallError("DeleteVirtualMachine", "no");
      assert.equal(refused.disconnected, false);
    } finally {
      client.close();
      await reader.cancel().catch(() => {});
      try {
        child.kill("SIGKILL");
      } catch { /* it exited */ }
      await child.status;
      await Deno.remove(dir, { recursive: true });
    }
  },
);

/**
 * Repro: Deno's node:net closes a unix socket's descriptor twice.
 *
 *     deno run -A tests/repro/pipe_double_close.ts [iterations] [listener|client|server]
 *
 * Each iteration opens one node:net unix socket of the kind named and closes it, while a
 * second task creates and removes small directory trees (Deno's blocking pool opens each
 * directory it reads). When the socket's descriptor is closed a second time after the number
 * went to such a directory, the directory read fails: "Bad file descriptor" from
 * `Deno.remove`, or Deno panics with "unexpected error during closedir". Any descriptor can be
 * the one reused: a file being written, a netns, a libvirt connection.
 *
 * - `listener`: a node:net server listens on a socket and closes.
 * - `client`: a node:net client connects to a `Deno.listen` socket and is destroyed.
 * - `server`: a node:net server accepts a `Deno.connect` client and destroys the connection.
 *
 * Deno's own sockets (`Deno.listen`, `Deno.connect`) and node:net over TCP do not do it.
 * Results in docs/compatibility.md's known limitations (1500 iterations per run).
 *
 * @module
 */
import * as net from "node:net";

const iterations = Number(Deno.args[0] ?? 1500);
const kind = Deno.args[1] ?? "listener";
if (!["listener", "client", "server"].includes(kind)) {
  console.error(`usage: pipe_double_close.ts [iterations] [listener|client|server]`);
  Deno.exit(2);
}

let stop = false;
const scratch = await Deno.makeTempDir({ prefix: "repro-churn-" });
const churn = (async () => {
  for (let i = 0; !stop; i++) {
    const dir = `${scratch}/t${i}`;
    await Deno.mkdir(`${dir}/a/b`, { recursive: true });
    for (let j = 0; j < 10; j++) await Deno.writeTextFile(`${dir}/a/f${j}`, "x");
    await Deno.remove(dir, { recursive: true });
  }
})();

const once = <T>(emitter: { once(e: string, f: (v: T) => void): unknown }, event: string) =>
  new Promise<T>((resolve) => emitter.once(event, resolve));

for (let n = 0; n < iterations; n++) {
  const dir = await Deno.makeTempDir({ prefix: "repro-sock-" });
  const path = `${dir}/s.sock`;
  if (kind === "listener") {
    const server = net.createServer();
    await new Promise<void>((resolve) => server.listen(path, resolve));
    await new Promise<void>((resolve) => server.close(() => resolve()));
  } else if (kind === "client") {
    const listener = Deno.listen({ transport: "unix", path });
    const accepted = listener.accept();
    const client = net.createConnection(path);
    client.on("error", () => {});
    await once(client, "connect");
    const conn = await accepted;
    client.destroy();
    await new Promise((resolve) => setTimeout(resolve, 0));
    conn.close();
    listener.close();
  } else {
    const server = net.createServer();
    const connection = once<net.Socket>(server, "connection");
    await new Promise<void>((resolve) => server.listen(path, resolve));
    const conn = await Deno.connect({ transport: "unix", path });
    const socket = await connection;
    socket.on("error", () => {});
    socket.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
    conn.close();
  }
  await Deno.remove(dir, { recursive: true });
}
stop = true;
await churn;
await Deno.remove(scratch, { recursive: true });
console.log(`${iterations} ${kind} sockets closed, no descriptor lost`);

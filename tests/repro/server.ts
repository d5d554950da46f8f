// Repro server: serves repro.Echo on the target given as argv[0] (e.g. unix:///tmp/x.sock,
// unix-abstract:name, 127.0.0.1:0). Prints "ready <port>" once bound.
// SIGUSR1 -> the shutdown named by env REPRO_SHUTDOWN, then Deno.exit(0):
//   try (default): server.tryShutdown()      -> GOAWAY(NO_ERROR) to every client
//   force:         server.forceShutdown()    -> GOAWAY(CANCEL)
//   exit:          nothing, just exit        -> clients see EOF, no GOAWAY
//   sockets:       destroy each session's socket (no GOAWAY), then forceShutdown()
// SIGUSR2 -> server.forceShutdown() then Deno.exit(0). SIGTERM -> exit(0) at once.
// Env REPRO_SERVER_OPTS: JSON grpc.ServerOptions. REPRO_EXIT_DELAY_MS: wait before exit.
import { echoService, envOptions, grpc } from "./common.ts";

const target = Deno.args[0];
const exitDelay = Number(Deno.env.get("REPRO_EXIT_DELAY_MS") ?? "0");
const server = new grpc.Server(envOptions("REPRO_SERVER_OPTS"));
server.addService(echoService, {
  Ping(call: grpc.ServerUnaryCall<{ text: string }, unknown>, cb: grpc.sendUnaryData<unknown>) {
    cb(null, { text: call.request.text });
  },
});
const path = target.startsWith("unix://") ? target.slice("unix://".length) : undefined;
if (path) await Deno.remove(path).catch(() => {});
const port = await new Promise<number>((resolve, reject) =>
  server.bindAsync(
    target,
    grpc.ServerCredentials.createInsecure(),
    (e, p) => e ? reject(e) : resolve(p),
  )
);
// Raw sockets of the http2 servers grpc-js created (the session's `socket` is a proxy that
// refuses destroy()); used by REPRO_SHUTDOWN=sockets.
const rawSockets = new Set<{ destroy(): void }>();
// deno-lint-ignore no-explicit-any
for (const h2 of (server as any).http2Servers.keys()) {
  h2.on("connection", (sock: { destroy(): void; once(e: string, f: () => void): void }) => {
    rawSockets.add(sock);
    sock.once("close", () => rawSockets.delete(sock));
  });
}
console.log(`ready ${port}`);

const exitSoon = () => setTimeout(() => Deno.exit(0), exitDelay);
const mode = Deno.env.get("REPRO_SHUTDOWN") ?? "try";
Deno.addSignalListener("SIGUSR1", () => {
  if (mode === "try") server.tryShutdown(() => exitSoon());
  else if (mode === "force") (server.forceShutdown(), exitSoon());
  else if (mode === "exit") exitSoon();
  else if (mode === "sockets") {
    for (const sock of rawSockets) sock.destroy();
    setTimeout(() => (server.forceShutdown(), exitSoon()), 50);
  } else throw new Error(`unknown REPRO_SHUTDOWN ${mode}`);
});
Deno.addSignalListener("SIGUSR2", () => {
  server.forceShutdown();
  exitSoon();
});
Deno.addSignalListener("SIGTERM", () => Deno.exit(0));
setInterval(() => {}, 1 << 30); // stay alive

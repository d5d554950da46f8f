// Repro client: argv[0] target, argv[1] mode.
//   idle        : one Ping, print "called", then stay alive up to REPRO_LINGER_MS (default
//                 3000) and exit 0. The driver kills/shuts the server meanwhile.
//   close:<ms>  : one Ping, print "called", wait <ms>, client.close(), print "closed",
//                 linger REPRO_LINGER_MS (default 500), exit 0.
//   fresh:<ms>  : like close:<ms> but never calls close(); drops the reference
//                 (and calls gc() if run with --v8-flags=--expose-gc).
// Env REPRO_CHANNEL_OPTS: JSON grpc.ChannelOptions. REPRO_CALLS: number of Pings (default 1;
// 0 = connect with waitForReady and make no call).
import { EchoClient, envOptions, grpc } from "./common.ts";

const [target, mode = "idle"] = Deno.args;
const calls = Number(Deno.env.get("REPRO_CALLS") ?? "1");
let client: grpc.Client | null = new EchoClient(
  target,
  grpc.credentials.createInsecure(),
  envOptions("REPRO_CHANNEL_OPTS"),
);
const ping = (c: grpc.Client) =>
  new Promise<void>((resolve, reject) =>
    // deno-lint-ignore no-explicit-any
    (c as any).Ping(
      { text: "x" },
      { deadline: Date.now() + 5000 },
      (e: unknown) => e ? reject(e) : resolve(),
    )
  );
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

if (calls === 0) {
  // Connect without any stream: wait until the channel is READY.
  await new Promise<void>((resolve, reject) =>
    client!.waitForReady(Date.now() + 5000, (e) => e ? reject(e) : resolve())
  );
}
for (let i = 0; i < calls; i++) await ping(client);
console.log("called");
if (mode === "idle") {
  await sleep(Number(Deno.env.get("REPRO_LINGER_MS") ?? "3000"));
} else {
  const [kind, ms] = mode.split(":");
  await sleep(Number(ms));
  if (kind === "close") client.close();
  client = null;
  // deno-lint-ignore no-explicit-any
  (globalThis as any).gc?.();
  console.log("closed");
  await sleep(Number(Deno.env.get("REPRO_LINGER_MS") ?? "500"));
}
Deno.exit(0);

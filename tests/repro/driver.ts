// Driver of the grpc-js/Deno crash repro. Usage (from the repo root):
//   deno run -A tests/repro/driver.ts [--n 20] [--scenarios a,b,c0,c100,c1000,c5000,d]
//       [--deno /path/to/deno] [--transport unix|abstract|tcp] [--v]
// Env REPRO_SHUTDOWN_AFTER_MS (default 200): pause between the client's last call and the
// server's shutdown in a/b/d. Env REPRO_CHANNEL_OPTS / REPRO_SERVER_OPTS / REPRO_CALLS /
// REPRO_EXIT_DELAY_MS / REPRO_SHUTDOWN / REPRO_LINGER_MS are passed
// through to client.ts / server.ts. A run "crashes" when a process ends by a signal or with
// a code other than 0 (134 = SIGABRT, 139 = SIGSEGV), except the server's SIGKILL in (b).
//
// Scenarios:
//   a     client idle-connected; server: tryShutdown() then exit
//   b     client idle-connected; server SIGKILLed
//   cN    client: Ping, wait N ms, client.close(); server stays up (SIGTERM afterwards)
//   fN    client: Ping, wait N ms, drop the client without close() (gc if exposed)
//   d     client idle-connected; server: forceShutdown() then exit
import { parseArgs } from "node:util";
import { fileURLToPath } from "node:url";

const { values } = parseArgs({
  options: {
    n: { type: "string", default: "20" },
    scenarios: { type: "string", default: "a,b,c0,c100,c1000,c5000,d" },
    deno: { type: "string", default: Deno.execPath() },
    transport: { type: "string", default: "unix" },
    v: { type: "boolean", default: false },
    "deno-flags": { type: "string", default: "" },
  },
});
const here = fileURLToPath(new URL(".", import.meta.url));
const N = Number(values.n);
const denoFlags = values["deno-flags"] ? values["deno-flags"].split(" ") : [];

type Exit = { code: number; signal: string | null; stderr: string };

class Proc {
  child: Deno.ChildProcess;
  lines: string[] = [];
  stderr = "";
  status: Promise<Exit>;
  #waiters: Array<() => void> = [];
  constructor(script: string, args: string[]) {
    this.child = new Deno.Command(values.deno!, {
      args: ["run", "-A", "--no-lock", ...denoFlags, `${here}${script}`, ...args],
      stdout: "piped",
      stderr: "piped",
      stdin: "null",
    }).spawn();
    const out = this.#pump(this.child.stdout, (s) => {
      this.lines.push(...s.split("\n").filter(Boolean));
      this.#waiters.splice(0).forEach((w) => w());
    });
    const err = this.#pump(this.child.stderr, (s) => (this.stderr += s));
    this.status = Promise.all([this.child.status, out, err]).then(([s]) => ({
      code: s.code,
      signal: s.signal,
      stderr: this.stderr,
    }));
  }
  async #pump(stream: ReadableStream<Uint8Array>, on: (s: string) => void) {
    const dec = new TextDecoder();
    for await (const chunk of stream) on(dec.decode(chunk));
  }
  async waitLine(prefix: string, ms = 10_000): Promise<string> {
    const end = Date.now() + ms;
    while (Date.now() < end) {
      const l = this.lines.find((x) => x.startsWith(prefix));
      if (l) return l;
      const exited = await Promise.race([
        new Promise<boolean>((r) => {
          this.#waiters.push(() => r(false));
          setTimeout(() => r(false), 50);
        }),
        this.status.then(() => true),
      ]);
      if (exited && !this.lines.find((x) => x.startsWith(prefix))) {
        throw new Error(`exited before "${prefix}": ${this.stderr.slice(-300)}`);
      }
    }
    throw new Error(`timeout waiting for "${prefix}"`);
  }
  kill(sig: Deno.Signal) {
    try {
      this.child.kill(sig);
    } catch { /* gone */ }
  }
  async wait(ms: number): Promise<Exit | "hang"> {
    let t: ReturnType<typeof setTimeout> | undefined;
    const r = await Promise.race([
      this.status,
      new Promise<"hang">((res) => (t = setTimeout(() => res("hang"), ms))),
    ]);
    clearTimeout(t);
    if (r === "hang") {
      this.kill("SIGKILL");
      await this.status;
    }
    return r;
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
let seq = 0;
function targets(): { serverTarget: string; clientTarget: (port: number) => string } {
  const id = `${Deno.pid}-${seq++}`;
  switch (values.transport) {
    case "abstract":
      return {
        serverTarget: `unix-abstract:repro-${id}`,
        clientTarget: () => `unix-abstract:repro-${id}`,
      };
    case "tcp":
      return { serverTarget: "127.0.0.1:0", clientTarget: (p) => `127.0.0.1:${p}` };
    default:
      return {
        serverTarget: `unix:///tmp/repro-${id}.sock`,
        clientTarget: () => `unix:///tmp/repro-${id}.sock`,
      };
  }
}

function classify(e: Exit | "hang", expectSignal?: string): string | null {
  if (e === "hang") return "hang";
  if (e.signal && e.signal === expectSignal) return null;
  if (e.code === 0 && !e.signal) return null;
  const why = /Assertion.*$/m.exec(e.stderr)?.[0] ??
    /Segmentation fault|free\(\)[^\n]*|panicked[^\n]*/.exec(e.stderr)?.[0] ?? "";
  return `${e.signal ?? "code " + e.code}${why ? " " + why.slice(0, 120) : ""}`;
}

async function once(scenario: string): Promise<{ client: string | null; server: string | null }> {
  const { serverTarget, clientTarget } = targets();
  const server = new Proc("server.ts", [serverTarget]);
  const port = Number((await server.waitLine("ready")).split(" ")[1]);
  let clientMode = "idle";
  if (/^[cf]\d+$/.test(scenario)) {
    clientMode = `${scenario[0] === "c" ? "close" : "fresh"}:${scenario.slice(1)}`;
  }
  const client = new Proc("client.ts", [clientTarget(port), clientMode]);
  let serverExpect: string | undefined;
  try {
    await client.waitLine("called");
  } catch (e) {
    console.error(`  client failed to call: ${(e as Error).message}`);
  }
  if (clientMode === "idle") {
    await sleep(Number(Deno.env.get("REPRO_SHUTDOWN_AFTER_MS") ?? "200"));
    if (scenario === "a") server.kill("SIGUSR1");
    else if (scenario === "b") (server.kill("SIGKILL"), (serverExpect = "SIGKILL"));
    else if (scenario === "d") server.kill("SIGUSR2");
    const s = await server.wait(10_000);
    const c = await client.wait(10_000);
    return { client: classify(c), server: classify(s, serverExpect) };
  }
  const c = await client.wait(Number(scenario.slice(1)) + 10_000);
  server.kill("SIGTERM");
  const s = await server.wait(10_000);
  return { client: classify(c), server: classify(s) };
}

const results: Record<
  string,
  { n: number; client: number; server: number; kinds: Record<string, number> }
> = {};
for (const sc of values.scenarios!.split(",")) {
  const r = (results[sc] = { n: 0, client: 0, server: 0, kinds: {} as Record<string, number> });
  for (let i = 0; i < N; i++) {
    const { client, server } = await once(sc);
    r.n++;
    if (client) {
      (r.client++, (r.kinds["client: " + client] = (r.kinds["client: " + client] ?? 0) + 1));
    }
    if (server) {
      (r.server++, (r.kinds["server: " + server] = (r.kinds["server: " + server] ?? 0) + 1));
    }
    if (values.v && (client || server)) {
      console.error(`  ${sc}#${i}: client=${client} server=${server}`);
    }
  }
  console.log(
    `${sc.padEnd(6)} n=${r.n} client-crash=${r.client} server-crash=${r.server} ${
      JSON.stringify(r.kinds)
    }`,
  );
}
const ver = new TextDecoder().decode(
  new Deno.Command(values.deno!, { args: ["--version"], stdout: "piped" }).outputSync().stdout,
).split("\n")[0];
console.log(
  JSON.stringify({
    deno: ver,
    transport: values.transport,
    channelOpts: Deno.env.get("REPRO_CHANNEL_OPTS") ?? "{}",
    serverOpts: Deno.env.get("REPRO_SERVER_OPTS") ?? "{}",
    results,
  }),
);

import assert from "node:assert/strict";
import { join } from "node:path";
import * as grpc from "@grpc/grpc-js";
import { LauncherCallError, LauncherClient } from "../../mod/handler/testing.ts";
import { cmdInfoService, cmdService, unixTarget } from "../../mod/proto/mod.ts";

// grpc-js keeps timers and sockets past a test's end.
const grpcTest = { sanitizeOps: false, sanitizeResources: false };

type Callback = (error: Partial<grpc.ServiceError> | null, value?: unknown) => void;

/** A launcher's socket with a real grpc-js server: CmdInfo (unless `versions` is unset) and Ping/GetDomain. */
interface FakeLauncher {
  socketPath: string;
  /** `CmdInfo.Info` calls. */
  infoCalls: number;
  /** Calls of the Cmd service, by method. */
  cmdCalls: string[];
  /** Answer the next N Ping calls with UNAVAILABLE. */
  unavailablePings: number;
  close(): Promise<void>;
}

async function startLauncher(versions?: number[]): Promise<FakeLauncher> {
  const dir = await Deno.makeTempDir({ prefix: "vn-launcher-info" });
  const server = new grpc.Server();
  const launcher: FakeLauncher = {
    socketPath: join(dir, "launcher-sock"),
    infoCalls: 0,
    cmdCalls: [],
    unavailablePings: 0,
    close: async () => {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(() => {
          server.forceShutdown();
          resolve();
        }, 1_000);
        server.tryShutdown(() => {
          clearTimeout(timer);
          resolve();
        });
      });
      await Deno.remove(dir, { recursive: true });
    },
  };
  server.addService(cmdService(), {
    Ping: (_call: unknown, callback: Callback) => {
      launcher.cmdCalls.push("Ping");
      if (launcher.unavailablePings > 0) {
        launcher.unavailablePings--;
        callback({ code: grpc.status.UNAVAILABLE, details: "test: going away" });
        return;
      }
      callback(null, { success: true, message: "" });
    },
    GetDomain: (_call: unknown, callback: Callback) => {
      launcher.cmdCalls.push("GetDomain");
      callback(null, { response: { success: true, message: "" }, domain: "" });
    },
  });
  // Without `versions` the launcher predates CmdInfo: Info answers UNIMPLEMENTED.
  if (versions) {
    server.addService(cmdInfoService(), {
      Info: (_call: unknown, callback: Callback) => {
        launcher.infoCalls++;
        callback(null, { supportedCmdVersions: versions });
      },
    });
  }
  await new Promise<void>((resolve, reject) => {
    server.bindAsync(
      unixTarget(launcher.socketPath),
      grpc.ServerCredentials.createInsecure(),
      (error) => error ? reject(error) : resolve(),
    );
  });
  return launcher;
}

Deno.test(
  "LauncherClient asks CmdInfo once per connection and again after UNAVAILABLE resets it",
  grpcTest,
  async () => {
    // Concurrent first calls share the one CmdInfo request.
    const launcher = await startLauncher([1]);
    const client = new LauncherClient(launcher.socketPath);
    try {
      const [, domain] = await Promise.all([client.ping(), client.getDomain(), client.ping()]);
      assert.equal(domain, undefined);
      await client.ping();
      await client.getDomain();
      assert.equal(launcher.infoCalls, 1);
      assert.deepEqual(launcher.cmdCalls.toSorted(), [
        "GetDomain",
        "GetDomain",
        "Ping",
        "Ping",
        "Ping",
      ]);

      launcher.unavailablePings = 1;
      const error = await client.ping().then(() => undefined, (e) => e);
      assert.ok(error instanceof LauncherCallError);
      assert.equal(error.unreachable, true);
      await client.ping();
      assert.equal(launcher.infoCalls, 2, "a new connection asks again");
    } finally {
      client.close();
      await launcher.close();
    }
  },
);

Deno.test(
  "LauncherClient refuses a launcher without cmd version 1, naming both sides' versions",
  grpcTest,
  async () => {
    // Cmd itself is never called on such a launcher.
    const launcher = await startLauncher([2, 3]);
    const client = new LauncherClient(launcher.socketPath);
    try {
      for (const call of [() => client.ping(), () => client.getDomain()]) {
        const error = await call().then(() => undefined, (e) => e);
        assert.ok(error instanceof LauncherCallError);
        assert.match(
          error.message,
          /failed: no compatible cmd version: the launcher speaks \[2, 3\], this handler speaks \[1\]$/,
        );
        assert.equal(error.unreachable, false, "the launcher answered");
      }
      assert.deepEqual(launcher.cmdCalls, []);
      // A failed check is not kept: a launcher replaced at the same socket is asked again.
      assert.equal(launcher.infoCalls, 2);
    } finally {
      client.close();
      await launcher.close();
    }
  },
);

Deno.test(
  "LauncherClient refuses a launcher whose CmdInfo is UNIMPLEMENTED, as KubeVirt's NewClient does",
  grpcTest,
  async () => {
    const launcher = await startLauncher();
    const client = new LauncherClient(launcher.socketPath);
    try {
      const error = await client.getDomain().then(() => undefined, (e) => e);
      assert.ok(error instanceof LauncherCallError);
      assert.match(error.message, /command GetDomain failed: could not check cmd server version: /);
      assert.equal((error.cause as grpc.ServiceError).code, grpc.status.UNIMPLEMENTED);
      assert.equal(error.unreachable, false, "the launcher answered");
      assert.deepEqual(launcher.cmdCalls, []);
    } finally {
      client.close();
      await launcher.close();
    }
  },
);

Deno.test(
  "LauncherClient reports a launcher that does not answer CmdInfo as unreachable",
  grpcTest,
  async () => {
    const dir = await Deno.makeTempDir({ prefix: "vn-launcher-info" });
    const client = new LauncherClient(join(dir, "launcher-sock"));
    try {
      const error = await client.ping().then(() => undefined, (e) => e);
      assert.ok(error instanceof LauncherCallError);
      assert.match(error.message, /command Ping failed: could not check cmd server version: /);
      assert.equal(error.unreachable, true);
    } finally {
      client.close();
      await Deno.remove(dir, { recursive: true });
    }
  },
);

/**
 * `--migration-cn-types`, as virt-operator gives it to the handler's DaemonSet
 * (`--migration-cn-types migration`): the migration target lets in only the clients whose
 * certificate names one of the given types, `kubevirt.io:system:client:<type>`. Without
 * the flag, KubeVirt's default types (virt-handler and migration) are let in.
 */
import assert from "node:assert/strict";
import net from "node:net";
import tls from "node:tls";
import { join } from "node:path";
import { MigrationProxyManager } from "../../mod/migration/mod.ts";
import { type KeyPair, makeCertificates } from "../helpers/rest_client.ts";

/** Whether the test client (common name `kubevirt.io:system:client:virt-handler`) reaches the launcher's socket through a target listener. */
async function reachesLauncher(clientNames: string[] | undefined): Promise<boolean> {
  const dir = await Deno.makeTempDir({ prefix: "virtnode-mig-cn-" });
  const certs = await makeCertificates(dir);
  const serverPair: KeyPair = {
    cert: await Deno.readTextFile(join(certs.serverDir, "tls.crt")),
    key: await Deno.readTextFile(join(certs.serverDir, "tls.key")),
  };
  let reached = 0;
  const launcher = net.createServer((s) => {
    reached++;
    s.destroy();
  });
  await new Promise<void>((resolve) => launcher.listen(join(dir, "launcher.sock"), resolve));
  const manager = new MigrationProxyManager({
    serverTls: () => ({ ...serverPair, ca: certs.ca }),
    clientTls: () => ({ ...certs.client, ca: certs.ca }),
    bindAddress: "127.0.0.1",
    ...(clientNames ? { clientNames } : {}),
  });
  try {
    await manager.startTargetListener("vmi", [{
      port: 0,
      open: () => Promise.resolve({ path: join(dir, "launcher.sock"), release: () => {} }),
    }]);
    const port = Number(Object.keys(manager.targetListenerPorts("vmi"))[0]);
    await new Promise<void>((resolve) => {
      const c = tls.connect({
        host: "127.0.0.1",
        port,
        ...certs.client,
        ca: certs.ca,
        checkServerIdentity: () => undefined,
      });
      c.on("secureConnect", () => c.write("libvirt RPC"));
      c.on("error", () => resolve());
      c.on("close", () => resolve());
      setTimeout(() => (c.destroy(), resolve()), 5_000);
    });
    return reached > 0;
  } finally {
    await manager.shutdown();
    await new Promise((resolve) => launcher.close(resolve));
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("a migration client named virt-handler is let in by default, as virt-handler's default CN types allow", async () => {
  assert.equal(await reachesLauncher(undefined), true);
});

Deno.test("--migration-cn-types migration, as virt-operator sets it, refuses a client named virt-handler", async () => {
  assert.equal(await reachesLauncher(["kubevirt.io:system:client:migration"]), false);
  assert.equal(
    await reachesLauncher([
      "kubevirt.io:system:client:migration",
      "kubevirt.io:system:client:virt-handler",
    ]),
    true,
  );
});

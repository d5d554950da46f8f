/**
 * The launcher host (`virtnode launcher-host`) as its own process: many VMIs' cmd sockets
 * in one process, each VMI's failures its own, and a SIGKILLed host that takes every VMI
 * back without a guest stopping or a status changing. Domains live in a real libvirtd
 * (its test driver through `test+unix:///default`, so they outlive the host as QEMU
 * guests would; the QEMU case is in the e2e tier).
 *
 * @module
 */

import assert from "node:assert/strict";
import { decodeDomainJson } from "../../mod/domain/mod.ts";
import type { LauncherHostClient } from "../../mod/handler/testing.ts";
import type { HostExit } from "../../mod/handler/testing.ts";
import { openLibvirt } from "../../ffi/mod.ts";
import { TestCmdClient } from "../helpers/cmd_client.ts";
import { startNotifyServer } from "../helpers/notify_server.ts";
import { ensureLibvirtd } from "../helpers/libvirtd.ts";
import {
  hostedSpec,
  hostedVmi,
  type HostProcess,
  startHostProcess,
} from "../helpers/launcher_host.ts";
import { waitFor } from "../helpers/handler_process.ts";

const grpcTest = { sanitizeOps: false, sanitizeResources: false };
const URI = "test+unix:///default";

async function domainStatus(client: TestCmdClient): Promise<string> {
  const res = await client.getDomain();
  if (!res.domain) return "none";
  const d = decodeDomainJson(res.domain);
  return `${d.status.status}/${d.status.reason}`;
}

/** Whether libvirtd's test driver still has a domain of that name. */
async function domainDefined(name: string): Promise<boolean> {
  const conn = await openLibvirt(URI, { workers: 1 });
  try {
    return (await conn.listAllDomains()).some((d) => d.name === name);
  } finally {
    await conn.close();
  }
}

/** Removes the test's domains from libvirtd's shared test driver. */
async function removeDomains(names: string[]): Promise<void> {
  const conn = await openLibvirt(URI, { workers: 1 });
  try {
    for (const name of names) {
      const domain = await conn.lookupByName(name).catch(() => undefined);
      if (!domain) continue;
      await domain.destroy().catch(() => {});
      await domain.undefine().catch(() => {});
    }
  } finally {
    await conn.close();
  }
}

Deno.test(
  "launcher host: serves many VMIs' sockets, keeps a failure to its VMI, stop removes all it served",
  grpcTest,
  async () => {
    // A bad spec or a failing VMI touches no other VMI.
    await ensureLibvirtd();
    const dir = await Deno.makeTempDir({ prefix: "vn-host" });
    const notify = await startNotifyServer();
    const exits: HostExit[] = [];
    let host: HostProcess | undefined;
    let control: LauncherHostClient | undefined;
    const clients: TestCmdClient[] = [];
    const specs = [1, 2, 3].map((i) => hostedSpec(dir, `hosted-${i}-${Deno.pid}`));
    try {
      host = await startHostProcess({
        dir: `${dir}/host`,
        libvirtUri: URI,
        notifySocket: notify.socketPath,
        logFile: `${dir}/host.log`,
      });
      control = await host.connect(exits);
      for (const spec of specs) {
        const status = await control.start(spec);
        assert.equal(status.state, "ready");
        assert.equal(status.socket, `${spec.socketDir}/launcher-sock`);
        assert.equal((await Deno.lstat(status.socket)).isSocket, true);
        assert.equal((await Deno.stat(status.socket)).mode! & 0o777, 0o600);
        clients.push(new TestCmdClient(status.socket));
      }
      // Starting again is idempotent.
      assert.equal((await control.start(specs[0])).state, "ready");
      await assert.rejects(
        control.start({ ...specs[0], uid: "../etc", name: "x" }),
        /Invalid launcher spec: uid "\.\.\/etc" is not valid/,
      );
      // One VMI's bad spec is its own failure.
      const bad = await clients[1].vmiCall(
        "SyncVirtualMachine",
        hostedVmi(specs[1], { devices: { disks: [{ name: "nope" }] } }),
      );
      assert.equal(bad.success, false);
      for (const i of [0, 2]) {
        const ok = await clients[i].vmiCall("SyncVirtualMachine", hostedVmi(specs[i]));
        assert.equal(ok.success, true, ok.message);
        assert.equal(await domainStatus(clients[i]), "Running/Unknown");
      }
      await notify.waitForDomainEvent((e) =>
        e.domain?.metadata?.name === specs[2].name && e.domain.status.status === "Running"
      );
      const listed = await control.list();
      assert.deepEqual(listed.map((v) => v.state).sort(), ["ready", "ready", "ready"]);

      // A domain destroyed behind the host's back ends that VMI's launcher only.
      const conn = await openLibvirt(URI, { workers: 1 });
      try {
        const domain = await conn.lookupByName(`default_${specs[0].name}`);
        await domain.destroy();
      } finally {
        await conn.close();
      }
      await waitFor("the host to report the launcher ended", () => exits.length === 1, 10_000);
      assert.equal(exits[0].uid, specs[0].uid);
      assert.equal(exits[0].code, 1);
      assert.match(exits[0].why, /Shutoff \(Destroyed\)/);
      assert.equal(await Deno.lstat(`${specs[0].socketDir}/launcher-sock`).catch(() => null), null);
      assert.equal(await domainStatus(clients[2]), "Running/Unknown");
      assert.equal((await control.start(specs[0])).state, "exited", "restart policy none");
      // Stopping an ended launcher removes the domain it left defined for inspection.
      await control.stop(specs[0].uid, 10_000);
      assert.equal(await domainDefined(`default_${specs[0].name}`), false, "its domain is gone");
      assert.equal(
        await Deno.lstat(`${host.dir}/vms/${specs[0].uid}.exit`).catch(() => null),
        null,
      );

      // stop: the guest goes, the domain is undefined, the socket and records are removed.
      await control.stop(specs[2].uid, 10_000);
      assert.equal(await Deno.lstat(`${specs[2].socketDir}/launcher-sock`).catch(() => null), null);
      assert.equal(
        await Deno.lstat(`${host.dir}/vms/${specs[2].uid}.json`).catch(() => null),
        null,
      );
      await notify.waitForDomainEvent((e) =>
        e.eventType === "DELETED" && e.domain?.metadata?.name === specs[2].name
      );
      assert.deepEqual((await control.list()).map((v) => v.uid), [specs[1].uid]);
    } finally {
      for (const c of clients) c.close();
      await control?.close();
      await host?.kill("SIGTERM");
      await notify.close();
      await removeDomains(specs.map((s) => `default_${s.name}`));
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
);

Deno.test(
  "launcher host: SIGKILLed with 50 running VMIs and restarted, it takes each back on its socket",
  grpcTest,
  async () => {
    // Each VMI is adopted on the same socket as before; no guest stops and no status changes.
    await ensureLibvirtd();
    const dir = await Deno.makeTempDir({ prefix: "vn-host" });
    const notify = await startNotifyServer();
    const hostOptions = {
      dir: `${dir}/host`,
      libvirtUri: URI,
      notifySocket: notify.socketPath,
      logFile: `${dir}/host.log`,
    };
    let host: HostProcess | undefined;
    const specs = Array.from({ length: 50 }, (_, i) => hostedSpec(dir, `k${i}-${Deno.pid}`));
    let control: LauncherHostClient | undefined;
    try {
      host = await startHostProcess(hostOptions);
      control = await host.connect();
      await Promise.all(specs.map(async (spec) => {
        const status = await control!.start(spec);
        const client = new TestCmdClient(status.socket);
        try {
          const res = await client.vmiCall("SyncVirtualMachine", hostedVmi(spec));
          assert.equal(res.success, true, res.message);
        } finally {
          client.close();
        }
      }));
      const conn = await openLibvirt(URI, { workers: 1 });
      const idsOf = async () =>
        new Map((await conn.listAllDomains()).map((d) => [d.name, d.id] as [string, number]));
      try {
        const ids = await idsOf();
        await control.close();
        const killed = await host.kill("SIGKILL");
        assert.equal(killed.signal, "SIGKILL");
        for (const spec of specs) {
          assert.ok(await Deno.lstat(`${spec.socketDir}/launcher-sock`), "socket file stays");
        }
        const eventsBefore = notify.domainEvents.length;
        host = await startHostProcess(hostOptions);
        control = await host.connect();
        const listed = await control.list();
        assert.equal(listed.length, 50);
        assert.ok(listed.every((v) => v.state === "ready"), JSON.stringify(listed));
        for (const spec of specs) {
          const client = new TestCmdClient(`${spec.socketDir}/launcher-sock`);
          try {
            assert.equal(await domainStatus(client), "Running/Unknown", spec.name);
          } finally {
            client.close();
          }
        }
        const idsAfter = await idsOf();
        for (const spec of specs) {
          const name = `default_${spec.name}`;
          assert.ok(ids.get(name)! > 0, `${name} ran`);
          assert.equal(idsAfter.get(name), ids.get(name), `${name} is the same guest`);
        }
        // The restarted host reports each domain as it is: Running, nothing else.
        await waitFor(
          "every domain reported again",
          () => notify.domainEvents.length >= eventsBefore + 50,
          10_000,
        );
        const after = notify.domainEvents.slice(eventsBefore);
        assert.ok(
          after.every((e) => e.eventType === "MODIFIED" && e.domain?.status.status === "Running"),
          notify.statuses().slice(eventsBefore).join(", "),
        );
      } finally {
        await conn.close();
      }
    } finally {
      await control?.close();
      await host?.kill("SIGTERM");
      await notify.close();
      await removeDomains(specs.map((s) => `default_${s.name}`));
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
);

Deno.test(
  "launcher host: start with sync defines and starts the domain in one request",
  grpcTest,
  async () => {
    // A bad spec becomes that VMI's sync error, and its launcher stays.
    await ensureLibvirtd();
    const dir = await Deno.makeTempDir({ prefix: "vn-host" });
    const notify = await startNotifyServer();
    let host: HostProcess | undefined;
    let control: LauncherHostClient | undefined;
    const [good, bad] = ["good", "bad"].map((n) => hostedSpec(dir, `sync-${n}-${Deno.pid}`));
    try {
      host = await startHostProcess({
        dir: `${dir}/host`,
        libvirtUri: URI,
        notifySocket: notify.socketPath,
        logFile: `${dir}/host.log`,
      });
      control = await host.connect();
      const started = await control.startAndSync(good, JSON.stringify(hostedVmi(good)), 30_000);
      assert.equal(started.status.state, "ready");
      assert.deepEqual(started.synced, {});
      // Answered after the start: the domain runs, and its cmd socket says so.
      const client = new TestCmdClient(started.status.socket);
      try {
        assert.equal(await domainStatus(client), "Running/Unknown");
      } finally {
        client.close();
      }
      await notify.waitForDomainEvent((e) =>
        e.domain?.metadata?.name === good.name && e.domain.status.status === "Running"
      );
      // Again (a handler that restarted mid-start): the same VMI, the same running guest.
      const again = await control.startAndSync(good, JSON.stringify(hostedVmi(good)), 30_000);
      assert.deepEqual(again.synced, {});

      // The same words a SyncVirtualMachine on the socket answers with.
      const badVmi = hostedVmi(bad, { devices: { disks: [{ name: "nope" }] } });
      const refused = await control.startAndSync(bad, JSON.stringify(badVmi), 30_000);
      assert.equal(refused.status.state, "ready", "the launcher stays up");
      assert.ok(refused.synced?.error, JSON.stringify(refused));
      const badClient = new TestCmdClient(refused.status.socket);
      try {
        const viaSocket = await badClient.vmiCall("SyncVirtualMachine", badVmi);
        assert.equal(viaSocket.success, false);
        assert.equal(refused.synced.error, viaSocket.message);
        assert.equal(await domainStatus(badClient), "none");
      } finally {
        badClient.close();
      }
      // A sync that is not a string is refused as a request.
      await assert.rejects(
        (control as unknown as {
          startAndSync(s: unknown, v: unknown, t: number): Promise<unknown>;
        }).startAndSync(good, 42, 5_000),
        /sync is not a string/,
      );
      assert.deepEqual((await control.list()).map((v) => v.state), ["ready", "ready"]);
    } finally {
      if (control) {
        for (const spec of [good, bad]) await control.stop(spec.uid, 10_000).catch(() => {});
        await control.close();
      }
      await host?.kill("SIGTERM");
      await notify.close();
      await removeDomains([good, bad].map((s) => `default_${s.name}`));
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
);

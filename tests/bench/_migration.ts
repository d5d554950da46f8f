/**
 * Scenario 10: a live migration of the 128 MiB test guest between two libvirt nodes on
 * this machine, through virtnode's migration proxy (mutual TLS), beside the same migration
 * straight between the two libvirtds (the floor). The guest goes back and forth: through
 * the proxy from the first node to the second, straight back, `runs` times after a first
 * round that is not counted.
 *
 * @module
 */
import { join } from "node:path";
import { VIR_DOMAIN_JOB_STATS_COMPLETED } from "../../ffi/mod.ts";
import { MigrationProxyManager } from "../../mod/migration/mod.ts";
import { testGuestImage } from "../helpers/guest.ts";
import {
  guestAgentAnswers,
  migrateDomain,
  migrationGuestXml,
  migrationTargets,
  startMigrationNodes,
} from "../helpers/migration.ts";
import { makeCertificates } from "../helpers/rest_client.ts";
import type { Row } from "./_report.ts";
import { summarize, type Summary } from "./_util.ts";

/** What scenario 10 measured. */
export interface MigrationBench {
  /** Wall time of each migration through the proxy, ms. */
  proxyMs: number[];
  /** Wall time of each straight migration, ms. */
  straightMs: number[];
  /** The guest's pause at each switch-over through the proxy, as libvirt reports it, ms. */
  proxyDowntimeMs: number[];
  /** The same, straight. */
  straightDowntimeMs: number[];
}

/** Runs scenario 10; the rows and a note for the report. */
export async function migrationBench(
  runs: number,
  log: (line: string) => void,
): Promise<{ rows: Row[]; notes: string[]; json: MigrationBench }> {
  const nodes = await startMigrationNodes();
  const dir = await Deno.makeTempDir({ prefix: "virtnode-bench-mig-" }).catch(async (error) => {
    await nodes.stop();
    throw error;
  });
  const proxies: MigrationProxyManager[] = [];
  const json: MigrationBench = {
    proxyMs: [],
    straightMs: [],
    proxyDowntimeMs: [],
    straightDowntimeMs: [],
  };
  try {
    const certs = await makeCertificates(dir);
    const server = {
      cert: await Deno.readTextFile(join(certs.serverDir, "tls.crt")),
      key: await Deno.readTextFile(join(certs.serverDir, "tls.key")),
      ca: certs.ca,
    };
    const proxy = () => {
      const m = new MigrationProxyManager({
        serverTls: () => server,
        clientTls: () => ({ ...certs.client, ca: certs.ca }),
        bindAddress: "127.0.0.1",
      });
      proxies.push(m);
      return m;
    };
    const { a, b } = nodes;
    const name = `vn-bench-migrate-${crypto.randomUUID().slice(0, 6)}`;
    const uid = crypto.randomUUID();
    const guestDir = join(await testGuestImage(), "..");
    await (await a.conn.defineXML(migrationGuestXml(name, uid, guestDir))).start();
    for (const deadline = Date.now() + 180_000; !(await guestAgentAnswers(a.conn, name));) {
      if (Date.now() > deadline) throw new Error("the guest's agent never answered");
      await new Promise((r) => setTimeout(r, 500));
    }
    const target = proxy();
    const source = proxy();
    await target.startTargetListener(uid, migrationTargets(b, uid));
    await source.startSourceListener(uid, "127.0.0.1", target.targetListenerPorts(uid), a.run);
    const timed = async (
      conn: typeof a.conn,
      straight: typeof a | undefined,
      ms: number[],
      downtime: number[],
    ) => {
      const domain = await conn.lookupByName(name);
      const t = performance.now();
      await migrateDomain(domain, uid, { straight });
      ms.push(performance.now() - t);
      const done = await domain.jobStats(VIR_DOMAIN_JOB_STATS_COMPLETED);
      downtime.push(Number(done.params.downtime ?? NaN));
    };
    // A first round, not counted: the first move of a guest that has just booted carries
    // more dirty memory than any later one, and would weigh on whichever way goes first.
    for (let i = 0; i <= runs; i++) {
      const counted = i > 0;
      await timed(
        a.conn,
        undefined,
        counted ? json.proxyMs : [],
        counted ? json.proxyDowntimeMs : [],
      );
      await timed(
        b.conn,
        a,
        counted ? json.straightMs : [],
        counted ? json.straightDowntimeMs : [],
      );
      // The source keeps a Shutoff definition; the next migration there replaces it.
      for (const conn of [a.conn, b.conn]) {
        const dom = await conn.lookupByName(name);
        if ((await dom.getState()).state === 5) await dom.undefine();
      }
    }
    if (!(await guestAgentAnswers(a.conn, name))) {
      throw new Error("the guest's agent did not answer after the migrations");
    }
  } finally {
    for (const m of proxies) await m.shutdown();
    await nodes.stop();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
  const p = summarize(json.proxyMs);
  const s = summarize(json.straightMs);
  const pd = summarize(json.proxyDowntimeMs);
  const sd = summarize(json.straightDowntimeMs);
  const fmt = (x: Summary) =>
    `p50 ${x.p50.toFixed(0)} ms (min ${x.min.toFixed(0)}, max ${x.max.toFixed(0)})`;
  log(`migration through the proxy ${fmt(p)}; straight ${fmt(s)}`);
  return {
    rows: [{
      scenario: 10,
      metric: `live migration, 128 MiB test guest, through the TLS proxy, p50 (${p.n} runs)`,
      value: Math.round(p.p50),
      unit: "ms",
      floor: Math.round(s.p50),
      floorNote: "the same migration straight between the two libvirtds",
    }],
    notes: [
      `migration (scenario 10): through the proxy ${fmt(p)}, downtime p50 ${pd.p50} ms; ` +
      `straight ${fmt(s)}, downtime p50 ${sd.p50} ms; two libvirtds on this machine, each with ` +
      `its own mount namespace and host UUID, peer to peer with the memory on its own socket`,
    ],
    json,
  };
}

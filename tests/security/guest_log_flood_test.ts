/**
 * A guest cannot fill the host's disk through logs (issue 34, H4): its DHCP client asking
 * again and again is logged once, and a pod-less launcher that logs without end keeps its
 * log file (and the two copies rotated out of it) within the bound `--help` promises,
 * 10 MiB each, the newest lines in the live file.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { DatagramPoller, NetnsRunner, sendDatagram } from "../../ffi/mod.ts";
import { LauncherSpawner } from "../../mod/handler/testing.ts";
import { sleep } from "../../mod/lifecycle/mod.ts";
import { setupLogging } from "../../mod/log/mod.ts";
import { type Dhcp4Lease, DhcpServers } from "../../mod/network/mod.ts";

const MAC = "52:54:00:12:34:56";
const LEASE: Dhcp4Lease = {
  mac: MAC,
  address: "10.0.2.2",
  prefix: 24,
  serverAddress: "10.0.2.1",
  router: "10.0.2.1",
  dnsServers: ["10.96.0.10"],
  searchDomains: ["default.svc.cluster.local"],
  domainName: "default.svc.cluster.local",
  hostname: "vm1",
  mtu: 1500,
  routes: [{ destination: "0.0.0.0", prefix: 0, gateway: "10.0.2.1" }],
};

/**
 * A renewing client's DHCPREQUEST for the lease (RFC 2131: its address in `ciaddr`, no
 * requested-address option), laid out byte by byte.
 */
function renewRequest(xid: number): Uint8Array {
  const b = new Uint8Array(244);
  b[0] = 1; // BOOTREQUEST
  b[1] = 1; // Ethernet
  b[2] = 6; // hardware address length
  new DataView(b.buffer).setUint32(4, xid);
  b.set([10, 0, 2, 2], 12); // ciaddr
  b.set(MAC.split(":").map((h) => parseInt(h, 16)), 28); // chaddr
  b.set([99, 130, 83, 99], 236); // magic cookie
  b.set([53, 1, 3, 255], 240); // message type REQUEST, end
  return b;
}

Deno.test("a guest's DHCP client asking 200 times gets 200 answers and one log line", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vn-dhcp-flood-" });
  const netns = join(dir, "pod-net");
  const runner = new NetnsRunner();
  const dhcp = new DhcpServers(runner);
  const guest = new DatagramPoller();
  const lines: string[] = [];
  setupLogging({
    level: "info",
    format: "json",
    component: "virt-launcher",
    write: (line) => lines.push(line),
  });
  try {
    // The pod's namespace: the bridge is loopback here, the guest a socket on it.
    await runner.run(undefined, [{ op: "create", path: netns }]);
    for (const args of [["link", "set", "lo", "up"], ["addr", "add", "10.0.2.2/24", "dev", "lo"]]) {
      const [result] = await runner.run(netns, [{ op: "exec", cmd: "ip", args }]);
      assert.equal((result as { code: number }).code, 0, `ip ${args.join(" ")}`);
    }
    const key = "4a1b3c2d-0000-4000-8000-000000000001/default";
    await dhcp.start(key, { netns, device: "lo", v4: LEASE });
    const [fd] = await runner.run(netns, [
      { op: "udpSocket", family: 4, port: 68, device: "lo" },
    ]) as number[];
    let answers = 0;
    guest.add(fd, () => answers++);
    const requests = 200;
    for (let i = 1; i <= requests; i++) {
      sendDatagram(fd, renewRequest(i), { address: "127.0.0.1", port: 67 });
      if (i % 20 === 0) await sleep(5); // a guest's pace, not a burst the socket drops
    }
    const deadline = Date.now() + 10_000;
    while ((dhcp.given(key) < requests || answers < requests) && Date.now() < deadline) {
      await sleep(10);
    }
    assert.equal(dhcp.given(key), requests, "every request was answered with an ACK");
    assert.equal(answers, requests, "every ACK reached the guest");
    const leaseLines = lines.filter((l) => JSON.parse(l).msg === "DHCP lease given");
    assert.equal(leaseLines.length, 1, `the lease was logged ${leaseLines.length} times`);
    assert.equal(JSON.parse(leaseLines[0]).address, "10.0.2.2");
  } finally {
    await guest.close();
    await dhcp.close();
    await runner.run(undefined, [{ op: "remove", path: netns }]).catch(() => {});
    runner.close();
    setupLogging({ level: "info", format: "json", component: "test" });
    await Deno.remove(dir, { recursive: true });
  }
});

/** The project's configuration: the stand-in's imports resolve as the project's do. */
const DENO_JSON = new URL("../../deno.json", import.meta.url).pathname;

/** The bound `--help` states for a log file: 10 MiB, two rotated copies. */
const BOUND = 10 * 1024 * 1024;

/**
 * A stand-in launcher that starts its logging as every virtnode role does (the
 * configuration from flags and environment, then `setupLogging`) and logs 48 MiB, then
 * ends.
 */
function floodingLauncher(): string {
  const config = new URL("../../mod/config/mod.ts", import.meta.url).href;
  const log = new URL("../../mod/log/mod.ts", import.meta.url).href;
  return `
import { parseConfig } from "${config}";
import { getLogger, setupLogging } from "${log}";
const config = parseConfig({});
setupLogging({ level: config.logLevel, format: "json", component: "virt-launcher", file: config.logFile });
const log = getLogger("network", "dhcp");
const filler = "x".repeat(4000);
for (let i = 1; i <= 12288; i++) log.info("Flood {n} " + filler, { n: i });
log.info("Last line");
`;
}

Deno.test("a launcher logging 48 MiB leaves its log and two rotated copies, each within 10 MiB", async () => {
  // The newest lines are in the live file.
  const dir = await Deno.makeTempDir({ prefix: "vn-log-flood-" });
  const script = join(dir, "launcher.ts");
  await Deno.writeTextFile(script, floodingLauncher());
  const exited = Promise.withResolvers<number>();
  const uid = "4a1b3c2d-0000-4000-8000-000000000002";
  const spawner = new LauncherSpawner({
    stateDir: join(dir, "state"),
    command: () => ({
      cmd: Deno.execPath(),
      args: ["run", "-A", "--no-check", `--config=${DENO_JSON}`, script, "launcher", "--uid", uid],
    }),
    onExit: (_uid, code) => exited.resolve(code),
  });
  try {
    await spawner.start({
      namespace: "default",
      name: "vm1",
      uid,
      gracePeriodSeconds: 0,
      socketDir: join(dir, "sock"),
    });
    const code = await Promise.race([exited.promise, sleep(120_000).then(() => -1)]);
    assert.equal(code, 0, "the launcher ended on its own");
    const logFile = spawner.logFile(uid);
    const sizes = [logFile, `${logFile}.1`, `${logFile}.2`, `${logFile}.3`].map((f) => {
      try {
        return Deno.statSync(f).size;
      } catch {
        return 0;
      }
    });
    assert.ok(
      sizes.every((size) => size <= BOUND),
      `log file sizes ${sizes.join(", ")} bytes, bound ${BOUND}`,
    );
    assert.equal(sizes[3], 0, "no third rotated copy");
    const live = await Deno.readTextFile(logFile);
    assert.match(live.trimEnd().split("\n").at(-1)!, /"msg":"Last line"/);
    // Oldest copy first: the lines kept are the last ones written, none missing between.
    const kept = [`${logFile}.2`, `${logFile}.1`, logFile]
      .map((f) => Deno.readTextFileSync(f))
      .join("")
      .matchAll(/"msg":"Flood (\d+) /g)
      .map((m) => Number(m[1]))
      .toArray();
    assert.equal(kept.at(-1), 12288, "the last flood line is kept");
    assert.ok(kept.length > 12288 / 3, `${kept.length} of 12288 lines kept`);
    assert.deepEqual(kept, kept.map((_, i) => 12288 - kept.length + 1 + i), "no gap");
  } finally {
    spawner.release();
    await Deno.remove(dir, { recursive: true });
  }
});

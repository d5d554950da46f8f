/**
 * The handler's REST server with QEMU (pod-less): a client playing virt-api, with its
 * client certificate, types into the test guest's serial console through the console
 * WebSocket and reads the shell's answer; the VNC WebSocket gets QEMU's RFB greeting, a
 * second VNC client takes over unless the first one's session is to be preserved (then
 * 503); the usbredir WebSocket gets the hello of QEMU's redirected USB port; a screenshot
 * comes back as QEMU's PNG (PPM where QEMU is older); pause and unpause move the VMI's Paused
 * condition. The test guest's agent (QEMU's qemu-ga) connects: the VMI shows AgentConnected
 * and the guest's OS, the guest info, user and filesystem routes answer with what the guest
 * has, and a freeze and an unfreeze show in `status.fsFreezeStatus`, also when made with
 * virsh past the launcher (its agent poller sees them). With the agent stopped
 * inside the guest, guest queries and a freeze fail clearly. After
 * 100 console sessions, and clients that vanish without a close, the handler holds as
 * many descriptors as before.
 */
import assert from "node:assert/strict";
import { useCluster } from "../../deploy/cluster/cluster.ts";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { ensureLibvirtd, virsh } from "../helpers/libvirtd.ts";
import { guestVmi, installTestGuest } from "../helpers/guest.ts";
import {
  createVmi,
  deleteVmi,
  eventsFor,
  freePort,
  getVmi,
  hostLogOf,
  killLaunchers,
  kubeClient,
  startHandlerProcess,
  waitFor,
  waitForPhase,
} from "../helpers/handler_process.ts";
import {
  makeCertificates,
  openWebSocket,
  restRequest,
  restServerArgs,
  type RestTarget,
  type WsSession,
} from "../helpers/rest_client.ts";

/** A guest booting under software emulation takes its time on a busy 2-core machine. */
const BOOT_MS = 180_000;

function paused(vmi: VirtualMachineInstance | undefined): boolean {
  return (vmi?.status?.conditions ?? []).some((c) => c.type === "Paused" && c.status === "True");
}

function agentConnected(vmi: VirtualMachineInstance | undefined): boolean {
  return (vmi?.status?.conditions ?? []).some((c) =>
    c.type === "AgentConnected" && c.status === "True"
  );
}

function json(body: Uint8Array): Record<string, unknown> {
  return JSON.parse(new TextDecoder().decode(body));
}

function fdCount(pid: number): number {
  return [...Deno.readDirSync(`/proc/${pid}/fd`)].length;
}

/** Types a command the shell answers with a line the typed text does not contain. */
async function askShell(ws: WsSession, n: number, timeoutMs = 10_000): Promise<void> {
  const before = new TextDecoder().decode(ws.received()).length;
  ws.send(`echo virtnode-answer-$((${n} * 7))\n`);
  await ws.waitFor((t) => t.slice(before).includes(`virtnode-answer-${n * 7}`), timeoutMs);
}

Deno.test("REST+QEMU (pod-less): console, VNC, screenshots, pause and guest agent calls reach the guest", async () => {
  // The console WebSocket reaches the guest's shell and back; VNC greets with RFB, one
  // session at a time; pause/unpause; the guest agent's OS, users, filesystems and freeze.
  // Once the guest stops the errors are clear, and 100 sessions leave no descriptor behind.
  const uri = await ensureLibvirtd();
  const cluster = await useCluster();
  const client = await kubeClient(cluster.kubeconfigPath);
  const id = crypto.randomUUID().slice(0, 8);
  const ns = `restq-${id}`;
  const node = `restq-node-${id}`;
  await client.request("POST", "/api/v1/namespaces", { metadata: { name: ns } });
  const dir = await Deno.makeTempDir({ prefix: "virtnode-restq-" });
  await installTestGuest(`${dir}/state/images`);
  const certs = await makeCertificates(dir);
  const port = freePort();
  const h = await startHandlerProcess({
    kubeconfig: cluster.handlerKubeconfigPath,
    nodeName: node,
    libvirtUri: uri,
    dir,
    extraArgs: restServerArgs(certs, port),
  });
  const sessions: WsSession[] = [];
  // KubeVirt's admission takes the downwardMetrics device only with its feature gate on.
  const crPath = "/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts/kubevirt";
  const cr = await client.request<{ spec: { configuration?: Record<string, unknown> } }>(
    "GET",
    crPath,
  );
  const configuration = cr.spec.configuration ?? {};
  const developer = (configuration.developerConfiguration ?? {}) as Record<string, unknown>;
  const setConfiguration = (value: Record<string, unknown>) =>
    client.request("PATCH", crPath, [{ op: "add", path: "/spec/configuration", value }], {
      contentType: "application/json-patch+json",
    });
  await setConfiguration({
    ...configuration,
    developerConfiguration: {
      ...developer,
      featureGates: [...((developer.featureGates ?? []) as string[]), "DownwardMetrics"],
    },
  });
  try {
    const good: RestTarget = { port, ca: certs.ca, client: certs.client };
    const base = `/v1/namespaces/${ns}/virtualmachineinstances/vm1`;
    // No network: the guest's console is all this test needs.
    const vmi = guestVmi("vm1", node, { namespace: ns, binding: "none" });
    const devices = vmi.spec.domain.devices as Record<string, unknown>;
    // Four redirected USB ports, for the usbredir route; the downward metrics port.
    devices.clientPassthrough = {};
    devices.downwardMetrics = {};
    await createVmi(client, vmi);
    await waitForPhase(client, ns, "vm1", "Running", BOOT_MS);

    // The console: the guest's shell answers what is typed.
    const consoleWs = await openWebSocket(good, `${base}/console`);
    sessions.push(consoleWs);
    assert.equal(consoleWs.status, 101, consoleWs.refusal);
    await waitFor(
      "the guest's shell to answer",
      async () => {
        await askShell(consoleWs, 6, 3_000);
        return true;
      },
      BOOT_MS,
      0,
    );

    // Downward metrics: the guest asks on its vhostmd port and reads the node's and the
    // VM's metrics, which the handler answers through the channel; a bad request is told so.
    const port0 = "for p in /sys/class/virtio-ports/*; do " +
      '[ "$(cat $p/name)" = org.github.vhostmd.1 ] && d=/dev/${p##*/}; done; exec 3<>$d';
    const dmFrom = new TextDecoder().decode(consoleWs.received()).length;
    consoleWs.send(
      `${port0}; printf 'GET /metrics/XML\\n\\n' >&3; ` +
        `while read -r l <&3; do echo "dm: $l"; [ "$l" = '</metrics>' ] && break; done; ` +
        // The answer ends with a blank line: read it before the next request.
        `read -r l <&3; printf 'PUT /metrics/XML\\n\\n' >&3; read -r l <&3; echo "bad: $l"; ` +
        `exec 3<&-; echo dm-$((6 * 7))\n`,
    );
    const metrics = (await consoleWs.waitFor(
      (t) => t.slice(dmFrom).includes("dm-42"),
      60_000,
    )).slice(dmFrom);
    assert.match(metrics, new RegExp(`dm: <value>${node}</value>`), metrics);
    assert.match(metrics, /dm: <metric type="real64" context="vm" unit="s">/);
    assert.match(metrics, /dm: <name>PhysicalMemoryAllocatedToVirtualSystem<\/name>/);
    assert.match(metrics, /dm: <name>FreePhysicalMemory<\/name>/);
    assert.match(metrics, /dm: <value>QEMU [\d.]+/, "VirtProductInfo: the launcher's QEMU");
    assert.match(metrics, /bad: INVALID REQUEST/);
    await consoleWs.close();

    // VNC: QEMU's RFB greeting; a second client takes over, unless asked to preserve.
    const vnc = await openWebSocket(good, `${base}/vnc`);
    sessions.push(vnc);
    assert.equal(vnc.status, 101, vnc.refusal);
    await vnc.waitFor((t) => t.startsWith("RFB 003.008\n"));
    const preserve = await openWebSocket(good, `${base}/vnc?preserveSession=true`);
    assert.equal(preserve.status, 503);
    assert.match(preserve.refusal, /Active VNC connection\. Request denied\./);
    const second = await openWebSocket(good, `${base}/vnc`);
    sessions.push(second);
    assert.equal(second.status, 101, second.refusal);
    await second.waitFor((t) => t.startsWith("RFB 003.008\n"));
    await waitFor("the first VNC session to be closed", () => vnc.closed(), 5_000);
    // As virt-handler ends it: the connection closed without a close frame, which virt-api
    // passes on to its client as an EOF (KubeVirt's console spec 1591 waits for one).
    assert.equal(vnc.gotCloseFrame(), false, "the replaced session got a close frame");
    await second.close();

    // USB redirection: QEMU's redirected port greets the client with usbredir's hello
    // (packet type 0, QEMU's version string) through the usbredir route.
    const usb = await openWebSocket(good, `${base}/usbredir`);
    sessions.push(usb);
    assert.equal(usb.status, 101, usb.refusal);
    await usb.waitFor((t) => t.includes("qemu usb-redir guest"));
    assert.equal(new DataView(usb.received().buffer).getUint32(0, true), 0, "a hello packet");
    await usb.close();

    const shot = await restRequest(good, "GET", `${base}/vnc/screenshot`);
    assert.equal(shot.status, 200, new TextDecoder().decode(shot.body));
    // libvirt asks QEMU for PNG where it can (QEMU 7.1 and later), PPM otherwise.
    const magic = [...shot.body.subarray(0, 4)];
    if (shot.headers["content-type"] === "image/png") {
      assert.deepEqual(magic, [0x89, 0x50, 0x4e, 0x47]);
    } else {
      assert.equal(shot.headers["content-type"], "image/x-portable-pixmap");
      assert.deepEqual(magic.slice(0, 2), [0x50, 0x36]);
    }
    assert.ok(shot.body.length > 100, `a ${shot.body.length}-byte screenshot`);

    // Pause and unpause.
    assert.equal((await restRequest(good, "PUT", `${base}/pause`)).status, 202);
    await waitFor("the Paused condition", async () => paused(await getVmi(client, ns, "vm1")));
    assert.equal((await restRequest(good, "PUT", `${base}/unpause`)).status, 202);
    await waitFor(
      "the Paused condition to go",
      async () => !paused(await getVmi(client, ns, "vm1")),
    );

    // The guest agent: connected, and the guest's OS in the VMI's status.
    await waitFor(
      "AgentConnected and status.guestOSInfo",
      async () => {
        const now = await getVmi(client, ns, "vm1");
        return agentConnected(now) && now?.status?.guestOSInfo?.id === "virtnode-guest";
      },
      BOOT_MS,
    );
    const guestInfo = await restRequest(good, "GET", `${base}/guestosinfo`);
    assert.equal(guestInfo.status, 200, new TextDecoder().decode(guestInfo.body));
    const about = json(guestInfo.body) as {
      guestAgentVersion?: string;
      os?: { id?: string; prettyName?: string; kernelRelease?: string };
      userList?: { userName: string }[];
      fsInfo?: { disks: { mountPoint: string; fileSystemType: string }[] };
      supportedCommands?: { name: string }[];
    };
    assert.match(about.guestAgentVersion ?? "", /^\d+\.\d+/);
    assert.equal(about.os?.id, "virtnode-guest");
    assert.equal(about.os?.prettyName, "virtnode test guest");
    assert.match(about.os?.kernelRelease ?? "", /-amd64$/);
    assert.ok(about.supportedCommands?.some((c) => c.name === "guest-fsfreeze-freeze"));
    // Debian's qemu-ga has every basic command: the handler judges it supported, as
    // virt-handler would (no AgentVersionNotSupported condition).
    const judged = await getVmi(client, ns, "vm1");
    assert.equal(
      judged?.status?.conditions?.find((c) => c.type === "AgentVersionNotSupported"),
      undefined,
      JSON.stringify(judged?.status?.conditions),
    );
    assert.deepEqual(about.userList?.map((u) => u.userName), ["virtnode"]);
    assert.ok(
      about.fsInfo?.disks.some((d) => d.mountPoint === "/boot" && d.fileSystemType === "vfat"),
      JSON.stringify(about.fsInfo),
    );
    const users = await restRequest(good, "GET", `${base}/userlist`);
    assert.equal(users.status, 200);
    const userList = json(users.body) as { metadata: unknown; items: { userName: string }[] };
    assert.deepEqual(userList.metadata, {});
    assert.deepEqual(userList.items.map((u) => u.userName), ["virtnode"]);
    const filesystems = await restRequest(good, "GET", `${base}/filesystemlist`);
    assert.equal(filesystems.status, 200);
    const fsList = json(filesystems.body) as {
      items: { mountPoint: string; fileSystemType: string; totalBytes: number }[];
    };
    const boot = fsList.items.find((f) => f.mountPoint === "/boot");
    assert.equal(boot?.fileSystemType, "vfat");
    assert.ok((boot?.totalBytes ?? 0) > 1_000_000, JSON.stringify(boot));
    assert.equal(fsList.items.find((f) => f.mountPoint === "/data")?.fileSystemType, "ext4");

    // Freeze and unfreeze, seen in status.fsFreezeStatus.
    const frozen = await restRequest(good, "PUT", `${base}/freeze`, `{"unfreezeTimeout":"1m"}`);
    assert.equal(frozen.status, 202, new TextDecoder().decode(frozen.body));
    await waitFor(
      "status.fsFreezeStatus frozen",
      async () => (await getVmi(client, ns, "vm1"))?.status?.fsFreezeStatus === "frozen",
    );
    assert.equal((await restRequest(good, "PUT", `${base}/unfreeze`)).status, 202);
    await waitFor(
      "status.fsFreezeStatus to clear",
      async () => (await getVmi(client, ns, "vm1"))?.status?.fsFreezeStatus === undefined,
    );
    // A freeze made past the launcher (virsh, on the node) shows too: the launcher polls
    // the agent's freeze state every 5 s, as KubeVirt's does.
    await virsh("domfsfreeze", `${ns}_vm1`);
    await waitFor(
      "status.fsFreezeStatus frozen after virsh domfsfreeze",
      async () => (await getVmi(client, ns, "vm1"))?.status?.fsFreezeStatus === "frozen",
      30_000,
      500,
    );
    await virsh("domfsthaw", `${ns}_vm1`);
    await waitFor(
      "status.fsFreezeStatus to clear after virsh domfsthaw",
      async () => (await getVmi(client, ns, "vm1"))?.status?.fsFreezeStatus === undefined,
      30_000,
      500,
    );

    // The agent stopped inside the guest: AgentConnected goes, and clear errors.
    const stopAgent = await openWebSocket(good, `${base}/console`);
    sessions.push(stopAgent);
    assert.equal(stopAgent.status, 101, stopAgent.refusal);
    stopAgent.send("kill $(cat /run/qemu-ga.pid)\n");
    await askShell(stopAgent, 3);
    await stopAgent.close();
    await waitFor(
      "AgentConnected to go",
      async () => !agentConnected(await getVmi(client, ns, "vm1")),
    );
    const info = await restRequest(good, "GET", `${base}/guestosinfo`);
    assert.equal(info.status, 409);
    const freeze = await restRequest(good, "PUT", `${base}/freeze`, `{"unfreezeTimeout":"1m"}`);
    assert.equal(freeze.status, 400);
    assert.match(new TextDecoder().decode(freeze.body), /agent/i);
    await waitFor(
      "the FreezeError event",
      async () => (await eventsFor(client, ns, "vm1")).some((e) => e.reason === "FreezeError"),
    );

    // 100 sessions, some ended by a close frame, some by clients that just vanish; then
    // the console still works and the handler holds no more descriptors than before.
    const pid = h.child.pid;
    const before = fdCount(pid);
    for (let i = 0; i < 100; i++) {
      const ws = await openWebSocket(good, `${base}/console`);
      assert.equal(ws.status, 101, ws.refusal);
      if (i % 10 === 0) await askShell(ws, i);
      if (i % 2 === 0) await ws.close();
      else ws.destroy();
    }
    const last = await openWebSocket(good, `${base}/console`);
    sessions.push(last);
    await askShell(last, 1000);
    await last.close();
    await waitFor(
      `the handler's descriptors to return to ${before}`,
      () => fdCount(pid) <= before,
      10_000,
    );
  } catch (error) {
    console.error(await Deno.readTextFile(h.logFile).catch(() => ""));
    const hostLog = await Promise.resolve().then(() => hostLogOf(h.stateDir)).catch(() => "");
    if (hostLog) {
      console.error((await Deno.readTextFile(hostLog).catch(() => "")).slice(-20_000));
    }
    throw error;
  } finally {
    await setConfiguration(configuration).catch(() => {});
    for (const s of sessions) s.destroy();
    await deleteVmi(client, ns, "vm1");
    await waitFor("vm1 to go", async () => !(await getVmi(client, ns, "vm1")), 60_000).catch(
      () => {},
    );
    await h.kill();
    killLaunchers(h.stateDir);
    await client.request("DELETE", `/api/v1/namespaces/${ns}`).catch(() => {});
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    client.close();
    await cluster.stop();
  }
});

/**
 * KubeVirt's handler-side code driving virtnode's launcher: `cmdclient-check` is
 * compiled from KubeVirt's `pkg/virt-handler/cmd-client` and `notify-server`
 * (deploy/kubevirt). It negotiates the cmd version through CmdInfo.Info, runs Sync,
 * Pause, Unpause, GetDomain, GetDomainStats, GetGuestInfo, GetUsers, GetFilesystems,
 * Shutdown, Kill and Delete against a `virtnode launcher` process with a QEMU guest,
 * and receives the launcher's events in KubeVirt's notify server. The VMI is what
 * KubeVirt's admission stores (virt-api's defaults: hot-plug limits, machine type).
 */
import { buildKubevirtPeers } from "../harness/kubevirt/peers.ts";
import assert from "node:assert/strict";
import { join } from "node:path";
import { startCluster } from "../../deploy/cluster/cluster.ts";
import { admit } from "../helpers/admission.ts";
import { ensureLibvirtd } from "../helpers/libvirtd.ts";
import { GUEST_CPU_FEATURES } from "../harness/guest_cpu.ts";

const REPO_ROOT = new URL("../../", import.meta.url).pathname;

interface Step {
  step: string;
  ok: boolean;
  error?: string;
  detail?: Record<string, unknown>;
}

async function admittedVmi(name: string): Promise<Record<string, unknown>> {
  const cluster = await startCluster({ admission: true });
  try {
    const vmi = {
      apiVersion: "kubevirt.io/v1",
      kind: "VirtualMachineInstance",
      metadata: { name, namespace: "default" },
      spec: {
        terminationGracePeriodSeconds: 0,
        domain: {
          cpu: { features: GUEST_CPU_FEATURES },
          memory: { guest: "1Gi" },
          devices: { autoattachPodInterface: false, autoattachGraphicsDevice: false },
        },
      },
    };
    const admitted = await admit(cluster, vmi);
    assert.ok(admitted.ok, admitted.ok ? "" : admitted.error);
    return admitted.object;
  } finally {
    await cluster.stop();
  }
}

Deno.test("KubeVirt's cmd client and notify server drive virtnode's launcher through a QEMU guest's life", async () => {
  const kubevirtDir = await buildKubevirtPeers();
  const uri = await ensureLibvirtd();
  const name = `kvcc-${crypto.randomUUID().slice(0, 8)}`;
  const vmi = await admittedVmi(name);
  const spec = vmi.spec as {
    domain: { cpu: { maxSockets?: number }; memory: { maxGuest?: string } };
  };
  assert.ok((spec.domain.cpu.maxSockets ?? 0) > 1, "virt-api set CPU hot-plug limits");
  assert.equal(spec.domain.memory.maxGuest, "4Gi", "virt-api set memory hot-plug limits");
  const uid = (vmi.metadata as { uid: string }).uid;
  const dir = await Deno.makeTempDir({ prefix: "virtnode-cmdclient-" });
  const vmiFile = join(dir, "vmi.json");
  await Deno.writeTextFile(vmiFile, JSON.stringify(vmi));
  const socketDir = join(dir, "sockets");
  await Deno.mkdir(join(dir, "share"));
  const check = new Deno.Command(join(kubevirtDir, "cmdclient-check"), {
    args: [
      "--share-dir",
      join(dir, "share"),
      "--socket",
      join(socketDir, "launcher-sock"),
      "--vmi",
      vmiFile,
    ],
    stdin: "null",
    stdout: "piped",
    // Its log goes to the test's output: reading both of a child's pipes here held back
    // stdout until the child exited.
    stderr: "inherit",
  }).spawn();
  const lines: string[] = [];
  const reader = check.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let buffered = "";
  const nextLine = async (): Promise<string | undefined> => {
    while (!buffered.includes("\n")) {
      const { value, done } = await reader.read();
      if (done) return undefined;
      buffered += value;
    }
    const at = buffered.indexOf("\n");
    const line = buffered.slice(0, at);
    buffered = buffered.slice(at + 1);
    lines.push(line);
    return line;
  };
  const stderr = Promise.resolve("(see the test output for cmdclient-check's log)");
  let launcher: Deno.ChildProcess | undefined;
  try {
    const first = await nextLine();
    assert.ok(first, `cmdclient-check printed nothing: ${await stderr}`);
    const notifySocket = JSON.parse(first).notify as string;
    launcher = new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        join(REPO_ROOT, "main.ts"),
        "launcher",
        "--namespace",
        "default",
        "--name",
        name,
        "--uid",
        uid,
        "--socket-dir",
        socketDir,
        "--libvirt-uri",
        uri,
        "--notify-socket",
        notifySocket,
        "--grace-period",
        "0",
        "--run-dir",
        join(dir, "run"),
        "--disk-dir",
        join(dir, "disks"),
        "--image-dir",
        join(dir, "images"),
      ],
      stdin: "null",
      // Its JSON log goes to the test's output, shown when the test fails.
      stdout: "inherit",
      stderr: "inherit",
    }).spawn();
    while (await nextLine() !== undefined) { /* collect every line */ }
    const status = await check.status;
    const steps = lines.slice(1).map((l) => JSON.parse(l)).filter((l) => "step" in l) as Step[];
    const events = (lines.map((l) => JSON.parse(l)).find((l) => "events" in l)?.events ?? []) as {
      type: string;
      status?: string;
      uid?: string;
    }[];
    for (const s of steps) {
      console.log(
        `  ${s.ok ? "ok  " : "FAIL"} ${s.step}${s.error ? `: ${s.error}` : ""}${
          s.detail ? ` ${JSON.stringify(s.detail)}` : ""
        }`,
      );
    }
    console.log(
      `  ${events.length} events: ${events.map((e) => `${e.type}/${e.status ?? ""}`).join(", ")}`,
    );
    const failed = steps.filter((s) => !s.ok);
    assert.deepEqual(failed, [], `KubeVirt's client failed: ${await stderr}`);
    assert.equal(status.code, 0, await stderr);
    assert.deepEqual(steps.map((s) => s.step), [
      "connect",
      "ping",
      "sync",
      "running",
      "getDomain",
      "getDomainStats",
      "pause",
      "paused",
      "unpause",
      "unpaused",
      "getGuestInfo",
      "getUsers",
      "getFilesystems",
      "shutdown",
      "kill",
      "killed",
      "delete",
      "deleted",
    ]);
    // What virt-handler reads from a launcher's domain, as KubeVirt's code parsed it.
    const domain = steps.find((s) => s.step === "getDomain")!.detail!;
    assert.equal(domain.uid, uid);
    assert.equal(domain.name, name);
    assert.match(String(domain.machine), /q35/);
    assert.match(String(domain.currentMemory), /^\d+ /);
    assert.deepEqual(domain.channels, [{ name: "org.qemu.guest_agent.0", state: "disconnected" }]);
    const stats = steps.find((s) => s.step === "getDomainStats")!.detail!;
    assert.equal(stats.cpuTimeSet, true);
    assert.ok(events.some((e) => e.status === "Running" && e.uid === uid), "a Running event");
    assert.ok(events.some((e) => e.status === "Paused"), "a Paused event");
    assert.ok(events.some((e) => e.type === "DELETED"), "a DELETED event");
  } finally {
    try {
      check.kill("SIGKILL");
    } catch { /* exited */ }
    await check.status;
    await stderr.catch(() => "");
    if (launcher) {
      try {
        launcher.kill("SIGTERM");
      } catch { /* exited */ }
      await launcher.status;
    }
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
});

/**
 * The handler in KubeVirt mode (launcher "pods" found under the kubelet pods
 * directory), a VMI recreated under the same name (UID conflict), and a handler
 * started before its kubeconfig exists.
 */
import assert from "node:assert/strict";
import { useCluster } from "../../deploy/cluster/cluster.ts";
import {
  createVmi,
  deleteVmi,
  eventsFor,
  getVmi,
  killLaunchers,
  kubeClient,
  pidAlive,
  releaseVmi,
  scheduleToPod,
  startHandlerProcess,
  testVmi,
  waitFor,
  waitForPhase,
} from "../helpers/handler_process.ts";

const MAIN = new URL("../../main.ts", import.meta.url).pathname;

function suffix(): string {
  return crypto.randomUUID().slice(0, 8);
}

async function run(cmd: string, args: string[]): Promise<void> {
  const out = await new Deno.Command(cmd, { args, stdout: "null", stderr: "piped" }).output();
  if (!out.success) {
    throw new Error(`${cmd} ${args.join(" ")}: ${new TextDecoder().decode(out.stderr).trim()}`);
  }
}

Deno.test("handler (KubeVirt mode) finds a launcher pod's socket from status.activePods and runs its VMI", async () => {
  const cluster = await useCluster();
  const client = await kubeClient(cluster.kubeconfigPath);
  const controller = await kubeClient(cluster.handlerKubeconfigPath);
  const dir = await Deno.makeTempDir({ prefix: "virtnode-kvmode-" });
  const podsDir = `${dir}/pods`;
  const node = `kvmode-${suffix()}`;
  const h = await startHandlerProcess({
    kubeconfig: cluster.handlerKubeconfigPath,
    nodeName: node,
    libvirtUri: "test:///default",
    kubeletPodsDir: podsDir,
  });
  let launcher: Deno.ChildProcess | undefined;
  let socketDir: string | undefined;
  let mounted: string | undefined;
  let ok = false;
  try {
    const name = `vm-${suffix()}`;
    // The test plays virt-controller, which puts the VMI on the node (KubeVirt's
    // admission lets only KubeVirt's service accounts set kubevirt.io/nodeName).
    const vmi = await createVmi(controller, testVmi(name, node, { placed: true }));
    const uid = vmi.metadata.uid!;
    // KubeVirt mode: no scheduling by the handler; the VMI stays Pending until
    // virt-controller (here: the test) schedules it and its launcher pod runs.
    // Deliberate: nothing announces "the handler decided not to schedule it"; the test
    // gives it a second to do so and checks that it did not.
    await new Promise((r) => setTimeout(r, 1_000));
    assert.equal((await getVmi(client, "default", name))!.status?.phase, "Pending");

    // The launcher "pod": a real launcher process with its socket where the kubelet
    // would put the pod's emptyDir volume.
    // Inside the pod the socket path is short; from the host the same emptyDir is seen
    // under the kubelet's long volume path (longer than a unix socket address allows).
    const podUid = crypto.randomUUID();
    socketDir = await Deno.makeTempDir({ prefix: "vnpod-" });
    const volumeDir = `${podsDir}/${podUid}/volumes/kubernetes.io~empty-dir`;
    // As the kubelet does: the volume is a bind mount of the pod's directory, not a
    // symlink (the handler refuses to reach a socket through one).
    mounted = `${volumeDir}/sockets`;
    await Deno.mkdir(mounted, { recursive: true });
    await run("mount", ["--bind", socketDir, mounted]);
    assert.ok(`${volumeDir}/sockets/launcher-sock`.length > 108);
    launcher = new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        MAIN,
        "--log-format",
        "json",
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
        "test:///default",
        "--notify-socket",
        `${h.runDir}/domain-notify.sock`,
        "--run-dir",
        `${dir}/private/${uid}`,
        "--disk-dir",
        `${dir}/disks/${uid}`,
        "--image-dir",
        `${dir}/images`,
      ],
      stdin: "null",
      stdout: "null",
      stderr: "null",
    }).spawn();
    await waitFor("the launcher socket", async () => {
      try {
        await Deno.lstat(`${socketDir}/launcher-sock`);
        return true;
      } catch {
        return false;
      }
    });
    // What virt-controller would write: Scheduled, on this node, with the active pod.
    await scheduleToPod(controller, "default", name, node, podUid);
    const running = await waitForPhase(client, "default", name, "Running");
    assert.equal(running.status!.activePods![podUid], node);
    assert.equal(
      running.status!.conditions!.find((c) => c.type === "Ready"),
      undefined,
      "Ready belongs to virt-controller in KubeVirt mode",
    );
    const ghost = JSON.parse(await Deno.readTextFile(`${h.stateDir}/ghost-records/${uid}`));
    assert.equal(ghost.socketFile, `${mounted}/launcher-sock`);
    await deleteVmi(client, "default", name);
    await waitFor("the ghost record to be removed after the domain is gone", async () => {
      try {
        await Deno.lstat(`${h.stateDir}/ghost-records/${uid}`);
        return false;
      } catch {
        return true;
      }
    });
    assert.ok(pidAlive(launcher.pid), "KubeVirt mode never kills a launcher pod's process");
    const deleted = await getVmi(client, "default", name);
    assert.deepEqual(
      deleted?.metadata.finalizers,
      ["kubevirt.io/foregroundDeleteVirtualMachine"],
      "KubeVirt mode leaves virt-api's finalizer to virt-controller",
    );
    // virt-controller's last step, once the pod is gone.
    await releaseVmi(controller, "default", name);
    ok = true;
  } finally {
    if (!ok) console.error((await Deno.readTextFile(h.logFile)).slice(-5000));
    try {
      launcher?.kill("SIGKILL");
      await launcher?.status;
    } catch { /* gone */ }
    await h.kill("SIGTERM");
    client.close();
    controller.close();
    if (mounted) await run("umount", [mounted]).catch(() => {});
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    if (socketDir) await Deno.remove(socketDir, { recursive: true }).catch(() => {});
    await Deno.remove(h.dir, { recursive: true }).catch(() => {});
    await cluster.stop();
  }
});

Deno.test("handler: a VMI recreated under its old name gets a new launcher; the old one is cleaned up", async () => {
  // The VMI is deleted and created again, so only its UID tells the two apart.
  const cluster = await useCluster();
  const client = await kubeClient(cluster.kubeconfigPath);
  const node = `uid-${suffix()}`;
  const h = await startHandlerProcess({
    kubeconfig: cluster.handlerKubeconfigPath,
    nodeName: node,
    libvirtUri: "test:///default",
  });
  let ok = false;
  try {
    const name = `vm-${suffix()}`;
    const first = await createVmi(client, testVmi(name, node));
    await waitForPhase(client, "default", name, "Running");
    const hostedFile = (uid: string) => `${h.stateDir}/launcher-host/vms/${uid}.json`;
    assert.ok(await Deno.lstat(hostedFile(first.metadata.uid!)), "the host serves the first");
    await deleteVmi(client, "default", name);
    // virt-api's finalizer keeps the old VMI until the handler is done with it.
    await waitFor(
      "the old VMI to be gone",
      async () => (await getVmi(client, "default", name)) === undefined ? true : undefined,
    );
    const second = await createVmi(client, testVmi(name, node));
    assert.notEqual(second.metadata.uid, first.metadata.uid);
    const running = await waitForPhase(client, "default", name, "Running");
    assert.equal(running.metadata.uid, second.metadata.uid);
    await waitFor(
      "the old launcher to end",
      () => Deno.lstat(hostedFile(first.metadata.uid!)).then(() => false, () => true),
      30_000,
    );
    assert.ok(await Deno.lstat(hostedFile(second.metadata.uid!)), "the host serves the second");
    await waitFor("only the new VMI's ghost record to remain", () => {
      const files = [...Deno.readDirSync(`${h.stateDir}/ghost-records`)]
        .filter((e) => e.isFile).map((e) => e.name);
      return files.length === 1 && files[0] === second.metadata.uid;
    });
    const started = (await eventsFor(client, "default", name)).filter((e) =>
      e.reason === "Started"
    );
    assert.ok(started.length >= 1);
    await deleteVmi(client, "default", name);
    ok = true;
  } finally {
    if (!ok) console.error((await Deno.readTextFile(h.logFile)).slice(-5000));
    await h.kill("SIGTERM");
    killLaunchers(h.stateDir); // the launcher host outlives its handler by design
    client.close();
    await Deno.remove(h.dir, { recursive: true }).catch(() => {});
    await cluster.stop();
  }
});

Deno.test("handler: a missing kubeconfig is reported and retried with backoff until it appears", async () => {
  const cluster = await useCluster();
  const client = await kubeClient(cluster.kubeconfigPath);
  const dir = await Deno.makeTempDir({ prefix: "virtnode-nokube-" });
  const kubeconfig = `${dir}/later/kubeconfig`;
  const node = `nokube-${suffix()}`;
  const h = await startHandlerProcess({
    kubeconfig,
    nodeName: node,
    libvirtUri: "test:///default",
    noWait: true,
  });
  let ok = false;
  try {
    await waitFor("two retries in the log", async () => {
      const log = await Deno.readTextFile(h.logFile);
      return (log.match(/Cannot load Kubernetes credentials, retrying/g) ?? []).length >= 2;
    }, 15_000);
    const log = await Deno.readTextFile(h.logFile);
    assert.match(log, /later\/kubeconfig/, "the error names the path");
    const health = await fetch(`${h.health}/readyz`).catch(() => undefined);
    await health?.body?.cancel();
    assert.notEqual(health?.status, 200, "not ready without credentials");
    await Deno.mkdir(`${dir}/later`);
    await Deno.copyFile(cluster.handlerKubeconfigPath, kubeconfig);
    const name = `vm-${suffix()}`;
    await createVmi(client, testVmi(name, node));
    await waitForPhase(client, "default", name, "Running", 60_000);
    await deleteVmi(client, "default", name);
    ok = true;
  } finally {
    if (!ok) console.error((await Deno.readTextFile(h.logFile)).slice(-5000));
    await h.kill("SIGTERM");
    killLaunchers(h.stateDir);
    client.close();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    await Deno.remove(h.dir, { recursive: true }).catch(() => {});
    await cluster.stop();
  }
});

/**
 * The swap, end to end: a real node (kubelet, containerd, kube-proxy) and KubeVirt's own
 * control plane (virt-api admitting, virt-controller creating launcher pods with
 * KubeVirt's own virt-launcher image), with virtnode installed as a user installs it —
 * `kubectl apply` of deploy/rbac.yaml and deploy/daemonset.yaml with the virtnode image
 * built here — in place of virt-handler. The journey a user sees: a VMI applied runs
 * through its launcher pod; the handler's pod deleted and recreated by its DaemonSet
 * re-adopts the running VM without touching it; `kubectl delete vmi` stops the guest and
 * the pod goes; a node drain evicts a launcher pod cleanly. The network guests' journey
 * takes virtctl's routes, the probes, and a scrape of the handler's metrics that KubeVirt's
 * own alerts and recording rules are evaluated over.
 *
 * The same journey runs with KubeVirt's own virt-handler (its DaemonSet as virt-operator
 * makes it, `kubevirt-install --handler-image`), the yardstick: a failure with virtnode
 * alone is virtnode's. Each prints its create -> Running and delete -> pod gone times.
 *
 * Each DaemonSet is applied as shipped but for what this test node has elsewhere than a
 * production node: the image (built here), the kubelet's directories (below the node's
 * temporary directory) and the handler's state and run directories (likewise, so the
 * test leaves nothing on the host).
 */
import { buildKubevirtPeers } from "../harness/kubevirt/peers.ts";
import assert from "node:assert/strict";
import https from "node:https";
import { join } from "node:path";
import { kubectl, startCluster } from "../../deploy/cluster/cluster.ts";
import { buildVirtctl } from "../../deploy/kubevirt/virtctl.ts";
import { CDI_CONFIG_READER } from "../../deploy/kubevirt/virt_api.ts";
import {
  consoleAnswers,
  portForwardAnswers,
  usbredirGreets,
  vncGreets,
} from "../helpers/virtctl.ts";
import { launcherImage, startNode, virtHandlerImage, virtnodeImage } from "../harness/node/node.ts";
import { startKubevirt } from "../harness/node/kubevirt.ts";
import {
  cpuModelFor,
  DAEMONSET_NAMES,
  offered,
  userVmi,
  virtHandlerDaemonSet,
  virtnodeDaemonSet,
  virtnodeDirs,
} from "../harness/node/daemonsets.ts";
import { ensureLibvirtd } from "../helpers/libvirtd.ts";
import {
  familiesNamedByRules,
  kubevirtMonitoring,
  writeRulesTest,
} from "../helpers/kubevirt_rules.ts";
import { promtoolTestRules } from "../helpers/promtool.ts";
import { kubeClient, waitFor } from "../helpers/handler_process.ts";
import {
  networkVmi,
  nodeApi,
  type NodeObject,
  type Pod,
  podReady,
  stepper,
  type Vmi,
} from "../helpers/node_api.ts";
import {
  httpGet,
  KERNEL_IMAGE,
  parseLease,
  TEST_KERNEL_BOOT,
  testGuestImage,
  testGuestOciArchive,
  testKernelOciArchive,
} from "../helpers/guest.ts";
import { localClaim, localVolume } from "../helpers/local_volumes.ts";

const REPO = new URL("../../", import.meta.url).pathname;

type Handler = "virtnode" | "virt-handler";

/** What every stage of the journey works with. */
interface Journey {
  handler: Handler;
  kc: string;
  admin: Awaited<ReturnType<typeof kubeClient>>;
  node: Awaited<ReturnType<typeof startNode>>;
  getVmi: ReturnType<typeof nodeApi>["getVmi"];
  pods: ReturnType<typeof nodeApi>["pods"];
  /** The handler's pods (virtnode's carry virt-handler's label too). */
  handlerPods: () => ReturnType<ReturnType<typeof nodeApi>["pods"]>;
  step: (what: string) => void;
}

async function journey(handler: Handler): Promise<void> {
  const libvirtUri = await ensureLibvirtd();
  assert.equal(libvirtUri, "qemu:///system", "the DaemonSet's labeller reads the host's libvirtd");
  const cluster = await startCluster({ podNetwork: true });
  const kc = cluster.kubeconfigPath;
  const admin = await kubeClient(kc);
  const node = await startNode(cluster);
  let kubevirt: Awaited<ReturnType<typeof startKubevirt>> | undefined;
  let ok = false;
  const { getVmi, pods } = nodeApi(admin);
  const j: Journey = {
    handler,
    kc,
    admin,
    node,
    getVmi,
    pods,
    handlerPods: () => pods("kubevirt.io=virt-handler", "kubevirt"),
    step: stepper(),
  };
  try {
    const launcher = await launcherImage();
    const handlerImage = handler === "virtnode" ? await virtnodeImage() : await virtHandlerImage();
    await node.importImage(launcher.archive);
    await node.importImage(handlerImage.archive);
    j.step("node Ready, images imported");
    const kubevirtDir = await buildKubevirtPeers();
    kubevirt = await startKubevirt(cluster, { kubevirtDir, launcherImage: launcher.name });
    j.step("virt-api and virt-controller up");
    const first = await installHandler(j, kubevirtDir, handlerImage.name, launcher.name);
    const cpuModel = await waitNodeLabelled(j);
    const times = await createRestartDelete(j, first, cpuModel);
    await networkGuests(j, cpuModel);
    if (handler === "virtnode") {
      await storageJourney({
        kc,
        admin,
        node,
        cpuModel,
        getVmi,
        step: j.step,
        audit: cluster.auditLogPath,
      });
      await kernelBootJourney({ kc, node, cpuModel, getVmi, step: j.step });
      await memoryDumpJourney({ kc, admin, node, cpuModel, getVmi, step: j.step });
    }
    await drainNode(j, cpuModel);
    const seconds = (ms: number) => (ms / 1000).toFixed(2);
    console.log(
      `journey with ${handler}: create -> Running ${seconds(times.createToRunning)} s, ` +
        `delete -> pod gone ${seconds(times.deleteToPodGone)} s`,
    );
    ok = true;
  } finally {
    if (!ok) await reportFailure(j, kubevirt);
    // The handler first (its pod's grace lets it stop its device plugins), then the rest.
    await kubectl(kc, [
      "delete",
      "daemonset",
      "-n",
      "kubevirt",
      DAEMONSET_NAMES[handler],
      "--wait=true",
    ]).catch(() => {});
    await kubevirt?.stop();
    await node.stop();
    admin.close();
    await cluster.stop();
  }
}

/** Installs the handler's DaemonSet as a user does; returns its first pod, once Ready. */
async function installHandler(
  j: Journey,
  kubevirtDir: string,
  handlerImage: string,
  launcherImage: string,
) {
  const { handler, kc, node, step, handlerPods } = j;
  const ready = podReady;
  if (handler === "virtnode") {
    // Installed as a user installs it.
    await kubectl(kc, ["apply", "-f", join(REPO, "deploy/rbac.yaml")]);
    await kubectl(
      kc,
      ["apply", "-f", "-"],
      await virtnodeDaemonSet(handlerImage, launcherImage, virtnodeDirs(node)),
    );
  } else {
    await kubectl(
      kc,
      ["apply", "-f", "-"],
      await virtHandlerDaemonSet(kubevirtDir, handlerImage, launcherImage, node),
    );
  }
  const first = await waitFor("the handler's pod to be Ready", async () => {
    const [p] = await handlerPods();
    if (p?.status?.containerStatuses?.some((c) => c.restartCount > 0)) {
      throw new Error(`The handler's container restarted: ${JSON.stringify(p.status)}`);
    }
    return p && ready(p) ? p : undefined;
  }, 180_000);
  assert.equal(first.spec.nodeName, node.name);
  step(`${handler}'s DaemonSet pod Ready`);
  return first;
}

/** Waits for the handler to label the node, beat and offer its devices; returns the CPU model. */
async function waitNodeLabelled(j: Journey): Promise<string> {
  const { admin, node, step } = j;
  let seen: NodeObject | undefined;
  const labelled = await waitFor("the node labelled, beating and with devices", async () => {
    const n = await admin.request<NodeObject>("GET", `/api/v1/nodes/${node.name}`);
    seen = n;
    const l = n.metadata.labels;
    const a = n.status.allocatable;
    return l["kubevirt.io/schedulable"] === "true" &&
        l["machine-type.node.kubevirt.io/q35"] === "true" &&
        n.metadata.annotations?.["kubevirt.io/heartbeat"] &&
        offered(a["devices.kubevirt.io/tun"]) &&
        offered(a["devices.kubevirt.io/kvm"]) === exists("/dev/kvm")
      ? n
      : undefined;
  }, 120_000).catch((error) => {
    const labels = Object.entries(seen?.metadata.labels ?? {})
      .filter(([k]) => !/cpu-|hyperv|host-model|machine-type|tsc/.test(k));
    throw new Error(
      `${error.message}; the node: ${JSON.stringify(labels)} ${
        JSON.stringify(seen?.metadata.annotations)
      } ${JSON.stringify(seen?.status.allocatable)}`,
    );
  });
  step("node labelled, heartbeat, device plugins in allocatable");
  const cpuModel = cpuModelFor(labelled);

  return cpuModel;
}

/** Create -> Running, the handler's pod deleted and re-adopting, then kubectl delete. */
async function createRestartDelete(j: Journey, first: Pod, cpuModel: string) {
  const { handler, kc, admin, node, getVmi, pods, handlerPods, step } = j;
  const ready = podReady;
  // Journey: create -> Running.
  const created = performance.now();
  await kubectl(kc, ["apply", "-f", "-"], JSON.stringify(userVmi("vm-a", cpuModel)));
  const runningA = await waitFor("vm-a Running", async () => {
    const v = await getVmi("vm-a");
    return v?.status?.phase === "Running" ? v : undefined;
  }, 180_000);
  const createToRunning = performance.now() - created;
  assert.equal(runningA.status?.nodeName, node.name);
  const [podA] = await pods(`kubevirt.io/created-by=${runningA.metadata.uid}`);
  assert.ok(podA, "virt-controller made vm-a's launcher pod");
  step(`vm-a Running ${(createToRunning / 1000).toFixed(2)} s after kubectl apply`);

  // The handler's pod deleted: the DaemonSet makes another, which re-adopts vm-a.
  await admin.request("DELETE", `/api/v1/namespaces/kubevirt/pods/${first.metadata.name}`);
  const second = await waitFor("a new handler pod Ready", async () => {
    const p = (await handlerPods()).find((p) => p.metadata.uid !== first.metadata.uid);
    return p && ready(p) ? p : undefined;
  }, 180_000);
  step("handler pod recreated and Ready");
  const log = await kubectl(kc, ["logs", "-n", "kubevirt", second.metadata.name]);
  if (handler === "virtnode") {
    assert.match(log, /Handler ready: 1 VMIs on this node, 1 launchers re-adopted/);
  }
  const afterRestart = await getVmi("vm-a");
  assert.equal(afterRestart?.status?.phase, "Running");
  assert.deepEqual(
    afterRestart?.status?.phaseTransitionTimestamps?.map((t) => t.phase),
    runningA.status?.phaseTransitionTimestamps?.map((t) => t.phase),
    "no phase change across the handler's restart",
  );
  const [podAAfter] = await pods(`kubevirt.io/created-by=${runningA.metadata.uid}`);
  assert.equal(podAAfter.metadata.uid, podA.metadata.uid, "the same launcher pod");
  assert.equal(podAAfter.status?.phase, "Running");
  assert.ok(
    podAAfter.status?.containerStatuses?.every((c) => c.restartCount === 0),
    "no launcher container restarted",
  );
  if (handler === "virtnode") {
    const complaints = log.split("\n").filter((l) => /"level":"(warning|error)"/.test(l));
    assert.deepEqual(complaints, [], "no warning or error from the re-adopting handler");
  }

  // kubectl delete: the guest stops and the pod goes.
  const deleting = performance.now();
  await kubectl(kc, ["delete", "vmi", "vm-a", "--wait=false"]);
  await waitFor(
    "vm-a's launcher pod gone",
    async () => (await pods(`kubevirt.io/created-by=${runningA.metadata.uid}`)).length === 0,
    120_000,
  );
  const deleteToPodGone = performance.now() - deleting;
  await waitFor("vm-a gone", async () => !(await getVmi("vm-a")), 60_000);
  step(
    `vm-a deleted, its pod gone ${(deleteToPodGone / 1000).toFixed(2)} s after kubectl delete`,
  );

  return { createToRunning, deleteToPodGone };
}

/**
 * The pod network: the test guest, booted from its containerDisk, gets its address by
 * DHCP from the launcher inside its pod and answers HTTP on the pod's IP, through
 * masquerade and with bridge binding.
 */
async function networkGuests(j: Journey, cpuModel: string): Promise<void> {
  const { handler, kc, node, getVmi, step } = j;
  const netStarted = performance.now();
  await node.importImage(await testGuestOciArchive());
  const hostDisk = handler === "virt-handler" ? join(node.dir, "guest", "guest.img") : undefined;
  if (hostDisk) {
    await Deno.mkdir(join(node.dir, "guest"), { mode: 0o755 });
    await Deno.copyFile(await testGuestImage(), hostDisk);
    await Deno.chmod(hostDisk, 0o644);
  }
  const bindings = ["masquerade", "bridge"] as const;
  for (const binding of bindings) {
    const vmi = networkVmi(`vm-${binding}`, cpuModel, binding, hostDisk);
    // A readiness probe through the guest agent: virt-controller renders it on the launcher
    // pod as KubeVirt's virt-probe, which asks the launcher's GuestPing. Four redirected USB
    // ports (clientPassthrough), which KubeVirt's launcher makes, for virtctl usbredir, and
    // the downward metrics port, which the node's handler answers, and the downward
    // metrics disk (vhostmd's), which the launcher makes and the node's handler fills.
    const spec = binding === "masquerade"
      ? {
        ...vmi.spec,
        domain: {
          ...vmi.spec.domain,
          devices: {
            ...vmi.spec.domain.devices,
            clientPassthrough: {},
            downwardMetrics: {},
            disks: [...vmi.spec.domain.devices.disks, { name: "metrics", disk: { bus: "virtio" } }],
          },
        },
        volumes: [...vmi.spec.volumes, { name: "metrics", downwardMetrics: {} }],
        readinessProbe: { guestAgentPing: {}, periodSeconds: 2, failureThreshold: 2 },
      }
      : vmi.spec;
    await kubectl(kc, ["apply", "-f", "-"], JSON.stringify({ ...vmi, spec }));
  }
  for (const binding of bindings) {
    const name = `vm-${binding}`;
    if (handler === "virt-handler" && binding === "bridge" && !(await dummyLinks())) {
      // KubeVirt's handler keeps the pod's address on a dummy link, which this kernel
      // lacks: its bridge binding fails here (virtnode's uses a port-less bridge).
      const failed = await waitFor(`${name} Failed under virt-handler`, async () => {
        const v = await getVmi(name);
        return v?.status?.phase === "Failed" ? v : undefined;
      }, 180_000);
      assert.equal(failed.status?.phase, "Failed");
      const handlerLog = await kubectl(kc, [
        "logs",
        "-n",
        "kubevirt",
        "-l",
        "kubevirt.io=virt-handler",
        "--tail=-1",
      ]);
      assert.match(handlerLog, /LinkAdd: operation not supported/);
      step(`${name}: KubeVirt's handler cannot build bridge binding here (no dummy link type)`);
      continue;
    }
    const vmi = await waitFor(`${name} Running with its pod IP`, async () => {
      const v = await getVmi(name);
      return v?.status?.phase === "Running" && v.status.interfaces?.[0]?.ipAddress ? v : undefined;
    }, 180_000);
    const ip = vmi.status!.interfaces![0].ipAddress!;
    const text = await waitFor(
      `${name}'s guest answering HTTP on ${ip}`,
      () => httpGet(`http://${ip}/dhcp`),
      240_000,
      1_000,
    );
    const lease = parseLease(text);
    assert.equal(lease.ip, binding === "masquerade" ? "10.0.2.2" : ip, `${name}: ${text}`);
    assert.equal(lease.hostname, name);
    if (binding === "bridge") assert.equal(lease.serverid, "169.254.75.10");
    const table = await kubectl(kc, ["get", "vmi", name]);
    assert.ok(table.includes(ip), `the IP column of ${name}: ${table}`);
    step(`${name}: lease ${lease.ip} by DHCP, HTTP answered on the pod IP ${ip}`);
    if (binding === "masquerade") {
      await virtctlJourney({ kc, name, getVmi, step });
      assert.ok(await httpGet(`http://${ip}/dhcp`), `${name} answers HTTP after virtctl`);
      await metricsJourney(j, name);
      await probeJourney({ kc, name, getVmi, step });
    }
  }
  for (const binding of bindings) {
    await kubectl(kc, ["delete", "vmi", `vm-${binding}`, "--wait=true", "--timeout=120s"]);
  }
  console.log(
    `network guests with ${handler}: ${
      ((performance.now() - netStarted) / 1000).toFixed(1)
    } s from apply to deleted`,
  );
}

/** A drain evicts the launcher pod (through virt-api's eviction webhook) cleanly. */
async function drainNode(j: Journey, cpuModel: string): Promise<void> {
  const { kc, node, getVmi, pods, handlerPods, step } = j;
  await kubectl(kc, ["apply", "-f", "-"], JSON.stringify(userVmi("vm-b", cpuModel)));
  const runningB = await waitFor("vm-b Running", async () => {
    const v = await getVmi("vm-b");
    return v?.status?.phase === "Running" ? v : undefined;
  }, 180_000);
  step("vm-b Running");
  await kubectl(kc, [
    "drain",
    node.name,
    "--ignore-daemonsets",
    "--delete-emptydir-data",
    "--timeout=120s",
  ]);
  assert.deepEqual(await pods(`kubevirt.io/created-by=${runningB.metadata.uid}`), []);
  const drained = await waitFor("vm-b final", async () => {
    const v = await getVmi("vm-b");
    return v?.status?.phase === "Succeeded" || v?.status?.phase === "Failed" ? v : undefined;
  }, 60_000);
  step(`node drained: vm-b's pod evicted, vm-b ${drained.status?.phase}`);
  // The phase KubeVirt's handler gives a VMI whose launcher pod a drain evicted.
  assert.equal(
    drained.status?.phase,
    "Failed",
    `vm-b's events: ${await kubectl(kc, [
      "get",
      "events",
      "--field-selector",
      "involvedObject.name=vm-b",
      "-o",
      "custom-columns=TYPE:.type,REASON:.reason,FROM:.source.component,MESSAGE:.message",
    ]).catch((e) => String(e))}`,
  );
  assert.equal((await handlerPods()).length, 1, "the handler stays on the drained node");
}

/** What a failed journey prints: the Events, the handler pods' logs, the components' complaints. */
async function reportFailure(
  j: Journey,
  kubevirt: Awaited<ReturnType<typeof startKubevirt>> | undefined,
): Promise<void> {
  const { kc, node, handlerPods } = j;
  console.error(
    await kubectl(kc, ["get", "events", "-n", "kubevirt", "--sort-by=.lastTimestamp"])
      .catch((e) => String(e)),
  );
  for (const p of await handlerPods().catch(() => [])) {
    console.error(JSON.stringify(p.status).slice(0, 3000));
    const log = await kubectl(kc, [
      "logs",
      "-n",
      "kubevirt",
      "--all-containers",
      p.metadata.name,
    ]).catch((e) => String(e));
    console.error(`--- ${p.metadata.name}:\n${log.split("\n").slice(-40).join("\n")}`);
  }
  if (kubevirt) console.error(await kubevirt.complaints());
  console.error(await node.complaints());
}

// virtnode is installed as the DaemonSet next to KubeVirt's virt-api, virt-controller
// and virt-launcher; the journey covers create, a handler restart, delete and drain.
Deno.test(
  "node: virtnode from deploy/ takes virt-handler's place beside KubeVirt's own components",
  () => journey("virtnode"),
);

Deno.test(
  "node: the same journey with KubeVirt's own virt-handler DaemonSet, the yardstick",
  () => journey("virt-handler"),
);

/** GET `https://<ip>:8443/metrics`, the handler pod's port, as Prometheus scrapes it. */
function scrapeHandler(ip: string): Promise<string> {
  return new Promise((resolve, reject) => {
    // KubeVirt's ServiceMonitor scrapes with insecureSkipVerify: so does this.
    https.get(
      { host: ip, port: 8443, path: "/metrics", rejectUnauthorized: false, agent: false },
      (res) => {
        let body = "";
        res.setEncoding("utf8");
        res.on("data", (c: string) => body += c);
        res.on(
          "end",
          () =>
            res.statusCode === 200
              ? resolve(body)
              : reject(new Error(`${res.statusCode}: ${body.slice(0, 200)}`)),
        );
      },
    ).on("error", reject);
  });
}

/**
 * The node's handler scraped as Prometheus scrapes it, with `name` (the test guest, its
 * agent connected) running: every handler family KubeVirt v1.7.0's own alerts and recording
 * rules name is in the scrape (but the guest load, which needs libvirt 11.1 in the
 * launcher), and `promtool test rules` evaluates the rules over it. With either handler.
 */
async function metricsJourney(j: Journey, name: string): Promise<void> {
  const [pod] = await j.handlerPods();
  const ip = (pod as { status?: { podIP?: string } }).status?.podIP;
  assert.ok(ip, "the handler's pod has an address");
  const text = await waitFor(
    `${name}'s filesystem families in ${j.handler}'s scrape (its guest agent's)`,
    async () => {
      const t = await scrapeHandler(ip).catch(() => "");
      return new RegExp(`^kubevirt_vmi_filesystem_capacity_bytes\\{[^}]*name="${name}"`, "m")
          .test(t)
        ? t
        : undefined;
    },
    120_000,
    2_000,
  );
  const monitoring = await kubevirtMonitoring();
  const { named, missing } = familiesNamedByRules(monitoring, text);
  j.step(
    `${name}: ${j.handler}'s scrape has ${named.size - missing.length} of the ${named.size} ` +
      `families KubeVirt's rules name (missing: ${missing.join(", ") || "none"})`,
  );
  assert.deepEqual(missing.filter((f) => !f.startsWith("kubevirt_vmi_guest_load")), []);
  const dir = await Deno.makeTempDir({ prefix: "virtnode-node-rules-" });
  try {
    const rules = await promtoolTestRules(await writeRulesTest(monitoring, text, dir));
    assert.ok(rules.ok, `promtool test rules over ${j.handler}'s scrape:\n${rules.output}`);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
  j.step(`${name}: promtool test rules passed over ${j.handler}'s scrape`);
}

/**
 * A guestAgentPing readiness probe as virt-controller renders it (KubeVirt's virt-probe in
 * the launcher pod, run by the kubelet): the VMI is Ready while the guest's agent answers,
 * and not Ready once the agent is stopped (typed into the guest's console through virtctl).
 */
async function probeJourney(o: {
  kc: string;
  name: string;
  getVmi: (name: string) => Promise<Vmi | undefined>;
  step: (what: string) => void;
}): Promise<void> {
  const ready = async () =>
    (await o.getVmi(o.name))?.status?.conditions?.find((c) => c.type === "Ready")?.status;
  await waitFor(
    `${o.name} Ready through its readiness probe`,
    async () => await ready() === "True",
    120_000,
  );
  const probe = await kubectl(o.kc, [
    "get",
    "pods",
    "-l",
    `kubevirt.io/created-by=${(await o.getVmi(o.name))?.metadata.uid}`,
    "-o",
    `jsonpath={.items[0].spec.containers[?(@.name=="compute")].readinessProbe.exec.command}`,
  ]);
  assert.match(probe, /"virt-probe".*"--guestAgentPing"/, probe);
  await consoleAnswers({ virtctl: await buildVirtctl(), kubeconfig: o.kc, name: o.name }, {
    line: "kill $(cat /run/qemu-ga.pid); echo agent-$((6 * 7))",
    answer: /agent-42/,
  });
  await waitFor(
    `${o.name} not Ready once its agent stopped`,
    async () => await ready() === "False",
    60_000,
  );
  o.step(`${o.name}: Ready by virt-probe's GuestPing, not Ready once the agent stopped`);
}

/**
 * KubeVirt's virtctl against a running guest, through KubeVirt's virt-api and the node's
 * handler (its REST API on the handler pod's IP, mutual TLS with virt-api's certificate):
 * `pause vmi` and `unpause vmi` move the Paused condition, `console` reaches the guest's
 * shell and brings its answer back, `vnc --proxy-only` gives QEMU's RFB greeting.
 */
async function virtctlJourney(o: {
  kc: string;
  name: string;
  getVmi: (name: string) => Promise<Vmi | undefined>;
  step: (what: string) => void;
}): Promise<void> {
  const virtctl = await buildVirtctl();
  const paused = async () =>
    (await o.getVmi(o.name))?.status?.conditions?.some((c) =>
      c.type === "Paused" && c.status === "True"
    ) === true;
  await command(virtctl, ["--kubeconfig", o.kc, "pause", "vmi", o.name]);
  await waitFor(`${o.name} Paused`, paused, 60_000);
  await command(virtctl, ["--kubeconfig", o.kc, "unpause", "vmi", o.name]);
  await waitFor(`${o.name} no longer Paused`, async () => !(await paused()), 60_000);
  o.step(`${o.name}: virtctl pause and unpause through virt-api`);

  const target = { virtctl, kubeconfig: o.kc, name: o.name };
  const consoleMs = await consoleAnswers(target, {
    line: "echo virtnode-answer-$((6 * 7))",
    answer: /virtnode-answer-42/,
  });
  o.step(`${o.name}: virtctl console answered in ${(consoleMs / 1000).toFixed(2)} s`);
  await vncGreets(target);
  o.step(`${o.name}: virtctl vnc --proxy-only greeted with RFB 003.008`);
  await usbredirGreets(target);
  o.step(`${o.name}: virtctl usbredir --no-launch greeted with QEMU's usbredir hello`);
  // The guest reads its downward metrics from its vhostmd port: the handler answers them.
  await consoleAnswers(target, {
    line: "for p in /sys/class/virtio-ports/*; do " +
      '[ "$(cat $p/name)" = org.github.vhostmd.1 ] && d=/dev/${p##*/}; done; exec 3<>$d; ' +
      "printf 'GET /metrics/XML\\n\\n' >&3; while read -r l <&3; do " +
      'case $l in *HostName*) read -r v <&3; echo "dm-host $v";; esac; ' +
      "[ \"$l\" = '</metrics>' ] && break; done; exec 3<&-",
    answer: /dm-host <value>[^<]+<\/value>/,
    timeoutMs: 60_000,
  });
  o.step(`${o.name}: the guest read its downward metrics from the node's handler`);
  // And from its vhostmd disk (the one starting "mvbd"), which the handler rewrites every
  // 5 s: read past the guest's page cache, until the node's name is in it.
  await consoleAnswers(target, {
    line: 'for d in /dev/vd?; do [ "$(head -c 4 $d)" = mvbd ] && m=$d; done; i=0; ' +
      "while [ $i -lt 30 ]; do echo 3 > /proc/sys/vm/drop_caches; " +
      "v=$(dd if=$m bs=4096 count=64 2>/dev/null | tr -d '\\000' | " +
      "grep -A1 '<name>HostName</name>' | tail -n 1); " +
      '[ -n "$v" ] && { echo "dm-disk $v"; break; }; i=$((i + 1)); sleep 1; done',
    answer: /dm-disk +<value>[^<]+<\/value>/,
    timeoutMs: 60_000,
  });
  o.step(`${o.name}: the guest read its downward metrics from its vhostmd disk`);
  // virt-api dials the VMI's first interface itself: the guest's HTTP port, forwarded.
  const forwarded = await portForwardAnswers(target, 80, "/dhcp");
  o.step(`${o.name}: virtctl port-forward reached the guest's HTTP port: ${forwarded}`);
}

/**
 * Persistent volumes, as a user has them: a local PersistentVolume of a directory on the
 * node (a filesystem claim) and one of a loop device (a block claim), each claimed and
 * given to a VMI booting the test guest from its containerDisk. The guest counts its boots
 * in the first sector of each data disk: after the VMI is deleted the count is on the node
 * (in `disk.img` the handler created on the claim, and on the loop device), and the VMI
 * recreated sees it and counts on.
 */
async function storageJourney(o: {
  kc: string;
  admin: Awaited<ReturnType<typeof kubeClient>>;
  audit?: string;
  node: Awaited<ReturnType<typeof startNode>>;
  cpuModel: string;
  getVmi: (name: string) => Promise<Vmi | undefined>;
  step: (what: string) => void;
}): Promise<void> {
  const { kc, node } = o;
  const fsDir = join(node.dir, "pv-data");
  await Deno.mkdir(fsDir, { mode: 0o755 });
  const backing = join(node.dir, "pv-block.img");
  const file = await Deno.open(backing, { create: true, write: true });
  await file.truncate(32 * 1024 * 1024);
  file.close();
  const loop = (await command("losetup", ["-f", "--show", backing])).trim();
  const hotBacking = join(node.dir, "pv-hotblk.img");
  const hotFile = await Deno.open(hotBacking, { create: true, write: true });
  await hotFile.truncate(8 * 1024 * 1024);
  hotFile.close();
  const hotLoop = (await command("losetup", ["-f", "--show", hotBacking])).trim();
  const hotDir = join(node.dir, "pv-hot");
  await Deno.mkdir(hotDir, { mode: 0o755 });
  // A hotplugged claim's image is there already (CDI's or the user's), as KubeVirt expects.
  const hotImage = await Deno.open(join(hotDir, "disk.img"), { create: true, write: true });
  await hotImage.truncate(16 * 1024 * 1024);
  hotImage.close();
  const size = (name: string) =>
    ({ "pv-block": "32Mi", "pv-hot": "16Mi", "pv-hotblk": "8Mi" } as Record<string, string>)[
      name
    ] ??
      "64Mi";
  const pv = (name: string, path: string, block: boolean) =>
    localVolume({ name, path, size: size(name), block, node: node.name });
  const pvc = (name: string, volumeName: string, block: boolean) =>
    localClaim({ name, volumeName, size: size(volumeName), block });
  try {
    await kubectl(
      kc,
      ["apply", "-f", "-"],
      JSON.stringify({
        apiVersion: "v1",
        kind: "List",
        items: [
          pv("pv-data", fsDir, false),
          pv("pv-block", loop, true),
          pv("pv-hot", hotDir, false),
          pv("pv-hotblk", hotLoop, true),
          pvc("data", "pv-data", false),
          pvc("block", "pv-block", true),
          pvc("hot", "pv-hot", false),
          pvc("hotblk", "pv-hotblk", true),
        ],
      }),
    );
    const base = networkVmi("vm-disks", o.cpuModel, "masquerade");
    const vmi = {
      ...base,
      spec: {
        ...base.spec,
        domain: {
          ...base.spec.domain,
          devices: {
            ...base.spec.domain.devices,
            disks: [
              ...base.spec.domain.devices.disks,
              { name: "data", disk: { bus: "virtio" } },
              { name: "block", disk: { bus: "virtio" } },
            ],
          },
        },
        volumes: [
          ...base.spec.volumes,
          { name: "data", persistentVolumeClaim: { claimName: "data" } },
          { name: "block", persistentVolumeClaim: { claimName: "block" } },
        ],
      },
    };
    for (const boot of [1, 2]) {
      // Recreated, the VMI names the same claim as a DataVolume's (no CDI runs here: the
      // claim of that name is the DataVolume's, as virt-controller and the handler read it).
      const asked = boot === 1 ? vmi : {
        ...vmi,
        spec: {
          ...vmi.spec,
          volumes: vmi.spec.volumes.map((v) =>
            v.name === "data" ? { name: "data", dataVolume: { name: "data" } } : v
          ),
        },
      };
      await kubectl(kc, ["apply", "-f", "-"], JSON.stringify(asked));
      const running = await waitFor(`vm-disks Running with its pod IP (boot ${boot})`, async () => {
        const v = await o.getVmi("vm-disks");
        return v?.status?.phase === "Running" && v.status.interfaces?.[0]?.ipAddress
          ? v
          : undefined;
      }, 180_000);
      const ip = running.status!.interfaces![0].ipAddress!;
      const disks = await waitFor(
        `vm-disks's guest listing its disks on ${ip}`,
        () => httpGet(`http://${ip}/disks`),
        240_000,
        1_000,
      );
      // vda boots; vdb is the filesystem claim's image (64 MiB), vdc the loop device.
      const lines = disks.trim().split("\n").map((l) => l.split(" "));
      assert.deepEqual(
        lines.map(([dev, sectors, count]) => [dev, Number(sectors), count]).slice(1),
        [["vdb", 64 * 2048, String(boot)], ["vdc", 32 * 2048, String(boot)]],
        `the guest's disks: ${disks}`,
      );
      const statuses = (running.status as { volumeStatus?: VolumeStatusEntry[] }).volumeStatus;
      const data = statuses?.find((s) => s.name === "data");
      assert.equal(data?.target, "vdb", JSON.stringify(statuses));
      assert.equal(data?.persistentVolumeClaimInfo?.claimName, "data", "virt-controller's info");
      o.step(`vm-disks (boot ${boot}): the guest wrote its count ${boot} to both claims`);
      if (boot === 2) {
        await hotplugJourney(o, "hot");
        await hotplugJourney(o, "hotblk");
      }
      await kubectl(kc, ["delete", "vmi", "vm-disks", "--wait=true", "--timeout=120s"]);
      // The count is on the node once the VMI is gone.
      const image = join(fsDir, "disk.img");
      const st = await Deno.stat(image);
      assert.equal(st.size, 64 * 1024 * 1024);
      assert.equal(st.uid, 107, "QEMU's user owns the image the handler created");
      for (const path of [image, backing]) {
        const head = new TextDecoder().decode((await Deno.readFile(path)).subarray(0, 32));
        assert.ok(head.startsWith(`virtnode-data ${boot}\n`), `${path}: ${JSON.stringify(head)}`);
      }
    }
    o.step("vm-disks deleted and recreated: each claim kept what the guest wrote");
  } finally {
    // The VMI first, so its pod lets go of the claims.
    await kubectl(kc, [
      "delete",
      "vmi",
      "vm-disks",
      "--ignore-not-found",
      "--wait=true",
      "--timeout=120s",
    ]).catch(() => {});
    await kubectl(kc, [
      "delete",
      "pvc",
      "data",
      "block",
      "hot",
      "hotblk",
      "--wait=true",
      "--timeout=60s",
    ])
      .catch(() => {});
    await kubectl(kc, [
      "delete",
      "pv",
      "pv-data",
      "pv-block",
      "pv-hot",
      "pv-hotblk",
      "--wait=true",
      "--timeout=60s",
    ]).catch(() => {});
    await command("losetup", ["-d", loop]).catch(() => {});
    await command("losetup", ["-d", hotLoop]).catch(() => {});
  }
}

/**
 * Kernel boot: a VMI with no disk boots the test guest's kernel and initramfs from a kernel
 * boot container image (`firmware.kernelBoot.container`), which the handler binds from that
 * container into the launcher; the guest answers HTTP on its pod IP.
 */
async function kernelBootJourney(o: {
  kc: string;
  node: Awaited<ReturnType<typeof startNode>>;
  cpuModel: string;
  getVmi: (name: string) => Promise<Vmi | undefined>;
  step: (what: string) => void;
}): Promise<void> {
  await o.node.importImage(await testKernelOciArchive());
  const base = networkVmi("vm-kernel", o.cpuModel, "masquerade");
  const vmi = {
    ...base,
    spec: {
      ...base.spec,
      domain: {
        ...base.spec.domain,
        devices: { interfaces: base.spec.domain.devices.interfaces },
        firmware: { kernelBoot: TEST_KERNEL_BOOT },
      },
      volumes: [],
    },
  };
  await kubectl(o.kc, ["apply", "-f", "-"], JSON.stringify(vmi));
  try {
    const running = await waitFor("vm-kernel Running with its pod IP", async () => {
      const v = await o.getVmi("vm-kernel");
      return v?.status?.phase === "Running" && v.status.interfaces?.[0]?.ipAddress ? v : undefined;
    }, 180_000);
    const ip = running.status!.interfaces![0].ipAddress!;
    const text = await waitFor(
      `vm-kernel's guest answering HTTP on ${ip}`,
      () => httpGet(`http://${ip}/dhcp`),
      240_000,
      1_000,
    );
    assert.equal(parseLease(text).hostname, "vm-kernel");
    o.step(`vm-kernel: booted its kernel and initrd from ${KERNEL_IMAGE}, HTTP answered on ${ip}`);
  } finally {
    await kubectl(o.kc, [
      "delete",
      "vmi",
      "vm-kernel",
      "--ignore-not-found",
      "--wait=true",
      "--timeout=120s",
    ]).catch(() => {});
  }
}

interface VolumeStatusEntry {
  name: string;
  target?: string;
  phase?: string;
  hotplugVolume?: { attachPodName?: string; attachPodUID?: string };
  persistentVolumeClaimInfo?: { claimName?: string };
}

/**
 * `virtctl addvolume` and `removevolume` of the claim `hot` on the running vm-disks, through
 * virt-api's subresources: virt-controller's attachment pod mounts the claim, the handler
 * hands its image to the launcher, KubeVirt's launcher attaches it to the domain (the
 * volume Ready with its target), and on removal detaches it, the handler unmounts it and
 * the attachment pod and the volume's status go.
 */
async function hotplugJourney(o: {
  kc: string;
  audit?: string;
  admin: Awaited<ReturnType<typeof kubeClient>>;
  getVmi: (name: string) => Promise<Vmi | undefined>;
  step: (what: string) => void;
}, name: string): Promise<void> {
  const sub =
    "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/vm-disks";
  const statusOf = async () =>
    ((await o.getVmi("vm-disks"))?.status as { volumeStatus?: VolumeStatusEntry[] } | undefined)
      ?.volumeStatus?.find((s) => s.name === name);
  const added = performance.now();
  // As virtctl calls them (virt-api answers 202 with no body).
  await kubectl(
    o.kc,
    ["replace", "--raw", `${sub}/addvolume`, "-f", "-"],
    JSON.stringify({
      name,
      disk: { name, disk: { bus: "scsi" } },
      volumeSource: { persistentVolumeClaim: { claimName: name, hotpluggable: true } },
    }),
  );
  const ready = await waitFor(
    "the hotplugged volume Ready",
    async () => {
      const s = await statusOf();
      return s?.phase === "Ready" && s.target ? s : undefined;
    },
    180_000,
    500,
  ).catch(async (error) => {
    // CI shows a failure's first lines only: what tells the stages apart goes first, on a
    // line each (the volume's status, the handler's words on it, the writes to the VMI).
    const v = await o.getVmi("vm-disks");
    console.error(JSON.stringify(v).slice(0, 8000));
    const lines = (await Deno.readTextFile(o.audit ?? "/dev/null").catch(() => ""))
      .split("\n").filter((l) => l.includes("vm-disks") && !/"verb":"(get|watch|list)"/.test(l))
      .map((l) => {
        const e = JSON.parse(l);
        return `${e.requestReceivedTimestamp} ${e.user?.username} ${e.verb} ${
          e.objectRef?.subresource ?? ""
        } ${e.responseStatus?.code}`;
      });
    const handlerLog = await kubectl(o.kc, [
      "logs",
      "-n",
      "kubevirt",
      "-l",
      "kubevirt.io=virt-handler", // virtnode's pods carry KubeVirt's label too
      "--tail=-1",
    ]).catch((e) => String(e));
    const said = handlerLog.split("\n").filter((l) => /hotplug|vm-disks|volume/i.test(l));
    const status = v?.status as { volumeStatus?: VolumeStatusEntry[] } | undefined;
    throw new Error(
      [
        `${(error as Error).message}; "${name}" status: ${
          JSON.stringify(status?.volumeStatus?.find((s) => s.name === name))
        }`,
        ...said.slice(-12).map((l) => `handler: ${l.slice(0, 300)}`),
        ...lines.slice(-12).map((l) => `audit: ${l}`),
      ].join("\n"),
      { cause: error },
    );
  });
  assert.match(ready.target!, /^sd[a-z]$/, "a SCSI disk of the running domain");
  assert.ok(ready.hotplugVolume?.attachPodName?.startsWith("hp-volume-"), JSON.stringify(ready));
  o.step(
    `hotplug: "${name}" attached to the running domain as ${ready.target} ${
      ((performance.now() - added) / 1000).toFixed(1)
    } s after addvolume`,
  );
  const removed = performance.now();
  await kubectl(
    o.kc,
    ["replace", "--raw", `${sub}/removevolume`, "-f", "-"],
    JSON.stringify({ name }),
  );
  await waitFor(
    "the hotplugged volume's status gone",
    async () => {
      const v = await o.getVmi("vm-disks");
      return v !== undefined && !(await statusOf());
    },
    180_000,
    500,
  );
  const pods = await o.admin.request<{ items: { metadata: { name: string } }[] }>(
    "GET",
    `/api/v1/namespaces/default/pods?labelSelector=${
      encodeURIComponent("kubevirt.io=hotplug-disk")
    }`,
  );
  assert.deepEqual(pods.items.map((p) => p.metadata.name), [], "no attachment pod left");
  assert.equal((await o.getVmi("vm-disks"))?.status?.phase, "Running");
  o.step(
    `hotplug: "${name}" detached and its attachment pod gone ${
      ((performance.now() - removed) / 1000).toFixed(1)
    } s after removevolume`,
  );
}

/**
 * `virtctl memory-dump get` of a running VM onto a claim, the way KubeVirt runs it:
 * virt-api records the request in the VM's status, virt-controller hotplugs the claim as a
 * memory dump volume through an attachment pod, the handler binds the claim's directory
 * into the launcher and asks KubeVirt's launcher for the dump, and virt-controller, seeing
 * the volume's MemoryDumpCompleted, unplugs the claim and writes the dump's file name on
 * the VM's status and the claim's annotation. The dump is on the node's directory, the
 * size of the guest's memory.
 */
async function memoryDumpJourney(o: {
  kc: string;
  admin: Awaited<ReturnType<typeof kubeClient>>;
  node: Awaited<ReturnType<typeof startNode>>;
  cpuModel: string;
  getVmi: (name: string) => Promise<Vmi | undefined>;
  step: (what: string) => void;
}): Promise<void> {
  const { kc, node } = o;
  const dir = join(node.dir, "pv-dump");
  await Deno.mkdir(dir, { mode: 0o755 });
  const base = networkVmi("vm-dump", o.cpuModel, "masquerade");
  const vm = {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachine",
    metadata: { name: "vm-dump", namespace: "default" },
    spec: {
      runStrategy: "Always",
      template: { metadata: {}, spec: base.spec },
    },
  };
  type VmStatus = {
    memoryDumpRequest?: {
      claimName?: string;
      phase?: string;
      fileName?: string;
      message?: string;
    };
  };
  const vmStatus = async () =>
    (await o.admin.request<{ status?: VmStatus }>(
      "GET",
      "/apis/kubevirt.io/v1/namespaces/default/virtualmachines/vm-dump",
    )).status;
  try {
    await kubectl(
      kc,
      ["apply", "-f", "-"],
      JSON.stringify({
        apiVersion: "v1",
        kind: "List",
        items: [
          localVolume({ name: "pv-dump", path: dir, size: "512Mi", node: node.name }),
          localClaim({ name: "dump", volumeName: "pv-dump", size: "512Mi" }),
          vm,
          // virt-api reads CDI's config for the claim's file system overhead; CDI's install
          // lets every authenticated user read it, and without CDI the read finds no
          // CDIConfig and KubeVirt's default overhead holds.
          ...CDI_CONFIG_READER.items,
        ],
      }),
    );
    await waitFor("vm-dump Running", async () => {
      const v = await o.getVmi("vm-dump");
      return v?.status?.phase === "Running" ? v : undefined;
    }, 180_000);
    const virtctl = await buildVirtctl();
    const asked = performance.now();
    await command(virtctl, [
      "--kubeconfig",
      kc,
      "memory-dump",
      "get",
      "vm-dump",
      "--claim-name=dump",
    ]);
    const done = await waitFor(
      "vm-dump's memory dump Completed",
      async () => {
        const request = (await vmStatus())?.memoryDumpRequest;
        if (request?.phase === "Failed") {
          throw new Error(`the memory dump failed: ${JSON.stringify(request)}`);
        }
        return request?.phase === "Completed" ? request : undefined;
      },
      240_000,
      1_000,
    ).catch(async (error) => {
      // The first line says where it stopped: the VM's request and the volume's status.
      const v = await o.getVmi("vm-dump");
      const volume = (v?.status as { volumeStatus?: VolumeStatusEntry[] } | undefined)
        ?.volumeStatus?.find((s) => s.name === "dump");
      throw new Error(
        `${(error as Error).message}; request ${
          JSON.stringify((await vmStatus())?.memoryDumpRequest)
        }; volume ${JSON.stringify(volume)}`,
        { cause: error },
      );
    });
    const file = done.fileName ?? "";
    assert.match(file, /^vm-dump-dump-\d{8}-\d{6}\.memory\.dump$/, JSON.stringify(done));
    const dumped = await Deno.stat(join(dir, file));
    // A memory-only dump holds the guest's 128 MiB and a little more (its ELF notes).
    assert.ok(
      dumped.size >= 128 * 1024 * 1024 && dumped.size < 160 * 1024 * 1024,
      `the dump's size: ${dumped.size}`,
    );
    // A core file of the guest's memory, as a user checks it.
    const elf = await command("readelf", ["-h", join(dir, file)]);
    assert.match(elf, /^\s*Type:\s+CORE \(Core file\)$/m, elf);
    const claim = await o.admin.request<{ metadata: { annotations?: Record<string, string> } }>(
      "GET",
      "/api/v1/namespaces/default/persistentvolumeclaims/dump",
    );
    assert.equal(claim.metadata.annotations?.["kubevirt.io/memory-dump"], file);
    // Unplugged again: the volume left the VMI, its attachment pod went, the guest runs on.
    const after = await o.getVmi("vm-dump");
    assert.equal(after?.status?.phase, "Running");
    assert.ok(
      !(after?.status as { volumeStatus?: VolumeStatusEntry[] }).volumeStatus?.some((s) =>
        s.name === "dump"
      ),
      JSON.stringify(after?.status),
    );
    o.step(
      `memory dump: virtctl memory-dump wrote ${file} (${
        (dumped.size / 1024 / 1024).toFixed(0)
      } MiB) to the claim ${((performance.now() - asked) / 1000).toFixed(1)} s after it asked`,
    );
  } finally {
    await kubectl(kc, [
      "delete",
      "vm",
      "vm-dump",
      "--ignore-not-found",
      "--wait=true",
      "--timeout=120s",
    ]).catch(() => {});
    await waitFor("vm-dump's VMI gone", async () => !(await o.getVmi("vm-dump")), 120_000)
      .catch(() => {});
    await kubectl(kc, [
      "delete",
      "pvc",
      "dump",
      "--ignore-not-found",
      "--wait=true",
      "--timeout=60s",
    ]).catch(() => {});
    await kubectl(kc, ["delete", "pv", "pv-dump", "--ignore-not-found", "--wait=true"])
      .catch(() => {});
  }
}

async function command(cmd: string, args: string[]): Promise<string> {
  const out = await new Deno.Command(cmd, { args, stdout: "piped", stderr: "piped" }).output();
  const text = new TextDecoder();
  if (!out.success) throw new Error(`${cmd} ${args.join(" ")}: ${text.decode(out.stderr)}`);
  return text.decode(out.stdout);
}

/** Whether this kernel makes `dummy` links (KubeVirt's bridge binding needs them). */
async function dummyLinks(): Promise<boolean> {
  const name = `vnd${crypto.randomUUID().slice(0, 8)}`;
  const made = await new Deno.Command("ip", {
    args: ["link", "add", name, "type", "dummy"],
    stdout: "null",
    stderr: "null",
  }).output();
  if (made.success) await new Deno.Command("ip", { args: ["link", "delete", name] }).output();
  return made.success;
}

function exists(path: string): boolean {
  try {
    Deno.statSync(path);
    return true;
  } catch {
    return false;
  }
}

/**
 * Every manifest under deploy/ is accepted by a real apiserver (`kubectl apply
 * --dry-run=server`, which runs validation and admission without persisting); the
 * DaemonSet mounts and probes only what KubeVirt mode uses, within resource limits; and
 * the systemd unit passes `systemd-analyze verify`, keeps VMs alive across restarts and
 * keeps its `systemd-analyze security` exposure at or below {@linkcode UNIT_EXPOSURE}.
 */

import assert from "node:assert/strict";
import { join, relative } from "node:path";
import { load } from "js-yaml";
import { useCluster } from "../../deploy/cluster/cluster.ts";

const REPO_ROOT = new URL("../../", import.meta.url).pathname;
const DEPLOY = join(REPO_ROOT, "deploy");
const UNIT = join(DEPLOY, "virtnode.service");
/** `systemd-analyze security` of the unit (0 safest, 10 unsafe; 9.6 without hardening). */
const UNIT_EXPOSURE = 4.1;
/** The merge patches for an operator's KubeVirt CR (docs/operating.md), not objects. */
const CR_PATCH = /kubevirt-cr-(un)?patch\.yaml$/;

async function run(
  cmd: string,
  args: string[],
): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(cmd, { args, stdin: "null", stdout: "piped", stderr: "piped" })
    .output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

function yamlFiles(dir: string): string[] {
  const files: string[] = [];
  for (const entry of Deno.readDirSync(dir)) {
    const path = join(dir, entry.name);
    if (entry.isDirectory) files.push(...yamlFiles(path));
    else if (/\.ya?ml$/.test(entry.name)) files.push(path);
  }
  return files.sort();
}

Deno.test("every manifest in deploy/ passes a server-side dry run", async () => {
  const cluster = await useCluster();
  const kubectl = (...args: string[]) =>
    run("kubectl", ["--kubeconfig", cluster.kubeconfigPath, ...args]);
  try {
    const all = yamlFiles(DEPLOY);
    const patches = all.filter((f) => CR_PATCH.test(f));
    const files = all.filter((f) => !CR_PATCH.test(f));
    assert.ok(files.some((f) => f.endsWith("daemonset.yaml")), "the DaemonSet is there");
    assert.equal(patches.length, 2, "the KubeVirt CR's patch and its reverse are there");
    // Namespaced objects are dry-run in their namespace, KubeVirt's, which the cluster's
    // KubeVirt admission created; the examples' kinds are known from KubeVirt's CRDs.
    for (const file of files) {
      const result = await kubectl("apply", "--dry-run=server", "-f", file);
      assert.equal(
        result.code,
        0,
        `${relative(REPO_ROOT, file)}: ${result.stderr.trim() || result.stdout.trim()}`,
      );
      assert.match(result.stdout, /\(server dry run\)/, relative(REPO_ROOT, file));
    }
    // The CR patches are not objects: they go to the cluster's KubeVirt CR with the command
    // docs/operating.md gives, and the CR that would result is read back.
    for (const file of patches) {
      const result = await kubectl(
        "patch",
        "kubevirt",
        "kubevirt",
        "-n",
        "kubevirt",
        "--type",
        "merge",
        "--patch-file",
        file,
        "--dry-run=server",
        "-o",
        "json",
      );
      const name = relative(REPO_ROOT, file);
      assert.equal(result.code, 0, `${name}: ${result.stderr.trim() || result.stdout.trim()}`);
      const cr = JSON.parse(result.stdout) as {
        spec: { customizeComponents?: { patches?: { resourceName: string }[] } };
      };
      const names = (cr.spec.customizeComponents?.patches ?? []).map((p) => p.resourceName);
      if (file.endsWith("-unpatch.yaml")) assert.deepEqual(names, [], name);
      else assert.deepEqual(names, ["virt-handler"], name);
    }
    console.log(`  ${files.length} manifests and ${patches.length} KubeVirt CR patches accepted`);
  } finally {
    await cluster.stop();
  }
});

interface Container {
  image: string;
  args: string[];
  resources?: { requests?: Record<string, string>; limits?: Record<string, string> };
  volumeMounts: {
    name: string;
    mountPath: string;
    mountPropagation?: string;
    readOnly?: boolean;
  }[];
}

interface PodSpec {
  hostNetwork?: boolean;
  initContainers: Container[];
  containers: Container[];
  volumes: { name: string; hostPath?: { path: string }; secret?: { secretName: string } }[];
}

function daemonSetPod(): PodSpec {
  const ds = load(Deno.readTextFileSync(join(DEPLOY, "daemonset.yaml"))) as {
    spec: { template: { spec: PodSpec } };
  };
  return ds.spec.template.spec;
}

Deno.test("the DaemonSet propagates no mount back to the host and mounts only what KubeVirt mode uses", () => {
  const pod = daemonSetPod();
  const [handler] = pod.containers;
  // The handler makes no mounts: nothing may propagate from the container to the host.
  for (const m of handler.volumeMounts) {
    assert.ok(
      m.mountPropagation === undefined || m.mountPropagation === "HostToContainer",
      `${m.mountPath}: ${m.mountPropagation}`,
    );
  }
  const hostPaths = pod.volumes.filter((v) => v.hostPath).map((v) => v.hostPath?.path).sort();
  // Beside the host's directories, only the handler's certificate Secrets (the server's, for
  // the REST API and migration listeners; the client's, for migrations to other nodes).
  assert.deepEqual(
    pod.volumes.filter((v) => !v.hostPath).map((v) => v.secret?.secretName),
    ["kubevirt-virt-handler-server-certs", "kubevirt-virt-handler-certs"],
  );
  assert.deepEqual(hostPaths, [
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet/pods",
    "/var/lib/kubevirt-node-labeller",
    "/var/lib/virtnode",
    "/var/run/kubevirt",
  ]);
  // No host libvirtd: KubeVirt's node-labeller init container writes what the launcher
  // image's libvirt offers, as under virt-operator, and the handler only reads it.
  const [labeller] = pod.initContainers;
  assert.match(labeller.image, /\/virt-launcher:v1\.7\.0$/);
  assert.deepEqual(labeller.volumeMounts.map((m) => m.mountPath), [
    "/var/lib/kubevirt-node-labeller",
  ]);
  const files = handler.volumeMounts.find((m) => m.mountPath === "/var/lib/kubevirt-node-labeller");
  assert.equal(files?.readOnly, true);
});

Deno.test("the DaemonSet requests and limits CPU and memory and says why its health port is not loopback", () => {
  const pod = daemonSetPod();
  const [handler] = pod.containers;
  for (const kind of ["requests", "limits"] as const) {
    for (const resource of ["cpu", "memory"]) {
      assert.ok(handler.resources?.[kind]?.[resource], `${kind}.${resource}`);
    }
  }
  const health = handler.args.find((a) => a.startsWith("--health-address="));
  assert.ok(health, "the health address is explicit");
  if (!health.startsWith("--health-address=127.0.0.1:")) {
    // Anything but loopback is for the kubelet's probes of the pod IP: only in the pod's
    // own network namespace, never on the host's.
    assert.notEqual(pod.hostNetwork, true, "health beyond loopback only off the host network");
    assert.match(
      Deno.readTextFileSync(join(DEPLOY, "daemonset.yaml")),
      /# Not loopback: .*\n.*kubelet probes the pod IP/,
    );
  }
});

/** Sections of a unit file: name -> key -> values (keys may repeat). */
function parseUnit(text: string): Map<string, Map<string, string[]>> {
  const sections = new Map<string, Map<string, string[]>>();
  let current: Map<string, string[]> | undefined;
  for (const [i, raw] of text.split("\n").entries()) {
    const line = raw.trim();
    if (line === "" || line.startsWith("#") || line.startsWith(";")) continue;
    const header = /^\[([A-Za-z]+)\]$/.exec(line);
    if (header) {
      current = new Map();
      sections.set(header[1], current);
      continue;
    }
    const kv = /^([A-Za-z][A-Za-z0-9]*)=(.*)$/.exec(line);
    if (!kv || !current) throw new Error(`Cannot parse unit line ${i + 1}: "${raw}"`);
    current.set(kv[1], [...(current.get(kv[1]) ?? []), kv[2]]);
  }
  return sections;
}

Deno.test("the systemd unit keeps launchers alive and restarts the handler", () => {
  const unit = parseUnit(Deno.readTextFileSync(UNIT));
  assert.deepEqual([...unit.keys()], ["Unit", "Service", "Install"]);
  const service = unit.get("Service")!;
  assert.match(service.get("ExecStart")![0], /^\/usr\/local\/bin\/virtnode handler --podless/);
  assert.deepEqual(service.get("KillMode"), ["process"]);
  assert.deepEqual(service.get("Restart"), ["always"]);
  assert.ok(Number(service.get("TimeoutStopSec")![0]) > 60, "stop timeout covers the drain");
  assert.equal(service.get("RuntimeDirectory"), undefined, "no runtime dir to wipe on stop");
  assert.deepEqual(unit.get("Install")!.get("WantedBy"), ["multi-user.target"]);
});

Deno.test("the systemd unit sandboxes the handler with what the launchers tolerate", () => {
  const service = parseUnit(Deno.readTextFileSync(UNIT)).get("Service")!;
  for (
    const [key, value] of [
      ["NoNewPrivileges", "yes"],
      ["ProtectKernelTunables", "yes"],
      ["ProtectControlGroups", "yes"],
      ["RestrictNamespaces", "net"],
    ]
  ) {
    assert.deepEqual(service.get(key), [value], key);
  }
  // No mount namespace of its own: the VMs' pod network pins must be seen by the launcher
  // host, the CNI plugins and a restarted handler.
  for (const key of ["ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateMounts"]) {
    assert.equal(service.get(key), undefined, key);
  }
  assert.match(service.get("CapabilityBoundingSet")![0], /CAP_NET_ADMIN .*CAP_SYS_ADMIN/);
  assert.match(service.get("SystemCallFilter")![0], /^@system-service\b/);
  assert.deepEqual(service.get("SystemCallErrorNumber"), ["EPERM"]);
});

/** The unit with ExecStart pointing at an executable stand-in (verify checks it exists). */
async function withUnitCopy(fn: (path: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "virtnode-unit-" });
  try {
    const stub = join(dir, "virtnode");
    await Deno.writeTextFile(stub, "#!/bin/sh\nexit 0\n");
    await Deno.chmod(stub, 0o755);
    const copy = join(dir, "virtnode.service");
    await Deno.writeTextFile(
      copy,
      Deno.readTextFileSync(UNIT).replaceAll("/usr/local/bin/virtnode", stub),
    );
    await fn(copy);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test(`the systemd unit's exposure stays at or below ${UNIT_EXPOSURE} (systemd-analyze security)`, async () => {
  await withUnitCopy(async (copy) => {
    const result = await run("systemd-analyze", ["security", "--offline=yes", "--no-pager", copy]);
    const score = /Overall exposure level for \S+: ([0-9.]+)/.exec(result.stdout + result.stderr);
    assert.ok(score, `no exposure level in: ${result.stdout}${result.stderr}`);
    assert.ok(Number(score[1]) <= UNIT_EXPOSURE, `exposure ${score[1]} > ${UNIT_EXPOSURE}`);
  });
});

Deno.test("the systemd unit passes systemd-analyze verify", async () => {
  const which = await run("sh", ["-c", "command -v systemd-analyze"]);
  // deploy/setup.sh installs systemd: a missing tool is a broken setup, not a skip.
  assert.equal(
    which.code,
    0,
    'systemd-analyze is missing: install the Debian package "systemd" (deploy/setup.sh does)',
  );
  await withUnitCopy(async (copy) => {
    const result = await run("systemd-analyze", ["verify", copy]);
    assert.equal(result.code, 0, result.stderr);
    // Unknown or misspelled keys are only warnings: any output is a failure here.
    assert.equal(result.stderr.trim(), "", result.stderr);
  });
});

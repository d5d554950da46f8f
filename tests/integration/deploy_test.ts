/**
 * Every manifest under deploy/ is accepted by a real apiserver (`kubectl apply
 * --dry-run=server`, which runs validation and admission without persisting), and the
 * systemd unit passes `systemd-analyze verify` (or, without systemd-analyze, a parse
 * of its sections and the settings that keep VMs alive across restarts).
 */

import assert from "node:assert/strict";
import { join, relative } from "node:path";
import { useCluster } from "../../deploy/cluster/cluster.ts";

const REPO_ROOT = new URL("../../", import.meta.url).pathname;
const DEPLOY = join(REPO_ROOT, "deploy");
const UNIT = join(DEPLOY, "virtnode.service");

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
  let createdNamespace = false;
  try {
    const files = yamlFiles(DEPLOY);
    assert.ok(files.some((f) => f.endsWith("daemonset.yaml")), "the DaemonSet is there");
    assert.ok(files.some((f) => f.includes("/crds/")), "the CRDs are there");
    // Namespaced objects are dry-run in the namespace, which must exist for real; the
    // CRDs are applied for real too, so that the examples' kinds are known.
    const ns = await kubectl("apply", "-f", join(DEPLOY, "namespace.yaml"));
    assert.equal(ns.code, 0, ns.stderr);
    createdNamespace = true;
    const crds = await kubectl("apply", "--server-side", "-f", join(DEPLOY, "crds"));
    assert.equal(crds.code, 0, crds.stderr);
    const established = await kubectl(
      "wait",
      "--for=condition=Established",
      "--timeout=60s",
      "-f",
      join(DEPLOY, "crds"),
    );
    assert.equal(established.code, 0, established.stderr);
    for (const file of files) {
      const result = await kubectl("apply", "--dry-run=server", "-f", file);
      assert.equal(
        result.code,
        0,
        `${relative(REPO_ROOT, file)}: ${result.stderr.trim() || result.stdout.trim()}`,
      );
      assert.match(result.stdout, /\(server dry run\)/, relative(REPO_ROOT, file));
    }
    console.log(`  ${files.length} manifests accepted`);
  } finally {
    if (createdNamespace) {
      await kubectl("delete", "--wait=false", "-f", join(DEPLOY, "namespace.yaml"));
    }
    await cluster.stop();
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

Deno.test("the systemd unit passes systemd-analyze verify", async () => {
  const which = await run("sh", ["-c", "command -v systemd-analyze"]);
  // deploy/setup.sh installs systemd: a missing tool is a broken setup, not a skip.
  assert.equal(
    which.code,
    0,
    'systemd-analyze is missing: install the Debian package "systemd" (deploy/setup.sh does)',
  );
  // verify also checks that ExecStart's binary exists: point it at a stand-in.
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
    const result = await run("systemd-analyze", ["verify", copy]);
    assert.equal(result.code, 0, result.stderr);
    // Unknown or misspelled keys are only warnings: any output is a failure here.
    assert.equal(result.stderr.trim(), "", result.stderr);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

/**
 * M5: KubeVirt mode's ClusterRole (`deploy/rbac.yaml`, the DaemonSet's) holds only what
 * KubeVirt mode calls; the migration writes and claim reads that only pod-less mode makes
 * (it stands in for virt-controller and the kubelet) are in the pod-less node's role
 * (`deploy/podless-node.yaml`); the Secret reads of access credentials are an opt-in of their
 * own (`deploy/podless-secrets.yaml`). Every rule names the code that makes its calls.
 * `tests/integration/rbac_test.ts` runs a KubeVirt-mode handler through a VMI's life with
 * deploy/rbac.yaml alone.
 */
import assert from "node:assert/strict";
import { loadAll } from "js-yaml";

const DEPLOY = new URL("../../deploy/", import.meta.url);

interface Rule {
  apiGroups: string[];
  resources: string[];
  verbs: string[];
}

interface Manifest {
  kind: string;
  metadata: { name: string };
  rules?: Rule[];
}

function manifests(file: string): Manifest[] {
  return loadAll(Deno.readTextFileSync(new URL(file, DEPLOY))) as Manifest[];
}

/** "verb resource" for every permission of the file's ClusterRoles. */
function clusterPermissions(file: string): string[] {
  return manifests(file).filter((m) => m.kind === "ClusterRole").flatMap((m) =>
    (m.rules ?? []).flatMap((r) => r.resources.flatMap((res) => r.verbs.map((v) => `${v} ${res}`)))
  );
}

const MIGRATION_WRITES =
  /^(create|update|patch|delete|deletecollection|\*) virtualmachineinstancemigrations(\/status)?$/;
const CLAIM_READS = /^(get|list|watch|\*) (persistentvolumeclaims|persistentvolumes)$/;

Deno.test("KubeVirt mode's ClusterRole grants no migration write and no claim or volume read", () => {
  const kubevirtMode = clusterPermissions("rbac.yaml");
  assert.ok(kubevirtMode.includes("update virtualmachineinstances"), "the role was read");
  assert.deepEqual(kubevirtMode.filter((p) => MIGRATION_WRITES.test(p)), []);
  assert.deepEqual(kubevirtMode.filter((p) => CLAIM_READS.test(p)), []);
  assert.ok(!kubevirtMode.some((p) => p.startsWith("*") || p.endsWith(" *")), "no wildcard");
});

Deno.test("the pod-less node's ClusterRole holds the migration writes and claim reads", () => {
  const podless = clusterPermissions("podless-node.yaml");
  for (
    const p of [
      "update virtualmachineinstancemigrations",
      "delete virtualmachineinstancemigrations",
      "update virtualmachineinstancemigrations/status",
      "get persistentvolumeclaims",
      "get persistentvolumes",
    ]
  ) {
    assert.ok(podless.includes(p), `deploy/podless-node.yaml grants ${p}`);
  }
});

Deno.test("Secrets are read only where deploy/podless-secrets.yaml is applied, and only by name", () => {
  // virt-handler reads no Secret; a pod-less node reads its VMIs' credential Secrets once
  // an operator opts in with deploy/podless-secrets.yaml: get only, never list or watch.
  const secretRules = (file: string) => clusterPermissions(file).filter((p) => / secrets$/.test(p));
  assert.deepEqual(secretRules("rbac.yaml"), []);
  assert.deepEqual(secretRules("podless-node.yaml"), []);
  assert.deepEqual(clusterPermissions("podless-secrets.yaml"), ["get secrets"]);
});

Deno.test("every rule of the roles names the code that makes its calls", () => {
  for (const file of ["rbac.yaml", "podless-node.yaml", "podless-secrets.yaml"]) {
    const lines = Deno.readTextFileSync(new URL(file, DEPLOY)).split("\n");
    lines.forEach((line, i) => {
      if (!/^ {2}- apiGroups:/.test(line)) return;
      const comment: string[] = [];
      for (let j = i - 1; j >= 0 && /^\s*#/.test(lines[j]); j--) comment.unshift(lines[j]);
      assert.match(
        comment.join(" "),
        /mod\/[\w/]+\.ts/,
        `${file}:${i + 1}: the rule's comment names no file of mod/`,
      );
    });
  }
});

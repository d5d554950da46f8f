/**
 * deploy/kubevirt-cr-patch.yaml, the swap on an operator-managed KubeVirt, runs what
 * deploy/daemonset.yaml runs: the image `deno task image` builds and the same handler
 * arguments. (The conformance tier applies the patch through the real virt-operator.)
 */
import assert from "node:assert/strict";
import { loadYaml } from "@kubernetes/client-node";
import { imageName } from "../../deploy/image/image.ts";

const root = new URL("../../", import.meta.url);
const yaml = async (file: string) => loadYaml(await Deno.readTextFile(new URL(file, root)));

interface Container {
  name: string;
  image: string;
  command: string[];
  args: string[];
  volumeMounts: { name: string; mountPath: string }[];
}

Deno.test("the CR patch runs the DaemonSet's image and handler arguments in virt-handler's container", async () => {
  const cr = await yaml("deploy/kubevirt-cr-patch.yaml") as {
    spec: { customizeComponents: { patches: { resourceName: string; patch: string }[] } };
  };
  const [entry, ...rest] = cr.spec.customizeComponents.patches;
  assert.equal(rest.length, 0);
  assert.equal(entry.resourceName, "virt-handler");
  const spec = JSON.parse(entry.patch).spec.template.spec;
  const patched: Container = spec.containers[0];
  const daemonSet = await yaml("deploy/daemonset.yaml") as {
    spec: { template: { spec: { containers: Container[] } } };
  };
  const shipped = daemonSet.spec.template.spec.containers[0];
  const { version } = JSON.parse(await Deno.readTextFile(new URL("deno.json", root)));

  assert.equal(patched.name, "virt-handler");
  assert.equal(patched.image, imageName(version));
  assert.equal(shipped.image, imageName(version));
  assert.deepEqual(patched.command, shipped.command);
  assert.deepEqual(patched.args, shipped.args);
  // The ghost records' folder (--state-dir's default) survives the pod, from the host.
  assert.deepEqual(patched.volumeMounts, [
    { name: "virtnode-state", mountPath: "/var/lib/virtnode" },
  ]);
  assert.equal(spec.volumes[0].hostPath.path, "/var/lib/virtnode");
});

Deno.test("the reverse patch takes the CR's component patches away", async () => {
  const cr = await yaml("deploy/kubevirt-cr-unpatch.yaml") as {
    spec: { customizeComponents: { patches: unknown } };
  };
  assert.equal(cr.spec.customizeComponents.patches, null);
});

/**
 * M3: the pod-less host disk root holds every tenant's volumes, so a VMI's `hostDisk.path`
 * may name only its own namespace's folder of it (`<root>/<namespace>/`), resolved
 * beneath the root with no symlink out. A VMI of namespace "a" naming `<root>/b/disk.img`
 * (or a symlink in its own folder that leads there) is refused, naming the field and the
 * folder it may use: by the converter, and by a pod-less handler as a `Synchronized=False`
 * condition and a `SyncFailed` Event, on a control plane with KubeVirt's admission (its
 * HostDisk feature gate on) — while the same VMI naming its own folder runs.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { KUBEVIRT_NAMESPACE, startCluster } from "../../deploy/cluster/cluster.ts";
import { convertVmiToDomainXml, InvalidFieldError } from "../../mod/launcher/testing.ts";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import {
  createVmi,
  eventsFor,
  getVmi,
  killLaunchers,
  kubeClient,
  startHandlerProcess,
  testVmi,
  waitFor,
  waitForPhase,
} from "../helpers/handler_process.ts";

const FIELD = "spec.volumes[0].hostDisk.path";

/** A VMI of `namespace` whose one disk is the host disk `path`. */
function hostDiskVmi(
  name: string,
  namespace: string,
  node: string,
  path: string,
): VirtualMachineInstance {
  const vmi = testVmi(name, node, { namespace });
  vmi.spec.domain.devices.disks = [{ name: "data", disk: { bus: "virtio" } }];
  vmi.spec.volumes = [{ name: "data", hostDisk: { path, type: "Disk" } }];
  return vmi;
}

/** A host disk root with a disk in the folders of namespaces "a" and "b". */
async function hostDiskRoot(): Promise<string> {
  const root = await Deno.realPath(await Deno.makeTempDir({ prefix: "virtnode-tenancy-" }));
  for (const namespace of ["a", "b"]) {
    await Deno.mkdir(join(root, namespace));
    await Deno.writeFile(join(root, namespace, "disk.img"), new Uint8Array(1024 * 1024));
  }
  return root;
}

Deno.test("a VMI in namespace a may not name a host disk in namespace b's folder, even through a symlink", async () => {
  // Both folders sit in one host disk root; the disk is refused named directly and through a link.
  const root = await hostDiskRoot();
  try {
    await Deno.symlink(join(root, "b"), join(root, "a", "to-b"));
    const options = {
      domainType: "qemu" as const,
      runDir: join(root, "run"),
      diskDir: join(root, "vm-disks"),
      hostDiskRoot: root,
    };
    for (const named of [join(root, "b", "disk.img"), join(root, "a", "to-b", "disk.img")]) {
      await assert.rejects(
        convertVmiToDomainXml(hostDiskVmi("vm1", "a", "n", named), options),
        (error: unknown) => {
          assert.ok(error instanceof InvalidFieldError, String(error));
          assert.equal(error.path, FIELD);
          assert.ok(
            error.message.includes(`must stay inside "${root}/a/"`),
            `the message names the allowed folder: ${error.message}`,
          );
          return true;
        },
      );
    }
    // Its own folder is fine.
    const own = await convertVmiToDomainXml(
      hostDiskVmi("vm1", "a", "n", join(root, "a", "disk.img")),
      options,
    );
    assert.equal(own.volumes.data.path, join(root, "a", "disk.img"));
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("a pod-less handler refuses another namespace's host disk, naming the field and the allowed root", async () => {
  // The refusal shows as Synchronized=False and a SyncFailed Event.
  const cluster = await startCluster({ admission: true });
  const root = await hostDiskRoot();
  const admin = await kubeClient(cluster.kubeconfigPath);
  const node = `tenancy-${crypto.randomUUID().slice(0, 8)}`;
  let h: Awaited<ReturnType<typeof startHandlerProcess>> | undefined;
  let ok = false;
  try {
    // KubeVirt's admission takes hostDisk volumes only with its HostDisk feature gate.
    await admin.request(
      "PATCH",
      `/apis/kubevirt.io/v1/namespaces/${KUBEVIRT_NAMESPACE}/kubevirts/kubevirt`,
      { spec: { configuration: { developerConfiguration: { featureGates: ["HostDisk"] } } } },
      { contentType: "application/merge-patch+json" },
    );
    for (const namespace of ["a", "b"]) {
      await admin.request("POST", "/api/v1/namespaces", { metadata: { name: namespace } });
    }
    h = await startHandlerProcess({
      kubeconfig: cluster.handlerKubeconfigPath,
      nodeName: node,
      libvirtUri: "test:///default",
      hostDiskRoot: root,
    });
    const theirs = hostDiskVmi("theirs", "a", node, join(root, "b", "disk.img"));
    await waitFor("KubeVirt's admission to take a hostDisk", () => createVmi(admin, theirs));
    await createVmi(admin, hostDiskVmi("own", "a", node, join(root, "a", "disk.img")));

    const allowed = `must stay inside "${root}/a/", the host disk root of namespace "a"`;
    const condition = await waitFor("Synchronized=False on the VMI", async () => {
      const v = await getVmi(admin, "a", "theirs");
      return v?.status?.conditions?.find((c) => c.type === "Synchronized" && c.status === "False");
    });
    const message = condition.message ?? "";
    assert.ok(message.includes(FIELD) && message.includes(allowed), message);
    const event = await waitFor("a SyncFailed Event", async () => {
      return (await eventsFor(admin, "a", "theirs")).find((e) => e.reason === "SyncFailed");
    });
    assert.equal(event.type, "Warning");
    assert.ok(event.message.includes(FIELD) && event.message.includes(allowed), event.message);
    assert.notEqual((await getVmi(admin, "a", "theirs"))?.status?.phase, "Running");

    // The same VMI naming its own namespace's disk runs.
    await waitForPhase(admin, "a", "own", "Running");
    ok = true;
  } finally {
    if (h) {
      if (!ok) console.error((await Deno.readTextFile(h.logFile)).slice(-5000));
      await h.kill("SIGTERM");
      killLaunchers(h.stateDir);
      await Deno.remove(h.dir, { recursive: true }).catch(() => {});
    }
    admin.close();
    await Deno.remove(root, { recursive: true }).catch(() => {});
    await cluster.stop();
  }
});

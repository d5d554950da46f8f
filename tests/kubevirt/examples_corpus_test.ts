/**
 * KubeVirt v1.7.0's own examples as a corpus: every VMI, and the VMI template of every
 * VM, under its `examples/` folder is created through KubeVirt's admission (server-side
 * dry run: virt-api's defaults applied, nothing stored) and handed to virtnode's
 * converter. The test prints `converted N of M` and each refusal; every refusal must
 * name the field at fault and say why. containerDisk images are not pulled here (no
 * registry is reachable): each image an example names gets a 1 MiB placeholder disk in
 * the converter's image directory, and each pod-network interface what a launcher finds in
 * its pod (tap0, the pod's MAC and MTU), so what is judged is the conversion.
 */
// deno-lint-ignore-file no-explicit-any
import { buildKubevirtPeers } from "../harness/kubevirt/peers.ts";
import assert from "node:assert/strict";
import { join } from "node:path";
import { loadAll } from "js-yaml";
import { startCluster } from "../../deploy/cluster/cluster.ts";
import { admit } from "../helpers/admission.ts";
import { NetworkSpecError, podNetworkPlan, type PreparedInterface } from "../../mod/network/mod.ts";
import {
  containerDiskFileName,
  ConversionError,
  convertVmiToDomainXml,
} from "../../mod/launcher/testing.ts";

interface Manifest {
  kind?: string;
  metadata?: { name?: string };
  spec?: { template?: { metadata?: Record<string, unknown>; spec?: unknown } };
}

/** A 1 MiB qcow2 placeholder at `file`; throws when qemu-img fails. */
async function placeholderDisk(file: string): Promise<void> {
  const output = await new Deno.Command("qemu-img", {
    args: ["create", "-q", "-f", "qcow2", file, "1M"],
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).output();
  if (!output.success) throw new Error(new TextDecoder().decode(output.stderr));
}

/** The VMIs of the examples: VMI manifests, and each VM's template as a VMI. */
async function exampleVmis(
  dir: string,
): Promise<{ source: string; vmi: Record<string, unknown> }[]> {
  const found: { source: string; vmi: Record<string, unknown> }[] = [];
  const files = [...Deno.readDirSync(dir)].filter((e) => e.isFile && /\.ya?ml$/.test(e.name))
    .map((e) => e.name).sort();
  for (const file of files) {
    for (const doc of loadAll(await Deno.readTextFile(join(dir, file))) as Manifest[]) {
      if (doc?.kind === "VirtualMachineInstance") {
        found.push({ source: file, vmi: doc as Record<string, unknown> });
      } else if (doc?.kind === "VirtualMachine" && doc.spec?.template?.spec) {
        found.push({
          source: `${file} (VM template)`,
          vmi: {
            apiVersion: "kubevirt.io/v1",
            kind: "VirtualMachineInstance",
            metadata: { ...doc.spec.template.metadata, name: doc.metadata?.name },
            spec: doc.spec.template.spec,
          },
        });
      }
    }
  }
  return found;
}

/**
 * What a launcher would find of the VMI's pod-network interfaces in its pod: `tap0`, the
 * spec's MAC or the pod's, the pod's MTU. None when the plan refuses the spec (the
 * converter says why).
 */
function launcherView(vmi: any): Record<string, PreparedInterface> {
  try {
    return Object.fromEntries(
      podNetworkPlan(vmi).map((
        p,
      ) => [p.name, { targetDev: p.tap, mac: p.macAddress ?? "0a:58:0a:f4:01:05", mtu: 1450 }]),
    );
  } catch (error) {
    if (error instanceof NetworkSpecError) return {};
    throw error;
  }
}

function containerDiskImages(vmi: Record<string, unknown>): string[] {
  const volumes = (vmi.spec as { volumes?: { containerDisk?: { image?: string } }[] })?.volumes;
  return (volumes ?? []).flatMap((v) => v.containerDisk?.image ? [v.containerDisk.image] : []);
}

Deno.test("KubeVirt's examples through the converter: converted N of M, every refusal names its field", async () => {
  // Each example is first defaulted by KubeVirt's admission, as the cluster would store it.
  const kubevirtDir = await buildKubevirtPeers();
  const cluster = await startCluster({ admission: true });
  const work = await Deno.realPath(await Deno.makeTempDir({ prefix: "virtnode-corpus-" }));
  try {
    const examples = await exampleVmis(join(kubevirtDir, "examples"));
    assert.ok(examples.length >= 30, `only ${examples.length} VMIs in KubeVirt's examples`);
    const imageDir = join(work, "images");
    await Deno.mkdir(imageDir);
    const converted: string[] = [];
    const refused: string[] = [];
    const notAdmitted: string[] = [];
    for (const { source, vmi } of examples) {
      (vmi.metadata as Record<string, unknown>).namespace = "default";
      const admitted = await admit(cluster, vmi);
      if (!admitted.ok) {
        notAdmitted.push(`${source}: ${admitted.error}`);
        continue;
      }
      const defaulted = admitted.object as Record<string, any>;
      for (const image of containerDiskImages(defaulted)) {
        const file = join(imageDir, `${containerDiskFileName(image)}.qcow2`);
        await Deno.stat(file).catch(() => placeholderDisk(file));
      }
      const uid = defaulted.metadata.uid ?? crypto.randomUUID();
      try {
        await convertVmiToDomainXml(defaulted, {
          domainType: "qemu",
          runDir: join(work, "run", uid),
          diskDir: join(work, "disks", uid),
          imageDir,
          ovmfDir: "/usr/share/OVMF",
          interfaces: launcherView(defaulted),
        });
        converted.push(source);
      } catch (error) {
        if (!(error instanceof ConversionError)) throw error;
        refused.push(`${source}: ${error.message}`);
        // A refusal names the field at fault (a spec or metadata path) and says why.
        assert.match(error.message, /"(spec|metadata)\.[^"]+": \S/, error.message);
      }
    }
    const total = examples.length;
    console.log(`  converted ${converted.length} of ${total} (KubeVirt v1.7.0 examples/)`);
    for (const line of refused) console.log(`  refused: ${line}`);
    for (const line of notAdmitted) console.log(`  not admitted by KubeVirt: ${line}`);
    assert.equal(converted.length + refused.length + notAdmitted.length, total);
    // The pod network's bindings convert: what is refused on the network is what the node
    // does not build (SR-IOV, Multus), never a bridge or masquerade interface.
    const network = refused.filter((r) => /"spec\.(networks|domain\.devices\.interfaces)/.test(r));
    for (const line of network) assert.match(line, /SR-IOV|Multus/, line);
    assert.ok(
      converted.some((c) => /vmi-masquerade|vmi-fedora/.test(c)),
      "a masquerade example converts",
    );
  } finally {
    await Deno.remove(work, { recursive: true }).catch(() => {});
    await cluster.stop();
  }
});

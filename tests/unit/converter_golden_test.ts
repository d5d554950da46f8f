import assert from "node:assert/strict";
import { convertVmiToDomainXml } from "../../mod/launcher/testing.ts";
import type { ConvertOptions } from "../../mod/launcher/testing.ts";
import { createWorkspace, FIXTURE_DIR, virtXmlValidate } from "./converter_workspace.ts";

/** Fixtures converted for a KVM host; the others for software emulation. */
const KVM_FIXTURES = new Set(["named-cpu", "efi-hyperv", "cpu-memory"]);

const UPDATE = Deno.env.get("UPDATE_GOLDEN") === "1";

/**
 * XML with layout whitespace removed: `deno fmt` re-wraps the golden files (attributes
 * on continuation lines, `<a />`), which changes nothing libvirt reads.
 */
function canonicalXml(xml: string): string {
  return xml.replace(/\s+/g, " ").replace(/\s*\/>/g, "/>").replace(/>\s+</g, "><").trim();
}

/** Writes a golden file in the layout `deno fmt` keeps, so `deno fmt --check` stays clean. */
async function writeGolden(url: URL, xml: string): Promise<void> {
  await Deno.writeTextFile(url, xml);
  const fmt = await new Deno.Command(Deno.execPath(), {
    args: ["fmt", "--quiet", url.pathname],
    stdout: "null",
    stderr: "inherit",
  }).output();
  assert.ok(fmt.success, `deno fmt ${url.pathname} failed`);
}

const fixtures: string[] = [];
for (const entry of Deno.readDirSync(FIXTURE_DIR)) {
  if (entry.isFile && entry.name.endsWith(".vmi.json")) {
    fixtures.push(entry.name.slice(0, -".vmi.json".length));
  }
}
fixtures.sort();

Deno.test("converter golden fixtures exist", () => {
  assert.ok(fixtures.length >= 6, `only ${fixtures.length} fixtures`);
});

for (const name of fixtures) {
  Deno.test(`convertVmiToDomainXml() turns fixture "${name}" into its golden XML, valid for libvirt`, async () => {
    const workspace = await createWorkspace();
    try {
      const text = await Deno.readTextFile(new URL(`${name}.vmi.json`, FIXTURE_DIR));
      const vmi = JSON.parse(workspace.localize(text));
      // What the launcher found of the pod's interfaces, for fixtures on the pod network.
      const interfaces = await Deno.readTextFile(new URL(`${name}.interfaces.json`, FIXTURE_DIR))
        .then(JSON.parse, () => undefined);
      const options: ConvertOptions = {
        ...workspace.options(vmi.metadata.namespace, vmi.metadata.name, vmi.metadata.uid),
        domainType: KVM_FIXTURES.has(name) ? "kvm" : "qemu",
        interfaces,
      };
      const result = await convertVmiToDomainXml(vmi, options);

      const validation = await virtXmlValidate(result.xml);
      assert.ok(validation.ok, `virt-xml-validate rejected "${name}":\n${validation.output}`);

      for (const file of Object.values(result.volumes)) {
        const info = await Deno.stat(file.path);
        assert.ok(info.isFile, `${file.path} is not a file`);
      }

      const actual = workspace.normalize(result.xml);
      const goldenUrl = new URL(`${name}.xml`, FIXTURE_DIR);
      if (UPDATE) await writeGolden(goldenUrl, actual);
      const golden = await Deno.readTextFile(goldenUrl).catch(() => "");
      assert.equal(
        canonicalXml(actual),
        canonicalXml(golden),
        `output differs from ${name}.xml (UPDATE_GOLDEN=1 rewrites it)`,
      );
    } finally {
      await workspace.dispose();
    }
  });
}

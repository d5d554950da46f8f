import assert from "node:assert/strict";
import { descriptorsCurrent } from "../proto_compile.ts";
import { cmdService, notifyService } from "../../mod/proto/mod.ts";

Deno.test("mod/proto/descriptors.json is what the .proto files compile to ('deno task proto')", async () => {
  assert.equal(await descriptorsCurrent(), true);
});

Deno.test("services built from the precompiled descriptors keep KubeVirt's paths and field names", () => {
  const sync = cmdService().SyncVirtualMachine;
  assert.equal(sync.path, "/kubevirt.cmd.v1.Cmd/SyncVirtualMachine");
  const bytes = sync.requestSerialize({ vmi: { vmiJson: new TextEncoder().encode("{}") } });
  const back = sync.requestDeserialize(bytes) as { vmi: { vmiJson: Uint8Array } };
  assert.equal(new TextDecoder().decode(back.vmi.vmiJson), "{}");
  const notify = notifyService().HandleDomainEvent;
  const json = new TextEncoder().encode("{}");
  const event = notify.requestDeserialize(
    notify.requestSerialize({ domainJSON: json, statusJSON: json, eventType: "ADDED" }),
  ) as Record<string, Uint8Array | string>;
  assert.equal(
    new TextDecoder().decode(event.domainJSON as Uint8Array),
    "{}",
    "keepCase: KubeVirt's field names",
  );
  assert.equal(event.eventType, "ADDED");
});

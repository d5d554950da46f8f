/**
 * The phase of a VMI whose domain was destroyed, computed from the VMI and the domain as
 * KubeVirt's launcher reports it (its domain JSON): KubeVirt's `isACPIEnabled` and the
 * phase rule beside it (`pkg/virt-handler/vm.go`), whoever destroyed the domain.
 */
import assert from "node:assert/strict";
import type { MigrationState, VirtualMachineInstance } from "../../mod/api/mod.ts";
import { decodeDomainJson } from "../../mod/domain/mod.ts";
import { computeStatus, phaseChangeEvent } from "../../mod/handler/testing.ts";

type Grace = "unset" | 0 | 30;
type Features = "none" | "empty" | "acpi";
type MetadataGrace = "none" | 0 | 30;

function runningVmi(grace: Grace, migrationState?: MigrationState): VirtualMachineInstance {
  return {
    metadata: { name: "vm1", namespace: "default", uid: "u1" },
    spec: {
      ...(grace === "unset" ? {} : { terminationGracePeriodSeconds: grace }),
      domain: { devices: {} },
    },
    status: { phase: "Running", ...(migrationState ? { migrationState } : {}) },
  } as VirtualMachineInstance;
}

/** A Shutoff (Destroyed) domain as KubeVirt's launcher sends it. */
function destroyedDomainJson(features: Features, metadataGrace: MetadataGrace): string {
  return JSON.stringify({
    kind: "Domain",
    apiVersion: "kubevirt.io/v1",
    ObjectMeta: { name: "vm1", namespace: "default", uid: "u1" },
    Spec: {
      Name: "default_vm1",
      // No <features>, <features> without ACPI, or with ACPI (KubeVirt's API defaults
      // spec.domain.features.acpi to on, so its launcher's domains have it unless turned off).
      Features: features === "none" ? null : features === "empty" ? {} : { ACPI: {} },
      Metadata: {
        KubeVirt: {
          UID: "u1",
          ...(metadataGrace === "none"
            ? {}
            : { GracePeriod: { DeletionGracePeriodSeconds: metadataGrace } }),
        },
      },
      OS: { Type: { Machine: "" } },
      Devices: {},
    },
    Status: { Status: "Shutoff", Reason: "Destroyed" },
  });
}

function phaseAfterDestroy(vmi: VirtualMachineInstance, domainJson: string) {
  return computeStatus(vmi, {
    domain: decodeDomainJson(domainJson),
    launcher: "responsive",
    nodeName: "node1",
    now: "2026-11-29T10:00:00Z",
  });
}

Deno.test("computeStatus() of a destroyed domain gives virt-handler's phase for every grace and ACPI mix", () => {
  // Rows cover each VMI grace period, domain features and the grace period in its metadata.
  // Failed exactly where the domain has ACPI and the VMI's grace period is not 0; the
  // domain's metadata grace period never changes the answer.
  const rows: [Grace, Features, MetadataGrace, "Failed" | "Succeeded"][] = [
    ["unset", "none", "none", "Succeeded"],
    ["unset", "none", 0, "Succeeded"],
    ["unset", "none", 30, "Succeeded"],
    ["unset", "empty", "none", "Succeeded"],
    ["unset", "empty", 0, "Succeeded"],
    ["unset", "empty", 30, "Succeeded"],
    ["unset", "acpi", "none", "Failed"],
    ["unset", "acpi", 0, "Failed"],
    ["unset", "acpi", 30, "Failed"],
    [0, "none", "none", "Succeeded"],
    [0, "none", 0, "Succeeded"],
    [0, "none", 30, "Succeeded"],
    [0, "empty", "none", "Succeeded"],
    [0, "empty", 0, "Succeeded"],
    [0, "empty", 30, "Succeeded"],
    [0, "acpi", "none", "Succeeded"],
    [0, "acpi", 0, "Succeeded"],
    [0, "acpi", 30, "Succeeded"],
    [30, "none", "none", "Succeeded"],
    [30, "none", 0, "Succeeded"],
    [30, "none", 30, "Succeeded"],
    [30, "empty", "none", "Succeeded"],
    [30, "empty", 0, "Succeeded"],
    [30, "empty", 30, "Succeeded"],
    [30, "acpi", "none", "Failed"],
    [30, "acpi", 0, "Failed"],
    [30, "acpi", 30, "Failed"],
  ];
  for (const [grace, features, metadataGrace, phase] of rows) {
    const r = phaseAfterDestroy(runningVmi(grace), destroyedDomainJson(features, metadataGrace));
    const row = `grace=${grace} features=${features} metadata grace=${metadataGrace}`;
    assert.equal(r.status.phase, phase, row);
    assert.deepEqual(r.phaseChange, { from: "Running", to: phase }, row);
  }
});

Deno.test("computeStatus() of a destroyed domain without ACPI is Failed after a failed post-copy migration only", () => {
  const rows: [MigrationState | undefined, "Failed" | "Succeeded"][] = [
    [undefined, "Succeeded"],
    [{ failed: true, mode: "PostCopy" }, "Failed"],
    [{ failed: true, mode: "PreCopy" }, "Succeeded"],
    [{ failed: false, mode: "PostCopy" }, "Succeeded"],
    [{ completed: true, mode: "PostCopy" }, "Succeeded"],
  ];
  for (const [migrationState, phase] of rows) {
    const r = phaseAfterDestroy(runningVmi(0, migrationState), destroyedDomainJson("none", 0));
    assert.equal(r.status.phase, phase, JSON.stringify(migrationState));
  }
});

Deno.test("a guest with ACPI and a grace period destroyed from outside gets virt-handler's Warning", () => {
  // To virt-handler that is a crash, not a shutdown.
  const r = phaseAfterDestroy(runningVmi(30), destroyedDomainJson("acpi", 30));
  assert.deepEqual(phaseChangeEvent(r.phaseChange!), {
    type: "Warning",
    reason: "Stopped",
    message: "The VirtualMachineInstance crashed.",
  });
});

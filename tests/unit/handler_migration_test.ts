import assert from "node:assert/strict";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { type Domain, LifeCycle, newDomain, StateChangeReason } from "../../mod/domain/mod.ts";
import {
  domainActiveOnTarget,
  domainMigrated,
  isMigrating,
  isMigrationDone,
  isMigrationInProgress,
  isMigrationSource,
  isMigrationTarget,
  migrationNeedsFinalization,
  migrationOptions,
  notMigratable,
  omitEmptyMigrationState,
} from "../../mod/handler/testing.ts";

function vmi(
  status: VirtualMachineInstance["status"] = {},
  extra: Partial<VirtualMachineInstance> = {},
) {
  return {
    metadata: { name: "vm", namespace: "ns", uid: "u1", ...(extra.metadata ?? {}) },
    spec: { domain: { devices: {} }, ...(extra.spec ?? {}) },
    status,
  } as VirtualMachineInstance;
}

function domain(status: LifeCycle, reason: StateChangeReason, migration?: object): Domain {
  const d = newDomain({ namespace: "ns", name: "vm", uid: "u1" }, { status, reason });
  if (migration) d.spec.metadata.kubevirt.migration = migration as never;
  return d;
}

Deno.test("isMigrationInProgress() follows KubeVirt's rule over the VMI, the domain and a migration pause", () => {
  // In progress: started and not ended in the VMI or the domain, or paused by the migration.
  const rows: [string, VirtualMachineInstance | undefined, Domain | undefined, boolean][] = [
    ["no migration", vmi(), domain(LifeCycle.Running, StateChangeReason.Unknown), false],
    ["VMI says started", vmi({ migrationState: { startTimestamp: "t" } }), undefined, true],
    [
      "VMI says ended",
      vmi({ migrationState: { startTimestamp: "t", endTimestamp: "t2" } }),
      undefined,
      false,
    ],
    [
      "domain metadata says started",
      vmi(),
      domain(LifeCycle.Running, StateChangeReason.Unknown, { uid: "m", startTimestamp: "t" }),
      true,
    ],
    [
      "domain metadata says ended",
      vmi(),
      domain(LifeCycle.Running, StateChangeReason.Unknown, {
        uid: "m",
        startTimestamp: "t",
        endTimestamp: "t2",
      }),
      false,
    ],
    [
      "paused by migration",
      vmi(),
      domain(LifeCycle.Paused, StateChangeReason.PausedMigration),
      true,
    ],
    [
      "paused starting up",
      vmi(),
      domain(LifeCycle.Paused, StateChangeReason.PausedStartingUp),
      true,
    ],
    ["paused post-copy", vmi(), domain(LifeCycle.Paused, StateChangeReason.PausedPostcopy), true],
    ["paused by the user", vmi(), domain(LifeCycle.Paused, StateChangeReason.PausedUser), false],
  ];
  for (const [row, v, d, want] of rows) assert.equal(isMigrationInProgress(v, d), want, row);
});

Deno.test("the migration state predicates: migrating, done, needing finalization, source and target of a node", () => {
  assert.equal(isMigrating(vmi({ migrationState: { startTimestamp: "t" } })), true);
  assert.equal(
    isMigrating(vmi({ migrationState: { startTimestamp: "t", endTimestamp: "e" } })),
    false,
  );
  assert.equal(isMigrationDone(undefined), true);
  assert.equal(
    isMigrationDone({ endTimestamp: "e" }),
    false,
    "ended, neither completed nor failed",
  );
  assert.equal(isMigrationDone({ endTimestamp: "e", failed: true }), true);
  assert.equal(isMigrationDone({ endTimestamp: "e", completed: true }), true);
  assert.equal(migrationNeedsFinalization({ startTimestamp: "s", endTimestamp: "e" }), true);
  assert.equal(
    migrationNeedsFinalization({ startTimestamp: "s", endTimestamp: "e", completed: true }),
    false,
  );
  assert.equal(migrationNeedsFinalization({ endTimestamp: "e" }), false);
  const source = vmi({ nodeName: "a", migrationState: { sourceNode: "a", targetNode: "b" } });
  assert.equal(isMigrationSource(source, "a"), true);
  assert.equal(isMigrationSource(source, "b"), false);
  assert.equal(
    isMigrationSource(vmi({ nodeName: "b", migrationState: { sourceNode: "a" } }), "a"),
    false,
    "taken over by the target",
  );
  const target = vmi({}, {
    metadata: { name: "vm", labels: { "kubevirt.io/migrationTargetNodeName": "b" } },
  });
  assert.equal(isMigrationTarget(target, "b"), true);
  assert.equal(isMigrationTarget(target, "a"), false);
});

Deno.test("domainMigrated() and domainActiveOnTarget() read the domain's state as KubeVirt's handler", () => {
  assert.equal(domainMigrated(domain(LifeCycle.Shutoff, StateChangeReason.Migrated)), true);
  assert.equal(domainMigrated(domain(LifeCycle.Shutoff, StateChangeReason.Destroyed)), false);
  assert.equal(domainMigrated(undefined), false);
  assert.equal(domainActiveOnTarget(domain(LifeCycle.Running, StateChangeReason.Unknown)), true);
  assert.equal(domainActiveOnTarget(domain(LifeCycle.Paused, StateChangeReason.PausedUser)), true);
  assert.equal(
    domainActiveOnTarget(domain(LifeCycle.Paused, StateChangeReason.PausedMigration)),
    false,
  );
  assert.equal(domainActiveOnTarget(undefined), false);
});

Deno.test("migrationOptions() builds KubeVirt's MigrationOptions from the configuration and defaults", () => {
  // The parallel connections rule is applied as KubeVirt applies it.
  assert.deepEqual(migrationOptions(vmi()), {
    Bandwidth: "0Mi",
    ProgressTimeout: 150,
    CompletionTimeoutPerGiB: 150,
    UnsafeMigration: false,
    AllowAutoConverge: false,
    AllowPostCopy: false,
    AllowWorkloadDisruption: false,
    ParallelMigrationThreads: 8,
  });
  const configured = migrationOptions(vmi({
    migrationState: {
      migrationConfiguration: {
        bandwidthPerMigration: "64Mi",
        progressTimeout: 30,
        allowPostCopy: true,
        allowAutoConverge: true,
      },
    },
  }));
  assert.equal(configured.Bandwidth, "64Mi");
  assert.equal(configured.ProgressTimeout, 30);
  assert.equal(configured.AllowPostCopy, true);
  assert.equal(configured.AllowWorkloadDisruption, true, "unset: follows post-copy");
  assert.equal(configured.ParallelMigrationThreads, undefined, "none with post-copy");
  const limited = migrationOptions(vmi({}, {
    spec: { domain: { devices: {}, resources: { limits: { cpu: "2" } } } },
  } as Partial<VirtualMachineInstance>));
  assert.equal(limited.ParallelMigrationThreads, undefined, "none with a CPU limit");
});

Deno.test("notMigratable() gives admission's refusal for LiveMigratable=False, nothing for True or no condition", () => {
  assert.equal(notMigratable(vmi({})), undefined);
  assert.equal(
    notMigratable(vmi({ conditions: [{ type: "LiveMigratable", status: "True" }] })),
    undefined,
  );
  assert.equal(
    notMigratable(vmi({
      conditions: [
        { type: "Ready", status: "False" },
        {
          type: "LiveMigratable",
          status: "False",
          reason: "InterfaceNotLiveMigratable",
          message: "cannot migrate VMI which does not use masquerade",
        },
      ],
    })),
    "Cannot migrate VMI, Reason: InterfaceNotLiveMigratable, " +
      "Message: cannot migrate VMI which does not use masquerade",
  );
});

Deno.test("omitEmptyMigrationState(): the migration state as KubeVirt's Go types write it", () => {
  const v = {
    metadata: { name: "vm", namespace: "ns", uid: "u1" },
    spec: { domain: { devices: {} } },
    status: {
      migrationState: {
        completed: true,
        failed: false,
        abortRequested: false,
        failureReason: "",
        mode: "PreCopy",
        targetDirectMigrationNodePorts: { "34909": 0, "38625": 49152 },
        targetCPUSet: [],
        migrationConfiguration: { allowPostCopy: false, progressTimeout: 150 },
        targetState: {
          domainDetected: false,
          nodeAddress: "10.0.0.2",
          directMigrationNodePorts: {},
        },
        sourceState: { node: "", pod: "p" },
      },
    },
  } as unknown as VirtualMachineInstance;
  omitEmptyMigrationState(v);
  assert.deepEqual(v.status?.migrationState, {
    completed: true,
    mode: "PreCopy",
    // A map's own zero entries stay: only the map as a whole is left out when empty.
    targetDirectMigrationNodePorts: { "34909": 0, "38625": 49152 },
    // Pointers in Go: a false there is written.
    migrationConfiguration: { allowPostCopy: false, progressTimeout: 150 },
    targetState: { nodeAddress: "10.0.0.2" },
    sourceState: { pod: "p" },
  });
});

/**
 * The handler with the RBAC of `deploy/` and nothing more: `deploy/rbac.yaml` is applied
 * to the test apiserver (which authorizes with RBAC and runs KubeVirt's admission), a
 * token of the ServiceAccount it binds — KubeVirt's own kubevirt-handler, bound to the
 * handler's Node as a pod's token is, for KubeVirt's NodeRestriction — is requested with
 * the TokenRequest API, and a real pod-less handler runs with a kubeconfig that holds
 * only that token. Every other
 * test authenticates as `system:masters`, which would hide a missing rule.
 *
 * The negative cases run the same handler with a copy of the ClusterRole that lacks one
 * verb, and show that the handler then reports the 403: the positive case cannot pass
 * because authorization is not checked.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { load, loadAll } from "js-yaml";
import { type Cluster, useCluster } from "../../deploy/cluster/cluster.ts";
import type { KubeClient, KubeObject } from "../../mod/kube/mod.ts";
import {
  createVmi,
  deleteVmi,
  eventsFor,
  getVmi,
  type HandlerProcess,
  killLaunchers,
  kubeClient,
  startHandlerProcess,
  testVmi,
  waitFor,
  waitForPhase,
} from "../helpers/handler_process.ts";

const DEPLOY = new URL("../../deploy/", import.meta.url).pathname;
const TEST_URI = "test:///default";
const NAMESPACE = "kubevirt";
const ACCOUNT = "kubevirt-handler";

/**
 * Every kind of request `virtnode handler` makes (both modes, node services included),
 * as "verb group/resource". KubeVirt's virt-handler role also has VMI update and patch,
 * migrations, pods, node list/watch and events update: virtnode does none of those.
 */
const HANDLER_CALLS = [
  "create /events", // the event recorder
  "delete kubevirt.io/virtualmachineinstancemigrations", // pod-less: a gone VMI's migration
  "get /nodes", // the labeller reads its node; pod-less migrations, their target
  "get /persistentvolumeclaims", // pod-less hotplug finds its claim
  "get /persistentvolumes", // ... and the volume bound to it
  "get kubevirt.io/virtualmachineinstancemigrations", // the status writer re-reads after a 409
  "get kubevirt.io/virtualmachineinstances", // the status writer re-reads after a 409
  "list /nodes", // pod-less migrations: nodes that take VMIs
  "list kubevirt.io/kubevirts", // pod-less migrations: the KubeVirt CR's configuration
  "list kubevirt.io/virtualmachineinstancemigrations", // pod-less: the migration informer
  "list kubevirt.io/virtualmachineinstances", // the VMI informers (the node's, its targets')
  "patch /events", // the recorder's aggregation of repeats
  "patch /nodes", // heartbeat and labeller
  "update kubevirt.io/virtualmachineinstancemigrations", // pod-less: a migration's finalizer
  "update kubevirt.io/virtualmachineinstancemigrations/status", // pod-less: its phase
  "update kubevirt.io/virtualmachineinstances", // the status writer's PUT of the whole VMI
  "watch kubevirt.io/virtualmachineinstancemigrations", // pod-less: the migration informer
  "watch kubevirt.io/virtualmachineinstances", // the VMI informers
];

interface Rule {
  apiGroups: string[];
  resources: string[];
  verbs: string[];
}

interface RbacObject extends KubeObject {
  rules?: Rule[];
  roleRef?: { apiGroup: string; kind: string; name: string };
  subjects?: { kind: string; name: string; namespace: string }[];
}

/** Rules as sorted "verb group/resource" strings, one per permission. */
function permissions(rules: Rule[]): string[] {
  return rules.flatMap((r) =>
    r.apiGroups.flatMap((g) => r.resources.flatMap((res) => r.verbs.map((v) => `${v} ${g}/${res}`)))
  ).sort();
}

/** What the credentials of `kubeconfig` may do in namespace "default" (SelfSubjectRulesReview). */
async function grantedTo(kubeconfig: string): Promise<string[]> {
  const client = await kubeClient(kubeconfig);
  try {
    const review = await client.request<{ status: { resourceRules: Rule[] } }>(
      "POST",
      "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
      {
        apiVersion: "authorization.k8s.io/v1",
        kind: "SelfSubjectRulesReview",
        spec: { namespace: "default" },
      },
    );
    return permissions(review.status.resourceRules);
  } finally {
    client.close();
  }
}

function suffix(): string {
  return crypto.randomUUID().slice(0, 8);
}

async function kubectl(cluster: Cluster, args: string[], stdin?: string): Promise<string> {
  const child = new Deno.Command("kubectl", {
    args: ["--kubeconfig", cluster.kubeconfigPath, ...args],
    stdin: stdin === undefined ? "null" : "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  if (stdin !== undefined) {
    const writer = child.stdin.getWriter();
    await writer.write(new TextEncoder().encode(stdin));
    await writer.close();
  }
  const out = await child.output();
  const dec = new TextDecoder();
  if (!out.success) {
    throw new Error(`Cannot run "kubectl ${args.join(" ")}": ${dec.decode(out.stderr).trim()}`);
  }
  return dec.decode(out.stdout);
}

/** The objects of `deploy/rbac.yaml`, as written. */
function rbacObjects(): RbacObject[] {
  return loadAll(Deno.readTextFileSync(join(DEPLOY, "rbac.yaml"))) as RbacObject[];
}

/** The single object of `kind` among `objects`. */
function only(objects: RbacObject[], kind: string): RbacObject {
  const found = objects.filter((o) => o.kind === kind);
  assert.equal(found.length, 1, `one ${kind} in deploy/rbac.yaml`);
  return found[0];
}

/**
 * A copy of deploy/rbac.yaml's objects, renamed to `name`, whose ClusterRole lacks
 * `verb` on `resource` (the rule goes when it has no verb left).
 */
function narrowed(name: string, resource: string, verb: string): RbacObject[] {
  const copy = structuredClone(rbacObjects());
  for (const object of copy) object.metadata!.name = name;
  const role = only(copy, "ClusterRole");
  let removed = false;
  role.rules = role.rules!.flatMap((rule) => {
    if (!rule.resources.includes(resource) || !rule.verbs.includes(verb)) return [rule];
    removed = true;
    const verbs = rule.verbs.filter((v) => v !== verb);
    return verbs.length > 0 ? [{ ...rule, verbs }] : [];
  });
  assert.ok(removed, `deploy/rbac.yaml grants ${verb} on ${resource}`);
  only(copy, "ClusterRoleBinding").roleRef!.name = name;
  only(copy, "ClusterRoleBinding").subjects![0].name = name;
  return copy;
}

/**
 * A kubeconfig for the cluster that authenticates with a fresh token of the
 * ServiceAccount `namespace/name` (TokenRequest: no controller needed) and nothing else.
 */
async function serviceAccountKubeconfig(
  cluster: Cluster,
  account: { namespace: string; name: string },
  path: string,
  node: string,
): Promise<string> {
  // Bound to the Node, as a pod's token carries its node: KubeVirt's NodeRestriction
  // admits kubevirt-handler's VMI writes only for VMIs on that node.
  const token = (await kubectl(cluster, [
    "create",
    "token",
    account.name,
    "-n",
    account.namespace,
    "--duration=1h",
    "--bound-object-kind=Node",
    `--bound-object-name=${node}`,
  ])).trim();
  const admin = load(await Deno.readTextFile(cluster.kubeconfigPath)) as {
    clusters: { cluster: Record<string, string> }[];
  };
  const caData = admin.clusters[0].cluster["certificate-authority-data"];
  await Deno.writeTextFile(
    path,
    [
      "apiVersion: v1",
      "kind: Config",
      "clusters:",
      "  - name: test",
      "    cluster:",
      `      server: ${cluster.server}`,
      `      certificate-authority-data: ${caData}`,
      "users:",
      `  - name: ${account.name}`,
      "    user:",
      `      token: ${token}`,
      "contexts:",
      "  - name: test",
      "    context:",
      "      cluster: test",
      `      user: ${account.name}`,
      "current-context: test",
      "",
    ].join("\n"),
    { mode: 0o600 },
  );
  return path;
}

/** A Node for the heartbeat to patch (no kubelet registers one here). */
async function createNode(client: KubeClient, name: string): Promise<void> {
  await client.request("POST", "/api/v1/nodes", {
    apiVersion: "v1",
    kind: "Node",
    metadata: { name },
  });
}

async function getNode(client: KubeClient, name: string): Promise<KubeObject> {
  return await client.request<KubeObject>("GET", `/api/v1/nodes/${name}`);
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.lstat(path);
    return true;
  } catch {
    return false;
  }
}

/** The handler's log lines that report an authorization failure. */
async function forbiddenLines(h: HandlerProcess): Promise<string[]> {
  return (await Deno.readTextFile(h.logFile)).split("\n").filter((l) => /forbidden/i.test(l));
}

interface Context {
  cluster: Cluster;
  admin: KubeClient;
  /** virt-controller's identity, which places VMIs on nodes (KubeVirt's admission). */
  controller: KubeClient;
  node: string;
  kubeconfig: string;
  dir: string;
}

/**
 * A cluster with deploy/rbac.yaml and `extra` applied, a Node,
 * and a kubeconfig holding only a token of ServiceAccount `account` in "virtnode".
 */
async function withServiceAccount(
  account: string,
  extra: RbacObject[],
  fn: (ctx: Context) => Promise<void>,
): Promise<void> {
  const cluster = await useCluster();
  const admin = await kubeClient(cluster.kubeconfigPath);
  const controller = await kubeClient(cluster.handlerKubeconfigPath);
  const dir = await Deno.makeTempDir({ prefix: "virtnode-rbac-" });
  const node = `rbac-${suffix()}`;
  try {
    // Applied as written, so a manifest the apiserver rejects fails here. Nothing is
    // deleted afterwards: without a namespace controller a deleted namespace stays
    // Terminating and refuses new objects, and a re-apply is idempotent.
    await kubectl(cluster, ["apply", "-f", join(DEPLOY, "rbac.yaml")]);
    if (extra.length > 0) {
      await kubectl(
        cluster,
        ["apply", "-f", "-"],
        JSON.stringify({ apiVersion: "v1", kind: "List", items: extra }),
      );
    }
    await createNode(admin, node);
    const kubeconfig = await serviceAccountKubeconfig(
      cluster,
      { namespace: NAMESPACE, name: account },
      join(dir, "kubeconfig"),
      node,
    );
    await fn({ cluster, admin, controller, node, kubeconfig, dir });
  } finally {
    await admin.request("DELETE", `/api/v1/nodes/${node}`).catch(() => {});
    admin.close();
    controller.close();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    await cluster.stop();
  }
}

/** Runs a pod-less handler with `kubeconfig` for `fn`; ends it and its launchers after. */
async function withHandler(
  ctx: Context,
  options: { noWait?: boolean },
  fn: (h: HandlerProcess) => Promise<void>,
): Promise<void> {
  const h = await startHandlerProcess({
    kubeconfig: ctx.kubeconfig,
    nodeName: ctx.node,
    libvirtUri: TEST_URI,
    noWait: options.noWait,
  });
  try {
    await fn(h);
  } catch (error) {
    const log = await Deno.readTextFile(h.logFile);
    console.error(`handler log:\n${log.slice(-6000)}`);
    // The handler's warnings go with the failure into the run's summary.
    const warnings = log.split("\n").filter((l) => /"level":"(warning|error)"/.test(l));
    throw new Error(
      `${error instanceof Error ? error.message : error}\n` +
        `the handler's last warnings and errors:\n${warnings.slice(-12).join("\n")}`,
      { cause: error },
    );
  } finally {
    await h.kill("SIGTERM");
    killLaunchers(h.stateDir);
    // Its own temporary directory: launcher socket paths must stay within 108 bytes.
    await Deno.remove(h.dir, { recursive: true }).catch(() => {});
  }
}

Deno.test("rbac: the ServiceAccount of deploy/rbac.yaml may do exactly what the handler calls, no more", async () => {
  await withServiceAccount(ACCOUNT, [], async (ctx) => {
    // What the apiserver says the token may do, less what any ServiceAccount may do
    // (the default roles every authenticated user has): a ServiceAccount of no binding.
    const baseline = "virtnode-rbac-baseline";
    await kubectl(
      ctx.cluster,
      ["apply", "-f", "-"],
      JSON.stringify({
        apiVersion: "v1",
        kind: "ServiceAccount",
        metadata: { name: baseline, namespace: NAMESPACE },
      }),
    );
    const everyone = new Set(
      await grantedTo(
        await serviceAccountKubeconfig(
          ctx.cluster,
          { namespace: NAMESPACE, name: baseline },
          join(ctx.dir, "baseline"),
          ctx.node,
        ),
      ),
    );
    const granted = (await grantedTo(ctx.kubeconfig)).filter((p) => !everyone.has(p));
    assert.deepEqual(
      granted,
      permissions(only(rbacObjects(), "ClusterRole").rules!),
      "the token may do exactly what deploy/rbac.yaml grants",
    );
    assert.deepEqual(granted, HANDLER_CALLS, "deploy/rbac.yaml grants what the handler calls");
  });
});

Deno.test("rbac: a handler with only deploy/rbac.yaml's token runs a VMI to Running, deletes it and beats its Node, with no 403", async () => {
  await withServiceAccount(ACCOUNT, [], async (ctx) => {
    const { admin, controller, node } = ctx;
    let stopped: Deno.CommandStatus | undefined;
    await withHandler(ctx, {}, async (h) => {
      const name = `vm-${suffix()}`;
      // virt-controller places the VMI; the handler's own token cannot (KubeVirt's
      // admission keeps kubevirt.io/nodeName to KubeVirt's service accounts).
      const created = await createVmi(controller, testVmi(name, node, { placed: true }));
      const uid = created.metadata.uid!;
      const running = await waitForPhase(admin, "default", name, "Running");
      assert.equal(running.status!.nodeName, node);
      const hosted = `${h.stateDir}/launcher-host/vms/${uid}.json`;
      assert.ok(await exists(hosted), "the launcher host serves the VMI");
      await waitFor("Created and Started events", async () => {
        const reasons = (await eventsFor(admin, "default", name)).map((e) => e.reason);
        return reasons.includes("Created") && reasons.includes("Started");
      });

      // A VMI the converter rejects fails its sync again and again: the status writer
      // sets Synchronized=False, and the recorder aggregates the repeated SyncFailed
      // warning into one Event (events patch).
      const bad = `vm-bad-${suffix()}`;
      await createVmi(controller, testVmi(bad, node, { placed: true, extra: { tpm: {} } }));
      await waitFor("Synchronized=False on the invalid VMI", async () => {
        const v = await getVmi(admin, "default", bad);
        return v?.status?.conditions?.some((c) =>
          c.type === "Synchronized" && c.status === "False"
        );
      });
      await waitFor("a SyncFailed warning counted twice", async () => {
        const ev = (await eventsFor(admin, "default", bad)).find((e) => e.reason === "SyncFailed");
        return (ev?.count ?? 0) >= 2;
      });
      await deleteVmi(admin, "default", bad);

      await waitFor("the heartbeat to mark the node schedulable", async () => {
        const meta = (await getNode(admin, node)).metadata!;
        return meta.labels?.["kubevirt.io/schedulable"] === "true" &&
          meta.annotations?.["kubevirt.io/heartbeat"] !== undefined;
      });

      await deleteVmi(admin, "default", name);
      await waitFor("the launcher to end", async () => !(await exists(hosted)), 30_000);
      await waitFor(
        "the ghost record to be removed",
        async () => !(await exists(`${h.stateDir}/ghost-records/${uid}`)),
      );
      await waitFor("a Deleted event", async () => {
        return (await eventsFor(admin, "default", name)).some((e) => e.reason === "Deleted");
      });
      await waitFor(
        "the VMI to be gone (the handler released virt-api's finalizer)",
        async () => (await getVmi(admin, "default", name)) === undefined ? true : undefined,
      );

      stopped = await h.kill("SIGTERM");
      assert.deepEqual(await forbiddenLines(h), [], "no request was forbidden");
    });
    assert.equal(stopped?.code, 0, "the handler stopped cleanly");
    const labels = (await getNode(admin, node)).metadata!.labels!;
    assert.equal(labels["kubevirt.io/schedulable"], "false", "unschedulable on the way out");
  });
});

/** One verb taken away, and what the handler must then report. */
interface NarrowCase {
  resource: string;
  verb: string;
  /** The apiserver's denial, as it appears in the handler's log. */
  denial: RegExp;
  /** Whether the handler can still get ready without the verb. */
  ready: boolean;
  /** What must (not) have happened to a VMI of the node meanwhile. */
  check?: (ctx: Context, vmiName: string) => Promise<void>;
}

const NARROW_CASES: NarrowCase[] = [
  {
    resource: "virtualmachineinstances",
    verb: "update",
    denial: /cannot update resource \\"virtualmachineinstances\\" in API group \\"kubevirt\.io\\"/,
    ready: true,
    check: async (ctx, name) => {
      const vmi = await getVmi(ctx.admin, "default", name);
      assert.equal(vmi?.status?.phase, "Pending", "no status could be written (virt-api's)");
    },
  },
  {
    resource: "nodes",
    verb: "patch",
    denial: /Heartbeat failed.*cannot patch resource \\"nodes\\"/,
    ready: true,
  },
  {
    resource: "virtualmachineinstances",
    verb: "watch",
    denial: /cannot watch resource \\"virtualmachineinstances\\" in API group \\"kubevirt\.io\\"/,
    ready: true,
  },
];

for (const c of NARROW_CASES) {
  Deno.test(`rbac: without ${c.verb} on ${c.resource} the handler reports the 403`, async () => {
    const name = `virtnode-handler-no-${c.verb}-${c.resource.replace("/", "-")}`;
    await withServiceAccount(name, narrowed(name, c.resource, c.verb), async (ctx) => {
      await withHandler(ctx, { noWait: !c.ready }, async (h) => {
        const vmi = `vm-${suffix()}`;
        await createVmi(ctx.controller, testVmi(vmi, ctx.node, { placed: true }));
        const lines = await waitFor(`a 403 for ${c.verb} ${c.resource} in the log`, async () => {
          const found = (await forbiddenLines(h)).filter((l) => c.denial.test(l));
          return found.length > 0 ? found : undefined;
        });
        assert.match(lines[0], /403/);
        await c.check?.(ctx, vmi);
        const ready = await fetch(`${h.health}/readyz`).catch(() => undefined);
        await ready?.body?.cancel();
        assert.equal(ready?.status === 200, c.ready, "readiness");
        await deleteVmi(ctx.admin, "default", vmi);
      });
    });
  });
}

/**
 * The handler with the RBAC of `deploy/` and nothing more, in each mode: `deploy/rbac.yaml`
 * (KubeVirt mode) and with it `deploy/podless-node.yaml` (pod-less nodes) are applied to the
 * test apiserver (which authorizes with RBAC and runs KubeVirt's admission), a token of the
 * ServiceAccount they bind — KubeVirt's own kubevirt-handler, bound to the handler's Node,
 * as a pod-less node's is (`deploy/podless_node.ts`) and, for KubeVirt's NodeRestriction,
 * as a pod's token carries its node — is requested with the TokenRequest API, and a real
 * handler runs with a kubeconfig that holds only that token. Every other test
 * authenticates as `system:masters`, which would hide a missing rule.
 *
 * The pod-less handler runs under the admission policy of `deploy/podless-node.yaml`, so a
 * write of its that the policy does not foresee shows as a 403 here too. KubeVirt mode runs
 * on a control plane of its own, where only `deploy/rbac.yaml` is applied: the pod-less
 * role binds the same ServiceAccount, and a shared control plane may hold it already.
 *
 * The negative cases run the same handler with a copy of the roles that lacks one verb,
 * and show that the handler then reports the 403: the positive case cannot pass because
 * authorization is not checked.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { loadAll } from "js-yaml";
import {
  type Cluster,
  serviceAccountKubeconfig,
  startCluster,
  useCluster,
} from "../../deploy/cluster/cluster.ts";
import { podlessNodeKubeconfig } from "../../deploy/podless_node.ts";
import type { KubeClient, KubeObject } from "../../mod/kube/mod.ts";
import type { VirtualMachine } from "../../mod/api/mod.ts";
import {
  createVmi,
  deleteVmi,
  eventsFor,
  getVmi,
  type HandlerProcess,
  killLaunchers,
  kubeClient,
  releaseVmi,
  scheduleToPod,
  startHandlerProcess,
  testVmi,
  waitFor,
  waitForPhase,
} from "../helpers/handler_process.ts";

const DEPLOY = new URL("../../deploy/", import.meta.url).pathname;
const MAIN = new URL("../../main.ts", import.meta.url).pathname;
const TEST_URI = "test:///default";
const NAMESPACE = "kubevirt";
const ACCOUNT = "kubevirt-handler";

/**
 * Every kind of request `virtnode handler` makes in KubeVirt mode (node services
 * included), as "verb group/resource". KubeVirt's virt-handler role also has VMI patch,
 * migrations, pods, node list/watch and events update: virtnode does none of those.
 */
const KUBEVIRT_MODE_CALLS = [
  "create /events", // the event recorder
  "get /nodes", // the labeller reads its node; pod-less migrations, their target
  "get kubevirt.io/virtualmachineinstances", // the status writer re-reads after a 409
  "list kubevirt.io/kubevirts", // /healthz's config-resource-version; pod-less migrations
  "list kubevirt.io/virtualmachineinstances", // the VMI informers (the node's, its targets')
  "patch /events", // the recorder's aggregation of repeats
  "patch /nodes", // heartbeat and labeller
  "update kubevirt.io/virtualmachineinstances", // the status writer's PUT of the whole VMI
  "watch kubevirt.io/kubevirts", // the KubeVirt CR's watch (/healthz)
  "watch kubevirt.io/virtualmachineinstances", // the VMI informers
];

/** What pod-less mode calls besides: it stands in for virt-controller and the kubelet. */
const PODLESS_ONLY_CALLS = [
  "create kubevirt.io/virtualmachineinstances", // a VM's VMI (the VM controller)
  "delete kubevirt.io/virtualmachineinstancemigrations", // a gone VMI's migration
  "delete kubevirt.io/virtualmachineinstances", // a VM's stop
  "get kubevirt.io/virtualmachines", // the VM status writer re-reads after a 409
  "list kubevirt.io/virtualmachines", // the VM informer
  "update kubevirt.io/virtualmachines", // the VM controller's finalizer
  "update kubevirt.io/virtualmachines/status", // the VM's status
  "watch kubevirt.io/virtualmachines", // the VM informer
  "get /persistentvolumeclaims", // hotplug finds its claim; a memory dump's annotation
  "patch /persistentvolumeclaims", // ... which the VM controller sets (virtctl memory-dump)
  "patch kubevirt.io/virtualmachineinstances", // a memory dump volume into and out of a VMI
  "get /persistentvolumes", // ... and the volume bound to it
  "get k8s.cni.cncf.io/network-attachment-definitions", // a secondary network's CNI config
  "get kubevirt.io/virtualmachineinstancemigrations", // the status writer re-reads after a 409
  "list /nodes", // migrations: nodes that take VMIs
  "list kubevirt.io/virtualmachineinstancemigrations", // the migration informer
  "update kubevirt.io/virtualmachineinstancemigrations", // a migration's finalizer
  "update kubevirt.io/virtualmachineinstancemigrations/status", // its phase
  "watch kubevirt.io/virtualmachineinstancemigrations", // the migration informer
];

/** Every kind of request a pod-less handler makes. */
const PODLESS_CALLS = [...KUBEVIRT_MODE_CALLS, ...PODLESS_ONLY_CALLS].sort();

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

/** The objects of a manifest of `deploy/`, as written. */
function deployObjects(file: "rbac.yaml" | "podless-node.yaml"): RbacObject[] {
  return loadAll(Deno.readTextFileSync(join(DEPLOY, file))) as RbacObject[];
}

/** The single object of `kind` among `objects`. */
function only(objects: RbacObject[], kind: string): RbacObject {
  const found = objects.filter((o) => o.kind === kind);
  assert.equal(found.length, 1, `one ${kind} among ${objects.map((o) => o.kind).join(", ")}`);
  return found[0];
}

/**
 * A copy of deploy/rbac.yaml's objects, renamed to `name`, whose ClusterRole also holds
 * deploy/podless-node.yaml's rules (what a pod-less node's ServiceAccount has) and lacks
 * `verb` on `resource` (the rule goes when it has no verb left).
 */
function narrowed(name: string, resource: string, verb: string): RbacObject[] {
  const copy = structuredClone(deployObjects("rbac.yaml"));
  for (const object of copy) object.metadata!.name = name;
  const role = only(copy, "ClusterRole");
  role.rules = [...role.rules!, ...only(deployObjects("podless-node.yaml"), "ClusterRole").rules!];
  let removed = false;
  role.rules = role.rules!.flatMap((rule) => {
    if (!rule.resources.includes(resource) || !rule.verbs.includes(verb)) return [rule];
    removed = true;
    const verbs = rule.verbs.filter((v) => v !== verb);
    return verbs.length > 0 ? [{ ...rule, verbs }] : [];
  });
  assert.ok(removed, `deploy/ grants ${verb} on ${resource}`);
  only(copy, "ClusterRoleBinding").roleRef!.name = name;
  only(copy, "ClusterRoleBinding").subjects![0].name = name;
  return copy;
}

async function run(cmd: string, args: string[]): Promise<void> {
  const out = await new Deno.Command(cmd, { args, stdout: "null", stderr: "piped" }).output();
  if (!out.success) {
    throw new Error(
      `Cannot run "${cmd} ${args.join(" ")}": ${new TextDecoder().decode(out.stderr).trim()}`,
    );
  }
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

/** What {@linkcode withServiceAccount} sets up. */
interface Setup {
  /** The ServiceAccount in "kubevirt" whose token the handler gets. */
  account: string;
  /**
   * `podless`: the pod-less node's identity (`deploy/podless_node.ts`) on the shared
   * control plane; `kubevirt`: deploy/rbac.yaml alone on a control plane of its own.
   */
  mode: "podless" | "kubevirt";
  /** More objects to apply (a narrowed copy of the roles for another account). */
  extra?: RbacObject[];
}

/**
 * A cluster with the setup's manifests applied, a Node, and a kubeconfig holding only a
 * token of the setup's ServiceAccount, bound to that Node.
 */
async function withServiceAccount(setup: Setup, fn: (ctx: Context) => Promise<void>) {
  const cluster = setup.mode === "podless"
    ? await useCluster()
    : await startCluster({ admission: true });
  const admin = await kubeClient(cluster.kubeconfigPath);
  const controller = await kubeClient(cluster.handlerKubeconfigPath);
  const dir = await Deno.makeTempDir({ prefix: "virtnode-rbac-" });
  const node = `rbac-${suffix()}`;
  try {
    // Applied as written, so a manifest the apiserver rejects fails here. Nothing is
    // deleted afterwards: without a namespace controller a deleted namespace stays
    // Terminating and refuses new objects, and a re-apply is idempotent.
    await kubectl(cluster, ["apply", "-f", join(DEPLOY, "rbac.yaml")]);
    if (setup.extra) {
      await kubectl(
        cluster,
        ["apply", "-f", "-"],
        JSON.stringify({ apiVersion: "v1", kind: "List", items: setup.extra }),
      );
    }
    await createNode(admin, node);
    const file = join(dir, "kubeconfig");
    const kubeconfig = setup.mode === "podless" && setup.account === ACCOUNT
      ? await podlessNodeKubeconfig(cluster, node, file)
      : await serviceAccountKubeconfig(cluster, NAMESPACE, setup.account, file, {
        boundNode: node,
      });
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
  options: { noWait?: boolean; kubeletPodsDir?: string },
  fn: (h: HandlerProcess) => Promise<void>,
): Promise<void> {
  const h = await startHandlerProcess({
    kubeconfig: ctx.kubeconfig,
    nodeName: ctx.node,
    libvirtUri: TEST_URI,
    noWait: options.noWait,
    kubeletPodsDir: options.kubeletPodsDir,
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

/**
 * What the context's token may do per the apiserver, less what any ServiceAccount may do
 * (the default roles every authenticated user has): a ServiceAccount of no binding.
 */
async function grantedBeyondBaseline(ctx: Context): Promise<string[]> {
  const baseline = "virtnode-rbac-baseline";
  const everyone = new Set(
    await grantedTo(
      await serviceAccountKubeconfig(ctx.cluster, NAMESPACE, baseline, join(ctx.dir, "baseline")),
    ),
  );
  return (await grantedTo(ctx.kubeconfig)).filter((p) => !everyone.has(p));
}

Deno.test("rbac: a pod-less node's identity may do exactly what the pod-less handler calls, no more", async () => {
  // The identity is what deploy/rbac.yaml and deploy/podless-node.yaml grant together.
  await withServiceAccount({ account: ACCOUNT, mode: "podless" }, async (ctx) => {
    const granted = await grantedBeyondBaseline(ctx);
    assert.deepEqual(
      granted,
      permissions([
        ...only(deployObjects("rbac.yaml"), "ClusterRole").rules!,
        ...only(deployObjects("podless-node.yaml"), "ClusterRole").rules!,
      ]),
      "the token may do exactly what the two manifests grant",
    );
    assert.deepEqual(granted, PODLESS_CALLS, "they grant what the pod-less handler calls");
  });
});

Deno.test("rbac: a pod-less handler with only its node's identity runs a VMI's life with no 403", async () => {
  // It places the VMI, runs it, deletes it and beats its Node.
  await withServiceAccount({ account: ACCOUNT, mode: "podless" }, async (ctx) => {
    const { admin, controller, node } = ctx;
    let stopped: Deno.CommandStatus | undefined;
    await withHandler(ctx, {}, async (h) => {
      const name = `vm-${suffix()}`;
      // As users make VMIs: the handler's scheduler places it (deploy/podless-node.yaml's
      // policy lets a node place a VMI whose nodeSelector names it).
      const created = await createVmi(admin, testVmi(name, node));
      const uid = created.metadata.uid!;
      const running = await waitForPhase(admin, "default", name, "Running");
      assert.equal(running.status!.nodeName, node);
      assert.equal(running.metadata.labels?.["kubevirt.io/nodeName"], node);
      const hosted = `${h.stateDir}/launcher-host/vms/${uid}.json`;
      assert.ok(await exists(hosted), "the launcher host serves the VMI");
      await waitFor("Created and Started events", async () => {
        const reasons = (await eventsFor(admin, "default", name)).map((e) => e.reason);
        return reasons.includes("Created") && reasons.includes("Started");
      });

      // A VMI the converter rejects fails its sync again and again: the status writer
      // sets Synchronized=False, and the recorder aggregates the repeated SyncFailed
      // warning into one Event (events patch). virt-controller places this one.
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

Deno.test("rbac: a pod-less node keeps the VMI of a VirtualMachine placed on it, with no 403", async () => {
  // As virt-controller's VM controller: a VM whose template names the node gets its VMI
  // (Always), shows Running and Ready; Halted stops it; a deleted VM takes its VMI along.
  await withServiceAccount({ account: ACCOUNT, mode: "podless" }, async (ctx) => {
    const { admin, node } = ctx;
    await withHandler(ctx, {}, async (h) => {
      const name = `vm-${suffix()}`;
      const template = testVmi(name, node);
      const vmPath = `/apis/kubevirt.io/v1/namespaces/default/virtualmachines/${name}`;
      type Vm = VirtualMachine;
      const vm = await admin.request<Vm>(
        "POST",
        "/apis/kubevirt.io/v1/namespaces/default/virtualmachines",
        {
          apiVersion: "kubevirt.io/v1",
          kind: "VirtualMachine",
          metadata: { name, namespace: "default" },
          spec: {
            runStrategy: "Always",
            template: { metadata: { labels: { app: name } }, spec: template.spec },
          },
        },
      );
      const running = await waitForPhase(admin, "default", name, "Running");
      assert.equal(running.status!.nodeName, node);
      assert.equal(running.metadata.labels?.app, name, "the template's labels");
      const owner = running.metadata.ownerReferences?.[0] as { kind: string; uid: string };
      assert.deepEqual([owner.kind, owner.uid], ["VirtualMachine", vm.metadata.uid]);
      assert.ok(
        running.metadata.finalizers?.includes("kubevirt.io/virtualMachineControllerFinalize"),
      );
      assert.match(running.spec.domain.firmware?.uuid ?? "", /^[0-9a-f-]{36}$/);
      const shown = await waitFor("the VM Running and Ready", async () => {
        const v = await admin.request<Vm>("GET", vmPath);
        return v.status?.printableStatus === "Running" && v.status.ready ? v : undefined;
      });
      assert.equal(shown.status!.created, true);
      assert.equal(shown.status!.runStrategy, "Always");
      assert.ok(
        shown.metadata.finalizers?.includes("kubevirt.io/virtualMachineControllerFinalize"),
      );
      await waitFor(
        "a SuccessfulCreate Event on the VM",
        async () =>
          (await eventsFor(admin, "default", name)).some((e) => e.reason === "SuccessfulCreate"),
      );

      // Looked at again and again while its VMI runs here, the VM reads the VMI from the
      // handler's cache: the handler's own request counters show no GET of a VMI.
      const vmiGets = async () => {
        const text = await (await fetch(`${h.health}/metrics`)).text();
        return text.split("\n")
          .filter((l) =>
            l.startsWith("kubevirt_rest_client_requests_total{") &&
            l.includes('resource="virtualmachineinstances"') && l.includes('verb="get"')
          )
          .reduce((sum, l) => sum + Number(l.split(" ").at(-1)), 0);
      };
      const before = await vmiGets();
      for (let look = 1; look <= 3; look++) {
        const patched = await admin.request<Vm>(
          "PATCH",
          vmPath,
          { spec: { template: { metadata: { annotations: { look: String(look) } } } } },
          { contentType: "application/merge-patch+json" },
        );
        await waitFor(`the VM looked at at generation ${patched.metadata.generation}`, async () => {
          const v = await admin.request<Vm>("GET", vmPath);
          return v.status?.desiredGeneration === patched.metadata.generation ? true : undefined;
        });
      }
      assert.equal(await vmiGets(), before, "no GET of a VMI while the VM's runs here");

      // Halted: the VMI goes, the VM shows Stopped.
      await admin.request("PATCH", vmPath, { spec: { runStrategy: "Halted" } }, {
        contentType: "application/merge-patch+json",
      });
      await waitFor(
        "the VMI to be gone",
        async () => (await getVmi(admin, "default", name)) === undefined ? true : undefined,
        60_000,
      );
      await waitFor("the VM Stopped", async () => {
        const v = await admin.request<Vm>("GET", vmPath);
        return v.status?.printableStatus === "Stopped" && !v.status.created ? v : undefined;
      });

      // Always again, then the VM deleted: its VMI goes with it, and then the VM.
      await admin.request("PATCH", vmPath, { spec: { runStrategy: "Always" } }, {
        contentType: "application/merge-patch+json",
      });
      await waitForPhase(admin, "default", name, "Running");
      await admin.request("DELETE", vmPath);
      await waitFor("the VM and its VMI gone", async () => {
        const vmi = await getVmi(admin, "default", name);
        const left = await admin.request<Vm>("GET", vmPath).catch(() => undefined);
        return !vmi && !left ? true : undefined;
      }, 60_000);
      assert.deepEqual(await forbiddenLines(h), [], "no request was forbidden");
    });
  });
});

Deno.test("rbac: without deploy/podless-secrets.yaml a VMI with access credentials names what to apply", async () => {
  // The pod-less node's identity reads no Secret unless an operator opts in; a VMI whose
  // access credentials name one does not start, and its Synchronized condition says why.
  await withServiceAccount({ account: ACCOUNT, mode: "podless" }, async (ctx) => {
    const { admin, node } = ctx;
    await withHandler(ctx, {}, async (h) => {
      const name = `vm-creds-${suffix()}`;
      const vmi = testVmi(name, node);
      vmi.spec.accessCredentials = [{
        sshPublicKey: {
          source: { secret: { secretName: "keys" } },
          propagationMethod: { qemuGuestAgent: { users: ["root"] } },
        },
      }];
      await createVmi(admin, vmi);
      const refused = await waitFor(
        "Synchronized=False naming deploy/podless-secrets.yaml",
        async () => {
          const c = (await getVmi(admin, "default", name))?.status?.conditions?.find((c) =>
            c.type === "Synchronized"
          );
          return c?.status === "False" && /podless-secrets\.yaml/.test(c.message ?? "")
            ? c
            : undefined;
        },
      );
      assert.match(refused.message!, /may not read Secret "default\/keys" \(403 Forbidden: /);
      assert.notEqual((await getVmi(admin, "default", name))?.status?.phase, "Running");
      assert.ok(
        !(await exists(`${h.stateDir}/launcher-host/vms/${
          (await getVmi(admin, "default", name))!
            .metadata.uid
        }.json`)),
        "no launcher was started",
      );
      await deleteVmi(admin, "default", name);
      await waitFor(
        "the VMI to be gone",
        async () => (await getVmi(admin, "default", name)) === undefined ? true : undefined,
      );
    });
  });
});

Deno.test("rbac: KubeVirt mode's ClusterRole grants just what its handler calls, enough for a VMI's life", async () => {
  // The role grants exactly what the KubeVirt-mode handler calls, and a handler
  // holding only that role takes a launcher pod's VMI through its life with no 403.
  await withServiceAccount({ account: ACCOUNT, mode: "kubevirt" }, async (ctx) => {
    const { admin, controller, node } = ctx;
    assert.deepEqual(await grantedBeyondBaseline(ctx), KUBEVIRT_MODE_CALLS);

    const podsDir = join(ctx.dir, "pods");
    const socketDir = await Deno.makeTempDir({ prefix: "vnpod-" });
    let launcher: Deno.ChildProcess | undefined;
    let mounted: string | undefined;
    let stopped: Deno.CommandStatus | undefined;
    try {
      await withHandler(ctx, { kubeletPodsDir: podsDir }, async (h) => {
        const name = `vm-${suffix()}`;
        const uid = (await createVmi(controller, testVmi(name, node, { placed: true })))
          .metadata.uid!;
        // The launcher "pod": a launcher process whose socket is where the kubelet puts
        // the pod's emptyDir volume, a bind mount as the kubelet makes it.
        const podUid = crypto.randomUUID();
        mounted = `${podsDir}/${podUid}/volumes/kubernetes.io~empty-dir/sockets`;
        await Deno.mkdir(mounted, { recursive: true });
        await run("mount", ["--bind", socketDir, mounted]);
        launcher = new Deno.Command(Deno.execPath(), {
          args: [
            "run",
            "-A",
            MAIN,
            "launcher",
            "--namespace",
            "default",
            "--name",
            name,
            "--uid",
            uid,
            "--socket-dir",
            socketDir,
            "--libvirt-uri",
            TEST_URI,
            "--notify-socket",
            `${h.runDir}/domain-notify.sock`,
            "--run-dir",
            join(ctx.dir, "private", uid),
            "--disk-dir",
            join(ctx.dir, "disks", uid),
            "--image-dir",
            join(ctx.dir, "images"),
          ],
          stdin: "null",
          stdout: "null",
          stderr: "null",
        }).spawn();
        await waitFor("the launcher socket", () => exists(`${socketDir}/launcher-sock`));
        // virt-controller's part: the pod runs, so the VMI is Scheduled on this node.
        await scheduleToPod(controller, "default", name, node, podUid);
        await waitForPhase(admin, "default", name, "Running");
        await waitFor("Created and Started events", async () => {
          const reasons = (await eventsFor(admin, "default", name)).map((e) => e.reason);
          return reasons.includes("Created") && reasons.includes("Started");
        });
        // No kubelet takes the device plugins here, so the node stays unschedulable; the
        // heartbeat still beats.
        await waitFor("the heartbeat", async () => {
          const meta = (await getNode(admin, node)).metadata!;
          return meta.annotations?.["kubevirt.io/heartbeat"] !== undefined;
        });
        await deleteVmi(admin, "default", name);
        await waitFor(
          "the ghost record to be removed after the domain is gone",
          async () => !(await exists(`${h.stateDir}/ghost-records/${uid}`)),
        );
        await waitFor("a Deleted event", async () => {
          return (await eventsFor(admin, "default", name)).some((e) => e.reason === "Deleted");
        });
        // virt-controller's last step, once the pod is gone.
        await releaseVmi(controller, "default", name);
        stopped = await h.kill("SIGTERM");
        assert.deepEqual(await forbiddenLines(h), [], "no request was forbidden");
      });
      assert.equal(stopped?.code, 0, "the handler stopped cleanly");
    } finally {
      try {
        launcher?.kill("SIGKILL");
        await launcher?.status;
      } catch { /* gone */ }
      if (mounted) await run("umount", [mounted]).catch(() => {});
      await Deno.remove(socketDir, { recursive: true }).catch(() => {});
    }
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
    const setup: Setup = {
      account: name,
      mode: "podless",
      extra: narrowed(name, c.resource, c.verb),
    };
    await withServiceAccount(setup, async (ctx) => {
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

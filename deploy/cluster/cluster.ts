/**
 * A real Kubernetes control plane for tests, envtest style: etcd and
 * kube-apiserver built from source by `build.sh`, no controllers, no kubelet,
 * with KubeVirt's own CRDs (`deploy/kubevirt/build.sh` runs KubeVirt's generator)
 * and, when asked, KubeVirt's own admission: virt-api's VMI and migration webhooks,
 * configured from a KubeVirt CR the way a KubeVirt install configures virt-api.
 *
 * Run it by hand with `deno task cluster`; tests call {@linkcode useCluster}.
 *
 * @module
 */

import * as path from "node:path";
import { fileURLToPath } from "node:url";
import {
  ClusterError,
  freePorts,
  type Managed,
  spawnManaged,
  terminate,
  waitUntil,
} from "./processes.ts";
import { errorText } from "../../ffi/mod.ts";
import { removeIfPresent } from "../../mod/lifecycle/mod.ts";

export { ClusterError };

/** A running (or borrowed) control plane and how to reach it. */
export interface Cluster {
  /** A kubeconfig that authenticates as a member of `system:masters`. */
  kubeconfigPath: string;
  /** The apiserver URL, `https://127.0.0.1:<port>`. */
  server: string;
  /** The bearer token of the admin user. */
  token: string;
  /** The directory that holds the kubeconfig, certificates, data and logs. */
  dir: string;
  /** Stops only kube-apiserver; etcd and the port stay reserved. */
  stopApiserver(): Promise<void>;
  /** Starts kube-apiserver again on the same port and waits until it is ready. */
  startApiserver(): Promise<void>;
  /** Stops both processes and removes {@linkcode Cluster.dir}. */
  stop(): Promise<void>;
  /**
   * The apiserver's audit log: one JSON event per request to a `kubevirt.io` resource
   * (metadata level), or undefined for a borrowed cluster.
   */
  auditLogPath?: string;
  /**
   * The kubeconfig a pod-less handler runs with. With KubeVirt's admission, whoever
   * places VMIs on nodes must be one of KubeVirt's service accounts: this one is
   * virt-controller's (`kubevirt/kubevirt-controller`, bound to cluster-admin, as the
   * test harness also plays virt-controller with it). Without admission, the admin's.
   */
  handlerKubeconfigPath: string;
}

/** Options of {@linkcode startCluster}. */
export interface StartClusterOptions {
  /**
   * A directory of CRD manifests to apply once the apiserver is ready. Defaults to
   * KubeVirt's CRDs as its generator writes them ({@linkcode buildKubevirt});
   * `false` applies none.
   */
  crdDir?: string | false;
  /**
   * Run KubeVirt's admission for VMIs and migrations (virt-api's webhooks) and create
   * the `kubevirt` namespace and KubeVirt CR it is configured from. Default false.
   */
  admission?: boolean;
  /** A directory holding `kube-apiserver` and `etcd`; skips `build.sh`. */
  binDir?: string;
  /**
   * Stop the cluster and exit on SIGINT and SIGTERM (the default). A caller that has work
   * to do with the cluster after a signal (local mode deletes its VMIs first) passes
   * `false` and stops it itself; the servers still die with the process.
   */
  stopOnSignals?: boolean;
  /**
   * Make the apiserver reachable from pods, as a real node's pods reach it: it listens on
   * every address, advertises this host's address in the `kubernetes` Service's
   * endpoints (which kube-proxy on a test node turns into rules), and admits pods with
   * their ServiceAccount's token. Default false: loopback only, and pods (which nothing
   * runs) need no ServiceAccount.
   */
  podNetwork?: boolean;
}

const HERE = path.dirname(fileURLToPath(import.meta.url));
const REPO_ROOT = path.resolve(HERE, "..", "..");
const BUILD_SCRIPT = path.join(HERE, "build.sh");
const KUBEVIRT_BUILD_SCRIPT = path.join(REPO_ROOT, "deploy", "kubevirt", "build.sh");
const ADMISSION_READY_TIMEOUT_MS = 60_000;
/** The namespace of KubeVirt's own components and of its KubeVirt CR. */
export const KUBEVIRT_NAMESPACE = "kubevirt";
/** virt-controller's service account, which KubeVirt's admission trusts to place VMIs. */
export const CONTROLLER_SERVICE_ACCOUNT = "kubevirt-controller";
// Only kubevirt.io requests are recorded: enough to prove what the handler sends.
const AUDIT_POLICY = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    resources:
      - group: kubevirt.io
  - level: None
`;
const KUBECTL = Deno.env.get("KUBECTL") ?? "kubectl";
const ETCD_READY_TIMEOUT_MS = 30_000;
const APISERVER_READY_TIMEOUT_MS = 90_000;
const TEMP_PREFIX = "virtnode-cluster-";
const OWNER_FILE = "owner.pid";

/**
 * Starts etcd and kube-apiserver on free loopback ports in a fresh temporary
 * directory, writes a kubeconfig there and applies the CRDs.
 */
export async function startCluster(options: StartClusterOptions = {}): Promise<Cluster> {
  const binDir = options.binDir ?? await buildBinaries();
  const kubevirtDir = options.crdDir === undefined || options.admission
    ? await buildKubevirt()
    : undefined;
  const dir = await Deno.makeTempDir({ prefix: TEMP_PREFIX });
  await Deno.writeTextFile(path.join(dir, OWNER_FILE), `${Deno.pid}\n`);
  await removeOrphanedDirs(path.dirname(dir));
  const controlPlane = new ControlPlane(binDir, dir, options.podNetwork ?? false);
  live.add(controlPlane, options.stopOnSignals ?? true);
  try {
    await controlPlane.start();
    if (options.crdDir !== false) {
      await applyCrds(
        controlPlane.kubeconfigPath,
        options.crdDir ?? path.join(kubevirtDir!, "crds"),
      );
    }
    if (options.admission) await controlPlane.startAdmission(kubevirtDir!);
  } catch (error) {
    await controlPlane.stop();
    throw error;
  }
  return controlPlane;
}

/**
 * The cluster tests should use: the one `VIRTNODE_TEST_KUBECONFIG` points to
 * when set (it is never stopped; `VIRTNODE_TEST_HANDLER_KUBECONFIG` names its
 * handler's kubeconfig), else a fresh one from {@linkcode startCluster} with
 * KubeVirt's admission.
 */
export async function useCluster(options: StartClusterOptions = {}): Promise<Cluster> {
  const kubeconfigPath = Deno.env.get("VIRTNODE_TEST_KUBECONFIG");
  if (!kubeconfigPath) return await startCluster({ admission: true, ...options });
  const view = (field: string) =>
    kubectl(kubeconfigPath, ["config", "view", "--raw", "--minify", "-o", field]);
  let server: string;
  let token: string;
  try {
    server = await view("jsonpath={.clusters[0].cluster.server}");
    token = await view("jsonpath={.users[0].user.token}");
  } catch (error) {
    throw new ClusterError(
      `Cannot use the cluster of VIRTNODE_TEST_KUBECONFIG "${kubeconfigPath}": ${message(error)}`,
      { cause: error },
    );
  }
  const unsupported = (action: string) => () =>
    Promise.reject(
      new ClusterError(
        `Cannot ${action}: the cluster of VIRTNODE_TEST_KUBECONFIG is not managed by this process`,
      ),
    );
  return {
    kubeconfigPath,
    handlerKubeconfigPath: Deno.env.get("VIRTNODE_TEST_HANDLER_KUBECONFIG") ?? kubeconfigPath,
    server,
    token,
    dir: path.dirname(kubeconfigPath),
    stopApiserver: unsupported("stop the apiserver"),
    startApiserver: unsupported("start the apiserver"),
    stop: () => Promise.resolve(),
  };
}

/**
 * Runs `kubectl` (`$KUBECTL`, else the one on PATH) with `kubeconfig` and returns its
 * output, trimmed; a failure throws with its exit code and stderr.
 */
export async function kubectl(kubeconfig: string, args: string[], input?: string): Promise<string> {
  const child = new Deno.Command(KUBECTL, {
    args: ["--kubeconfig", kubeconfig, ...args],
    stdin: input === undefined ? "null" : "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  if (input !== undefined) {
    const w = child.stdin.getWriter();
    await w.write(new TextEncoder().encode(input));
    await w.close();
  }
  const out = await child.output();
  const dec = new TextDecoder();
  if (!out.success) {
    throw new Error(`kubectl ${args.join(" ")} exited ${out.code}: ${dec.decode(out.stderr)}`);
  }
  return dec.decode(out.stdout).trim();
}

/**
 * Runs `deploy/kubevirt/build.sh` (a no-op when its cache holds the result) and returns
 * its directory: KubeVirt's CRDs under `crds/`, its examples under `examples/`, and
 * virt-api's webhooks built from KubeVirt's packages (`kubevirt-admission`).
 */
export async function buildKubevirt(): Promise<string> {
  return await runBuildScript(KUBEVIRT_BUILD_SCRIPT, "KubeVirt's CRDs and admission");
}

/** Runs build.sh (a no-op when its cache holds the binaries) and returns the binary directory. */
function buildBinaries(): Promise<string> {
  return runBuildScript(BUILD_SCRIPT, "the control plane");
}

/**
 * Runs a build script that prints its cache directory (a no-op when the cache holds the
 * result) and returns that directory; a failure names `what` and the script's output.
 */
export async function runBuildScript(script: string, what: string): Promise<string> {
  let output: Deno.CommandOutput;
  try {
    output = await new Deno.Command("bash", {
      args: [script],
      stdin: "null",
      stdout: "piped",
      stderr: "inherit",
    }).output();
  } catch (error) {
    throw new ClusterError(`Cannot build ${what}: ${message(error)}`, { cause: error });
  }
  if (!output.success) {
    throw new ClusterError(`Cannot build ${what}: "${script}" exited with code ${output.code}`);
  }
  const lines = new TextDecoder().decode(output.stdout).trim().split("\n");
  return lines[lines.length - 1];
}

/** The processes and files of one cluster started by this process. */
class ControlPlane implements Cluster {
  readonly dir: string;
  readonly kubeconfigPath: string;
  readonly token = crypto.randomUUID();
  server = "";
  #binDir: string;
  #etcd?: Managed;
  #apiserver?: Managed;
  #admission?: Managed;
  #apiserverArgs: string[] = [];
  #stopping?: Promise<void>;
  #podNetwork: boolean;

  constructor(binDir: string, dir: string, podNetwork: boolean) {
    this.#binDir = binDir;
    this.#podNetwork = podNetwork;
    this.dir = dir;
    this.kubeconfigPath = path.join(dir, "kubeconfig");
    this.handlerKubeconfigPath = this.kubeconfigPath;
    this.auditLogPath = path.join(dir, "audit.log");
  }

  handlerKubeconfigPath: string;

  readonly auditLogPath: string;

  /**
   * Creates the `kubevirt` namespace and a KubeVirt CR (deployed, default configuration)
   * and starts KubeVirt's admission, which registers its webhook configurations; returns
   * once it said it is ready.
   */
  async startAdmission(kubevirtDir: string): Promise<void> {
    await kubectl(this.kubeconfigPath, ["create", "namespace", KUBEVIRT_NAMESPACE]);
    await createKubevirtCr(this.kubeconfigPath, this.dir, {});
    const readyFile = path.join(this.dir, "kubevirt-admission.ready");
    const admission = await this.#spawn(
      "kubevirt-admission",
      path.join(kubevirtDir, "kubevirt-admission"),
      [
        `--kubeconfig=${this.kubeconfigPath}`,
        `--namespace=${KUBEVIRT_NAMESPACE}`,
        `--ready-file=${readyFile}`,
      ],
    );
    this.#admission = admission;
    await waitUntil(admission, ADMISSION_READY_TIMEOUT_MS, async () => {
      const ready = await Deno.readTextFile(readyFile).catch(() => "");
      return ready.startsWith("ready https://");
    });
    this.handlerKubeconfigPath = await serviceAccountKubeconfig(
      this,
      KUBEVIRT_NAMESPACE,
      CONTROLLER_SERVICE_ACCOUNT,
      path.join(this.dir, `${CONTROLLER_SERVICE_ACCOUNT}.kubeconfig`),
    );
    await kubectl(this.kubeconfigPath, [
      "create",
      "clusterrolebinding",
      `${CONTROLLER_SERVICE_ACCOUNT}-test-harness`,
      "--clusterrole=cluster-admin",
      `--serviceaccount=${KUBEVIRT_NAMESPACE}:${CONTROLLER_SERVICE_ACCOUNT}`,
    ]);
  }

  async start(): Promise<void> {
    const [clientPort, peerPort, securePort] = freePorts(3);
    // A pod-network apiserver's certificate names the address it advertises, not loopback.
    const address = this.#podNetwork ? await hostAddress() : "127.0.0.1";
    this.server = `https://${address}:${securePort}`;
    await this.#startEtcd(clientPort, peerPort);
    await this.#writeApiserverFiles();
    const podNetwork = this.#podNetwork
      ? [
        "--bind-address=0.0.0.0",
        `--advertise-address=${address}`,
        "--endpoint-reconciler-type=lease",
      ]
      : [
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        "--disable-admission-plugins=ServiceAccount",
        "--endpoint-reconciler-type=none",
      ];
    this.#apiserverArgs = [
      `--etcd-servers=http://127.0.0.1:${clientPort}`,
      ...podNetwork,
      `--secure-port=${securePort}`,
      `--cert-dir=${path.join(this.dir, "certs")}`,
      "--service-cluster-ip-range=10.0.0.0/24",
      "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
      `--service-account-key-file=${path.join(this.dir, "service-account.pub")}`,
      `--service-account-signing-key-file=${path.join(this.dir, "service-account.key")}`,
      `--token-auth-file=${path.join(this.dir, "tokens.csv")}`,
      "--authorization-mode=RBAC",
      "--allow-privileged=true",
      "--kubelet-preferred-address-types=InternalIP,Hostname",
      // The aggregation layer's settings, as kubeadm gives them: the apiserver publishes
      // the request-header ones in kube-system/extension-apiserver-authentication (KubeVirt's
      // virt-api will not start without them) and calls aggregated APIs with the client
      // certificate.
      `--requestheader-client-ca-file=${path.join(this.dir, "front-proxy-ca.crt")}`,
      "--requestheader-allowed-names=front-proxy-client",
      "--requestheader-username-headers=X-Remote-User",
      "--requestheader-group-headers=X-Remote-Group",
      "--requestheader-extra-headers-prefix=X-Remote-Extra-",
      `--proxy-client-cert-file=${path.join(this.dir, "front-proxy-client.crt")}`,
      `--proxy-client-key-file=${path.join(this.dir, "front-proxy-client.key")}`,
      // Aggregated APIs are reached at their Service's endpoints (virt-api runs on this
      // host), not through a cluster IP only a node's kube-proxy routes.
      "--enable-aggregator-routing=true",
      `--audit-policy-file=${path.join(this.dir, "audit-policy.yaml")}`,
      `--audit-log-path=${this.auditLogPath}`,
    ];
    await this.startApiserver();
    await this.#writeKubeconfig();
  }

  async startApiserver(): Promise<void> {
    if (this.#stopping) {
      throw new ClusterError("Cannot start kube-apiserver: the cluster is stopped");
    }
    if (this.#apiserver) return;
    const binary = path.join(this.#binDir, "kube-apiserver");
    const apiserver = await this.#spawn("kube-apiserver", binary, this.#apiserverArgs);
    this.#apiserver = apiserver;
    try {
      await this.#waitForApiserver(apiserver);
    } catch (error) {
      await this.stopApiserver();
      throw error;
    }
  }

  async stopApiserver(): Promise<void> {
    const apiserver = this.#apiserver;
    this.#apiserver = undefined;
    if (apiserver) await terminate(apiserver);
  }

  stop(): Promise<void> {
    this.#stopping ??= this.#stop();
    return this.#stopping;
  }

  /** Kills the processes without waiting: the last resort on process exit. */
  killNow(): void {
    for (const managed of [this.#admission, this.#apiserver, this.#etcd]) {
      try {
        managed?.child.kill("SIGKILL");
      } catch {
        // Already gone.
      }
    }
    try {
      Deno.removeSync(this.dir, { recursive: true });
    } catch {
      // Already removed or never created.
    }
  }

  async #stop(): Promise<void> {
    try {
      const admission = this.#admission;
      this.#admission = undefined;
      if (admission) await terminate(admission);
      await this.stopApiserver();
      const etcd = this.#etcd;
      this.#etcd = undefined;
      if (etcd) await terminate(etcd);
      await Deno.remove(this.dir, { recursive: true }).catch((error) => {
        if (!(error instanceof Deno.errors.NotFound)) throw error;
      });
    } catch (error) {
      throw new ClusterError(`Cannot stop the cluster in "${this.dir}": ${message(error)}`, {
        cause: error,
      });
    } finally {
      live.delete(this);
    }
  }

  async #startEtcd(clientPort: number, peerPort: number): Promise<void> {
    const clientUrl = `http://127.0.0.1:${clientPort}`;
    const peerUrl = `http://127.0.0.1:${peerPort}`;
    const etcd = await this.#spawn("etcd", path.join(this.#binDir, "etcd"), [
      "--name=virtnode-test",
      `--data-dir=${path.join(this.dir, "etcd")}`,
      `--listen-client-urls=${clientUrl}`,
      `--advertise-client-urls=${clientUrl}`,
      `--listen-peer-urls=${peerUrl}`,
      `--initial-advertise-peer-urls=${peerUrl}`,
      `--initial-cluster=virtnode-test=${peerUrl}`,
      "--unsafe-no-fsync",
      "--log-level=warn",
    ]);
    this.#etcd = etcd;
    await waitUntil(etcd, ETCD_READY_TIMEOUT_MS, async () => {
      const response = await fetch(`${clientUrl}/health`);
      const body = await response.text();
      return response.ok && body.includes('"health":"true"');
    });
  }

  async #writeApiserverFiles(): Promise<void> {
    await Deno.mkdir(path.join(this.dir, "certs"));
    // One EC key both signs and verifies service account tokens.
    const key = await crypto.subtle.generateKey({ name: "ECDSA", namedCurve: "P-256" }, true, [
      "sign",
      "verify",
    ]);
    const privateKey = await crypto.subtle.exportKey("pkcs8", key.privateKey);
    const publicKey = await crypto.subtle.exportKey("spki", key.publicKey);
    await Deno.writeTextFile(
      path.join(this.dir, "service-account.key"),
      pem("PRIVATE KEY", privateKey),
      { mode: 0o600 },
    );
    await Deno.writeTextFile(
      path.join(this.dir, "service-account.pub"),
      pem("PUBLIC KEY", publicKey),
    );
    await Deno.writeTextFile(path.join(this.dir, "audit-policy.yaml"), AUDIT_POLICY);
    // The front proxy's CA (no front proxy runs: only its certificate is published).
    const openssl = await new Deno.Command("openssl", {
      args: [
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-subj",
        "/CN=front-proxy-ca",
        "-days",
        "7",
        "-keyout",
        path.join(this.dir, "front-proxy-ca.key"),
        "-out",
        path.join(this.dir, "front-proxy-ca.crt"),
      ],
      stdin: "null",
      stdout: "null",
      stderr: "piped",
    }).output();
    if (!openssl.success) {
      throw new ClusterError(
        `Cannot make the front proxy's CA: ${new TextDecoder().decode(openssl.stderr)}`,
      );
    }
    // The aggregation layer's client certificate (`front-proxy-client`, as kubeadm names
    // it), with which the apiserver calls aggregated APIs: KubeVirt's subresources.
    const ext = path.join(this.dir, "front-proxy-client.ext");
    await Deno.writeTextFile(ext, "extendedKeyUsage=clientAuth\n");
    for (
      const args of [
        [
          "req",
          "-new",
          "-newkey",
          "ec",
          "-pkeyopt",
          "ec_paramgen_curve:prime256v1",
          "-nodes",
          "-subj",
          "/CN=front-proxy-client",
          "-keyout",
          path.join(this.dir, "front-proxy-client.key"),
          "-out",
          path.join(this.dir, "front-proxy-client.csr"),
        ],
        [
          "x509",
          "-req",
          "-in",
          path.join(this.dir, "front-proxy-client.csr"),
          "-CA",
          path.join(this.dir, "front-proxy-ca.crt"),
          "-CAkey",
          path.join(this.dir, "front-proxy-ca.key"),
          "-CAcreateserial",
          "-days",
          "7",
          "-extfile",
          ext,
          "-out",
          path.join(this.dir, "front-proxy-client.crt"),
        ],
      ]
    ) {
      const made = await new Deno.Command("openssl", {
        args,
        stdin: "null",
        stdout: "null",
        stderr: "piped",
      }).output();
      if (!made.success) {
        throw new ClusterError(
          `Cannot make the front proxy's client certificate: ${
            new TextDecoder().decode(made.stderr)
          }`,
        );
      }
    }
    await Deno.writeTextFile(
      path.join(this.dir, "tokens.csv"),
      `${this.token},admin,admin,"system:masters"\n`,
      { mode: 0o600 },
    );
  }

  /** The self-signed serving certificate, followed by its CA, as kube-apiserver writes it. */
  get #servingCertPath(): string {
    return path.join(this.dir, "certs", "apiserver.crt");
  }

  async #waitForApiserver(apiserver: Managed): Promise<void> {
    let client: Deno.HttpClient | undefined;
    try {
      await waitUntil(apiserver, APISERVER_READY_TIMEOUT_MS, async () => {
        if (!client) {
          const caCert = await Deno.readTextFile(this.#servingCertPath).catch(() => undefined);
          if (!caCert) return false;
          client = Deno.createHttpClient({ caCerts: [caCert] });
        }
        const response = await fetch(`${this.server}/readyz`, {
          client,
          headers: { authorization: `Bearer ${this.token}` },
        });
        await response.body?.cancel();
        return response.ok;
      });
    } finally {
      client?.close();
    }
  }

  async #writeKubeconfig(): Promise<void> {
    const caData = btoa(await Deno.readTextFile(this.#servingCertPath));
    await Deno.writeTextFile(
      this.kubeconfigPath,
      [
        "apiVersion: v1",
        "kind: Config",
        "clusters:",
        "  - name: virtnode-test",
        "    cluster:",
        `      server: ${this.server}`,
        `      certificate-authority-data: ${caData}`,
        "users:",
        "  - name: admin",
        "    user:",
        `      token: ${this.token}`,
        "contexts:",
        "  - name: virtnode-test",
        "    context:",
        "      cluster: virtnode-test",
        "      user: admin",
        "      namespace: default",
        "current-context: virtnode-test",
        "",
      ].join("\n"),
      { mode: 0o600 },
    );
  }

  #spawn(name: string, binary: string, args: string[]): Promise<Managed> {
    return spawnManaged(name, binary, args, {
      logPath: path.join(this.dir, `${name}.log`),
      cwd: this.dir,
    });
  }
}

/**
 * The clusters this process started and has not stopped; while there are any,
 * SIGINT, SIGTERM and unload stop them so no server outlives us (unless every one is
 * owned by a caller that handles signals itself).
 */
class LiveClusters {
  #planes = new Set<ControlPlane>();
  /** Planes whose owner handles signals itself. */
  #signalExempt = new Set<ControlPlane>();

  add(plane: ControlPlane, stopOnSignals: boolean): void {
    if (this.#planes.size === 0) this.#listen();
    this.#planes.add(plane);
    if (!stopOnSignals) this.#signalExempt.add(plane);
  }

  delete(plane: ControlPlane): void {
    this.#signalExempt.delete(plane);
    if (!this.#planes.delete(plane) || this.#planes.size > 0) return;
    this.#unlisten();
  }

  #onUnload = (): void => {
    for (const plane of this.#planes) plane.killNow();
  };

  #onSigint = () => this.#stopAllAndExit(130);
  #onSigterm = () => this.#stopAllAndExit(143);

  async #stopAllAndExit(code: number): Promise<void> {
    if ([...this.#planes].every((plane) => this.#signalExempt.has(plane))) return;
    this.#unlisten();
    await Promise.allSettled([...this.#planes].map((plane) => plane.stop()));
    Deno.exit(code);
  }

  #listen(): void {
    globalThis.addEventListener("unload", this.#onUnload);
    Deno.addSignalListener("SIGINT", this.#onSigint);
    Deno.addSignalListener("SIGTERM", this.#onSigterm);
  }

  #unlisten(): void {
    globalThis.removeEventListener("unload", this.#onUnload);
    Deno.removeSignalListener("SIGINT", this.#onSigint);
    Deno.removeSignalListener("SIGTERM", this.#onSigterm);
  }
}

const live = new LiveClusters();

/** Applies every YAML file of the CRD directory and waits until each is Established. */
async function applyCrds(kubeconfigPath: string, dir: string): Promise<void> {
  let count = 0;
  try {
    for await (const entry of Deno.readDir(dir)) {
      if (entry.isFile && /\.(ya?ml|json)$/.test(entry.name)) count++;
    }
  } catch (error) {
    throw new ClusterError(`Cannot read the CRD directory "${dir}": ${message(error)}`, {
      cause: error,
    });
  }
  if (count === 0) throw new ClusterError(`The CRD directory "${dir}" holds no manifests`);
  // Server-side: KubeVirt's VMI CRD is too large for client-side apply's annotation.
  try {
    await kubectl(kubeconfigPath, ["apply", "--server-side", "--force-conflicts", "-f", dir]);
    await kubectl(kubeconfigPath, [
      "wait",
      "--for=condition=established",
      "--timeout=60s",
      "-f",
      dir,
    ]);
  } catch (error) {
    throw new ClusterError(`Cannot apply the CRDs of "${dir}": ${message(error)}`, {
      cause: error,
    });
  }
}

/**
 * Removes the directories of clusters whose owner died without cleaning up
 * (SIGKILL): its servers died with it, by the parent-death signal.
 */
async function removeOrphanedDirs(tempDir: string): Promise<void> {
  for await (const entry of Deno.readDir(tempDir)) {
    if (!entry.isDirectory || !entry.name.startsWith(TEMP_PREFIX)) continue;
    const dir = path.join(tempDir, entry.name);
    const owner = await Deno.readTextFile(path.join(dir, OWNER_FILE)).catch(() => "");
    // No owner file: a cluster still being created, or not ours to judge.
    if (!/^\d+\s*$/.test(owner)) continue;
    const ownerAlive = await Deno.stat(`/proc/${owner.trim()}`).then(() => true, () => false);
    // Best effort: another run retries, and this cluster does not need the space.
    if (!ownerAlive) {
      await removeIfPresent(dir, { recursive: true }).catch((error) =>
        console.warn(`cannot remove the orphaned ${dir}: ${error}`)
      );
    }
  }
}

/**
 * Creates the KubeVirt CR in KubeVirt's namespace with `developerConfiguration`, and
 * the phase virt-operator reports once installed: KubeVirt's components read a KubeVirt
 * CR's configuration only once it has one.
 */
export async function createKubevirtCr(
  kubeconfigPath: string,
  dir: string,
  developerConfiguration: Record<string, unknown>,
  configuration: Record<string, unknown> = {},
): Promise<void> {
  const crFile = path.join(dir, "kubevirt-cr.json");
  await Deno.writeTextFile(
    crFile,
    JSON.stringify({
      apiVersion: "kubevirt.io/v1",
      kind: "KubeVirt",
      metadata: { name: "kubevirt", namespace: KUBEVIRT_NAMESPACE },
      spec: { configuration: { ...configuration, developerConfiguration } },
    }),
  );
  await kubectl(kubeconfigPath, ["create", "-f", crFile]);
  await kubectl(kubeconfigPath, [
    "patch",
    "kubevirt",
    "kubevirt",
    "-n",
    KUBEVIRT_NAMESPACE,
    "--subresource=status",
    "--type=merge",
    "-p",
    JSON.stringify({ status: { phase: "Deployed", defaultArchitecture: "amd64" } }),
  ]);
}

/** This host's address on the interface of its default route (else its first global one). */
export async function hostAddress(): Promise<string> {
  const ip = async (args: string[]) => {
    const out = await new Deno.Command("ip", { args, stdout: "piped", stderr: "null" }).output();
    return new TextDecoder().decode(out.stdout);
  };
  const device = /\bdev (\S+)/.exec(await ip(["-4", "route", "show", "default"]))?.[1];
  const addresses = await ip(["-4", "-o", "addr", "show", ...(device ? ["dev", device] : [])]);
  const route = /inet (\d+\.\d+\.\d+\.\d+)\/\d+ .*scope global/.exec(addresses);
  if (route) return route[1];
  const any = /inet (\d+\.\d+\.\d+\.\d+)\/\d+ .*scope global/.exec(await ip(["-4", "addr"]));
  if (any) return any[1];
  throw new ClusterError("Cannot find an address of this host that pods can reach");
}

function pem(label: string, der: ArrayBuffer): string {
  const base64 = btoa(String.fromCharCode(...new Uint8Array(der)));
  const lines = base64.match(/.{1,64}/g) ?? [];
  return `-----BEGIN ${label}-----\n${lines.join("\n")}\n-----END ${label}-----\n`;
}

function message(error: unknown): string {
  return errorText(error);
}

if (import.meta.main) {
  // As the tests and local mode have it: KubeVirt's CRDs and admission.
  const cluster = await startCluster({ admission: true });
  console.log(`Kubeconfig: ${cluster.kubeconfigPath}`);
  console.log(
    `Pod-less handler's kubeconfig (virt-controller's): ${cluster.handlerKubeconfigPath}`,
  );
  console.log(`Server: ${cluster.server}`);
  console.log(`export KUBECONFIG=${cluster.kubeconfigPath}`);
  console.log("Press Ctrl-C to stop the cluster");
  // The listeners of LiveClusters stop the cluster and exit on SIGINT or SIGTERM.
  await new Promise<void>((resolve) => Deno.addSignalListener("SIGINT", resolve));
  await cluster.stop();
}

/**
 * Writes `file`, a kubeconfig for `cluster` that authenticates as the service account
 * `namespace/name` (both created when missing) with a token from the TokenRequest API,
 * valid for a day. How tests act as one of KubeVirt's own components, whose service
 * accounts KubeVirt's admission trusts with what it refuses other users. With
 * `boundNode`, the token is bound to that Node (which must exist) and carries its name,
 * as a pod-less node's does (`deploy/podless_node.ts`).
 */
export async function serviceAccountKubeconfig(
  cluster: Cluster,
  namespace: string,
  name: string,
  file: string,
  options: { boundNode?: string } = {},
): Promise<string> {
  const createIfMissing = async (args: string[]) => {
    try {
      await kubectl(cluster.kubeconfigPath, ["create", ...args]);
    } catch (error) {
      if (!/AlreadyExists|already exists/.test(message(error))) throw error;
    }
  };
  try {
    await createIfMissing(["namespace", namespace]);
    await createIfMissing(["serviceaccount", name, "-n", namespace]);
    const token = await kubectl(cluster.kubeconfigPath, [
      "create",
      "token",
      name,
      "-n",
      namespace,
      "--duration=24h",
      ...(options.boundNode
        ? ["--bound-object-kind=Node", `--bound-object-name=${options.boundNode}`]
        : []),
    ]);
    const config = JSON.parse(
      await kubectl(cluster.kubeconfigPath, ["config", "view", "--raw", "--minify", "-o", "json"]),
    );
    config.users = [{ name: `${namespace}-${name}`, user: { token: token.trim() } }];
    config.contexts[0].context.user = `${namespace}-${name}`;
    await Deno.writeTextFile(file, JSON.stringify(config, null, 2), { mode: 0o600 });
  } catch (error) {
    throw new ClusterError(
      `Cannot write a kubeconfig for service account "${namespace}/${name}": ${message(error)}`,
      { cause: error },
    );
  }
  return file;
}

/**
 * The cluster's KubeVirt CR, watched and read as virt-handler reads it: the CR of the
 * handler's own namespace (its service account's, `kubevirt` outside a pod) once virt-operator
 * has given it a phase and while it is not being deleted; its `spec.configuration` parsed
 * over KubeVirt's defaults (`mod/config/kubevirt.ts`). A CR that does not parse is refused
 * whole, with KubeVirt's log line, and the last good configuration stays in force; so does
 * the last one when the CR goes away. `/healthz` reports the resourceVersion of the
 * configuration in force as `config-resource-version`.
 *
 * Pod-less mode has no virt-operator to give the CR its phase: there a CR without one is
 * read too, and without any CR KubeVirt's defaults apply, said once in the log.
 *
 * @module
 */
import {
  KUBEVIRT_DEFAULTS,
  type KubevirtConfig,
  KubevirtConfigError,
  parseKubevirtConfiguration,
} from "../config/mod.ts";
import { getLogger } from "../log/mod.ts";
import type { Runnable } from "../lifecycle/mod.ts";
import type { KubeClient } from "./client.ts";
import { Informer } from "./informer.ts";
import type { KubeObject } from "./types.ts";

const log = getLogger("kube", "kubevirt-cr");

/** Where a pod's service account names its namespace. */
const SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
/** KubeVirt's namespace when the handler runs outside a pod. */
const DEFAULT_NAMESPACE = "kubevirt";

/** What is kept of the CR. */
interface KubevirtCr extends KubeObject {
  spec?: { configuration?: KubevirtConfiguration };
  status?: { phase?: string };
}

/** The CR's `spec.configuration`, as the CR has it (`mod/config/kubevirt.ts` reads it). */
type KubevirtConfiguration = Record<string, unknown>;

/** The handler's namespace as virt-handler finds it: its service account's, else `kubevirt`. */
export function handlerNamespace(file = SERVICE_ACCOUNT_NAMESPACE): string {
  try {
    return Deno.readTextFileSync(file).trim() || DEFAULT_NAMESPACE;
  } catch {
    return DEFAULT_NAMESPACE;
  }
}

/** Options of {@linkcode KubevirtCrWatch}. */
export interface KubevirtCrWatchOptions {
  /** This node, for `nodeVerbosity` (default: none matches). */
  nodeName?: string;
  /** The namespace whose CR counts (default: {@linkcode handlerNamespace}). */
  namespace?: string;
  /** Pod-less mode: a CR without a phase counts, and no CR is said once. */
  podless?: boolean;
}

/** Watches the KubeVirt CR; run it as a {@linkcode Runnable}. */
export class KubevirtCrWatch implements Runnable {
  /** For logs. */
  readonly name = "kubevirt-cr";
  readonly #informer: Informer<KubevirtCr>;
  readonly #listeners = new Set<() => void>();
  readonly #nodeName: string;
  readonly #namespace: string;
  readonly #podless: boolean;
  #config: KubevirtConfig = KUBEVIRT_DEFAULTS;
  #invalidVersion = "";

  /** A watch through `client`; nothing is listed until {@linkcode run}. */
  constructor(client: KubeClient, options: KubevirtCrWatchOptions = {}) {
    this.#nodeName = options.nodeName ?? "";
    this.#namespace = options.namespace ?? handlerNamespace();
    this.#podless = options.podless ?? false;
    this.#informer = new Informer<KubevirtCr>(client, {
      path: "/apis/kubevirt.io/v1/kubevirts",
      resource: "kubevirts",
      onError: (error) => log.warn("KubeVirt CR watch interrupted, retrying: {error}", { error }),
      // What the configuration needs, nothing else (the status is large).
      transform: (kv) => ({
        apiVersion: kv.apiVersion,
        kind: kv.kind,
        metadata: {
          name: kv.metadata?.name,
          namespace: kv.metadata?.namespace,
          resourceVersion: kv.metadata?.resourceVersion,
          annotations: kv.metadata?.annotations,
          deletionTimestamp: kv.metadata?.deletionTimestamp,
        },
        spec: { configuration: kv.spec?.configuration },
        status: { phase: kv.status?.phase },
      }),
    });
    const changed = () => {
      if (!this.#read()) return;
      for (const listener of this.#listeners) {
        try {
          listener();
        } catch (error) {
          log.error("A KubeVirt configuration listener failed: {error}", { error });
        }
      }
    };
    this.#informer.addHandlers({ onAdd: changed, onUpdate: changed, onDelete: changed });
  }

  /** The CR that counts: this namespace's, with a phase (pod-less: any), not being deleted. */
  #current(): KubevirtCr | undefined {
    return this.#informer.list().find((kv) =>
      kv.metadata?.namespace === this.#namespace && !kv.metadata?.deletionTimestamp &&
      (this.#podless || !!kv.status?.phase)
    );
  }

  /** Parses the current CR if it is new; true when the configuration in force changed. */
  #read(): boolean {
    const cr = this.#current();
    const version = cr?.metadata?.resourceVersion ?? "";
    if (!cr || version === this.#config.resourceVersion || version === this.#invalidVersion) {
      return false;
    }
    try {
      this.#config = parseKubevirtConfiguration(cr.spec?.configuration, {
        resourceVersion: version,
        annotations: cr.metadata?.annotations,
        nodeName: this.#nodeName,
      });
    } catch (error) {
      if (!(error instanceof KubevirtConfigError)) throw error;
      this.#invalidVersion = version;
      log.error(
        "Invalid cluster config using KubeVirt resource version '{version}', falling back to last good resource version '{good}': {error}",
        { version, good: this.#config.resourceVersion, error: error.message },
      );
      return false;
    }
    log.info("Updating cluster config from KubeVirt to resource version '{version}'", {
      version,
    });
    return true;
  }

  /** The configuration in force: the last good CR's, else KubeVirt's defaults. */
  config(): KubevirtConfig {
    return this.#config;
  }

  /** The resourceVersion of the configuration in force; empty while it is the defaults. */
  resourceVersion(): string {
    return this.#config.resourceVersion;
  }

  /** Resolves once the CRs have been listed (or the watch stopped). */
  synced(): Promise<void> {
    return this.#informer.waitForSync();
  }

  /** Calls `listener` after every change of the configuration in force; returns its removal. */
  onChange(listener: () => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  /** Lists and watches until `signal` aborts. */
  run(signal: AbortSignal): Promise<void> {
    const running = this.#informer.run(signal);
    this.#informer.waitForSync().then(() => {
      if (this.#podless && !signal.aborted && this.#current() === undefined) {
        log.info(
          "No KubeVirt CR in namespace {namespace}: KubeVirt's default configuration applies",
          { namespace: this.#namespace },
        );
      }
    });
    return running;
  }
}

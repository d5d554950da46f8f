/**
 * The cluster's KubeVirt CR, watched: its resourceVersion (what `/healthz` reports as
 * `config-resource-version`, as KubeVirt's components do) and its `spec.configuration`,
 * which the parts that follow KubeVirt's configuration read (the node labeller's obsolete
 * CPU models). One CR per cluster, in KubeVirt's namespace; listed across namespaces, as
 * KubeVirt's handler role allows.
 *
 * @module
 */
import { getLogger } from "../log/mod.ts";
import type { Runnable } from "../lifecycle/mod.ts";
import type { KubeClient } from "./client.ts";
import { Informer } from "./informer.ts";
import type { KubeObject } from "./types.ts";

const log = getLogger("kube", "kubevirt-cr");

/** What is kept of the CR. */
interface KubevirtCr extends KubeObject {
  spec?: { configuration?: KubevirtConfiguration };
}

/** The fields of the CR's `spec.configuration` virtnode reads. */
export interface KubevirtConfiguration {
  /** CPU models never offered; `true` marks a model obsolete. KubeVirt's list when unset. */
  obsoleteCPUModels?: Record<string, boolean>;
  /** The configuration's other fields, as the CR has them. */
  [field: string]: unknown;
}

/** Watches the KubeVirt CR; run it as a {@linkcode Runnable}. */
export class KubevirtCrWatch implements Runnable {
  /** For logs. */
  readonly name = "kubevirt-cr";
  readonly #informer: Informer<KubevirtCr>;
  readonly #listeners = new Set<() => void>();

  /** A watch through `client`; nothing is listed until {@linkcode run}. */
  constructor(client: KubeClient) {
    this.#informer = new Informer<KubevirtCr>(client, {
      path: "/apis/kubevirt.io/v1/kubevirts",
      resource: "kubevirts",
      onError: (error) => log.warn("KubeVirt CR watch interrupted, retrying: {error}", { error }),
      // Its version and configuration are read, nothing else (the status is large).
      transform: (kv) => ({
        apiVersion: kv.apiVersion,
        kind: kv.kind,
        metadata: {
          name: kv.metadata?.name,
          namespace: kv.metadata?.namespace,
          resourceVersion: kv.metadata?.resourceVersion,
        },
        spec: { configuration: kv.spec?.configuration },
      }),
    });
    const tell = () => {
      for (const listener of this.#listeners) {
        try {
          listener();
        } catch (error) {
          log.error("A KubeVirt configuration listener failed: {error}", { error });
        }
      }
    };
    this.#informer.addHandlers({ onAdd: tell, onUpdate: tell, onDelete: tell });
  }

  /** The CR's resourceVersion as last seen; empty before it is listed, or without a CR. */
  resourceVersion(): string {
    return this.#informer.list()[0]?.metadata?.resourceVersion ?? "";
  }

  /** The CR's `spec.configuration` as last seen; undefined without a CR. */
  configuration(): KubevirtConfiguration | undefined {
    const cr = this.#informer.list()[0];
    return cr ? cr.spec?.configuration ?? {} : undefined;
  }

  /** Calls `listener` after every change of the CR; returns its removal. */
  onChange(listener: () => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  /** Lists and watches until `signal` aborts. */
  run(signal: AbortSignal): Promise<void> {
    return this.#informer.run(signal);
  }
}

/**
 * The obsolete CPU models a configuration names: every key of `obsoleteCPUModels`, whatever
 * its value (KubeVirt's labeller tests a model's presence in the map, not its value).
 * Undefined when the map is absent or empty: virt-handler reads the CR through a JSON
 * round trip whose `omitempty` drops an empty map, so `{}` means what no map means there,
 * KubeVirt's default list for the `cpu-model` labels and no host model marked obsolete.
 */
export function obsoleteCpuModels(
  configuration: KubevirtConfiguration | undefined,
): string[] | undefined {
  const set = configuration?.obsoleteCPUModels;
  if (set === undefined || set === null) return undefined;
  const models = Object.keys(set).sort();
  return models.length > 0 ? models : undefined;
}

/**
 * The handler's `/healthz` answer, as virt-handler's: JSON with the apiserver's
 * connectivity and version, and `config-resource-version`, the KubeVirt CR's
 * resourceVersion the handler has seen. KubeVirt's functional suite reads that field on
 * every handler pod (through a port-forward to 8443) after it changes the CR, and waits
 * until each one has caught up.
 *
 * The apiserver's `/version` is read once at start and kept, as virt-handler keeps it: an
 * apiserver outage does not make the liveness probe fail (the handler keeps its VMs
 * through one). Only while it has never been read does `/healthz` try, and answer 500 with
 * the error when that fails.
 *
 * @module
 */
import { getLogger } from "../log/mod.ts";
import type { KubeClient } from "../kube/mod.ts";
import { type Runnable, runnable, sleep } from "../lifecycle/mod.ts";

const log = getLogger("handler", "healthz");
const VERSION_TIMEOUT_MS = 2_000;
const VERSION_RETRY_MS = 5_000;

/** What `/healthz` answers: a status and KubeVirt's JSON body. */
export interface HealthAnswer {
  status: number;
  body: Record<string, unknown>;
}

/** The KubeVirt CR's version and the apiserver's, for `/healthz`. */
export class HealthStatus {
  readonly #client: KubeClient;
  readonly #configVersion: () => string;
  #version: unknown;

  /**
   * Reads the apiserver's version through `client`; `configVersion` gives the KubeVirt
   * CR's resourceVersion as last seen (mod/kube/kubevirt_cr.ts).
   */
  constructor(client: KubeClient, configVersion: () => string) {
    this.#client = client;
    this.#configVersion = configVersion;
  }

  /** What `/healthz` answers now. */
  async answer(): Promise<HealthAnswer> {
    const config = this.#configVersion();
    if (this.#version === undefined) {
      try {
        await this.#readVersion();
      } catch (error) {
        return {
          status: 500,
          body: {
            apiserver: { connectivity: "failed", error: String((error as Error).message ?? error) },
            "config-resource-version": config,
          },
        };
      }
    }
    return {
      status: 200,
      body: {
        apiserver: { connectivity: "ok", version: this.#version },
        "config-resource-version": config,
      },
    };
  }

  async #readVersion(): Promise<void> {
    this.#version = await this.#client.request("GET", "/version", undefined, {
      timeoutMs: VERSION_TIMEOUT_MS,
    });
  }

  /** The first read of the apiserver's version (retried until it is read). */
  parts(): Runnable[] {
    return [
      runnable("apiserver-version", async (signal) => {
        while (this.#version === undefined && !signal.aborted) {
          try {
            await this.#readVersion();
          } catch (error) {
            log.debug("Cannot read the apiserver's version yet: {error}", { error });
            await sleep(VERSION_RETRY_MS, signal);
          }
        }
      }),
    ];
  }
}

/**
 * Pod-less mode's stand-in for virt-controller's scheduling step. In a KubeVirt
 * cluster virt-controller puts the `kubevirt.io/nodeName` label on a VMI once its
 * launcher pod is on a node, and KubeVirt's admission lets no other user set that
 * label. Without pods, users place a VMI with `spec.nodeSelector`
 * (`kubernetes.io/hostname: <node>`), and this scheduler — running as one of
 * KubeVirt's service accounts — labels the Pending VMIs that name its node and moves them
 * to Scheduled on it (one update, as virt-controller ends its scheduling); the handler's
 * informer, which selects on that label, then takes them over.
 *
 * A VMI that names no node stays Pending: pod-less mode has no scheduler to pick one.
 *
 * @module
 */

import {
  kubeTime,
  Labels,
  type VirtualMachineInstance,
  type VirtualMachineInstanceStatus,
  VMI_RESOURCE,
  VmiPhase,
} from "../../api/mod.ts";
import { detailOf, Informer, isApiStatus, type KubeClient } from "../../kube/mod.ts";
import type { Runnable } from "../../lifecycle/mod.ts";
import { getLogger } from "../../log/mod.ts";
import { POD_INTERFACE } from "../../network/mod.ts";
import { computeStatus } from "../status.ts";

const log = getLogger("scheduler");

/** The node label a VMI's `spec.nodeSelector` names its node with. */
export const HOSTNAME_LABEL = "kubernetes.io/hostname";
/** Attempts of one claim on 409 Conflict. */
const CLAIM_ATTEMPTS = 5;

/** Whether `vmi` is a Pending VMI, not yet on any node, whose node selector names `node`. */
export function wantsNode(vmi: VirtualMachineInstance, node: string): boolean {
  const phase = vmi.status?.phase ?? VmiPhase.Pending;
  return phase === VmiPhase.Pending &&
    !vmi.metadata.deletionTimestamp &&
    vmi.metadata.labels?.[Labels.NodeName] === undefined &&
    !vmi.status?.nodeName &&
    vmi.spec.nodeSelector?.[HOSTNAME_LABEL] === node;
}

/**
 * The status of a Pending VMI once it is placed on `node`: Scheduled there, at `now`, with
 * the conditions the handler's first sync gives a Scheduled VMI without a domain yet
 * (`Ready` False, `LiveMigratable`): that sync then has nothing to write, and the Running
 * write follows the domain's start without another write (and its watch echo) before it.
 */
export function scheduledStatus(
  vmi: VirtualMachineInstance,
  node: string,
  now: string,
): VirtualMachineInstanceStatus {
  const status: VirtualMachineInstanceStatus = { ...vmi.status };
  if (status.phase && status.phase !== VmiPhase.Pending) return status;
  status.phase = VmiPhase.Scheduled;
  status.nodeName = node;
  // As virt-controller once the launcher is placed: migrations go through unix sockets.
  status.migrationTransport = "Unix";
  status.phaseTransitionTimestamps = [
    ...(status.phaseTransitionTimestamps ?? []),
    { phase: VmiPhase.Scheduled, phaseTransitionTimestamp: now },
  ];
  return computeStatus({ ...vmi, status }, {
    domain: undefined,
    launcher: "notReady",
    nodeName: node,
    standIn: { podInterfaceName: POD_INTERFACE },
    now,
  }).status;
}

/** Labels the unplaced VMIs that ask for this node; see the module doc. */
export class PodlessScheduler implements Runnable {
  /** For logs. */
  readonly name = "podless-scheduler";
  readonly #client: KubeClient;
  readonly #node: string;
  readonly #informer: Informer<VirtualMachineInstance>;
  readonly #claiming = new Set<string>();

  /** Creates the scheduler of `node`; nothing happens before {@linkcode run}. */
  constructor(client: KubeClient, node: string) {
    this.#client = client;
    this.#node = node;
    this.#informer = new Informer<VirtualMachineInstance>(client, {
      path: `/apis/kubevirt.io/v1/${VMI_RESOURCE}`,
      labelSelector: `!${Labels.NodeName}`,
      resource: "unplaced virtualmachineinstances",
      onError: (error) => log.warn("Unplaced VMI watch interrupted, retrying: {error}", { error }),
    });
    const consider = (vmi: VirtualMachineInstance) => {
      if (wantsNode(vmi, this.#node)) void this.#claim(vmi);
    };
    this.#informer.addHandlers({ onAdd: consider, onUpdate: (_old, vmi) => consider(vmi) });
  }

  /** Watches unplaced VMIs until `signal` aborts. */
  run(signal: AbortSignal): Promise<void> {
    return this.#informer.run(signal);
  }

  async #claim(seen: VirtualMachineInstance): Promise<void> {
    const { namespace = "default", name } = seen.metadata;
    const key = `${namespace}/${name}`;
    if (this.#claiming.has(key)) return;
    this.#claiming.add(key);
    const path = `/apis/kubevirt.io/v1/namespaces/${
      encodeURIComponent(namespace)
    }/${VMI_RESOURCE}/${encodeURIComponent(name)}`;
    try {
      let vmi = seen;
      for (let attempt = 1;; attempt++) {
        if (!wantsNode(vmi, this.#node) || vmi.metadata.uid !== seen.metadata.uid) return;
        const labels = { ...vmi.metadata.labels, [Labels.NodeName]: this.#node };
        try {
          // The label and the Scheduled phase in one update, as virt-controller's own
          // scheduling step ends: the handler then starts the VMI at its first sync, with
          // no write of its own (and no watch round trip for it) in between.
          await this.#client.request("PUT", path, {
            ...vmi,
            metadata: { ...vmi.metadata, labels },
            status: scheduledStatus(vmi, this.#node, kubeTime()),
          });
          log.info("Placed VMI on this node (its nodeSelector names it)", {
            namespace,
            name,
            uid: vmi.metadata.uid,
          });
          return;
        } catch (error) {
          if (isApiStatus(error, 404)) return;
          if (!isApiStatus(error, 409) || attempt >= CLAIM_ATTEMPTS) throw error;
        }
        vmi = await this.#client.request<VirtualMachineInstance>("GET", path);
      }
    } catch (error) {
      log.error("Cannot place VMI on this node: {detail}", {
        namespace,
        name,
        detail: detailOf(error),
      });
    } finally {
      this.#claiming.delete(key);
    }
  }
}

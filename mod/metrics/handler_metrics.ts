/**
 * The handler's own families: whether it is ready, its work queue as client-go's
 * workqueue metrics report it (`kubevirt_workqueue_*`, `name` the queue's), its syncs by
 * outcome, and its Kubernetes client's requests and their latency
 * (`kubevirt_rest_client_*`).
 *
 * @module
 */
import type { QueueStats, RestLatency, RestRequestCount } from "../kube/mod.ts";
import { REST_LATENCY_BUCKETS } from "../kube/mod.ts";
import type { Exposition, FamilySpec } from "./exposition.ts";

/** The name of the VMI work queue, as virt-handler calls its queue. */
export const VMI_QUEUE_NAME = "virt-handler-vm";

const gauge = (name: string, help: string): FamilySpec => ({ name, help, type: "gauge" });
const counter = (name: string, help: string): FamilySpec => ({ name, help, type: "counter" });
const histogram = (name: string, help: string): FamilySpec => ({ name, help, type: "histogram" });

/** The handler's families. */
export const HANDLER_FAMILIES = {
  ready: gauge(
    "kubevirt_virt_handler_ready_status",
    "1 when the handler is ready to sync VMIs, 0 otherwise.",
  ),
  syncs: counter(
    "kubevirt_virt_handler_vmi_syncs_total",
    "VMI syncs since the handler started, by result.",
  ),
  depth: gauge("kubevirt_workqueue_depth", "Keys waiting in the work queue."),
  adds: counter("kubevirt_workqueue_adds_total", "Keys added to the work queue."),
  retries: counter(
    "kubevirt_workqueue_retries_total",
    "Keys put back on the work queue after a failed sync.",
  ),
  queueDuration: histogram(
    "kubevirt_workqueue_queue_duration_seconds",
    "How long keys waited in the work queue, seconds.",
  ),
  workDuration: histogram(
    "kubevirt_workqueue_work_duration_seconds",
    "How long syncs of a key took, seconds.",
  ),
  unfinished: gauge(
    "kubevirt_workqueue_unfinished_work_seconds",
    "Seconds of syncs in progress, summed over the keys being synced.",
  ),
  longest: gauge(
    "kubevirt_workqueue_longest_running_processor_seconds",
    "Seconds the longest sync in progress has run.",
  ),
  requests: counter(
    "kubevirt_rest_client_requests_total",
    "Requests to the apiserver, by status code, method, host, resource and verb.",
  ),
  latency: histogram(
    "kubevirt_rest_client_request_latency_seconds",
    "Latency of requests to the apiserver, seconds, by verb and URL template.",
  ),
  info: gauge("kubevirt_info", "Version information."),
  deprecatedMachineTypes: gauge(
    "kubevirt_node_deprecated_machine_types",
    "List of deprecated machine types based on the capabilities of individual nodes, as " +
      "detected by virt-handler.",
  ),
  refused: counter(
    "virtnode_notify_refused_total",
    "Launcher messages refused: a domain or Event about another VMI than the sender's, " +
      "a domain without a VMI UID, or an Event past the spam filter, by kind.",
  ),
} as const;

/** What {@linkcode addHandlerSamples} writes. */
export interface HandlerSnapshot {
  /**
   * `kubevirt_info`'s labels: the runtime's version where virt-handler gives Go's, and the
   * release where it gives KubeVirt's.
   */
  info?: { goversion: string; kubeversion: string };
  /** The node, and the machine types its QEMU calls deprecated. */
  machineTypes?: { node: string; deprecated: readonly string[] };
  /** Whether the handler is ready. */
  ready: boolean;
  /** Syncs by outcome. */
  syncs: { success: number; error: number };
  /** The VMI work queue's statistics. */
  queue: QueueStats;
  /** The Kubernetes client's request counts. */
  requests: RestRequestCount[];
  /** The Kubernetes client's latency series. */
  latencies: RestLatency[];
  /** Launcher messages refused, by kind (`domain`, `domain_without_uid`, `k8s_event`). */
  refused?: Record<string, number>;
}

/** Adds the handler's own samples. */
export function addHandlerSamples(exp: Exposition, s: HandlerSnapshot): void {
  const f = HANDLER_FAMILIES;
  if (s.info) exp.sample(f.info, s.info, 1);
  for (const machine of s.machineTypes?.deprecated ?? []) {
    exp.sample(f.deprecatedMachineTypes, { machine_type: machine, node: s.machineTypes!.node }, 1);
  }
  exp.sample(f.ready, {}, s.ready ? 1 : 0);
  exp.sample(f.syncs, { result: "success" }, s.syncs.success);
  exp.sample(f.syncs, { result: "error" }, s.syncs.error);
  for (const [kind, count] of Object.entries(s.refused ?? {})) {
    exp.sample(f.refused, { kind }, count);
  }
  const name = { name: VMI_QUEUE_NAME };
  exp.sample(f.depth, name, s.queue.depth);
  exp.sample(f.adds, name, s.queue.adds);
  exp.sample(f.retries, name, s.queue.retries);
  exp.histogram(f.queueDuration, name, s.queue.queueDuration);
  exp.histogram(f.workDuration, name, s.queue.workDuration);
  exp.sample(f.unfinished, name, s.queue.unfinishedWorkSeconds);
  exp.sample(f.longest, name, s.queue.longestRunningSeconds);
  for (const r of s.requests) {
    exp.sample(f.requests, {
      code: r.code,
      method: r.method,
      host: r.host,
      resource: r.resource,
      verb: r.verb,
    }, r.count);
  }
  for (const l of s.latencies) {
    exp.histogram(f.latency, { verb: l.verb, url: l.url }, {
      bounds: REST_LATENCY_BUCKETS,
      counts: l.counts,
      overflow: l.overflow,
      sum: l.sum,
    });
  }
}

/**
 * The Kubernetes side of the agent: a client with kubeconfig/in-cluster auth, a
 * list/watch informer that never stops silently, a client-go style rate-limited work
 * queue, expectations, a conflict-aware status writer, an aggregating event recorder
 * and node patching.
 *
 * @module
 */

export {
  KubeClient,
  type KubeClientOptions,
  type KubeCredentials,
  loadKubeClient,
  type RequestOptions,
  type StreamOptions,
} from "./client.ts";
export { handlerNamespace, KubevirtCrWatch, type KubevirtCrWatchOptions } from "./kubevirt_cr.ts";
export {
  detailOf,
  isApiStatus,
  KubeApiError,
  KubeConfigError,
  KubeConnectionError,
  PatchConflictError,
} from "./errors.ts";
export {
  EventRecorder,
  type EventRecorderOptions,
  EventSpamFilter,
  type EventSpamFilterOptions,
  type EventType,
  type KubeEvent,
} from "./events.ts";
export { Expectations, EXPECTATIONS_TTL_MS, type ExpectationsOptions } from "./expectations.ts";
export {
  Informer,
  type InformerBackoff,
  type InformerHandlers,
  type InformerOptions,
  jsonLines,
} from "./informer.ts";
export {
  type JsonPatchOp,
  jsonPointerEscape,
  type NodeMetadataPatch,
  type NodePatchOptions,
  patchNodeJson,
  patchNodeMetadata,
  replaceMapWithTest,
} from "./node.ts";
export {
  BucketRateLimiter,
  defaultControllerRateLimiter,
  ItemExponentialRateLimiter,
  MaxOfRateLimiter,
  QUEUE_DURATION_BUCKETS,
  type QueueHistogram,
  type QueueStats,
  type RateLimiter,
  WorkQueue,
  type WorkQueueOptions,
} from "./queue.ts";
export {
  desiredStatus,
  jsonEqual,
  StatusConflictError,
  StatusDroppedError,
  type StatusMutation,
  StatusWriter,
  type StatusWriteResult,
  type StatusWriterOptions,
} from "./status_writer.ts";
export {
  type KubeList,
  type KubeObject,
  objectKey,
  type ObjectMeta,
  resourcePath,
  type ResourcePathOptions,
  splitKey,
  type WatchEvent,
} from "./types.ts";
export {
  describeRequest,
  REST_LATENCY_BUCKETS,
  RestClientStats,
  restClientStats,
  type RestLatency,
  type RestRequestCount,
} from "./rest_stats.ts";
export { type RateLimit, TokenBucket, usableRateLimit } from "./rate_limit.ts";

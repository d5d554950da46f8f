/**
 * What the process's Kubernetes client did, for the handler's metrics: requests counted
 * by status code, method, host, resource and verb, and their latency by verb and URL
 * template (names and namespaces replaced, so one VMI more adds no series), as KubeVirt's
 * `kubevirt_rest_client_*` families break them down.
 *
 * @module
 */

/** The latency buckets, seconds (the apiserver's request duration buckets). */
export const REST_LATENCY_BUCKETS: readonly number[] = [
  0.005,
  0.025,
  0.05,
  0.1,
  0.2,
  0.4,
  0.6,
  0.8,
  1,
  1.25,
  1.5,
  2,
  3,
  4,
  5,
  6,
  8,
  10,
  15,
  20,
  30,
  45,
  60,
];

/** One request counter's labels and count. */
export interface RestRequestCount {
  /** The HTTP status, or `<error>` when none came. */
  code: string;
  /** The HTTP method. */
  method: string;
  /** The apiserver's host and port. */
  host: string;
  /** The resource, e.g. `virtualmachineinstances`. */
  resource: string;
  /** The Kubernetes verb, e.g. `update`. */
  verb: string;
  /** Requests so far. */
  count: number;
}

/** One latency series. */
export interface RestLatency {
  /** The Kubernetes verb. */
  verb: string;
  /** The path with namespaces and names replaced. */
  url: string;
  /** Requests per bucket of {@linkcode REST_LATENCY_BUCKETS} (not cumulative). */
  counts: number[];
  /** Requests slower than the last bucket. */
  overflow: number;
  /** Total seconds. */
  sum: number;
}

/** The resource and URL template of an API path, and the verb of a request on it. */
export function describeRequest(
  method: string,
  path: string,
  watch: boolean,
): { resource: string; url: string; verb: string } {
  const parts = path.split("?")[0].split("/").filter(Boolean);
  // /api/v1/... or /apis/<group>/<version>/...
  let i = parts[0] === "api" ? 2 : parts[0] === "apis" ? 3 : parts.length;
  const template = parts.slice(0, i);
  if (parts[i] === "watch") template.push(parts[i++]);
  if (parts[i] === "namespaces" && parts.length > i + 2) {
    template.push("namespaces", "{namespace}");
    i += 2;
  }
  const resource = parts[i] ?? "";
  if (resource) template.push(resource);
  const named = parts.length > i + 1;
  if (named) template.push("{name}", ...parts.slice(i + 2));
  const verbs: Record<string, string> = {
    POST: "create",
    PUT: "update",
    PATCH: "patch",
    DELETE: named ? "delete" : "deletecollection",
  };
  const verb = method === "GET"
    ? (watch ? "watch" : named ? "get" : "list")
    : verbs[method] ?? method.toLowerCase();
  return { resource, url: "/" + template.join("/"), verb };
}

/** Counts and times the client's requests; see the module doc. */
export class RestClientStats {
  readonly #counts = new Map<string, RestRequestCount>();
  readonly #latency = new Map<string, RestLatency>();

  /** Records one answered request (`code` is the status, or `<error>` when none came). */
  record(o: { method: string; url: URL; code: string; seconds: number }): void {
    const watch = o.url.searchParams.get("watch") === "true";
    const d = describeRequest(o.method, o.url.pathname, watch);
    const labels = {
      code: o.code,
      method: o.method,
      host: o.url.host,
      resource: d.resource,
      verb: d.verb,
    };
    const key = JSON.stringify(labels);
    const entry = this.#counts.get(key) ?? { ...labels, count: 0 };
    entry.count++;
    this.#counts.set(key, entry);
    const lkey = `${d.verb} ${d.url}`;
    const latency = this.#latency.get(lkey) ??
      { verb: d.verb, url: d.url, counts: REST_LATENCY_BUCKETS.map(() => 0), overflow: 0, sum: 0 };
    latency.sum += o.seconds;
    const b = REST_LATENCY_BUCKETS.findIndex((bound) => o.seconds <= bound);
    if (b < 0) latency.overflow++;
    else latency.counts[b]++;
    this.#latency.set(lkey, latency);
  }

  /** The counters now. */
  requests(): RestRequestCount[] {
    return [...this.#counts.values()].map((c) => ({ ...c }));
  }

  /** The latency series now. */
  latencies(): RestLatency[] {
    return [...this.#latency.values()].map((l) => ({ ...l, counts: [...l.counts] }));
  }
}

/** The process's client statistics (every {@linkcode KubeClient} records here). */
export const restClientStats: RestClientStats = new RestClientStats();

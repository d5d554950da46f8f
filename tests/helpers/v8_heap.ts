/**
 * The V8 heap of a Deno process started with `--inspect=127.0.0.1:<port>`, read through
 * the DevTools protocol: live bytes after a full garbage collection, which is what a leak
 * adds to (RSS also moves with the collector's timing and the allocators' free lists), and
 * least-squares slopes of memory samples for soak tests.
 *
 * @module
 */

/** The inspector of a process could not be reached or did not answer. */
export class InspectorError extends Error {
  /** Creates the error. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "InspectorError";
  }
}

/** One DevTools protocol session with a process's main isolate. */
export interface HeapProbe {
  /** Collects garbage, then returns the heap's live bytes. */
  usedAfterGc(): Promise<number>;
  /** Ends the session (the process runs on). */
  close(): void;
}

/** How long one protocol call may take, ms (a full collection of a large heap is slow). */
const CALL_TIMEOUT_MS = 60_000;

/**
 * Opens a session with the inspector on loopback `port`; waits up to `timeoutMs` for it
 * to list its target.
 */
export async function openHeapProbe(port: number, timeoutMs = 30_000): Promise<HeapProbe> {
  const deadline = Date.now() + timeoutMs;
  let url: string | undefined;
  let last: unknown;
  while (!url) {
    try {
      const r = await fetch(`http://127.0.0.1:${port}/json/list`);
      const targets = await r.json() as { webSocketDebuggerUrl?: string }[];
      url = targets[0]?.webSocketDebuggerUrl;
    } catch (error) {
      last = error;
    }
    if (!url && Date.now() > deadline) {
      throw new InspectorError(`Cannot find the inspector's target on port ${port}`, {
        cause: last,
      });
    }
    if (!url) await new Promise((r) => setTimeout(r, 200));
  }
  const ws = new WebSocket(url);
  await new Promise<void>((resolve, reject) => {
    ws.onopen = () => resolve();
    ws.onerror = (e) =>
      reject(new InspectorError(`Cannot open the inspector session "${url}"`, { cause: e }));
  });
  let nextId = 0;
  const pending = new Map<number, (answer: { result?: unknown; error?: unknown }) => void>();
  ws.onmessage = (e) => {
    const m = JSON.parse(e.data as string);
    if (typeof m.id === "number") {
      pending.get(m.id)?.(m);
      pending.delete(m.id);
    }
  };
  ws.onclose = () => {
    for (const answer of pending.values()) answer({ error: "the session closed" });
    pending.clear();
  };
  const call = (method: string): Promise<Record<string, unknown>> => {
    const id = ++nextId;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        pending.delete(id);
        reject(new InspectorError(`Cannot call "${method}": no answer in ${CALL_TIMEOUT_MS} ms`));
      }, CALL_TIMEOUT_MS);
      pending.set(id, (answer) => {
        clearTimeout(timer);
        if (answer.error !== undefined) {
          reject(
            new InspectorError(`Cannot call "${method}": ${JSON.stringify(answer.error)}`),
          );
        } else resolve((answer.result ?? {}) as Record<string, unknown>);
      });
      if (ws.readyState !== WebSocket.OPEN) {
        pending.get(id)!({ error: "the session is not open" });
        return;
      }
      ws.send(JSON.stringify({ id, method, params: {} }));
    });
  };
  return {
    async usedAfterGc() {
      // A session keeps console messages for DevTools: drop them, they are not the process's.
      await call("Runtime.discardConsoleEntries");
      await call("HeapProfiler.collectGarbage");
      const usage = await call("Runtime.getHeapUsage");
      if (typeof usage.usedSize !== "number") {
        throw new InspectorError(`Cannot read the heap's size: ${JSON.stringify(usage)}`);
      }
      return usage.usedSize;
    },
    close() {
      ws.close();
    },
  };
}

/** One sample of a quantity over time. */
export interface TimedValue {
  /** When, ms (any clock that only moves forward). */
  atMs: number;
  /** The value, bytes. */
  value: number;
}

/**
 * The least-squares slope of `samples` in MB (10^6 bytes) per hour; NaN with fewer than
 * two distinct times.
 */
export function slopeMbPerHour(samples: readonly TimedValue[]): number {
  const n = samples.length;
  if (n < 2) return NaN;
  const hours = samples.map((s) => s.atMs / 3_600_000);
  const mb = samples.map((s) => s.value / 1e6);
  const meanX = hours.reduce((a, b) => a + b, 0) / n;
  const meanY = mb.reduce((a, b) => a + b, 0) / n;
  let sxy = 0;
  let sxx = 0;
  for (let i = 0; i < n; i++) {
    sxy += (hours[i] - meanX) * (mb[i] - meanY);
    sxx += (hours[i] - meanX) ** 2;
  }
  return sxx === 0 ? NaN : sxy / sxx;
}

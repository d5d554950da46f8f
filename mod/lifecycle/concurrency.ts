/**
 * Bounded concurrency, written once: many calls out (to launchers, to a launcher host's
 * instances) with at most a set number in flight.
 *
 * @module
 */

/**
 * Calls `fn` for each item with at most `limit` calls in flight, each taking the next item
 * as soon as one ends (no batch waits for its slowest member). Resolves when every call
 * has ended; a call that rejects rejects the whole, after the calls in flight end, so
 * `fn` catches what it means to survive.
 */
export async function forEachLimited<T>(
  items: readonly T[],
  limit: number,
  fn: (item: T, index: number) => Promise<void>,
): Promise<void> {
  let next = 0;
  let failure: { error: unknown } | undefined;
  const lane = async () => {
    while (next < items.length && !failure) {
      const i = next++;
      try {
        await fn(items[i], i);
      } catch (error) {
        failure ??= { error };
      }
    }
  };
  const lanes = Math.max(1, Math.min(Math.floor(limit), items.length));
  await Promise.all(Array.from({ length: lanes }, lane));
  if (failure) throw failure.error;
}

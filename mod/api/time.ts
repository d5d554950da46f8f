/**
 * Timestamps as Kubernetes' `metav1.Time` writes them.
 *
 * @module
 */

/**
 * `date` as RFC 3339 in UTC to the second, e.g. `2026-12-02T07:38:24Z`, as Go's
 * `metav1.Time` marshals it. A status field written with milliseconds reads back into
 * virt-controller's Go types without them, so its JSON patches that test the field's old
 * value would fail (422) for as long as the field stays.
 */
export function kubeTime(date: Date = new Date()): string {
  return date.toISOString().replace(/\.\d+Z$/, "Z");
}

/**
 * The conformance tier reads KubeVirt's suite's Ginkgo JUnit report: only the specs the
 * filters selected count, a spec that skipped itself says why, a failure's first line is
 * kept (with what follows a Gomega line ending in a colon), and a failed set-up node is reported too.
 */
import assert from "node:assert/strict";
import { parseGinkgoJunit, summaryLine } from "../helpers/kubevirt_suite.ts";

const REPORT = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="5">
  <testsuite name="KubeVirt Tests Suite">
    <testcase name="[SynchronizedBeforeSuite]" classname="KubeVirt Tests Suite" status="passed" time="3"></testcase>
    <testcase name="[It] VMIlifecycle should start [sig-compute, conformance]" classname="KubeVirt Tests Suite" status="passed" time="12.5"></testcase>
    <testcase name="[It] Console should close &quot;old&quot; connection [conformance]" classname="KubeVirt Tests Suite" status="failed" time="200">
      <failure message="Timed out after 180.001s.&#xA;Expected VMI to be Running" type="failed">[FAILED] Timed out after 180.001s.</failure>
    </testcase>
    <testcase name="[It] Guest login [conformance]" classname="KubeVirt Tests Suite" status="failed" time="20">
      <failure message="Expected success, but got an error:&#xA;    &lt;*errors.errorString | 0xc0&gt;: &#xA;    login failed: timeout&#xA;    {s: &quot;login failed&quot;}" type="failed"></failure>
    </testcase>
    <testcase name="[It] Networking IPv6 spec [conformance]" classname="KubeVirt Tests Suite" status="skipped" time="0.2">
      <skipped message="skipped - Cluster has no IPv6 support"></skipped>
    </testcase>
    <testcase name="[It] Not selected [sig-storage]" classname="KubeVirt Tests Suite" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
    <testcase name="[It] Pending one" classname="KubeVirt Tests Suite" status="pending" time="0"></testcase>
    <testcase name="[SynchronizedAfterSuite]" classname="KubeVirt Tests Suite" status="failed" time="1">
      <failure message="namespaces were not deleted" type="failed"></failure>
    </testcase>
  </testsuite>
</testsuites>`;

Deno.test("a Ginkgo report gives the selected specs' outcomes and the failed set-up nodes", () => {
  const results = parseGinkgoJunit(REPORT);
  assert.deepEqual(results.map((r) => [r.name, r.status, r.reason, r.setup]), [
    ["VMIlifecycle should start [sig-compute, conformance]", "passed", undefined, undefined],
    [
      'Console should close "old" connection [conformance]',
      "failed",
      "Timed out after 180.001s.",
      undefined,
    ],
    [
      "Guest login [conformance]",
      "failed",
      "Expected success, but got an error: <*errors.errorString | 0xc0>: login failed: timeout",
      undefined,
    ],
    ["Networking IPv6 spec [conformance]", "skipped", "Cluster has no IPv6 support", undefined],
    ["[SynchronizedAfterSuite]", "failed", "namespaces were not deleted", true],
  ]);
  assert.equal(
    summaryLine("virtnode", results),
    "KubeVirt v1.7.0 conformance, substitute guests (virtnode): 1 passed, 2 failed, 1 skipped of 4",
  );
});

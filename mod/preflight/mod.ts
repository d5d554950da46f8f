/**
 * `virtnode check`: a preflight for operators, in the spirit of
 * `virt-host-validate`. Each check prints one line, PASS, WARN or FAIL, with the
 * reason; any FAIL makes the command exit non-zero.
 *
 * The checks take their probes as arguments so the composition root decides
 * what libvirt and Kubernetes code is loaded, and tests can run them for real.
 *
 * @module
 */

export {
  checkKvm,
  type CheckResult,
  checkSecurityDriver,
  checkWritableDir,
  CONFINING_SECURITY_MODELS,
  formatReport,
  type PreflightOptions,
  type PreflightProbes,
  runPreflight,
  SECURITY_DRIVER_CHECK,
  securityModels,
  type Verdict,
} from "./preflight.ts";
export { hostProbes } from "./probes.ts";

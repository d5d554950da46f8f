/**
 * The probes `virtnode check` and `virtnode version` run against this host: libvirt
 * through `ffi/` (its test driver needs no daemon) and the apiserver through
 * `mod/kube`, each loaded only when asked.
 *
 * @module
 */
import type { PreflightProbes } from "./preflight.ts";

function dotted(v: { major: number; minor: number; release: number }): string {
  return `${v.major}.${v.minor}.${v.release}`;
}

/**
 * The real probes: libvirt's library and hypervisor versions and capabilities, the
 * apiserver's version.
 */
export const hostProbes: PreflightProbes = {
  async libvirtVersion() {
    const { openLibvirt } = await import("../../ffi/mod.ts");
    const conn = await openLibvirt("test:///default", { events: false, workers: 1 });
    try {
      return dotted(await conn.getLibVersion());
    } finally {
      await conn.close();
    }
  },
  async openLibvirt(uri) {
    const { openLibvirt } = await import("../../ffi/mod.ts");
    const conn = await openLibvirt(uri, { events: false, workers: 1 });
    try {
      return `connected, hypervisor version ${dotted(await conn.getHypervisorVersion())}`;
    } finally {
      await conn.close();
    }
  },
  async capabilities(uri) {
    const { openLibvirt } = await import("../../ffi/mod.ts");
    const conn = await openLibvirt(uri, { events: false, workers: 1 });
    try {
      return await conn.getCapabilities();
    } finally {
      await conn.close();
    }
  },
  async apiserverVersion(kubeconfig) {
    const { loadKubeClient } = await import("../kube/mod.ts");
    const client = await loadKubeClient({ kubeconfigPath: kubeconfig, timeoutMs: 5_000 });
    try {
      const v = await client.request<{ gitVersion: string }>("GET", "/version");
      return `Kubernetes ${v.gitVersion}`;
    } finally {
      client.close();
    }
  },
};

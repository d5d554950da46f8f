/**
 * Pod-less mode's side of the handler: no kubelet and no virt-controller. The handler
 * starts the launcher host ({@linkcode PodlessLaunchers}), places Pending VMIs on its own
 * node ({@linkcode PodlessScheduler}), keeps the VMIs of the VirtualMachines placed on it
 * ({@linkcode PodlessVms}) and drives migrations between nodes ({@linkcode PodlessMigrations}),
 * the parts virt-controller plays in KubeVirt mode.
 *
 * @module
 */
export { type HostSettings, PodlessLaunchers, type PodlessLaunchersOptions } from "./launchers.ts";
export { PodlessMigrations, type PodlessMigrationsOptions } from "./migrations.ts";
export { networkAttachmentConfig } from "./network_attachments.ts";
export { PodlessScheduler } from "./scheduler.ts";
export { PodlessVms, type PodlessVmsOptions } from "./vms.ts";
export { CredentialSecretError, type CredentialSecrets, type SecretReader } from "./credentials.ts";
export type { ProbeLauncher, ProberOptions } from "./prober.ts";
// The core's types that these classes' members name.
export type * from "../launcher_provider.ts";
export type { DialResolver, DialTarget } from "../launcher_clients.ts";
export type { ReconcileResult } from "../controller.ts";

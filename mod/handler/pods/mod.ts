/**
 * KubeVirt mode's side of the handler: virt-controller makes a launcher pod per VMI and
 * the kubelet runs it. {@linkcode PodLaunchers} finds each pod's launcher and serves it
 * what a pod cannot do for itself: the notify pipe, container-disk and hotplug mounts,
 * device ownership and the pod's device cgroup. Nothing here starts a launcher.
 *
 * @module
 */
export { PodLaunchers, type PodLaunchersOptions } from "./launchers.ts";
// The core's types that PodLaunchers' members name.
export type * from "../launcher_provider.ts";
export type { DialResolver, DialTarget } from "../launcher_clients.ts";
export type { DomainNotification, K8sEventNotification, NotifyHandlers } from "../notify_server.ts";

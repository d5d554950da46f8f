/**
 * virtnode's FFI layer: libvirt (through call workers and libvirt's event loop) and the
 * libc calls privileged node work needs (namespaces, mounts, ownership, peer credentials).
 *
 * @module
 */

export * from "./errors.ts";
export * from "./libvirt.ts";
export * from "./libvirt_constants.ts";
export * from "./files.ts";
export * from "./namespaces.ts";
export * from "./libc.ts";
export * from "./mntns.ts";
export * from "./cgroup_devices.ts";
export * from "./processes.ts";
export * from "./sockets.ts";
export { mountNamespaceChild } from "./_mntns_child.ts";
export * from "./beneath.ts";
export * from "./netns.ts";
export * from "./datagram.ts";
export { answerCalls, CallWorker, WorkerPool } from "./worker_pool.ts";
export type {
  CallOps,
  CallOptions,
  CallRequest,
  CallWorkerOptions,
  WorkerPoolOptions,
} from "./worker_pool.ts";
export * from "./durable_file.ts";

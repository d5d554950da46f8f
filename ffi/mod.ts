/**
 * virtnode's FFI layer: libvirt (through call workers and libvirt's event loop) and the
 * libc calls privileged node work needs, one concern per file:
 *
 * - `files.ts`: descriptors, and files and paths beneath a root (`openat2`);
 *   `beneath.ts`: a socket or a directory opened beneath a root;
 * - `namespaces.ts`: `setns` and `unshare` of the calling thread;
 * - `mounts.ts`: the agent's bind mounts, and mounts attached beneath a process's root;
 * - `mntns.ts` and `netns.ts`: work inside a mount namespace (in a child process) or a
 *   network namespace (on a worker thread), the agent's own threads never moved;
 * - `processes.ts`: pidfds, signals, start times, close-on-exec, locked-memory limits;
 * - `sockets.ts`: unix and UDP sockets; `datagram.ts`: one wait over many UDP sockets;
 * - `cgroup_devices.ts`: cgroup v2 device programs (eBPF);
 * - `durable_file.ts`: the agent's own state files, written whole and durably.
 *
 * @module
 */

export * from "./errors.ts";
export * from "./libvirt.ts";
export * from "./libvirt_constants.ts";
export * from "./files.ts";
export * from "./namespaces.ts";
export * from "./mounts.ts";
export * from "./mntns.ts";
export * from "./processes.ts";
export * from "./scheduling.ts";
export * from "./sockets.ts";
export * from "./cgroup_devices.ts";
export { mountNamespaceChild } from "./mntns_child.ts";
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

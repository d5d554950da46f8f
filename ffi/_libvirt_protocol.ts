/**
 * The message protocol between the main thread and a libvirt call worker. Private to `ffi/`.
 *
 * Every libvirt call that can fail runs inside a worker, on that worker's one OS thread,
 * together with the read of libvirt's per-thread last error.
 *
 * @module
 */

import type { LibvirtErrorDetails } from "./errors.ts";

/** A domain as the worker reports it: enough to find it again. */
export interface DomainRef {
  /** Domain name. */
  name: string;
  /** Domain UUID in its canonical string form. */
  uuid: string;
}

/** A domain with its state, as listed by `virConnectListAllDomains`. */
export interface RawDomainSummary extends DomainRef {
  /** Hypervisor ID, or -1 when not running. */
  id: number;
  /** `virDomainState`. */
  state: number;
  /** The state's reason number. */
  reason: number;
}

/** A typed parameter value as a plain JavaScript value. */
export type TypedParamValue = number | bigint | boolean | string;

/** One record of `virConnectGetAllDomainStats`. */
export interface RawDomainStats extends DomainRef {
  /** Typed parameters by field name, e.g. `state.state`, `cpu.time`. */
  params: Record<string, TypedParamValue>;
}

/** Arguments of `virConnectGetDomainCapabilities` and `virConnectBaselineHypervisorCPU`. */
export interface HostCpuQuery {
  /** Emulator binary path. */
  emulator?: string;
  /** Architecture, e.g. `x86_64`. */
  arch?: string;
  /** Machine type, e.g. `pc`. */
  machine?: string;
  /** Virtualization type, e.g. `qemu` or `kvm`. */
  virttype?: string;
}

/** The operations a worker performs, each a synchronous libvirt sequence. */
export interface WorkerOps {
  init(libraryPath: string, qemuLibraryPath: string): void;
  open(uri: string, readOnly: boolean): bigint;
  attach(conn: bigint): void;
  closeConnection(): number;
  openEvents(
    uri: string,
    readOnly: boolean,
    keepAliveInterval: number,
    keepAliveCount: number,
  ): void;
  closeEvents(): number;
  setKeepAlive(interval: number, count: number): number;
  isAlive(): boolean;
  registerCloseCallback(cb: bigint): void;
  unregisterCloseCallback(cb: bigint): void;
  eventRegister(eventId: number, cb: bigint): number;
  eventDeregister(callbackId: number): void;
  libVersion(): number;
  hypervisorVersion(): number;
  capabilities(): string;
  domainCapabilities(query: HostCpuQuery, flags: number): string;
  baselineHypervisorCPU(query: HostCpuQuery, cpuXmls: string[], flags: number): string;
  defineXML(xml: string): DomainRef;
  createXML(xml: string, flags: number): DomainRef;
  lookupByName(name: string): DomainRef;
  lookupByUUID(uuid: string): DomainRef;
  listAll(flags: number): RawDomainSummary[];
  allDomainStats(stats: number, flags: number): RawDomainStats[];
  domainStats(uuid: string, stats: number, flags: number): RawDomainStats | null;
  domainCreate(uuid: string, flags: number): void;
  domainState(uuid: string): [number, number];
  domainXML(uuid: string, flags: number): string;
  domainShutdown(uuid: string, flags: number): void;
  domainDestroy(uuid: string, flags: number): void;
  domainUndefine(uuid: string, flags: number): void;
  domainSuspend(uuid: string): void;
  domainResume(uuid: string): void;
  domainReset(uuid: string): void;
  domainAttachDevice(uuid: string, xml: string, flags: number): void;
  domainUpdateDevice(uuid: string, xml: string, flags: number): void;
  domainSetVcpus(uuid: string, count: number, flags: number): void;
  domainPinVcpu(uuid: string, vcpu: number, cpus: number[], flags: number): void;
  domainCoreDump(uuid: string, path: string, format: number, flags: number): void;
  domainSetTime(uuid: string, seconds: number, nanoseconds: number): void;
  domainDetachDevice(uuid: string, xml: string, flags: number): void;
  domainReboot(uuid: string, flags: number): void;
  domainAgentCommand(uuid: string, command: string, timeout: number, flags: number): string;
  domainFsFreeze(uuid: string): number;
  domainFsThaw(uuid: string): number;
  domainScreenshot(uuid: string, screen: number): { mime: string; data: Uint8Array };
  domainMigrateToURI3(
    uuid: string,
    dconnuri: string,
    params: MigrateParam[],
    flags: number,
  ): void;
  domainJobStats(
    uuid: string,
    flags: number,
  ): { type: number; params: Record<string, TypedParamValue> };
  domainAbortJob(uuid: string): void;
  domainVcpuPinInfo(uuid: string): boolean[][];
  domainStartDirtyRateCalc(uuid: string, seconds: number, flags: number): void;
  domainMigrateSetMaxDowntime(uuid: string, milliseconds: number): void;
  domainMigrateStartPostCopy(uuid: string): void;
}

/**
 * One migration parameter (`VIR_MIGRATE_PARAM_*`): a string value is a string parameter
 * (several of one name make a list, as `migrate_disks`), a bigint an unsigned long long
 * (`bandwidth`), a number an int (`parallel.connections`).
 */
export type MigrateParam = [name: string, value: string | bigint | number];

/** Name of a worker operation. */
export type OpName = keyof WorkerOps;

/** A request from the main thread. */
export interface WorkerRequest {
  /** Correlates the response. */
  id: number;
  /** The operation. */
  op: OpName;
  /** Its arguments. */
  args: unknown[];
}

/** Why a worker operation failed. */
export type WorkerFailure =
  | { kind: "libvirt"; details: LibvirtErrorDetails }
  | { kind: "load"; library: string; detail: string }
  | { kind: "internal"; message: string };

/** A response from the worker. */
export type WorkerResponse =
  | { id: number; ok: true; value: unknown }
  | { id: number; ok: false; failure: WorkerFailure };

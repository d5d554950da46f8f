/**
 * A libvirt call worker. Runs on one OS thread of its own, so a failing call and the read
 * of libvirt's per-thread last error always happen on the same thread. Private to `ffi/`.
 *
 * @module
 */

/// <reference lib="deno.worker" />

import type { LibvirtErrorDetails } from "./errors.ts";
import {
  cstr,
  type LibcFreeLibrary,
  type LibvirtLibrary,
  type LibvirtQemuLibrary,
  loadLibcFree,
  loadLibvirt,
  loadLibvirtQemu,
  readCString,
} from "./_libvirt_symbols.ts";
import type {
  DomainRef,
  HostCpuQuery,
  RawDomainStats,
  RawDomainSummary,
  TypedParamValue,
  WorkerFailure,
  WorkerOps,
  WorkerRequest,
  WorkerResponse,
} from "./_libvirt_protocol.ts";
import { errorText, LibvirtLoadError } from "./errors.ts";

/** Thrown inside the worker with the failure already captured from libvirt. */
class Failure extends Error {
  readonly failure: WorkerFailure;
  constructor(failure: WorkerFailure) {
    super("libvirt call failed");
    this.failure = failure;
  }
}

let lib: LibvirtLibrary | null = null;
let libc: LibcFreeLibrary | null = null;
let qemu: LibvirtQemuLibrary | null = null;
let qemuLoadError: LibvirtLoadError | null = null;
let qemuPath = "";
let conn: Deno.PointerValue = null;
/**
 * A second connection that only carries domain events (first worker only, when asked): a
 * call that hangs on `conn` holds libvirt's client I/O for that socket, and events queued
 * behind it would wait for the next keepalive (5 s) to be read.
 */
let eventConn: Deno.PointerValue = null;
/** Buffers that native code points into during a call; see `baselineHypervisorCPU`. */
const retained = new Set<unknown>();

function vir(): LibvirtLibrary["symbols"] {
  if (lib === null) throw new Failure({ kind: "internal", message: "worker not initialised" });
  return lib.symbols;
}

function connection(): Deno.PointerObject {
  if (conn === null) throw new Failure({ kind: "internal", message: "connection is closed" });
  return conn;
}

/** Captures libvirt's last error of this thread and clears it. Call right after a failure. */
function lastError(): Failure {
  const s = vir();
  const err = s.virGetLastError();
  let details: LibvirtErrorDetails;
  if (err === null) {
    details = { code: -1, domain: 0, level: 2, message: "unknown error (libvirt reported none)" };
  } else {
    const view = new Deno.UnsafePointerView(err);
    details = {
      code: view.getInt32(0),
      domain: view.getInt32(4),
      message: readCString(view.getPointer(8)) ?? "",
      level: view.getInt32(16),
    };
  }
  s.virResetLastError();
  return new Failure({ kind: "libvirt", details });
}

function checkInt(rc: number): number {
  if (rc < 0) throw lastError();
  return rc;
}

function checkPtr(ptr: Deno.PointerValue): Deno.PointerObject {
  if (ptr === null) throw lastError();
  return ptr;
}

/** Reads and frees a string libvirt allocated for us. */
function takeString(ptr: Deno.PointerValue): string {
  const p = checkPtr(ptr);
  try {
    return Deno.UnsafePointerView.getCString(p);
  } finally {
    libc!.symbols.free(p);
  }
}

function domainRef(dom: Deno.PointerObject): DomainRef {
  const s = vir();
  const uuid = new Uint8Array(37);
  checkInt(s.virDomainGetUUIDString(dom, uuid));
  return {
    name: readCString(checkPtr(s.virDomainGetName(dom))) ?? "",
    uuid: new TextDecoder().decode(uuid.subarray(0, 36)),
  };
}

/** Looks up a domain, runs `fn` and frees the domain object again. */
/** The largest screenshot read from a stream (a 4K frame as PPM is 24 MiB). */
const SCREENSHOT_LIMIT = 64 * 1024 * 1024;

/**
 * The `n` records of a `virDomainStatsRecordPtr` list at `address`, read into plain
 * objects; the list, its typed parameters and its domain objects are freed.
 */
function readStatsRecords(address: bigint, n: number): RawDomainStats[] {
  const records = Deno.UnsafePointer.create(address);
  if (records === null) return [];
  const result: RawDomainStats[] = [];
  try {
    const list = new Deno.UnsafePointerView(records);
    for (let i = 0; i < n; i++) {
      const rec = list.getPointer(i * 8);
      if (rec === null) break;
      const rv = new Deno.UnsafePointerView(rec);
      const dom = rv.getPointer(0);
      const params = rv.getPointer(8);
      const nparams = rv.getInt32(16);
      const ref = dom === null ? { name: "", uuid: "" } : domainRef(dom);
      const values: Record<string, TypedParamValue> = {};
      if (params !== null) {
        const pv = new Deno.UnsafePointerView(params);
        for (let j = 0; j < nparams; j++) {
          const [k, v] = readTypedParam(pv, j * TYPED_PARAM_SIZE);
          values[k] = v;
        }
      }
      result.push({ ...ref, params: values });
    }
  } finally {
    vir().virDomainStatsRecordListFree(records);
  }
  return result;
}

function withDomain<T>(uuid: string, fn: (dom: Deno.PointerObject) => T): T {
  const s = vir();
  const dom = checkPtr(s.virDomainLookupByUUIDString(connection(), cstr(uuid)));
  try {
    return fn(dom);
  } finally {
    s.virDomainFree(dom);
  }
}

/** Turns a domain pointer we own into a ref and frees it. */
function refAndFree(dom: Deno.PointerObject): DomainRef {
  try {
    return domainRef(dom);
  } finally {
    vir().virDomainFree(dom);
  }
}

const TYPED_PARAM_SIZE = 96; // char field[80]; int type; (pad); union value (8 bytes)

function readTypedParam(view: Deno.UnsafePointerView, offset: number): [string, TypedParamValue] {
  const field = view.getCString(offset);
  const type = view.getInt32(offset + 80);
  const at = offset + 88;
  switch (type) {
    case 1:
      return [field, view.getInt32(at)];
    case 2:
      return [field, view.getUint32(at)];
    case 3: {
      const v = view.getBigInt64(at);
      return [field, Number.isSafeInteger(Number(v)) ? Number(v) : v];
    }
    case 4: {
      const v = view.getBigUint64(at);
      return [field, v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v];
    }
    case 5:
      return [field, view.getFloat64(at)];
    case 6:
      return [field, view.getInt8(at) !== 0];
    case 7:
      return [field, readCString(view.getPointer(at)) ?? ""];
    default:
      return [field, `<unknown typed parameter type ${type}>`];
  }
}

function optional(s: string | undefined): Uint8Array<ArrayBuffer> | null {
  return cstr(s ?? null);
}

const ops: WorkerOps = {
  init(libraryPath, qemuLibraryPath) {
    lib = loadLibvirt(libraryPath);
    libc = loadLibcFree();
    qemuPath = qemuLibraryPath;
  },
  open(uri, readOnly) {
    const s = vir();
    const p = checkPtr(
      readOnly ? s.virConnectOpenReadOnly(cstr(uri)) : s.virConnectOpen(cstr(uri)),
    );
    conn = p;
    return BigInt(Deno.UnsafePointer.value(p));
  },
  attach(value) {
    const p = Deno.UnsafePointer.create(value);
    checkInt(vir().virConnectRef(p));
    conn = p;
  },
  openEvents(uri, readOnly, keepAliveInterval, keepAliveCount) {
    const s = vir();
    const p = checkPtr(
      readOnly ? s.virConnectOpenReadOnly(cstr(uri)) : s.virConnectOpen(cstr(uri)),
    );
    if (
      keepAliveInterval > 0 && s.virConnectSetKeepAlive(p, keepAliveInterval, keepAliveCount) < 0
    ) {
      const failure = lastError();
      s.virConnectClose(p);
      throw failure;
    }
    eventConn = p;
  },
  closeEvents() {
    if (eventConn === null) return 0;
    const p = eventConn;
    eventConn = null;
    return checkInt(vir().virConnectClose(p));
  },
  closeConnection() {
    if (conn === null) return 0;
    const p = conn;
    conn = null;
    return checkInt(vir().virConnectClose(p));
  },
  setKeepAlive(interval, count) {
    return checkInt(vir().virConnectSetKeepAlive(connection(), interval, count));
  },
  isAlive() {
    return checkInt(vir().virConnectIsAlive(connection())) === 1;
  },
  registerCloseCallback(cb) {
    // On the event connection too: either closing is the daemon gone.
    for (const p of [connection(), eventConn]) {
      if (p === null) continue;
      checkInt(vir().virConnectRegisterCloseCallback(p, Deno.UnsafePointer.create(cb), null, null));
    }
  },
  unregisterCloseCallback(cb) {
    for (const p of [connection(), eventConn]) {
      if (p === null) continue;
      checkInt(vir().virConnectUnregisterCloseCallback(p, Deno.UnsafePointer.create(cb)));
    }
  },
  eventRegister(eventId, cb) {
    const fn = Deno.UnsafePointer.create(cb);
    return checkInt(
      vir().virConnectDomainEventRegisterAny(
        eventConn ?? connection(),
        null,
        eventId,
        fn,
        null,
        null,
      ),
    );
  },
  eventDeregister(callbackId) {
    checkInt(vir().virConnectDomainEventDeregisterAny(eventConn ?? connection(), callbackId));
  },
  libVersion() {
    const out = new BigUint64Array(1);
    checkInt(vir().virGetVersion(out, null, null));
    return Number(out[0]);
  },
  hypervisorVersion() {
    const out = new BigUint64Array(1);
    checkInt(vir().virConnectGetVersion(connection(), out));
    return Number(out[0]);
  },
  capabilities() {
    return takeString(vir().virConnectGetCapabilities(connection()));
  },
  domainCapabilities(q: HostCpuQuery, flags) {
    return takeString(
      vir().virConnectGetDomainCapabilities(
        connection(),
        optional(q.emulator),
        optional(q.arch),
        optional(q.machine),
        optional(q.virttype),
        flags,
      ),
    );
  },
  baselineHypervisorCPU(q, cpuXmls, flags) {
    const strings = cpuXmls.map((x) => cstr(x));
    retained.add(strings); // the pointer array below does not keep the strings alive
    const array = new BigUint64Array(strings.length + 1);
    strings.forEach((b, i) =>
      array[i] = BigInt(Deno.UnsafePointer.value(Deno.UnsafePointer.of(b)))
    );
    const result = vir().virConnectBaselineHypervisorCPU(
      connection(),
      optional(q.emulator),
      optional(q.arch),
      optional(q.machine),
      optional(q.virttype),
      new Uint8Array(array.buffer),
      strings.length,
      flags,
    );
    retained.delete(strings);
    return takeString(result);
  },
  defineXML(xml) {
    return refAndFree(checkPtr(vir().virDomainDefineXML(connection(), cstr(xml))));
  },
  createXML(xml, flags) {
    return refAndFree(checkPtr(vir().virDomainCreateXML(connection(), cstr(xml), flags)));
  },
  lookupByName(name) {
    return refAndFree(checkPtr(vir().virDomainLookupByName(connection(), cstr(name))));
  },
  lookupByUUID(uuid) {
    return refAndFree(checkPtr(vir().virDomainLookupByUUIDString(connection(), cstr(uuid))));
  },
  listAll(flags) {
    const s = vir();
    const out = new BigUint64Array(1);
    const n = checkInt(s.virConnectListAllDomains(connection(), out, flags));
    const array = Deno.UnsafePointer.create(out[0]);
    if (array === null) return [];
    const view = new Deno.UnsafePointerView(array);
    const result: RawDomainSummary[] = [];
    try {
      for (let i = 0; i < n; i++) {
        const dom = view.getPointer(i * 8);
        if (dom === null) continue;
        try {
          const ref = domainRef(dom);
          const st = new Int32Array(1);
          const rs = new Int32Array(1);
          checkInt(s.virDomainGetState(dom, st, rs, 0));
          result.push({ ...ref, id: s.virDomainGetID(dom) | 0, state: st[0], reason: rs[0] });
        } finally {
          s.virDomainFree(dom);
        }
      }
    } finally {
      libc!.symbols.free(array);
    }
    return result;
  },
  allDomainStats(stats, flags) {
    const out = new BigUint64Array(1);
    const n = checkInt(vir().virConnectGetAllDomainStats(connection(), stats, out, flags));
    return readStatsRecords(out[0], n);
  },
  domainStats(uuid, stats, flags) {
    return withDomain(uuid, (dom) => {
      // A NULL-terminated array of the one domain.
      const doms = new BigUint64Array([BigInt(Deno.UnsafePointer.value(dom)), 0n]);
      const out = new BigUint64Array(1);
      const n = checkInt(vir().virDomainListGetStats(doms, stats, out, flags));
      return readStatsRecords(out[0], n)[0] ?? null;
    });
  },
  domainCreate(uuid, flags) {
    withDomain(uuid, (d) => checkInt(vir().virDomainCreateWithFlags(d, flags)));
  },
  domainState(uuid) {
    return withDomain(uuid, (d) => {
      const st = new Int32Array(1);
      const rs = new Int32Array(1);
      checkInt(vir().virDomainGetState(d, st, rs, 0));
      return [st[0], rs[0]];
    });
  },
  domainXML(uuid, flags) {
    return withDomain(uuid, (d) => takeString(vir().virDomainGetXMLDesc(d, flags)));
  },
  domainShutdown(uuid, flags) {
    withDomain(uuid, (d) => checkInt(vir().virDomainShutdownFlags(d, flags)));
  },
  domainDestroy(uuid, flags) {
    withDomain(uuid, (d) => checkInt(vir().virDomainDestroyFlags(d, flags)));
  },
  domainUndefine(uuid, flags) {
    withDomain(uuid, (d) => checkInt(vir().virDomainUndefineFlags(d, flags)));
  },
  domainSuspend(uuid) {
    withDomain(uuid, (d) => checkInt(vir().virDomainSuspend(d)));
  },
  domainResume(uuid) {
    withDomain(uuid, (d) => checkInt(vir().virDomainResume(d)));
  },
  domainReset(uuid) {
    withDomain(uuid, (d) => checkInt(vir().virDomainReset(d, 0)));
  },
  domainAttachDevice(uuid, xml, flags) {
    withDomain(uuid, (d) => checkInt(vir().virDomainAttachDeviceFlags(d, cstr(xml), flags)));
  },
  domainCoreDump(uuid, path, format, flags) {
    withDomain(
      uuid,
      (d) => checkInt(vir().virDomainCoreDumpWithFormat(d, cstr(path), format, flags)),
    );
  },
  domainUpdateDevice(uuid, xml, flags) {
    withDomain(uuid, (d) => checkInt(vir().virDomainUpdateDeviceFlags(d, cstr(xml), flags)));
  },
  domainSetVcpus(uuid, count, flags) {
    withDomain(uuid, (d) => checkInt(vir().virDomainSetVcpusFlags(d, count, flags)));
  },
  domainPinVcpu(uuid, vcpu, cpus, flags) {
    // libvirt's CPU map: one bit per host CPU, the lowest bit of the first byte CPU 0.
    const map = new Uint8Array(Math.floor(Math.max(0, ...cpus) / 8) + 1);
    for (const cpu of cpus) map[cpu >> 3] |= 1 << (cpu & 7);
    withDomain(
      uuid,
      (d) => checkInt(vir().virDomainPinVcpuFlags(d, vcpu, map, map.length, flags)),
    );
  },
  domainSetTime(uuid, seconds, nanoseconds) {
    withDomain(
      uuid,
      (d) => checkInt(vir().virDomainSetTime(d, BigInt(seconds), nanoseconds, 0)),
    );
  },
  domainDetachDevice(uuid, xml, flags) {
    withDomain(uuid, (d) => checkInt(vir().virDomainDetachDeviceFlags(d, cstr(xml), flags)));
  },
  domainReboot(uuid, flags) {
    withDomain(uuid, (d) => checkInt(vir().virDomainReboot(d, flags)));
  },
  domainFsFreeze(uuid) {
    return withDomain(uuid, (d) => checkInt(vir().virDomainFSFreeze(d, null, 0, 0)));
  },
  domainFsThaw(uuid) {
    return withDomain(uuid, (d) => checkInt(vir().virDomainFSThaw(d, null, 0, 0)));
  },
  domainMigrateToURI3(uuid, dconnuri, params, flags) {
    const s = vir();
    const list = new BigUint64Array(1);
    const count = new Int32Array(1);
    const max = new Int32Array(1);
    try {
      for (const [name, value] of params) {
        if (typeof value === "string") {
          checkInt(s.virTypedParamsAddString(list, count, max, cstr(name), cstr(value)));
        } else if (typeof value === "bigint") {
          checkInt(s.virTypedParamsAddULLong(list, count, max, cstr(name), value));
        } else {
          checkInt(s.virTypedParamsAddInt(list, count, max, cstr(name), value));
        }
      }
      const pointer = Deno.UnsafePointer.create(list[0]);
      withDomain(
        uuid,
        (d) => checkInt(s.virDomainMigrateToURI3(d, cstr(dconnuri), pointer, count[0], flags)),
      );
    } finally {
      const pointer = Deno.UnsafePointer.create(list[0]);
      if (pointer !== null) s.virTypedParamsFree(pointer, count[0]);
    }
  },
  domainVcpuPinInfo(uuid) {
    const s = vir();
    // NULL map and online count: the number of the host's CPUs alone.
    const cpus = checkInt(s.virNodeGetCPUMap(connection(), null, null, 0));
    return withDomain(uuid, (d) => {
      const vcpus = checkInt(s.virDomainGetVcpusFlags(d, 0));
      const maplen = Math.ceil(cpus / 8);
      const maps = new Uint8Array(Math.max(1, vcpus * maplen));
      checkInt(s.virDomainGetVcpuPinInfo(d, vcpus, maps, maplen, 0));
      return Array.from(
        { length: vcpus },
        (_, v) =>
          Array.from(
            { length: cpus },
            (_, c) => (maps[v * maplen + (c >> 3)] & (1 << (c & 7))) !== 0,
          ),
      );
    });
  },
  domainStartDirtyRateCalc(uuid, seconds, flags) {
    withDomain(uuid, (d) => checkInt(vir().virDomainStartDirtyRateCalc(d, seconds, flags)));
  },
  domainJobStats(uuid, flags) {
    const s = vir();
    const type = new Int32Array(1);
    const list = new BigUint64Array(1);
    const count = new Int32Array(1);
    withDomain(uuid, (d) => checkInt(s.virDomainGetJobStats(d, type, list, count, flags)));
    const pointer = Deno.UnsafePointer.create(list[0]);
    const params: Record<string, TypedParamValue> = {};
    if (pointer === null) return { type: type[0], params };
    try {
      const view = new Deno.UnsafePointerView(pointer);
      for (let i = 0; i < count[0]; i++) {
        const [k, v] = readTypedParam(view, i * TYPED_PARAM_SIZE);
        params[k] = v;
      }
    } finally {
      s.virTypedParamsFree(pointer, count[0]);
    }
    return { type: type[0], params };
  },
  domainAbortJob(uuid) {
    withDomain(uuid, (d) => checkInt(vir().virDomainAbortJob(d)));
  },
  domainMigrateSetMaxDowntime(uuid, milliseconds) {
    withDomain(
      uuid,
      (d) => checkInt(vir().virDomainMigrateSetMaxDowntime(d, BigInt(milliseconds), 0)),
    );
  },
  domainMigrateStartPostCopy(uuid) {
    withDomain(uuid, (d) => checkInt(vir().virDomainMigrateStartPostCopy(d, 0)));
  },
  domainScreenshot(uuid, screen) {
    const s = vir();
    const stream = checkPtr(s.virStreamNew(connection(), 0));
    let finished = false;
    try {
      const mime = withDomain(uuid, (d) => takeString(s.virDomainScreenshot(d, stream, screen, 0)));
      const chunks: Uint8Array[] = [];
      let size = 0;
      const buffer = new Uint8Array(256 * 1024);
      for (;;) {
        const n = checkInt(s.virStreamRecv(stream, buffer, BigInt(buffer.length)));
        if (n === 0) break;
        if (size + n > SCREENSHOT_LIMIT) {
          throw new Failure({
            kind: "internal",
            message: `the screenshot is larger than ${SCREENSHOT_LIMIT} bytes`,
          });
        }
        chunks.push(buffer.slice(0, n));
        size += n;
      }
      checkInt(s.virStreamFinish(stream));
      finished = true;
      const data = new Uint8Array(size);
      let at = 0;
      for (const c of chunks) {
        data.set(c, at);
        at += c.length;
      }
      return { mime, data };
    } finally {
      if (!finished) s.virStreamAbort(stream);
      s.virStreamFree(stream);
    }
  },
  domainAgentCommand(uuid, command, timeout, flags) {
    if (qemu === null && qemuLoadError === null) {
      try {
        qemu = loadLibvirtQemu(qemuPath);
      } catch (error) {
        qemuLoadError = error as LibvirtLoadError;
      }
    }
    if (qemu === null) {
      const cause = qemuLoadError!.cause;
      throw new Failure({
        kind: "load",
        library: qemuPath,
        detail: errorText(cause),
      });
    }
    const q = qemu.symbols;
    return withDomain(
      uuid,
      (d) => takeString(q.virDomainQemuAgentCommand(d, cstr(command), timeout, flags)),
    );
  },
};

function handle(request: WorkerRequest): WorkerResponse {
  const fn = ops[request.op] as (...args: unknown[]) => unknown;
  try {
    return { id: request.id, ok: true, value: fn(...request.args) };
  } catch (error) {
    if (error instanceof Failure) return { id: request.id, ok: false, failure: error.failure };
    if (error instanceof LibvirtLoadError) {
      const cause = error.cause;
      return {
        id: request.id,
        ok: false,
        failure: {
          kind: "load",
          library: error.library,
          detail: errorText(cause),
        },
      };
    }
    const message = errorText(error);
    return { id: request.id, ok: false, failure: { kind: "internal", message } };
  }
}

self.onmessage = (event: MessageEvent<WorkerRequest>) => {
  self.postMessage(handle(event.data));
};

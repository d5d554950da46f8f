/**
 * The node side of `virtnode handler` in one call: device plugins, the heartbeat
 * fed by their registration, the labeller reading libvirt through a short-lived
 * connection per read, or in a short-lived child process (as KubeVirt's node-labeller
 * runs virsh outside virt-handler) so that the handler never maps libvirt. Stopping marks
 * the node unschedulable before the device plugins go, so the scheduler stops sending
 * VMIs before the kubelet loses the devices.
 *
 * @module
 */

import type { EventRecorder, KubeClient } from "../kube/mod.ts";
import { closeOnExecFrom, errorText, LIBVIRT_ERROR_CODES, openLibvirt } from "../../ffi/mod.ts";
import type { Runnable } from "../lifecycle/mod.ts";
import { DevicePluginManager, type DevicePluginManagerOptions } from "./device_plugins.ts";
import { Heartbeat, type HeartbeatOptions } from "./heartbeat.ts";
import {
  type CapabilitySource,
  type GatheredCapabilities,
  gatherNodeLabelInfo,
  type GatherOptions,
  NodeLabeller,
  type NodeLabellerOptions,
} from "./labeller.ts";

/** Options of {@linkcode startNodeServices}. */
export interface NodeServicesOptions {
  /** The node this agent serves. */
  nodeName: string;
  /** libvirt URI the labeller reads capabilities from. */
  libvirtUri: string;
  /** Device plugin settings; `false` runs none (schedulable then needs nothing). */
  devicePlugins?: DevicePluginManagerOptions | false;
  /** Heartbeat settings (readiness comes from the device plugins). */
  heartbeat?: Omit<HeartbeatOptions, "isReady">;
  /** Labeller settings; `false` runs no labeller. */
  labeller?: Omit<NodeLabellerOptions, "source" | "recorder"> & GatherOptions | false;
  /** Records the labeller's Node events. */
  recorder?: EventRecorder;
  /** How the labeller reads libvirt; {@linkcode readCapabilities} (in this process) unless told. */
  readCapabilities?: CapabilityReader;
}

/** Reads the labeller's inputs from libvirt at `libvirtUri`. */
export type CapabilityReader = (
  libvirtUri: string,
  options: GatherOptions,
) => Promise<GatheredCapabilities>;

/** The documents a capability read returns, as JSON between processes. */
export type CapabilityDocuments = Omit<GatheredCapabilities, "info">;

/** Raised when the child process that reads libvirt's capabilities fails. */
export class CapabilityReadError extends Error {
  /** Creates the error; `cause` carries the underlying failure. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "CapabilityReadError";
  }
}

/** The child read no domain capabilities: its libvirt driver has none (as libvirt says it). */
class DomainCapabilitiesUnsupported extends CapabilityReadError {
  /** libvirt's `VIR_ERR_NO_SUPPORT`, which {@linkcode gatherNodeLabelInfo} tells apart. */
  readonly code = LIBVIRT_ERROR_CODES.VIR_ERR_NO_SUPPORT;
  constructor() {
    super("libvirt's driver has no domain capabilities");
  }
}

/** The documents of a read, for {@linkcode readCapabilitiesInChild}'s child to print. */
export function capabilityDocuments(gathered: GatheredCapabilities): CapabilityDocuments {
  const { info: _, ...documents } = gathered;
  return documents;
}

/** A source that answers with documents read before (their parsing is pure). */
function replaySource(documents: CapabilityDocuments): CapabilitySource {
  return {
    getCapabilities: () => Promise.resolve(documents.capabilities),
    getDomainCapabilities: () =>
      documents.domainCapabilities === undefined
        ? Promise.reject(new DomainCapabilitiesUnsupported())
        : Promise.resolve(documents.domainCapabilities),
    baselineHypervisorCPU: () =>
      documents.baseline === undefined
        ? Promise.reject(new CapabilityReadError("The child process read no baseline CPU"))
        : Promise.resolve(documents.baseline),
  };
}

/** Options of {@linkcode readCapabilitiesInChild}. */
export interface ChildReadOptions extends GatherOptions {
  /** Kill the child after this many milliseconds; 60,000 unless told. */
  timeoutMs?: number;
}

/**
 * Runs `command` (a process that reads libvirt with the same gather options and prints
 * {@linkcode capabilityDocuments} as JSON) and parses its documents here, so libvirt's
 * libraries and call workers (about 30 MB RSS) live only as long as the child.
 */
export async function readCapabilitiesInChild(
  command: { cmd: string; args: string[] },
  options: ChildReadOptions = {},
): Promise<GatheredCapabilities> {
  const { timeoutMs = 60_000, ...gather } = options;
  let output: Deno.CommandOutput;
  try {
    // The child must hold none of this process's sockets (see closeOnExecFrom).
    closeOnExecFrom(3);
    output = await new Deno.Command(command.cmd, {
      args: command.args,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
      signal: AbortSignal.timeout(timeoutMs),
    }).output();
  } catch (error) {
    throw new CapabilityReadError(
      `Cannot run "${command.cmd}" to read libvirt's capabilities: ${message(error)}`,
      { cause: error },
    );
  }
  if (!output.success) {
    const stderr = new TextDecoder().decode(output.stderr).trim().split("\n").at(-1) ?? "";
    throw new CapabilityReadError(
      `Cannot read libvirt's capabilities: the child process exited with code ${output.code}${
        output.signal ? ` (${output.signal})` : ""
      }: ${stderr}`,
    );
  }
  let documents: CapabilityDocuments;
  try {
    documents = JSON.parse(new TextDecoder().decode(output.stdout));
  } catch (error) {
    throw new CapabilityReadError(
      `Cannot read libvirt's capabilities: the child process printed no JSON: ${message(error)}`,
      { cause: error },
    );
  }
  return await gatherNodeLabelInfo(replaySource(documents), gather);
}

function message(error: unknown): string {
  return errorText(error);
}

/**
 * Where virt-operator's handler DaemonSet has KubeVirt's node-labeller init container (in
 * the launcher image) write what libvirt says of the node, for the handler to read:
 * `capabilities.xml`, `virsh_domcapabilities.xml` and `supported_features.xml` (the
 * host-model baseline). A KubeVirt node has no libvirt of its own to ask.
 */
export const KUBEVIRT_LABELLER_DIR = "/var/lib/kubevirt-node-labeller";

/**
 * Reads the labeller's inputs from the documents KubeVirt's node-labeller script wrote in
 * `dir` (see {@linkcode KUBEVIRT_LABELLER_DIR}); undefined when it holds no
 * `capabilities.xml`. The domain capabilities and the baseline are optional, as the
 * script writes the baseline on some architectures only.
 */
export async function readCapabilityFiles(
  dir: string,
  options: GatherOptions = {},
): Promise<GatheredCapabilities | undefined> {
  const read = async (name: string) => {
    try {
      const text = await Deno.readTextFile(`${dir}/${name}`);
      return text.trim() === "" ? undefined : text;
    } catch (error) {
      if (error instanceof Deno.errors.NotFound) return undefined;
      throw new CapabilityReadError(`Cannot read "${dir}/${name}": ${message(error)}`, {
        cause: error,
      });
    }
  };
  const capabilities = await read("capabilities.xml");
  if (capabilities === undefined) return undefined;
  const domainCapabilities = await read("virsh_domcapabilities.xml");
  // The script writes a baseline on x86_64 and s390x only; elsewhere the host model has no
  // features to label.
  const baseline = await read("supported_features.xml") ?? "<cpu mode='custom' match='exact'/>";
  return await gatherNodeLabelInfo(
    replaySource({
      capabilities,
      ...(domainCapabilities !== undefined ? { domainCapabilities } : {}),
      baseline,
    }),
    options,
  );
}

/** The node services of one node, ready to run. */
export interface NodeServices {
  /** The heartbeat. */
  heartbeat: Heartbeat;
  /** The labeller, unless disabled. */
  labeller?: NodeLabeller;
  /** The device plugins, unless disabled. */
  devicePlugins?: DevicePluginManager;
  /**
   * The runnables in the order they stop: the heartbeat first (it marks the node
   * unschedulable), then the labeller and the device plugins.
   */
  stages: Runnable[][];
}

/** Reads the labeller's inputs from libvirt over a connection opened for this read. */
export async function readCapabilities(
  libvirtUri: string,
  options: GatherOptions = {},
): Promise<GatheredCapabilities> {
  // libvirt's library is opened (dlopen) here only: `virtnode heartbeat` never maps it.
  const conn = await openLibvirt(libvirtUri, { events: false, workers: 1 });
  try {
    return await gatherNodeLabelInfo(conn, options);
  } finally {
    await conn.close();
  }
}

/** Builds device plugins, heartbeat and labeller for one node; run them with `runStages`. */
export function nodeServices(client: KubeClient, options: NodeServicesOptions): NodeServices {
  const devicePlugins = options.devicePlugins === false
    ? undefined
    : new DevicePluginManager(options.devicePlugins ?? {});
  const heartbeat = new Heartbeat(client, options.nodeName, {
    ...options.heartbeat,
    isReady: () => devicePlugins?.allRegistered() ?? true,
  });
  let labeller: NodeLabeller | undefined;
  if (options.labeller !== false) {
    const { virttype, machine, arch, kvmPath, schedRtRuntimePath, ...rest } = options.labeller ??
      {};
    const gather = { virttype, machine, arch, kvmPath, schedRtRuntimePath };
    const read = options.readCapabilities ?? readCapabilities;
    labeller = new NodeLabeller(client, options.nodeName, {
      ...rest,
      recorder: options.recorder,
      source: async () => (await read(options.libvirtUri, gather)).info,
    });
  }
  const later: Runnable[] = [];
  if (labeller) later.push(labeller);
  if (devicePlugins) later.push(devicePlugins);
  return { heartbeat, labeller, devicePlugins, stages: [[heartbeat], later] };
}

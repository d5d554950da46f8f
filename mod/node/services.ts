/**
 * The node side of `virtnode handler` in one call: device plugins first, the heartbeat
 * fed by their registration, the labeller reading libvirt through a short-lived
 * connection per read. Stopping marks the node unschedulable before the device
 * plugins go, so the scheduler stops sending VMIs before the kubelet loses the devices.
 *
 * @module
 */

import type { EventRecorder, KubeClient } from "../kube/mod.ts";
import { getLogger } from "../log/mod.ts";
import { DevicePluginManager, type DevicePluginManagerOptions } from "./device_plugins.ts";
import { Heartbeat, type HeartbeatOptions } from "./heartbeat.ts";
import {
  type GatheredCapabilities,
  gatherNodeLabelInfo,
  type GatherOptions,
  NodeLabeller,
  type NodeLabellerOptions,
} from "./labeller.ts";

const log = getLogger("node");

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
}

/** The running node services. */
export interface NodeServices {
  /** The heartbeat. */
  heartbeat: Heartbeat;
  /** The labeller, unless disabled. */
  labeller?: NodeLabeller;
  /** The device plugins, unless disabled. */
  devicePlugins?: DevicePluginManager;
  /** Heartbeat says unschedulable, then the labeller and the device plugins stop. */
  stop(): Promise<void>;
}

/** Reads the labeller's inputs from libvirt over a connection opened for this read. */
export async function readCapabilities(
  libvirtUri: string,
  options: GatherOptions = {},
): Promise<GatheredCapabilities> {
  // Loaded on first use: `virtnode heartbeat` and friends never need libvirt.
  const { openLibvirt } = await import("../../ffi/mod.ts");
  const conn = await openLibvirt(libvirtUri, { events: false, workers: 1 });
  try {
    return await gatherNodeLabelInfo(conn, options);
  } finally {
    await conn.close();
  }
}

/** Starts device plugins, heartbeat and labeller for one node. */
export async function startNodeServices(
  client: KubeClient,
  options: NodeServicesOptions,
): Promise<NodeServices> {
  let devicePlugins: DevicePluginManager | undefined;
  if (options.devicePlugins !== false) {
    devicePlugins = new DevicePluginManager(options.devicePlugins ?? {});
    await devicePlugins.start();
  }
  const heartbeat = new Heartbeat(client, options.nodeName, {
    ...options.heartbeat,
    isReady: () => devicePlugins?.allRegistered() ?? true,
  });
  heartbeat.start();
  let labeller: NodeLabeller | undefined;
  if (options.labeller !== false) {
    const { virttype, machine, arch, kvmPath, schedRtRuntimePath, ...rest } = options.labeller ??
      {};
    const gather = { virttype, machine, arch, kvmPath, schedRtRuntimePath };
    labeller = new NodeLabeller(client, options.nodeName, {
      ...rest,
      recorder: options.recorder,
      source: async () => (await readCapabilities(options.libvirtUri, gather)).info,
    });
    labeller.start();
  }
  return {
    heartbeat,
    labeller,
    devicePlugins,
    async stop() {
      await heartbeat.stop().catch((error) =>
        log.error("Cannot mark the node unschedulable: {error}", { error })
      );
      await labeller?.stop();
      await devicePlugins?.stop();
    },
  };
}

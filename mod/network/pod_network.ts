/**
 * The handler's part of a VMI's pod network (KubeVirt's handler's network setup): before
 * the launcher defines the domain, the binding of each pod-network interface is built in
 * the launcher's network namespace, through {@linkcode NetnsRunner} (a worker thread that
 * enters the namespace for each step; the handler's own threads never do).
 *
 * Per network the setup is marked as KubeVirt marks it, in the network's state file:
 * what the pod interface was (its addresses, MAC, MTU, routes) is recorded first, then
 * `started`, then the binding is built, then `finished`. A finished network is left alone;
 * a started one (the handler stopped half-way) is built again from the recorded facts,
 * whose steps are all safe to repeat: no link, address or rule is made twice and none is
 * lost. For bridge binding the launcher's DHCP facts go to `vif-cache-<iface>.json` in
 * its private directory, written beneath it without following symlinks.
 *
 * @module
 */

import { join } from "node:path";
import { errorText, type NetnsResult, type NetnsRunner, writeFileBeneath } from "../../ffi/mod.ts";
import { type VirtualMachineInstance, vmiKey } from "../api/mod.ts";
import { getLogger } from "../log/mod.ts";
import { adoptHostTapSteps, type BindingOptions, bindingSteps } from "./bindings.ts";
import {
  bridgeDhcpCache,
  NetworkState,
  type NetworkStateRecord,
  type PodDiscovery,
  podIPsOf,
  readNetworkState,
  writeNetworkState,
} from "./cache.ts";
import {
  globalAddresses,
  type NamespaceState,
  parseNamespaceState,
  READ_STATE_COMMANDS,
} from "./links.ts";
import {
  bridgeName,
  type PodInterfacePlan,
  podNetworkPlan,
  specInterface,
  tapName,
} from "./plan.ts";

const log = getLogger("network");

/** Where a VMI's pod network lives and how its launcher is reached. */
export interface PodNetworkTarget {
  /** The pod's network namespace file: `/proc/<launcher pid>/ns/net`, or a pinned one. */
  netns: string;
  /**
   * Opens the launcher's private directory (`/var/run/kubevirt-private` in its pod), where
   * the launcher reads `vif-cache-<iface>.json`; the caller releases it.
   */
  openLauncherDir(): { path: string; release(): void };
  /** The tap's owner and the cache files' owner: 0, or the runtime user of a non-root VMI. */
  owner: number;
  /**
   * Pod-less mode: the name under which a tap is made in the host's namespace (libvirtd
   * opens it there), to be moved into the pod's by {@linkcode PodNetworks.afterStart}.
   */
  hostTap?(plan: PodInterfacePlan): string;
}

/** A failed step of a network's setup. */
export class PodNetworkError extends Error {
  /** Creates `Cannot set up the pod network of interface "<name>": <detail>`. */
  constructor(name: string, detail: string, options?: ErrorOptions) {
    super(`Cannot set up the pod network of interface "${name}": ${detail}`, options);
    this.name = "PodNetworkError";
  }
}

/** The pod IPs of one network, for `status.interfaces`. */
export interface PodAddresses {
  /** The first IP. */
  podIP?: string;
  /** Every IP, IPv4 first. */
  podIPs: string[];
}

function exec(result: NetnsResult): { code: number; stdout: string; stderr: string } {
  return result as { code: number; stdout: string; stderr: string };
}

function randomBridgeMac(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(6));
  bytes[0] = (bytes[0] & 0xfc) | 0x02; // locally administered, unicast
  return [...bytes].map((b) => b.toString(16).padStart(2, "0")).join(":");
}

/** Builds, finishes and forgets the pod networks of this node's VMIs; see the module doc. */
export class PodNetworks {
  readonly #runner: NetnsRunner;
  readonly #cacheDir: string;
  /** Pod IPs by VMI UID and network name, once read. */
  readonly #addresses = new Map<string, Map<string, PodAddresses>>();

  /** `cacheDir` holds `<vmi uid>/<network name>` state files. */
  constructor(options: { runner: NetnsRunner; cacheDir: string }) {
    this.#runner = options.runner;
    this.#cacheDir = options.cacheDir;
  }

  #file(uid: string, network: string): string {
    return join(this.#cacheDir, uid, network);
  }

  async #state(netns: string): Promise<NamespaceState> {
    const results = await this.#runner.run(
      netns,
      READ_STATE_COMMANDS.map((c) => ({ op: "exec" as const, ...c })),
    );
    const out = results.map(exec);
    const failed = out.find((o) => o.code !== 0);
    if (failed) throw new Error(`Cannot read the pod's links: ip: ${failed.stderr.trim()}`);
    return parseNamespaceState(out[0].stdout, out[1].stdout, out[2].stdout);
  }

  async #run(netns: string | undefined, what: string, cmd: string, args: string[], stdin?: string) {
    const [result] = await this.#runner.run(netns, [{ op: "exec", cmd, args, stdin }]);
    const out = exec(result);
    if (out.code !== 0) {
      throw new Error(
        `${what}: ${cmd}: ${(out.stderr || out.stdout).trim() || `exit ${out.code}`}`,
      );
    }
  }

  /** Runs `ip -batch` over `lines` in a namespace (none: the host's). */
  async #ipBatch(netns: string | undefined, what: string, lines: string[]): Promise<void> {
    await this.#run(netns, what, "ip", ["-batch", "-"], lines.join("\n") + "\n");
  }

  /**
   * Builds the binding of every pod-network interface of `vmi` (of those named in `only`,
   * when given) that is not finished yet.
   * Throws `NetworkSpecError` for a spec the node cannot serve, {@linkcode PodNetworkError}
   * for a step that failed (the next call goes on from the last marker).
   */
  async setup(
    vmi: VirtualMachineInstance,
    target: PodNetworkTarget,
    only?: ReadonlySet<string>,
  ): Promise<void> {
    const uid = vmi.metadata.uid!;
    for (const plan of podNetworkPlan(vmi)) {
      if (only && !only.has(plan.name)) continue;
      const file = this.#file(uid, plan.name);
      const record = await readNetworkState(file);
      if (record.networkState === NetworkState.Finished) {
        this.#remember(uid, plan.name, record);
        continue;
      }
      const started = performance.now();
      try {
        await this.#setupOne(vmi, plan, target, file, record);
      } catch (error) {
        if (error instanceof PodNetworkError) throw error;
        throw new PodNetworkError(
          plan.name,
          errorText(error),
          {
            cause: error,
          },
        );
      }
      log.info("Pod network set up", {
        namespace: vmi.metadata.namespace,
        name: vmi.metadata.name,
        uid,
        network: plan.name,
        binding: plan.binding,
        resumed: record.networkState === NetworkState.Started,
        ms: Math.round(performance.now() - started),
      });
    }
  }

  async #setupOne(
    vmi: VirtualMachineInstance,
    plan: PodInterfacePlan,
    target: PodNetworkTarget,
    file: string,
    record: NetworkStateRecord,
  ): Promise<void> {
    const uid = vmi.metadata.uid!;
    const state = await this.#state(target.netns);
    let discovery = record.virtnodeDiscovery;
    if (!discovery) {
      if (record.networkState === NetworkState.Started) {
        throw new PodNetworkError(
          plan.name,
          "another handler began this setup and recorded nothing of the pod interface; it cannot be finished, restart the VMI",
        );
      }
      if (plan.binding === "bridge" && state.links.get(plan.bridge)?.kind === "bridge") {
        // Built by an earlier handler that kept no record here (KubeVirt's, before a
        // swap): the placeholder still carries the pod's addresses. Nothing to build.
        const placeholder = state.links.get(plan.podInterface);
        const found: NetworkStateRecord = {
          iface: specInterface(vmi, plan),
          networkState: NetworkState.Finished,
          podIPs: [globalAddresses(placeholder, 4)[0], globalAddresses(placeholder, 6)[0]]
            .filter((a) => a !== undefined).map((a) => a!.address),
        };
        found.podIP = found.podIPs![0];
        await writeNetworkState(file, found);
        this.#remember(uid, plan.name, found);
        log.info("Pod network found built; recorded as finished", { uid, network: plan.name });
        return;
      }
      discovery = this.#discover(plan, state);
    }
    const podIPs = podIPsOf(discovery);
    const startedRecord: NetworkStateRecord = {
      iface: specInterface(vmi, plan),
      podIP: podIPs[0],
      podIPs,
      networkState: NetworkState.Started,
      virtnodeDiscovery: discovery,
    };
    await writeNetworkState(file, startedRecord);
    if (plan.binding === "bridge") {
      const dir = target.openLauncherDir();
      try {
        writeFileBeneath(
          dir.path,
          `vif-cache-${plan.podInterface}.json`,
          bridgeDhcpCache(discovery, plan.macAddress ?? discovery.mac),
          { mode: 0o604, owner: { uid: target.owner, gid: target.owner } },
        );
      } finally {
        dir.release();
      }
    }
    const options: BindingOptions = {
      tapOwner: target.owner,
      hostTap: target.hostTap?.(plan),
      migrationTransport: vmi.status?.migrationTransport,
    };
    const steps = bindingSteps(plan, discovery, state, options);
    if (options.hostTap !== undefined) {
      await this.#hostTap(options.hostTap, discovery.mtu, target.owner);
    }
    await this.#ipBatch(target.netns, "Cannot build the binding", steps.ip);
    const more = [
      ...steps.sysctls.map(([path, value]) => ({
        op: "writeFile" as const,
        path: `/proc/sys/net/${path}`,
        data: value,
      })),
      ...steps.txChecksumOff.map((device) => ({ op: "txChecksumOff" as const, device })),
    ];
    if (more.length > 0) await this.#runner.run(target.netns, more);
    if (steps.nft) {
      await this.#run(
        target.netns,
        "Cannot install the masquerade rules",
        "nft",
        ["-f", "-"],
        steps.nft,
      );
    }
    const finished = { ...startedRecord, networkState: NetworkState.Finished };
    await writeNetworkState(file, finished);
    this.#remember(uid, plan.name, finished);
  }

  #discover(plan: PodInterfacePlan, state: NamespaceState): PodDiscovery {
    const link = state.links.get(plan.podInterface);
    if (!link) {
      throw new PodNetworkError(
        plan.name,
        `the pod has no interface "${plan.podInterface}"` +
          (plan.source === "multus"
            ? ` for NetworkAttachmentDefinition "${plan.networkName}" (is Multus on the node?)`
            : ""),
      );
    }
    return {
      podInterface: link.name,
      index: link.index,
      mac: link.mac,
      mtu: link.mtu,
      ipv4: globalAddresses(link, 4),
      ipv6: globalAddresses(link, 6),
      routes4: state.routes4.filter((r) => r.device === link.name),
      bridgeMac: plan.binding === "bridge" ? randomBridgeMac() : undefined,
    };
  }

  /** Makes the host's tap (pod-less mode) unless it is there; libvirtd opens it by name. */
  async #hostTap(name: string, mtu: number, owner: number): Promise<void> {
    if (!hostLinkExists(name)) {
      await this.#run(undefined, "Cannot make the host's tap", "ip", [
        "tuntap",
        "add",
        "dev",
        name,
        "mode",
        "tap",
        "user",
        String(owner),
        "group",
        String(owner),
      ]);
    }
    await this.#run(undefined, "Cannot set the host's tap", "ip", [
      "link",
      "set",
      "dev",
      name,
      "mtu",
      String(mtu),
    ]);
  }

  /**
   * Pod-less mode, once the domain runs: moves each tap libvirtd opened in the host's
   * namespace into the pod's and puts it on the bridge as KubeVirt's `tap0`. Idempotent: a
   * tap moved already is not in the host's namespace.
   */
  async afterStart(vmi: VirtualMachineInstance, target: PodNetworkTarget): Promise<void> {
    if (!target.hostTap) return;
    const uid = vmi.metadata.uid!;
    for (const plan of podNetworkPlan(vmi)) {
      const hostTap = target.hostTap(plan);
      if (!hostLinkExists(hostTap)) continue;
      const record = await readNetworkState(this.#file(uid, plan.name));
      const mtu = record.virtnodeDiscovery?.mtu ?? 1500;
      const steps = adoptHostTapSteps(plan, hostTap, target.netns, mtu);
      const started = performance.now();
      try {
        await this.#ipBatch(undefined, "Cannot move the tap into the pod", steps.host);
        await this.#ipBatch(target.netns, "Cannot put the tap on the bridge", steps.pod);
      } catch (error) {
        throw new PodNetworkError(
          plan.name,
          errorText(error),
          {
            cause: error,
          },
        );
      }
      log.info("Tap moved into the pod's network namespace", {
        uid,
        network: plan.name,
        hostTap,
        ms: Math.round(performance.now() - started),
      });
    }
  }

  #remember(uid: string, network: string, record: NetworkStateRecord): void {
    let map = this.#addresses.get(uid);
    if (!map) this.#addresses.set(uid, map = new Map());
    map.set(network, { podIP: record.podIP, podIPs: record.podIPs ?? [] });
  }

  /** The pod IPs of the VMI's networks set up on this node (from memory, else its state files). */
  async addresses(vmi: VirtualMachineInstance): Promise<Map<string, PodAddresses>> {
    const uid = vmi.metadata.uid!;
    const known = this.#addresses.get(uid);
    if (known) return known;
    let plans: PodInterfacePlan[];
    try {
      plans = podNetworkPlan(vmi);
    } catch {
      return new Map();
    }
    for (const plan of plans) {
      try {
        const record = await readNetworkState(this.#file(uid, plan.name));
        if (record.networkState === NetworkState.Finished) this.#remember(uid, plan.name, record);
      } catch (error) {
        log.warn("Cannot read network state: {error}", { key: vmiKey(vmi.metadata), error });
      }
    }
    return this.#addresses.get(uid) ?? new Map();
  }

  /** The pod IPs known in memory for a VMI (what {@linkcode addresses} read last). */
  knownAddresses(uid: string): Map<string, PodAddresses> | undefined {
    return this.#addresses.get(uid);
  }

  /**
   * Takes down what the bridge binding of each of `unplugged` built in the pod once the
   * domain let go of its NIC, as virt-handler does for an absent interface: the tap, the
   * in-pod bridge and the placeholder that kept the pod interface's name go (the pod's own
   * interface, renamed `<hash>-nic`, is left to Multus and the pod), then its state file.
   * `unplugged` names each network with its pod interface; a network with no state file here
   * is skipped. Returns the networks taken down.
   */
  async unplug(
    vmi: VirtualMachineInstance,
    target: PodNetworkTarget,
    unplugged: { name: string; podInterface: string }[],
  ): Promise<string[]> {
    const uid = vmi.metadata.uid!;
    const done: string[] = [];
    for (const { name, podInterface } of unplugged) {
      const file = this.#file(uid, name);
      if (!(await Deno.stat(file).then(() => true, () => false))) continue;
      const state = await this.#state(target.netns);
      const lines: string[] = [];
      for (const link of [tapName(podInterface), bridgeName(podInterface)]) {
        if (state.links.has(link)) lines.push(`link delete ${link}`);
      }
      // The placeholder is a bridge with no ports; a pod interface never renamed is kept.
      if (state.links.get(podInterface)?.kind === "bridge") {
        lines.push(`link delete ${podInterface}`);
      }
      try {
        if (lines.length > 0) await this.#ipBatch(target.netns, "Cannot unplug", lines);
      } catch (error) {
        throw new PodNetworkError(name, errorText(error), { cause: error });
      }
      await Deno.remove(file).catch((error) => {
        if (!(error instanceof Deno.errors.NotFound)) throw error;
      });
      this.#addresses.get(uid)?.delete(name);
      log.info("Unplugged interface's network taken down", { uid, network: name, podInterface });
      done.push(name);
    }
    return done;
  }

  /** Forgets a VMI's networks: its state files go (KubeVirt's handler teardown). */
  async teardown(uid: string): Promise<void> {
    this.#addresses.delete(uid);
    await Deno.remove(join(this.#cacheDir, uid), { recursive: true }).catch((error) => {
      if (!(error instanceof Deno.errors.NotFound)) throw error;
    });
  }
}

/** Whether a link of that name exists in this process's (the host's) network namespace. */
export function hostLinkExists(name: string): boolean {
  try {
    Deno.lstatSync(`/sys/class/net/${name}`);
    return true;
  } catch {
    return false;
  }
}

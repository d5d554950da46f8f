/**
 * Pod-less mode's pod networks: no kubelet or container runtime gives a VM a pod, so the
 * handler does their part. Each VM gets a network namespace of its own, pinned by a bind
 * mount at `<netns dir>/<vmi uid>` (made through {@linkcode NetnsRunner} on a worker thread:
 * `unshare(CLONE_NEWNET)` there, never on the handler's own threads), and the CNI plugins
 * give it its `lo` (`loopback`) and its `eth0` with an address from the configured ranges
 * on the node bridge (`bridge`, with `host-local` addresses; the bridge holds each range's
 * gateway, so the host reaches every VM's pod address directly), called as a container
 * runtime calls them: `CNI_COMMAND=ADD|DEL`, `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_IFNAME`,
 * `CNI_PATH` and the network's configuration on stdin.
 *
 * Secondary networks are attached as Multus attaches them in a launcher pod: the
 * configuration of the network's NetworkAttachmentDefinition (`spec.config`, one plugin or a
 * list of them, chained with `prevResult`) is called with the interface named as KubeVirt
 * names it (`pod<hash>`). Only plugins of the CNI directory run: a `type` that is not a
 * plain file name is refused.
 *
 * After that the VM's namespace is like a launcher pod's, and the same bindings build on
 * it. Each ADD that succeeded is recorded beside the namespace (`<vmi uid>.json`, and
 * `<vmi uid>.<pod interface>.json` with the configuration it was made with for a secondary
 * network, so that it is deleted as it was made even once its definition is gone); an ADD
 * cut short by a restart is undone with DEL before it is tried again, so no address leaks.
 *
 * @module
 */

import { join } from "node:path";
import { type NetnsRunner, writeFileDurably } from "../../ffi/mod.ts";
import { getLogger } from "../log/mod.ts";
import { familyOf, parseCidr } from "./address.ts";
import { hostLinkExists } from "./pod_network.ts";
import { removeIfPresent } from "../lifecycle/mod.ts";

const log = getLogger("network", "cni");

/** The pod-less pod network, as the handler's configuration gives it. */
export interface PodlessNetworkConfig {
  /** The node bridge the VMs' pod interfaces join, e.g. `virtnode0`. */
  bridge: string;
  /** The pods' address ranges, at most one per family, e.g. `10.245.0.0/16`. */
  subnets: string[];
  /** The CNI plugins' directory; `/usr/lib/cni` (Debian's) unless told. */
  binDir?: string;
}

/** Options of {@linkcode PodlessNetworks}. */
export interface PodlessNetworksOptions extends PodlessNetworkConfig {
  /** Makes and removes the namespaces. */
  runner: NetnsRunner;
  /** Where the namespaces are pinned and the ADD results kept. */
  netnsDir: string;
  /** `host-local`'s lease directory. */
  ipamDir: string;
}

/** A secondary network to attach to a pod-less VM's namespace. */
export interface SecondaryAttachment {
  /** The VMI's network name. */
  network: string;
  /** The interface's name in the namespace (KubeVirt's `pod<hash>`). */
  podInterface: string;
  /** The NetworkAttachmentDefinition's `spec.config`: one plugin's configuration or a list. */
  config: string;
  /** The host's tap of the interface (made and moved by the binding), removed on release. */
  hostTap: string;
}

/** What is recorded of an attached secondary network. */
interface SecondaryRecord extends SecondaryAttachment {
  /** The last plugin's ADD result. */
  result: unknown;
}

/** One plugin of a network configuration, with the list's name and version. */
export interface PluginConfig {
  /** The plugin's file name in the CNI directory. */
  type: string;
  /** The network's name (the list's, for a plugin of a list). */
  name: string;
  /** The configuration's CNI version (the list's). */
  cniVersion: string;
  /** The plugin's own fields. */
  [field: string]: unknown;
}

/**
 * The plugins of a NetworkAttachmentDefinition's configuration, in order: a list's
 * `plugins`, or the one plugin. Throws naming what is wrong (not JSON, no name, no plugin,
 * a `type` that is not a plain file name).
 */
export function parseNetworkConfig(config: string): PluginConfig[] {
  let parsed: unknown;
  try {
    parsed = JSON.parse(config);
  } catch {
    throw new Error("its config is not JSON");
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
    throw new Error("its config is not a JSON object");
  }
  const c = parsed as Record<string, unknown>;
  const version = typeof c.cniVersion === "string" ? c.cniVersion : "0.3.1";
  if (typeof c.name !== "string" || c.name === "") throw new Error("its config has no name");
  const plugins = Array.isArray(c.plugins) ? c.plugins as unknown[] : [c];
  if (plugins.length === 0) throw new Error("its config lists no plugins");
  return plugins.map((p, i) => {
    if (typeof p !== "object" || p === null || Array.isArray(p)) {
      throw new Error(`its plugin ${i} is not a JSON object`);
    }
    const plugin = p as Record<string, unknown>;
    const type = plugin.type;
    if (typeof type !== "string" || !/^[A-Za-z0-9][A-Za-z0-9_.-]*$/.test(type)) {
      throw new Error(
        `its plugin ${i} has type ${JSON.stringify(type)}, not the file name of a CNI plugin`,
      );
    }
    const { plugins: _, ...rest } = plugin;
    return { ...rest, type, name: c.name as string, cniVersion: version };
  });
}

/** A CNI plugin that failed. */
export class CniError extends Error {
  /** Creates `Cannot <action> the pod network of VMI <uid>: <plugin>: <detail>`. */
  constructor(action: string, uid: string, plugin: string, detail: string) {
    super(`Cannot ${action} the pod network of VMI ${uid}: CNI plugin ${plugin}: ${detail}`);
    this.name = "CniError";
  }
}

/** The CNI network name virtnode's pod-less pods are on. */
export const PODLESS_NETWORK_NAME = "virtnode";
/** The name of a pod-less VMI's interface on the pod network in its namespace. */
export const POD_INTERFACE = "eth0";
const CNI_VERSION = "1.0.0";
const CNI_TIMEOUT_MS = 30_000;

/** Checks a pod-less network configuration; returns what is wrong, or undefined. */
export function checkPodlessNetwork(config: PodlessNetworkConfig): string | undefined {
  if (!/^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$/.test(config.bridge)) {
    return `bridge name "${config.bridge}" is not a network interface name (1 to 15 characters)`;
  }
  const families = new Set<number>();
  for (const subnet of config.subnets) {
    let cidr;
    try {
      cidr = parseCidr(subnet);
    } catch {
      return `"${subnet}" is not a CIDR`;
    }
    const family = familyOf(cidr.address);
    if (families.has(family)) return `more than one IPv${family} range`;
    families.add(family);
    if (cidr.prefix > (family === 4 ? 30 : 126)) return `range "${subnet}" is too small`;
  }
  return config.subnets.length === 0 ? "no address range" : undefined;
}

/** The pod-less VMs' pod networks; see the module doc. */
export class PodlessNetworks {
  readonly #o: PodlessNetworksOptions;

  /** Creates the manager; nothing is made until {@linkcode PodlessNetworks.ensure}. */
  constructor(options: PodlessNetworksOptions) {
    this.#o = options;
  }

  /** The namespace file of a VMI's pod. */
  netnsPath(uid: string): string {
    return join(this.#o.netnsDir, uid);
  }

  #resultFile(uid: string): string {
    return join(this.#o.netnsDir, `${uid}.json`);
  }

  #config(type: "bridge" | "loopback"): string {
    if (type === "loopback") {
      return JSON.stringify({ cniVersion: CNI_VERSION, name: "cni-loopback", type: "loopback" });
    }
    return JSON.stringify({
      cniVersion: CNI_VERSION,
      name: PODLESS_NETWORK_NAME,
      type: "bridge",
      bridge: this.#o.bridge,
      isGateway: true,
      ipMasq: false,
      ipam: {
        type: "host-local",
        dataDir: this.#o.ipamDir,
        ranges: this.#o.subnets.map((subnet) => [{ subnet }]),
        routes: this.#o.subnets.map((s) => ({ dst: familyOf(s) === 4 ? "0.0.0.0/0" : "::/0" })),
      },
    });
  }

  #plugin(
    command: "ADD" | "DEL",
    type: "bridge" | "loopback",
    uid: string,
    netns: string | undefined,
  ): Promise<unknown> {
    return this.#exec(
      command,
      type,
      this.#config(type),
      uid,
      netns,
      type === "loopback" ? "lo" : POD_INTERFACE,
    );
  }

  async #exec(
    command: "ADD" | "DEL",
    type: string,
    config: string,
    uid: string,
    netns: string | undefined,
    ifname: string,
  ): Promise<unknown> {
    const binDir = this.#o.binDir ?? "/usr/lib/cni";
    const child = new Deno.Command(join(binDir, type), {
      env: {
        CNI_COMMAND: command,
        CNI_CONTAINERID: uid,
        CNI_NETNS: netns ?? "",
        CNI_IFNAME: ifname,
        CNI_PATH: binDir,
        PATH: Deno.env.get("PATH") ?? "/usr/sbin:/usr/bin:/sbin:/bin",
      },
      clearEnv: true,
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
      signal: AbortSignal.timeout(CNI_TIMEOUT_MS),
    }).spawn();
    const writer = child.stdin.getWriter();
    await writer.write(new TextEncoder().encode(config));
    await writer.close();
    const out = await child.output();
    const stdout = new TextDecoder().decode(out.stdout);
    if (!out.success) {
      // CNI plugins report errors as JSON on stdout ({"code":...,"msg":...}).
      let detail = new TextDecoder().decode(out.stderr).trim() || stdout.trim();
      try {
        const e = JSON.parse(stdout) as { msg?: string; details?: string };
        if (e.msg) detail = e.details ? `${e.msg}: ${e.details}` : e.msg;
      } catch { /* not JSON */ }
      throw new CniError(
        command === "ADD" ? "add" : "delete",
        uid,
        type,
        detail || `exit ${out.code}`,
      );
    }
    return stdout.trim() === "" ? undefined : JSON.parse(stdout);
  }

  /** Runs a secondary network's plugins: ADD in order with each result passed on, DEL backwards. */
  async #chain(
    command: "ADD" | "DEL",
    attachment: SecondaryAttachment,
    uid: string,
    netns: string | undefined,
  ): Promise<unknown> {
    const plugins = parseNetworkConfig(attachment.config);
    let result: unknown;
    for (const plugin of command === "ADD" ? plugins : [...plugins].reverse()) {
      const config = command === "ADD" && result !== undefined
        ? { ...plugin, prevResult: result }
        : plugin;
      const out = await this.#exec(
        command,
        plugin.type,
        JSON.stringify(config),
        uid,
        netns,
        attachment.podInterface,
      );
      if (command === "ADD") result = out ?? result;
    }
    return result;
  }

  /** Whether a VMI's secondary network of that pod interface is attached (recorded). */
  attached(uid: string, podInterface: string): Promise<boolean> {
    return Deno.stat(this.#secondaryFile(uid, podInterface)).then(() => true, () => false);
  }

  #secondaryFile(uid: string, podInterface: string): string {
    return join(this.#o.netnsDir, `${uid}.${podInterface}.json`);
  }

  /** The secondary networks recorded for a VMI. */
  async #secondaries(uid: string): Promise<SecondaryRecord[]> {
    const records: SecondaryRecord[] = [];
    const prefix = `${uid}.`;
    const entries = await Array.fromAsync(Deno.readDir(this.#o.netnsDir)).catch((error) => {
      if (error instanceof Deno.errors.NotFound) return [];
      throw error;
    });
    for (const entry of entries) {
      const secondary = entry.isFile && entry.name.startsWith(prefix) &&
        entry.name.endsWith(".json") && entry.name !== `${uid}.json`;
      if (!secondary) continue;
      const text = await Deno.readTextFile(join(this.#o.netnsDir, entry.name));
      records.push(JSON.parse(text) as SecondaryRecord);
    }
    return records;
  }

  /**
   * Gives the VMI its pod network namespace with `lo` and `eth0`, and an interface on each
   * of `secondaries` (idempotent), and returns the namespace file.
   */
  async ensure(uid: string, secondaries: SecondaryAttachment[] = []): Promise<string> {
    const netns = await this.#ensurePod(uid);
    for (const attachment of secondaries) {
      const file = this.#secondaryFile(uid, attachment.podInterface);
      if (await Deno.stat(file).then(() => true, () => false)) continue;
      // An ADD a restart cut short may hold what it made: undone first.
      await this.#chain("DEL", attachment, uid, netns).catch(() => {});
      const started = performance.now();
      const result = await this.#chain("ADD", attachment, uid, netns);
      const record: SecondaryRecord = { ...attachment, result: result ?? {} };
      await writeFileDurably(file, JSON.stringify(record), { mode: 0o600 });
      log.info("Secondary network attached", {
        uid,
        network: attachment.network,
        podInterface: attachment.podInterface,
        ms: Math.round(performance.now() - started),
      });
    }
    return netns;
  }

  async #ensurePod(uid: string): Promise<string> {
    const netns = this.netnsPath(uid);
    const recorded = await Deno.stat(this.#resultFile(uid)).then(() => true, () => false);
    const pinned = await isPinned(netns);
    if (recorded && pinned) return netns;
    await Deno.mkdir(this.#o.netnsDir, { recursive: true, mode: 0o700 });
    await Deno.mkdir(this.#o.ipamDir, { recursive: true, mode: 0o700 });
    if (!pinned) {
      await this.#o.runner.run(undefined, [{ op: "remove", path: netns }]);
      await this.#o.runner.run(undefined, [{ op: "create", path: netns }]);
    }
    // An ADD a restart cut short may hold an address: give it back first.
    await this.#plugin("DEL", "bridge", uid, netns).catch(() => {});
    const started = performance.now();
    await this.#plugin("ADD", "loopback", uid, netns);
    const result = await this.#plugin("ADD", "bridge", uid, netns);
    await writeFileDurably(this.#resultFile(uid), JSON.stringify(result ?? {}), { mode: 0o600 });
    log.info("Pod network namespace made", {
      uid,
      netns,
      ips: ((result as { ips?: { address: string }[] })?.ips ?? []).map((i) => i.address),
      ms: Math.round(performance.now() - started),
    });
    return netns;
  }

  /**
   * Gives the VMI's addresses back and removes its namespace with every link in it, and
   * the taps of `hostTaps` still in the host's namespace (a domain that never started
   * took none of them into the pod). Idempotent.
   */
  async release(uid: string, hostTaps: string[] = []): Promise<void> {
    const netns = this.netnsPath(uid);
    const pinned = await isPinned(netns);
    const secondaries = await this.#secondaries(uid);
    for (const tap of [...hostTaps, ...secondaries.map((s) => s.hostTap)]) {
      if (!hostLinkExists(tap)) continue;
      const out = await new Deno.Command("ip", {
        args: ["link", "delete", "dev", tap],
        stdout: "null",
        stderr: "piped",
      }).output();
      if (!out.success && hostLinkExists(tap)) {
        throw new Error(
          `Cannot remove tap "${tap}": ip: ${new TextDecoder().decode(out.stderr).trim()}`,
        );
      }
    }
    for (const secondary of secondaries) {
      await this.#chain("DEL", secondary, uid, pinned ? netns : undefined);
      await removeIfPresent(this.#secondaryFile(uid, secondary.podInterface));
    }
    await this.#plugin("DEL", "bridge", uid, pinned ? netns : undefined);
    // The loopback plugin holds nothing outside the namespace, which goes next.
    if (pinned) await this.#plugin("DEL", "loopback", uid, netns).catch(() => {});
    await this.#o.runner.run(undefined, [{ op: "remove", path: netns }]);
    await removeIfPresent(this.#resultFile(uid));
  }
}

/** Whether `path` is a pinned network namespace: a file on the namespace filesystem (nsfs). */
async function isPinned(path: string): Promise<boolean> {
  try {
    const [file, nsfs] = await Promise.all([Deno.stat(path), Deno.stat("/proc/self/ns/net")]);
    return file.dev === nsfs.dev;
  } catch {
    return false;
  }
}

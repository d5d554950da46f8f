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
 * After that the VM's namespace is like a launcher pod's, and the same bindings build on
 * it. Each ADD that succeeded is recorded (`<vmi uid>.json` beside the namespace); an ADD
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

  async #plugin(
    command: "ADD" | "DEL",
    type: "bridge" | "loopback",
    uid: string,
    netns: string | undefined,
  ): Promise<unknown> {
    const binDir = this.#o.binDir ?? "/usr/lib/cni";
    const child = new Deno.Command(join(binDir, type), {
      env: {
        CNI_COMMAND: command,
        CNI_CONTAINERID: uid,
        CNI_NETNS: netns ?? "",
        CNI_IFNAME: type === "loopback" ? "lo" : POD_INTERFACE,
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
    await writer.write(new TextEncoder().encode(this.#config(type)));
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

  /**
   * Gives the VMI its pod network namespace with `lo` and `eth0` (idempotent) and returns
   * the namespace file.
   */
  async ensure(uid: string): Promise<string> {
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
    for (const tap of hostTaps) {
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
    const netns = this.netnsPath(uid);
    const pinned = await isPinned(netns);
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

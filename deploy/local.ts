/**
 * Local mode (`deno task start`): the whole agent on one machine, for trying
 * virtnode and for demos. It starts a real control plane (kube-apiserver and
 * etcd built by deploy/cluster/build.sh), a libvirtd with QEMU (or, when that
 * cannot run, libvirt's test driver, said loudly), and `virtnode handler
 * --podless` for a node named after this host; then applies the VMIs in
 * deploy/examples/ for that node and shows each VMI's phase live. It supervises the
 * handler: one that dies is said, started again (1 s, doubling to 30 s) and the phases are
 * marked stale until the new one is ready; the VMs keep running meanwhile.
 *
 * Ctrl-C deletes every VMI (the control plane is local mode's, with this host its only
 * node, and goes away with it), waits up to a minute for the handler to stop their guests,
 * then stops everything and removes what is left of the run: domains of its VMIs (directly
 * through libvirt when the handler did not), mounts and pinned network namespaces below its
 * folder, its processes and its folders. It says exactly what it could not remove, and
 * leaves the host's libvirt as it found it (qemu.conf, and whether libvirtd runs).
 *
 * Flags: `--until-running` exits (cleanly) once every example VMI is Running, for
 * tests; `--test-driver` uses libvirt's test driver even where QEMU could run;
 * `--virtctl` runs KubeVirt's own virt-api in place of the admission alone and the
 * handler's REST API beside it, so that KubeVirt's `virtctl console` and `vnc` reach the
 * VMIs (virt-api and virtctl are built on first use, deploy/kubevirt/build_virtctl.sh).
 *
 * @module
 */
import { kubectl, startCluster } from "./cluster/cluster.ts";
import { freePorts } from "./cluster/processes.ts";
import { buildVirtctlKit } from "./kubevirt/virtctl.ts";
import {
  CDI_CONFIG_READER,
  registerPodlessHandler,
  startVirtApi,
  type VirtApi,
} from "./kubevirt/virt_api.ts";
import { type PreparedLibvirtd, prepareLibvirtd } from "./libvirtd.ts";
import { podlessNodeKubeconfig } from "./podless_node.ts";
import { KubeApiError, type KubeClient, loadKubeClient } from "../mod/kube/mod.ts";
import { sleep } from "../mod/lifecycle/mod.ts";
import type { VirtualMachine, VirtualMachineInstance } from "../mod/api/mod.ts";
import { V8_FLAGS } from "../mod/config/mod.ts";
import { domainNameOf } from "../mod/domain/mod.ts";
import { type GhostRecord, GhostRecordStore } from "../mod/handler/mod.ts";
import { hostLinkExists, hostTapName } from "../mod/network/mod.ts";
import { type ClusterEvent, lastActionLine, shownName, vmiRows } from "./local_screen.ts";
import { parseXml, path } from "../mod/xml/mod.ts";
import { type Connection, MNT_DETACH, openLibvirt, umount2 } from "../ffi/mod.ts";
import {
  checkSecurityDriver,
  formatReport,
  hostProbes,
  securityModels,
} from "../mod/preflight/mod.ts";

const root = new URL("..", import.meta.url).pathname;
/** Local mode's flags and what each does, as `--help` lists them. */
const FLAGS: Record<string, string> = {
  "--virtctl": "also run KubeVirt's virt-api and the handler's REST API (virtctl console, vnc)",
  "--until-running": "exit once every example VMI is Running, cleaning up as Ctrl-C does",
  "--test-driver": "use libvirt's test driver (no guests run) even where QEMU could",
  "--help": "show this help",
};
if (Deno.args.includes("--help") || Deno.args.includes("-h")) {
  console.log(
    "Usage: deno task start [flags]\n\n" +
      "Runs virtnode's local mode: a control plane with KubeVirt's CRDs and admission, " +
      "libvirtd,\nthe pod-less handler for this host and the example VMIs, live. Flags:\n" +
      Object.entries(FLAGS).map(([flag, what]) => `  ${flag.padEnd(16)} ${what}`).join("\n"),
  );
  Deno.exit(0);
}
const unknown = Deno.args.find((arg) => !Object.hasOwn(FLAGS, arg));
if (unknown !== undefined) {
  console.error(
    `deno task start: unknown flag '${unknown}' (run 'deno task start --help' for usage)`,
  );
  Deno.exit(2);
}
const args = new Set(Deno.args);
const untilRunning = args.has("--until-running");
const withVirtctl = args.has("--virtctl");
const isTerminal = Deno.stdout.isTerminal();
/** `--until-running` gives up after this long. */
const UNTIL_RUNNING_TIMEOUT_MS = 5 * 60_000;
const nodeName = Deno.hostname().toLowerCase().replace(/[^a-z0-9.-]/g, "-");

function say(line: string) {
  console.log(`[local] ${line}`);
}

/** libvirtd with QEMU, as this host allows; libvirt's test driver when it cannot run. */
async function pickLibvirt(): Promise<{ uri: string; prepared?: PreparedLibvirtd }> {
  if (args.has("--test-driver")) return { uri: "test:///default" };
  try {
    const prepared = await prepareLibvirtd();
    if (prepared.changedQemuConf) {
      say("libvirt: added virtnode's lines to qemu.conf (undone at exit)");
    }
    if (prepared.startedDaemons) say("libvirt: started libvirtd (stopped at exit)");
    return { uri: prepared.uri, prepared };
  } catch (error) {
    const bar = "!".repeat(78);
    console.log(`${bar}\n!!! Cannot start libvirtd with QEMU: ${(error as Error).message}`);
    console.log(`!!! Falling back to libvirt's TEST DRIVER: no real guests will run.\n${bar}`);
    return { uri: "test:///default" };
  }
}

/**
 * Local mode's libvirtd runs QEMU without a security driver (deploy/libvirtd.ts), which a
 * node that runs others' guests must not: said loudly, in `virtnode check --local`'s words.
 */
async function warnSecurityDriver(uri: string): Promise<void> {
  let models: string[];
  try {
    models = securityModels(await hostProbes.capabilities(uri));
  } catch (error) {
    say(`cannot read libvirt's capabilities: ${(error as Error).message}`);
    return;
  }
  const result = checkSecurityDriver(uri, models, { local: true });
  if (result.verdict === "PASS") return;
  console.log(formatReport([result]));
  say(
    "WARNING: no security driver confines QEMU here: every guest runs unconfined as one " +
      "user; local mode is for guests you trust (virtnode check fails such a host)",
  );
}

/** The example manifests with their node label set to this host's node. */
async function examples(): Promise<{ file: string; yaml: string; name: string }[]> {
  const dir = `${root}deploy/examples`;
  const out = [];
  for (const e of [...Deno.readDirSync(dir)].sort((a, b) => a.name.localeCompare(b.name))) {
    if (!e.name.endsWith(".yaml")) continue;
    const text = await Deno.readTextFile(`${dir}/${e.name}`);
    const name = /^ {2}name: (\S+)/m.exec(text)?.[1] ?? e.name;
    out.push({
      file: e.name,
      name,
      yaml: text.replace(/kubernetes\.io\/hostname: \S+/, `kubernetes.io/hostname: ${nodeName}`),
    });
  }
  return out;
}

/** The first wait before a dead handler is started again; it doubles with each death. */
const RESTART_BACKOFF_MS = 1_000;
/** The longest wait before a dead handler is started again. */
const RESTART_BACKOFF_MAX_MS = 30_000;
/** A handler that ran this long was healthy: after its death the wait starts over. */
const HEALTHY_RUN_MS = 60_000;
/** How long the handler gets to end after SIGTERM before it is killed. */
const HANDLER_STOP_MS = 30_000;

/** Where the supervised handler stands, as the table shows it. */
interface HandlerHealth {
  /**
   * When the handler died, until one started since answers `/readyz`: meanwhile nobody
   * writes the VMIs' status, and what the table shows of them is stale.
   */
  downSince?: Date;
  /** How the last handler ended, e.g. "killed by SIGKILL". */
  reason?: string;
  /** The PID of the handler running now, if one is. */
  pid?: number;
}

/** Whether the handler's `/readyz` answers 200. */
async function handlerReady(port: number): Promise<boolean> {
  try {
    const res = await fetch(`http://127.0.0.1:${port}/readyz`, {
      signal: AbortSignal.timeout(2_000),
    });
    await res.body?.cancel();
    return res.ok;
  } catch {
    return false;
  }
}

/** How a process ended, in words. */
function describeExit(status: Deno.CommandStatus): string {
  return status.signal ? `killed by ${status.signal}` : `exit code ${status.code}`;
}

/** A wall clock time as HH:MM:SS. */
function clock(date: Date): string {
  return date.toTimeString().slice(0, 8);
}

/**
 * Runs `virtnode handler --podless` for this host's node, its output in
 * `<dir>/handler.log`, and starts it again whenever it dies: after 1 s, doubling to 30 s
 * (a handler that ran a minute starts over at 1 s), and at once while local mode stops,
 * which needs a handler to shut the VMIs' guests down. A restarted handler takes the
 * running VMs back (its ghost records and the launcher host outlive it), so no guest
 * stops; until it answers `/readyz`, {@linkcode HandlerSupervisor.health} says it is down.
 */
class HandlerSupervisor {
  readonly #dir: string;
  readonly #kubeconfig: string;
  readonly #uri: string;
  /** The handler subcommand's flags beyond local mode's own. */
  readonly #args: string[];
  readonly #logPath: string;
  readonly #logFile: Deno.FsFile;
  #child?: Deno.ChildProcess;
  /** The next restart is to come without a wait (once, as local mode begins to stop). */
  #immediate = false;
  /** The handler is to end for good. */
  #ending = false;
  /** Cuts a back-off wait short. */
  #wake = new AbortController();
  #loop: Promise<Deno.CommandStatus | undefined> = Promise.resolve(undefined);
  #changed = Promise.withResolvers<void>();
  /** The handler's state now. */
  readonly health: HandlerHealth = {};

  /**
   * A supervisor of the handler for the local node with `kubeconfig` and libvirt at
   * `uri`, its state, run directory and log below `dir`; nothing runs before `start()`.
   */
  constructor(o: { dir: string; kubeconfig: string; uri: string; args?: string[] }) {
    this.#dir = o.dir;
    this.#args = o.args ?? [];
    this.#kubeconfig = o.kubeconfig;
    this.#uri = o.uri;
    this.#logPath = `${o.dir}/handler.log`;
    this.#logFile = Deno.openSync(this.#logPath, { create: true, write: true, append: true });
  }

  /** Starts the handler and its supervision. */
  start(): void {
    this.#loop = this.#supervise();
  }

  /** Resolves at the next change of {@linkcode HandlerSupervisor.health}. */
  changed(): Promise<void> {
    return this.#changed.promise;
  }

  /**
   * Local mode stops and needs a handler to shut the guests down: one that is down is
   * started again at once (a later death waits its back-off, so that a handler that cannot
   * start is not started over and over).
   */
  stopping(): void {
    this.#immediate = true;
    this.#wake.abort();
  }

  /**
   * Ends the handler (SIGTERM; SIGKILL after {@linkcode HANDLER_STOP_MS}) and its
   * supervision; resolves with how the last handler ended, undefined when none ran.
   */
  async end(): Promise<Deno.CommandStatus | undefined> {
    this.#ending = true;
    this.#wake.abort();
    const child = this.#child;
    if (child) {
      try {
        child.kill("SIGTERM");
      } catch { /* ended meanwhile */ }
      const killer = setTimeout(() => {
        say(`the handler did not end within ${HANDLER_STOP_MS / 1000} s of SIGTERM: killing it`);
        try {
          child.kill("SIGKILL");
        } catch { /* ended meanwhile */ }
      }, HANDLER_STOP_MS);
      await child.status.finally(() => clearTimeout(killer));
    }
    const status = await this.#loop;
    this.#logFile.close();
    return status;
  }

  async #supervise(): Promise<Deno.CommandStatus | undefined> {
    let backoff = RESTART_BACKOFF_MS;
    let last: Deno.CommandStatus | undefined;
    while (!this.#ending) {
      const port = freePorts(1)[0];
      const child = this.#spawn(port);
      this.#child = child;
      this.health.pid = child.pid;
      this.#notify();
      say(`handler started (pid ${child.pid}); its log: ${this.#logPath}`);
      const started = performance.now();
      const pumped = Promise.all([this.#pump(child.stdout), this.#pump(child.stderr)]);
      const ready = this.#untilReady(child, port);
      last = await child.status;
      await Promise.all([pumped, ready]);
      this.#child = undefined;
      this.health.pid = undefined;
      if (this.#ending) break;
      if (performance.now() - started > HEALTHY_RUN_MS) backoff = RESTART_BACKOFF_MS;
      this.health.downSince ??= new Date();
      this.health.reason = describeExit(last);
      this.#notify();
      const wait = this.#immediate ? 0 : backoff;
      say(
        `the handler (pid ${child.pid}) died (${this.health.reason}); starting it again ` +
          `${wait > 0 ? `in ${wait / 1000} s` : "now"}; its log: ${this.#logPath}`,
      );
      await sleep(wait, this.#wake.signal);
      // Whether the wait was skipped or cut short, the one immediate restart is this one.
      this.#immediate = false;
      if (this.#wake.signal.aborted) this.#wake = new AbortController();
      backoff = Math.min(backoff * 2, RESTART_BACKOFF_MAX_MS);
    }
    return last;
  }

  /** Polls the handler's `/readyz` until it answers or the handler ends. */
  async #untilReady(child: Deno.ChildProcess, port: number): Promise<void> {
    let ended = false;
    const exited = child.status.then(() => (ended = true));
    while (!ended) {
      if (await handlerReady(port)) {
        const { downSince } = this.health;
        if (downSince) {
          const seconds = Math.round((Date.now() - downSince.getTime()) / 1000);
          say(`the handler is ready again (pid ${child.pid}), ${seconds} s after it went down`);
        } else {
          say(`handler ready (pid ${child.pid})`);
        }
        this.health.downSince = undefined;
        this.health.reason = undefined;
        this.#notify();
        return;
      }
      await Promise.race([exited, sleep(500)]);
    }
  }

  #notify(): void {
    this.#changed.resolve();
    this.#changed = Promise.withResolvers<void>();
  }

  async #pump(stream: ReadableStream<Uint8Array>): Promise<void> {
    for await (const chunk of stream) await this.#logFile.write(chunk);
  }

  #spawn(port: number): Deno.ChildProcess {
    // Its own session: a terminal's Ctrl-C reaches local mode only, which deletes the VMIs
    // through this handler before it stops it. setpriv has the kernel stop it should local
    // mode die without doing so.
    return new Deno.Command("setsid", {
      args: [
        "setpriv",
        "--pdeathsig",
        "SIGTERM",
        "--",
        Deno.execPath(),
        "run",
        "-A",
        `--v8-flags=${V8_FLAGS}`,
        `${root}main.ts`,
        "--node-name",
        nodeName,
        "--kubeconfig",
        this.#kubeconfig,
        "--libvirt-uri",
        this.#uri,
        "--state-dir",
        `${this.#dir}/state`,
        "--run-dir",
        `${this.#dir}/run`,
        "--log-format",
        "json",
        "handler",
        "--podless",
        "--health-address",
        `127.0.0.1:${port}`,
        ...this.#args,
      ],
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
  }
}

/** The node bridge of the handler's pod network (`--pod-network-bridge`'s default). */
const POD_BRIDGE = "virtnode0";

/** Resolves at the first SIGINT or SIGTERM. */
function stopRequested(): Promise<void> {
  return new Promise<void>((resolve) => {
    let said = false;
    const onSignal = () => {
      // `deno task` passes a terminal's Ctrl-C on to this process, which had it too.
      if (!said) say("Ctrl-C: stopping");
      said = true;
      resolve();
    };
    Deno.addSignalListener("SIGINT", onSignal);
    Deno.addSignalListener("SIGTERM", onSignal);
  });
}

/** Every VMI of the cluster, in every namespace. */
const ALL_VMIS = "/apis/kubevirt.io/v1/virtualmachineinstances";
const ALL_VMS = "/apis/kubevirt.io/v1/virtualmachines";

/** A VMI of this run, by UID: whatever of it is left on the host is this run's. */
type RunVmi = Pick<GhostRecord, "uid" | "namespace" | "name">;

/** Adds the listed VMIs to `seen`, the VMIs of this run by UID. */
function remember(seen: Map<string, RunVmi>, vmis: VirtualMachineInstance[]): void {
  for (const { metadata: { uid, namespace, name } } of vmis) {
    if (uid && namespace) seen.set(uid, { uid, namespace, name });
  }
}

/**
 * One screen of the VMIs, the node's labels and what the handler did last. While no ready
 * handler runs after one died, a line says so and every phase is marked stale: nobody
 * keeps them current.
 */
async function statusTable(client: KubeClient, health: HandlerHealth): Promise<{
  table: string;
  /** The table without its ages: what changed since the last one shown, in a log. */
  changes: string;
  vmis: VirtualMachineInstance[];
}> {
  const list = await client.request<{ items: VirtualMachineInstance[] }>("GET", ALL_VMIS);
  const rows = vmiRows(list.items, health.downSince !== undefined);
  if (health.downSince) {
    rows.unshift(
      `handler down since ${clock(health.downSince)} (${health.reason}), ` +
        (health.pid ? `restarted (pid ${health.pid}), not ready yet` : "restarting") +
        ": the phases below are stale until it is ready again",
    );
  }
  const node = await client.request<{ metadata: { labels?: Record<string, string> } }>(
    "GET",
    `/api/v1/nodes/${nodeName}`,
  );
  const labels = node.metadata.labels ?? {};
  const cpuLabels = Object.keys(labels).filter((k) => k.includes(".node.kubevirt.io/")).length;
  rows.push(
    `node ${nodeName}: kubevirt.io/schedulable=${labels["kubevirt.io/schedulable"] ?? "-"}, ` +
      `${cpuLabels} labels from libvirt's capabilities`,
  );
  const events = await client.request<{ items: ClusterEvent[] }>("GET", "/api/v1/events");
  rows.push(lastActionLine(events.items));
  const table = rows.join("\n");
  // Ages as the table shows them ("42s", "7m", "3h", "2d"; "5 s ago" on the last line).
  const changes = table.replace(/\b\d+[smhd]\b/g, "").replace(/, \d+[smhd] ago/, "");
  return { table, changes, vmis: list.items };
}

/**
 * Shows the VMIs until a stop is requested; with `--until-running`, until every example
 * VMI runs (0) or one fails (1).
 */
async function watch(
  client: KubeClient,
  o: {
    uri: string;
    kubeconfig: string;
    expected: number;
    handler: HandlerSupervisor;
    seen: Map<string, RunVmi>;
    /** How to reach the VMIs with virtctl, when local mode runs virt-api. */
    virtctlHint?: string;
  },
  stopped: Promise<void>,
): Promise<number> {
  let stopping = false;
  stopped.then(() => (stopping = true));
  let last = "";
  const deadline = Date.now() + UNTIL_RUNNING_TIMEOUT_MS;
  while (!stopping) {
    if (untilRunning && Date.now() > deadline) {
      say(`the example VMIs were not all Running after ${UNTIL_RUNNING_TIMEOUT_MS / 1000} s`);
      return 1;
    }
    try {
      const { table, changes, vmis } = await statusTable(client, o.handler.health);
      remember(o.seen, vmis);
      // A terminal's screen is redrawn as the ages grow; a log gets a table per change.
      if ((isTerminal ? table : changes) !== last) {
        if (isTerminal) {
          console.log(
            "\x1b[2J\x1b[H" + `virtnode local mode — node ${nodeName}, ` +
              `libvirt ${o.uri}  (Ctrl-C stops everything)\nkubeconfig: ${o.kubeconfig}\n` +
              (o.virtctlHint ? `${o.virtctlHint}\n` : ""),
          );
        }
        console.log(table + "\n");
        last = isTerminal ? table : changes;
      }
      if (
        untilRunning && vmis.length === o.expected &&
        vmis.every((v) => v.status?.phase === "Running")
      ) {
        say("every example VMI is Running");
        return 0;
      }
      if (untilRunning && vmis.some((v) => v.status?.phase === "Failed")) {
        say("an example VMI failed");
        return 1;
      }
    } catch (error) {
      say(`cannot list VMIs yet: ${(error as Error).message}`);
    }
    // A handler's death or readiness shows at once, not at the next round.
    await Promise.race([stopped, sleep(1000), o.handler.changed()]);
  }
  return 0;
}

/** How long a stop waits for the handler to shut the deleted VMIs' guests down. */
const STOP_WAIT_MS = 60_000;

/** The ghost records the handler keeps in `dir`: one per VMI it has not cleaned up after. */
async function ghostRecords(dir: string): Promise<GhostRecord[]> {
  try {
    await Deno.stat(dir);
  } catch {
    return []; // the handler never served a VMI
  }
  const store = new GhostRecordStore(dir);
  await store.load();
  return store.list();
}

/**
 * Deletes every VM and VMI of the cluster: local mode's control plane has this host as its only
 * node and goes away with it, so a VMI the user made is no more meant to outlive it than
 * the examples. Waits (up to {@linkcode STOP_WAIT_MS}) until the handler has shut their
 * guests down and cleaned up after them (no ghost record left) and the API has none;
 * deletes any VMI made meanwhile too.
 */
async function deleteEveryVmi(
  client: KubeClient,
  o: { ghostDir: string; seen: Map<string, RunVmi> },
): Promise<void> {
  const deleted = new Set<string>();
  const announce = () => {
    if (deleted.size > 0) return;
    say(
      "deleting every VM and VMI (local mode's cluster goes away with them); their guests " +
        "shut down as their grace periods allow",
    );
  };
  const deadline = Date.now() + STOP_WAIT_MS;
  let waitingFor = "";
  for (;;) {
    const left = new Set<string>();
    // VMs first: a VM left would make its VMI again.
    try {
      const vms = await client.request<{ items: VirtualMachine[] }>("GET", ALL_VMS);
      for (const vm of vms.items) {
        const name = `vm/${shownName(vm)}`;
        left.add(name);
        if (vm.metadata.deletionTimestamp || deleted.has(vm.metadata.uid!)) continue;
        announce();
        deleted.add(vm.metadata.uid!);
        say(`deleting VM ${shownName(vm)} (its VMI goes with it)`);
        const path = `/apis/kubevirt.io/v1/namespaces/${vm.metadata.namespace}` +
          `/virtualmachines/${vm.metadata.name}`;
        await client.request("DELETE", path).catch((error) => {
          if (!(error instanceof KubeApiError && error.status === 404)) {
            say(`cannot delete VM ${shownName(vm)}: ${error.message}`);
          }
        });
      }
    } catch (error) {
      say(`cannot list the VMs: ${(error as Error).message}`);
    }
    try {
      const { items } = await client.request<{ items: VirtualMachineInstance[] }>(
        "GET",
        ALL_VMIS,
      );
      remember(o.seen, items);
      for (const vmi of items) {
        const name = shownName(vmi);
        left.add(name);
        if (vmi.metadata.deletionTimestamp || deleted.has(vmi.metadata.uid!)) continue;
        announce();
        deleted.add(vmi.metadata.uid!);
        say(`deleting VMI ${name}`);
        const path = `/apis/kubevirt.io/v1/namespaces/${vmi.metadata.namespace}` +
          `/virtualmachineinstances/${vmi.metadata.name}`;
        await client.request("DELETE", path).catch((error) => {
          if (!(error instanceof KubeApiError && error.status === 404)) {
            say(`cannot delete VMI ${name}: ${error.message}`);
          }
        });
      }
    } catch (error) {
      say(`cannot list the VMIs: ${(error as Error).message}`);
    }
    for (const record of await ghostRecords(o.ghostDir).catch(() => [])) {
      left.add(shownName({ metadata: record }));
    }
    if (left.size === 0) return;
    const names = [...left].sort().join(", ");
    if (Date.now() > deadline) {
      say(
        `${names}: not gone after ${STOP_WAIT_MS / 1000} s; what the handler did not ` +
          "clean up is removed directly",
      );
      return;
    }
    if (names !== waitingFor) say(`waiting for the handler to clean up after: ${names}`);
    waitingFor = names;
    await sleep(500);
  }
}

/**
 * Ends the launcher host the handler started (it outlives the handler by design, so that
 * a handler restart never stops a VM); it serves nothing once the VMIs are deleted.
 */
async function stopLauncherHost(stateDir: string): Promise<void> {
  let entries: Deno.DirEntry[];
  try {
    entries = [...Deno.readDirSync(`${stateDir}/launchers`)];
  } catch {
    return;
  }
  for (const e of entries) {
    if (!e.name.startsWith("host-") || !e.name.endsWith(".pid")) continue;
    const pid = Number(Deno.readTextFileSync(`${stateDir}/launchers/${e.name}`).trim());
    let cmdline = "";
    try {
      cmdline = Deno.readTextFileSync(`/proc/${pid}/cmdline`);
    } catch {
      continue; // gone already
    }
    if (!cmdline.includes("\0launcher-host\0")) continue;
    say(`stopping the launcher host (pid ${pid})`);
    Deno.kill(pid, "SIGTERM");
    for (let i = 0; i < 100; i++) {
      try {
        Deno.statSync(`/proc/${pid}`);
      } catch {
        return;
      }
      await sleep(100);
    }
    Deno.kill(pid, "SIGKILL");
  }
}

/**
 * Destroys and undefines the domains the handler left of this run's VMIs (those it did
 * not finish with in time, or at all), each only when its KubeVirt metadata names the
 * VMI's UID: a domain of the same name from elsewhere is not this run's. Returns what
 * could not be removed.
 */
async function removeDomainsLeft(uri: string, records: RunVmi[]): Promise<string[]> {
  // The test driver's domains lived in the launcher host's connection, gone with it.
  if (records.length === 0 || uri.startsWith("test:")) return [];
  let conn: Connection;
  try {
    conn = await openLibvirt(uri);
  } catch (error) {
    return [
      `domains of ${records.map((r) => shownName({ metadata: r })).join(", ")}, if any: ` +
      `cannot connect to libvirt at "${uri}": ${(error as Error).message}`,
    ];
  }
  const left: string[] = [];
  try {
    const present = new Map((await conn.listAllDomains()).map((d) => [d.name, d]));
    for (const record of records) {
      const name = domainNameOf(record.namespace, record.name);
      const summary = present.get(name);
      if (!summary) continue;
      try {
        const domain = await conn.lookupByName(name);
        const uid = path(parseXml(await domain.getXMLDesc()), "metadata", "kubevirt", "uid");
        if (uid?.text.trim() !== record.uid) continue;
        if (summary.id >= 0) await domain.destroy();
        await domain.undefine({ nvram: true });
        say(`removed domain ${name}, which the handler did not clean up`);
      } catch (error) {
        left.push(`domain ${name}: ${(error as Error).message}`);
      }
    }
  } catch (error) {
    left.push(
      `domains of ${records.map((r) => shownName({ metadata: r })).join(", ")}: ` +
        (error as Error).message,
    );
  } finally {
    await conn.close();
  }
  return left;
}

/**
 * Removes the host side taps of this run's VMIs that are still in the host's namespace (a
 * pod network binding the handler did not finish or undo).
 */
async function removeHostTaps(records: RunVmi[]): Promise<string[]> {
  const left: string[] = [];
  for (const tap of records.map((r) => hostTapName(r.uid)).filter(hostLinkExists)) {
    const out = await new Deno.Command("ip", {
      args: ["link", "delete", "dev", tap],
      stdout: "null",
      stderr: "piped",
    }).output();
    if (hostLinkExists(tap)) {
      left.push(`tap ${tap}: ip: ${new TextDecoder().decode(out.stderr).trim()}`);
    } else say(`removed tap ${tap}`);
  }
  return left;
}

/** The processes, other than this one, whose command line names something in `dir`. */
function processesOf(dir: string): { pid: number; command: string }[] {
  const found = [];
  for (const entry of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(entry.name) || Number(entry.name) === Deno.pid) continue;
    let cmdline: string;
    try {
      cmdline = Deno.readTextFileSync(`/proc/${entry.name}/cmdline`);
    } catch {
      continue; // ended meanwhile
    }
    if (!cmdline.includes(`${dir}/`)) continue;
    found.push({ pid: Number(entry.name), command: cmdline.replaceAll("\0", " ").trim() });
  }
  return found;
}

/**
 * Ends every process still working in `dir` (a launcher or host the handler left):
 * SIGTERM, then SIGKILL after 5 s. Returns those that outlived both.
 */
async function endProcessesOf(dir: string): Promise<string[]> {
  const signal = (pid: number, name: Deno.Signal) => {
    try {
      Deno.kill(pid, name);
    } catch { /* ended meanwhile */ }
  };
  let left = processesOf(dir);
  for (const p of left) {
    say(`ending process ${p.pid} (${p.command.slice(0, 120)})`);
    signal(p.pid, "SIGTERM");
  }
  for (let i = 0; i < 50 && left.length > 0; i++) {
    await sleep(100);
    left = processesOf(dir);
  }
  for (const p of left) signal(p.pid, "SIGKILL");
  for (let i = 0; i < 20 && left.length > 0; i++) {
    await sleep(100);
    left = processesOf(dir);
  }
  return left.map((p) => `process ${p.pid}: ${p.command}`);
}

/** The mount points below `dir` in this mount namespace, the deepest first. */
function mountsBelow(dir: string): string[] {
  return Deno.readTextFileSync("/proc/self/mountinfo").split("\n")
    .map((line) => line.split(" ")[4]?.replace(/\\040/g, " "))
    .filter((point): point is string => point?.startsWith(`${dir}/`) ?? false)
    .sort((a, b) => b.length - a.length);
}

/**
 * Unmounts what is still mounted below `dir`: network namespaces the handler pinned for
 * the VMIs' pod networks, volume mounts. Returns the mounts that stayed.
 */
function unmountBelow(dir: string): string[] {
  const left: string[] = [];
  for (const point of mountsBelow(dir)) {
    try {
      umount2(point, MNT_DETACH);
      say(`unmounted ${point}`);
    } catch (error) {
      left.push(`mount ${point}: ${(error as Error).message}`);
    }
  }
  return left;
}

async function main(): Promise<number> {
  say(`node name: ${nodeName}`);
  say("starting the control plane (kube-apiserver + etcd; built and cached on first use)");
  // Local mode owns Ctrl-C: it deletes its VMIs through the cluster before stopping it.
  // With KubeVirt's CRDs and admission: the examples go through virt-api's webhooks, and
  // the handler, which places them as virt-controller would, holds one of KubeVirt's
  // service accounts (its handler's, bound to this node).
  // With --virtctl, KubeVirt's own virt-api is the admission (its webhooks) and serves the
  // subresources virtctl calls; built before the cluster starts, which waits for nothing.
  let kit: string | undefined;
  if (withVirtctl) {
    say("building KubeVirt's virt-api and virtctl (first use only; cached)");
    kit = await buildVirtctlKit();
  }
  const cluster = await startCluster({ stopOnSignals: false, admission: !kit });
  const kubeconfig = cluster.kubeconfigPath;
  let virtApi: VirtApi | undefined;
  const handlerArgs: string[] = [];
  if (kit) {
    const [consolePort] = freePorts(1);
    // HotplugVolumes: virt-api's memory-dump, addvolume and removevolume subresources.
    virtApi = await startVirtApi(cluster, {
      kubevirtDir: kit,
      consoleServerPort: consolePort,
      developerConfiguration: { featureGates: ["HotplugVolumes"] },
    })
      .catch(async (error) => {
        await cluster.stop();
        throw error;
      });
    // virt-api calls the handler's REST API at its Pod's IP with mutual TLS: the handler
    // serves virt-api's port at this host's address with the certificate the operator
    // made for handlers, and trusts the clients kubevirt/kubevirt-ca's CA signed.
    handlerArgs.push(
      "--console-server-port",
      String(consolePort),
      "--console-server-address",
      virtApi.address,
      "--server-cert-dir",
      virtApi.secretDir("kubevirt-virt-handler-server-certs"),
    );
    say(`virt-api: KubeVirt's own, at ${virtApi.address} (its log: ${virtApi.dir}/virt-api.log)`);
    // virt-api reads CDI's CDIConfig before it takes a memory dump request (for the claim's
    // file system overhead). CDI is not installed here: the role CDI's install gives every
    // authenticated user lets virt-api find there is none, and KubeVirt's default holds.
    await kubectl(kubeconfig, ["apply", "-f", "-"], JSON.stringify(CDI_CONFIG_READER));
  }
  say(`kubeconfig: ${kubeconfig}`);
  say(`  try: KUBECONFIG=${kubeconfig} kubectl get vmi -w`);
  // No kubelet runs here: register the Node as one would, for the heartbeat and labels.
  const nodeJson = JSON.stringify({ apiVersion: "v1", kind: "Node", metadata: { name: nodeName } });
  const nodeFile = `${cluster.dir}/node.json`;
  await Deno.writeTextFile(nodeFile, nodeJson);
  await kubectl(kubeconfig, ["apply", "-f", nodeFile]);
  const { uri, prepared } = await pickLibvirt();
  say(`libvirt: ${uri}`);
  await warnSecurityDriver(uri);
  const dir = await Deno.makeTempDir({ prefix: "virtnode-local-" });
  // The handler's own identity: kubevirt-handler with a token bound to this Node, kept to
  // this node's objects by deploy/podless-node.yaml's admission policy.
  const handlerKubeconfig = await podlessNodeKubeconfig(
    cluster,
    nodeName,
    `${cluster.dir}/node.kubeconfig`,
  );
  say(`handler identity: kubevirt/kubevirt-handler bound to Node ${nodeName}`);
  // Claims on this host: a PersistentVolume whose local or hostPath path is in the root's
  // folder of its claim's namespace (mod/storage/podless_claims.ts).
  const diskRoot = `${dir}/disks`;
  await Deno.mkdir(diskRoot, { mode: 0o700 });
  handlerArgs.push("--host-disk-root", diskRoot);
  say(`claims: PersistentVolumes under ${diskRoot}/<namespace>/ (hotplug, virtctl memory-dump)`);
  // The handler's pod network's node bridge (its default); one this run made goes at exit.
  const bridgeWasThere = hostLinkExists(POD_BRIDGE);
  if (virtApi) await registerPodlessHandler(cluster, nodeName, virtApi.address);
  const handler = new HandlerSupervisor({
    dir,
    kubeconfig: handlerKubeconfig,
    uri,
    args: handlerArgs,
  });
  handler.start();
  const stopped = stopRequested();

  const manifests = await examples();
  for (const m of manifests) {
    const tmp = `${dir}/${m.file}`;
    await Deno.writeTextFile(tmp, m.yaml);
    say((await kubectl(kubeconfig, ["apply", "-f", tmp])).trim());
  }
  // The console and VNC of a VMI, through virt-api and the handler (vnc: a VNC viewer on
  // PATH, or --proxy-only for a port to point one at).
  const virtctlHint = kit
    ? `virtctl: ${kit}/virtctl --kubeconfig ${kubeconfig} console|vnc <vmi>`
    : undefined;
  if (virtctlHint) say(virtctlHint);
  const client = await loadKubeClient({ kubeconfigPath: kubeconfig });
  // Every VMI local mode saw: a domain of one of them is this run's.
  const seen = new Map<string, RunVmi>();
  const code = await watch(client, {
    uri,
    kubeconfig,
    expected: manifests.length,
    handler,
    seen,
    virtctlHint,
  }, stopped);

  handler.stopping();
  const ghostDir = `${dir}/state/ghost-records`;
  await deleteEveryVmi(client, { ghostDir, seen });
  client.close();
  say("stopping the handler");
  const status = await handler.end();
  if (status) {
    say(
      status.signal
        ? `handler ended by ${status.signal}`
        : `handler exited with code ${status.code}`,
    );
  }
  await stopLauncherHost(`${dir}/state`);
  // What the handler did not clean up (it was gone, or a guest outlasted the wait) goes
  // directly; what cannot go is said. The handler's records name the VMIs it served, any
  // that local mode never saw among them.
  for (const record of await ghostRecords(ghostDir).catch(() => [])) seen.set(record.uid, record);
  const records = [...seen.values()];
  const left = [
    ...await removeDomainsLeft(uri, records),
    ...await endProcessesOf(dir),
    ...await removeHostTaps(records),
    ...unmountBelow(dir),
  ];
  if (!bridgeWasThere && hostLinkExists(POD_BRIDGE)) {
    await new Deno.Command("ip", { args: ["link", "delete", POD_BRIDGE] }).output();
    if (hostLinkExists(POD_BRIDGE)) left.push(`bridge ${POD_BRIDGE}`);
    else say(`removed the pod network's bridge ${POD_BRIDGE}`);
  }
  if (virtApi) {
    say("stopping virt-api");
    await virtApi.stop();
  }
  say("stopping the control plane");
  await cluster.stop().catch((error) => left.push(`the control plane: ${error.message}`));
  if (prepared) {
    // restore() now says when qemu.conf cannot be removed; it is one more thing left behind.
    await prepared.restore().then(
      () => say("libvirt: the host's configuration is as it was"),
      (error) => left.push(`libvirt's configuration: ${error.message}`),
    );
  }
  await Deno.remove(dir, { recursive: true })
    .catch((error) => left.push(`folder ${dir}: ${error.message}`));
  if (left.length === 0) say("nothing left behind");
  else say(`left behind, could not be removed:\n${left.map((l) => `  ${l}`).join("\n")}`);
  say("done");
  return code || (left.length === 0 && status?.code === 0 ? 0 : 1);
}

Deno.exit(await main());

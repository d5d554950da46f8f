/**
 * Local mode (`deno task start`) as a user runs it from a terminal, for the e2e tests: in a
 * session of its own (so that SIGINT to its process group is a terminal's Ctrl-C), its
 * output collected, every process it starts marked, and afterwards a look at everything a
 * run can leave on the host.
 *
 * @module
 */
import { kubectl } from "../../deploy/cluster/cluster.ts";
import { findMarkedProcesses, RUN_MARKER_VAR, sweepMarkedProcesses } from "../run.ts";

const root = new URL("../../", import.meta.url).pathname;

/** The VMIs of deploy/examples/, which local mode applies (vm-minimal's is its VM's). */
export const EXAMPLES = ["vm-minimal", "vmi-cirros", "vmi-efi", "vmi-minimal"];
/** Their domains' names. */
export const EXAMPLE_DOMAINS: string[] = EXAMPLES.map((n) => `default_${n}`);

/** What every run of local mode gives a test. */
export interface AnyLocalModeRun {
  /** The value of the test runner's marker variable that every process of the run carries. */
  marker: string;
  /** Everything it printed so far (stdout and stderr). */
  output(): string;
  /** Ends it, whatever state it is in (SIGKILL), and waits for that. */
  end(): Promise<void>;
  /** Whether the pod network's bridge was on the host before the run started. */
  bridgeWasThere: boolean;
}

/** The bridge local mode's handler puts the VMs' pod interfaces on (deploy/local.ts). */
const POD_BRIDGE = "virtnode0";

function bridgeExists(): boolean {
  try {
    Deno.statSync(`/sys/class/net/${POD_BRIDGE}`);
    return true;
  } catch {
    return false;
  }
}

/** One run of local mode with its output piped. */
export interface LocalModeRun extends AnyLocalModeRun {
  /** `deno task start`, in its own session: its PID is its process group's. */
  child: Deno.ChildProcess;
  /** Resolves once both of its output streams have ended. */
  drained: Promise<unknown>;
}

/** Starts `deno task start` with `args` (local mode's flags) in a session of its own. */
export function startLocalMode(args: string[] = []): LocalModeRun {
  const marker = `local-mode-${crypto.randomUUID()}`;
  const bridgeWasThere = bridgeExists();
  const child = new Deno.Command("setsid", {
    args: [Deno.execPath(), "task", "start", ...args],
    cwd: root,
    env: { [RUN_MARKER_VAR]: marker },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let text = "";
  const pump = async (stream: ReadableStream<Uint8Array>) => {
    const decoder = new TextDecoder();
    for await (const chunk of stream) text += decoder.decode(chunk, { stream: true });
  };
  const drained = Promise.all([pump(child.stdout), pump(child.stderr)]);
  const end = async () => {
    try {
      Deno.kill(-child.pid, "SIGKILL");
    } catch { /* ended */ }
    await child.status;
    await drained;
  };
  return { child, marker, output: () => text, drained, end, bridgeWasThere };
}

/** One run of local mode in a terminal of tmux's. */
export interface TmuxLocalModeRun extends AnyLocalModeRun {
  /** What the terminal shows now. */
  screen(): Promise<string>;
  /** Types `keys` into the terminal, as tmux's send-keys names them (`C-c`). */
  keys(...keys: string[]): Promise<void>;
  /** Resolves with `deno task start`'s exit status once it has ended. */
  exited(timeoutMs: number): Promise<number>;
}

/** A terminal's colour or cursor sequence (CSI). */
const TERMINAL_SEQUENCE = new RegExp(String.raw`\x1b\[[0-9;?]*[A-Za-z]`, "g");

async function tmux(args: string[]): Promise<string> {
  const out = await new Deno.Command("tmux", {
    args,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) {
    throw new Error(`tmux ${args.join(" ")}: ${new TextDecoder().decode(out.stderr).trim()}`);
  }
  return new TextDecoder().decode(out.stdout);
}

/**
 * Starts `deno task start` with `args` (local mode's flags, plain words) in a terminal of
 * its own: a detached tmux session of 120 by 40
 * on a server of its own (its socket in a temporary folder), the pane kept after the
 * program ends so that its last screen and exit status can be read. Everything the
 * terminal shows also goes to a log, which {@linkcode AnyLocalModeRun.output} reads.
 */
export async function startLocalModeInTmux(args: string[] = []): Promise<TmuxLocalModeRun> {
  const marker = `local-mode-${crypto.randomUUID()}`;
  const bridgeWasThere = bridgeExists();
  const dir = await Deno.makeTempDir({ prefix: "virtnode-tmux-" });
  const socket = `${dir}/tmux.sock`;
  const log = `${dir}/pane.log`;
  const session = "local";
  const t = (...args: string[]) => tmux(["-S", socket, ...args]);
  await t(
    "new-session",
    "-d",
    "-s",
    session,
    "-x",
    "120",
    "-y",
    "40",
    "-c",
    root,
    "-e",
    `${RUN_MARKER_VAR}=${marker}`,
    "-e",
    "TERM=xterm-256color",
    [Deno.execPath(), "task", "start", ...args].join(" "),
  );
  await t("set-option", "-t", session, "remain-on-exit", "on");
  await t("pipe-pane", "-t", session, `cat >> '${log}'`);
  const decoder = new TextDecoder();
  const output = () => {
    try {
      // The terminal's own bytes: colour and cursor sequences out, for matching.
      return decoder.decode(Deno.readFileSync(log)).replace(TERMINAL_SEQUENCE, "");
    } catch {
      return "";
    }
  };
  // tmux marks a pane dead when its terminal closes and learns the exit status when it
  // reaps the process, a moment later: a pane counts as ended once it has both (a program
  // ended by a signal, as a shell gives it: 128 + the signal).
  const paneState = async () => {
    const [dead, status, signal, panePid, serverPid] = (await t(
      "display-message",
      "-p",
      "-t",
      session,
      "#{pane_dead}:#{pane_dead_status}:#{pane_dead_signal}:#{pane_pid}:#{pid}",
    ))
      .trim().split(":");
    const code = status ? Number(status) : signal ? 128 + Number(signal) : undefined;
    if (dead === "1" && code === undefined && isZombie(Number(panePid))) {
      // tmux 3.3a here at times misses the SIGCHLD of the pane's process: the process
      // stays a zombie and the pane dead without a status for good (seen after local
      // mode printed "done"; a SIGCHLD sent to the server by hand then reaped it with
      // status 0). Another one makes the server reap it and record the status.
      Deno.kill(Number(serverPid), "SIGCHLD");
    }
    return {
      dead: dead === "1" && code !== undefined,
      status: code ?? -1,
      seen: `pane_dead=${dead} status=${status} signal=${signal}`,
    };
  };
  return {
    marker,
    bridgeWasThere,
    output,
    screen: () => t("capture-pane", "-p", "-t", session),
    keys: async (...keys) => void await t("send-keys", "-t", session, ...keys),
    async exited(timeoutMs) {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const state = await paneState();
        if (state.dead) return state.status;
        if (Date.now() > deadline) {
          // The first line is what a CI log's summary keeps: the pane's state and the
          // last thing local mode printed.
          const text = output();
          const last = text.trimEnd().split("\n").at(-1)?.trim() ?? "";
          throw new Error(
            `local mode did not end within ${timeoutMs / 1000} s (${state.seen}; last: ${
              JSON.stringify(last.slice(0, 160))
            }):\n${text}`,
          );
        }
        await new Promise((r) => setTimeout(r, 500));
      }
    },
    async end() {
      await t("kill-server").catch(() => {}); // the server went with its last session
      await sweepMarkedProcesses(marker);
      await Deno.remove(dir, { recursive: true });
    },
  };
}

/**
 * Waits until `pattern` matches the run's output after offset `from`; throws with the
 * output when it does not within `timeoutMs`, naming `what` did not happen.
 */
export async function waitForOutput(
  run: AnyLocalModeRun,
  pattern: RegExp,
  o: { what: string; timeoutMs: number; from?: number },
): Promise<RegExpExecArray> {
  const deadline = Date.now() + o.timeoutMs;
  for (;;) {
    const match = pattern.exec(run.output().slice(o.from ?? 0));
    if (match) {
      match.index += o.from ?? 0;
      return match;
    }
    if (Date.now() > deadline) {
      throw new Error(
        `${o.what} within ${o.timeoutMs / 1000} s; local mode printed:\n${run.output()}`,
      );
    }
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** Waits until every example VMI is shown Running; returns local mode's node name. */
export async function waitForExamples(run: AnyLocalModeRun, timeoutMs = 300_000): Promise<string> {
  const [, node] = await waitForOutput(run, /\[local\] node name: (\S+)/, {
    what: "local mode did not name its node",
    timeoutMs: 60_000,
  });
  for (const name of EXAMPLES) {
    await waitForOutput(run, new RegExp(`^${name} +Running`, "m"), {
      what: `${name} was not shown Running`,
      timeoutMs,
    });
  }
  return node;
}

/** The kubeconfig of the run's control plane and the folder local mode made, from its output. */
export function runPaths(run: AnyLocalModeRun): { kubeconfig: string; dirs: string[] } {
  const text = run.output();
  const kubeconfig = /\[local\] kubeconfig: (\S+)/.exec(text)?.[1];
  const localDir = /its log: (\S+)\/handler\.log/.exec(text)?.[1];
  if (!kubeconfig || !localDir) throw new Error(`Local mode did not print its paths:\n${text}`);
  const clusterDir = kubeconfig.slice(0, kubeconfig.lastIndexOf("/"));
  return { kubeconfig, dirs: [clusterDir, localDir] };
}

/**
 * Creates a VMI of the user's, not one of the examples: the smallest guest (no disk, no
 * network, ACPI on) named `namespace/name`, for the node `node`, through kubectl, with a
 * grace period of `gracePeriodSeconds` (0 unless given). With no OS, its guest never
 * answers ACPI's power button: a deletion waits out the whole grace period.
 */
export async function createUserVmi(
  kubeconfig: string,
  vmi: { namespace: string; name: string; node: string; gracePeriodSeconds?: number },
): Promise<void> {
  if (vmi.namespace !== "default") {
    await kubectl(kubeconfig, ["create", "namespace", vmi.namespace]);
  }
  const manifest = {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachineInstance",
    metadata: { name: vmi.name, namespace: vmi.namespace },
    spec: {
      nodeSelector: { "kubernetes.io/hostname": vmi.node },
      terminationGracePeriodSeconds: vmi.gracePeriodSeconds ?? 0,
      domain: {
        cpu: { cores: 1, features: [{ name: "arch-capabilities", policy: "disable" }] },
        memory: { guest: "64Mi" },
        resources: { requests: { memory: "64Mi" } },
        features: { acpi: { enabled: true } },
        devices: { autoattachPodInterface: false, autoattachGraphicsDevice: false },
      },
    },
  };
  await kubectl(kubeconfig, ["apply", "-f", "-"], JSON.stringify(manifest));
}

/** Waits until the API shows the VMI `namespace/name` Running. */
export async function waitForVmiRunning(
  kubeconfig: string,
  vmi: { namespace: string; name: string },
  timeoutMs = 300_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let phase = "";
  while (phase !== "Running") {
    if (Date.now() > deadline) {
      throw new Error(`VMI ${vmi.namespace}/${vmi.name} is "${phase}", not Running`);
    }
    await new Promise((r) => setTimeout(r, 500));
    phase = await kubectl(kubeconfig, [
      "get",
      "vmi",
      "-n",
      vmi.namespace,
      vmi.name,
      "-o",
      "jsonpath={.status.phase}",
    ]).catch(() => "");
  }
}

/** libvirt's domain names (`<namespace>_<name>`) on the system libvirtd. */
export async function domainNames(): Promise<string[]> {
  const out = await new Deno.Command("virsh", {
    args: ["-c", "qemu:///system", "list", "--all", "--name"],
    stdout: "piped",
    stderr: "null",
  }).output();
  return new TextDecoder().decode(out.stdout).split("\n").map((l) => l.trim()).filter(Boolean);
}

/** The ID of a running domain (a new one each time its QEMU starts), or "" when it is off. */
export async function domainId(name: string): Promise<string> {
  const out = await new Deno.Command("virsh", {
    args: ["-c", "qemu:///system", "domid", name],
    stdout: "piped",
    stderr: "null",
  }).output();
  return new TextDecoder().decode(out.stdout).trim();
}

/** The network namespaces `ip netns list` names (those pinned in /run/netns). */
export async function pinnedNetns(): Promise<string[]> {
  const out = await new Deno.Command("ip", {
    args: ["netns", "list"],
    stdout: "piped",
    stderr: "null",
  }).output();
  return new TextDecoder().decode(out.stdout).split("\n").map((l) => l.split(" ")[0])
    .filter(Boolean);
}

/** What a run of local mode left on the host. */
export interface Leftovers {
  /** Domains of the run's VMIs that libvirt still has. */
  domains: string[];
  /** Network namespaces pinned in /run/netns since the run began. */
  netns: string[];
  /** Mounts (network namespace pins among them) below the run's folders. */
  mounts: string[];
  /** The run's folders that still exist. */
  dirs: string[];
  /** Processes that carry the run's marker. */
  processes: string[];
}

/** The mount points below any of `dirs`, from this mount namespace's table. */
function mountsBelow(dirs: string[]): string[] {
  return Deno.readTextFileSync("/proc/self/mountinfo").split("\n")
    .map((line) => line.split(" ")[4]?.replace(/\\040/g, " "))
    .filter((point): point is string =>
      point !== undefined && dirs.some((d) => point === d || point.startsWith(`${d}/`))
    );
}

/**
 * Everything of the run still on the host: domains named `domains`, network namespaces
 * not in `netnsBefore`, mounts below and existence of `dirs`, and marked processes.
 */
export async function leftovers(
  run: AnyLocalModeRun,
  o: { domains: string[]; dirs: string[]; netnsBefore: string[] },
): Promise<Leftovers> {
  const domains = (await domainNames()).filter((d) => o.domains.includes(d));
  // containerd pins its pod sandboxes' namespaces as `cni-<uuid>`: a node of a tier running
  // beside this one (the conformance tier, in CI) makes and removes them meanwhile. Local mode
  // pins none in /run/netns, under that name or any other.
  const netns = (await pinnedNetns()).filter((n) =>
    !o.netnsBefore.includes(n) && !n.startsWith("cni-")
  );
  const dirs = o.dirs.filter((d) => {
    try {
      Deno.statSync(d);
      return true;
    } catch {
      return false;
    }
  });
  const processes = findMarkedProcesses(run.marker).map((p) => `${p.pid} ${p.command}`);
  return { domains, netns, mounts: mountsBelow(o.dirs), dirs, processes };
}

/** Nothing, as {@linkcode leftovers} reports it. */
export const NOTHING_LEFT: Leftovers = {
  domains: [],
  netns: [],
  mounts: [],
  dirs: [],
  processes: [],
};

/**
 * After a test, whatever it ended with: ends every process of the run, removes the
 * domains named `domains`, and the run's folders with the mounts below them, so that a
 * failed run neither outlives its test nor breaks the next one.
 */
export async function removeRun(run: AnyLocalModeRun, domains: string[]): Promise<void> {
  // The paths come from what it printed, which a tmux run's end() removes: read them first.
  let dirs: string[] = [];
  try {
    dirs = runPaths(run).dirs;
  } catch { /* it printed no paths: it made none */ }
  await run.end();
  await sweepMarkedProcesses(run.marker);
  const present = await domainNames();
  for (const domain of domains.filter((d) => present.includes(d))) {
    for (const args of [["destroy", domain], ["undefine", domain, "--nvram"]]) {
      await new Deno.Command("virsh", {
        args: ["-c", "qemu:///system", ...args],
        stdout: "null",
        stderr: "null",
      }).output();
    }
  }
  for (const point of mountsBelow(dirs).reverse()) {
    await new Deno.Command("umount", { args: ["-l", point], stdout: "null", stderr: "null" })
      .output();
  }
  for (const dir of dirs) await Deno.remove(dir, { recursive: true }).catch(() => {});
  // A run ended before its own clean-up leaves the bridge it made.
  if (!run.bridgeWasThere && bridgeExists()) {
    await new Deno.Command("ip", { args: ["link", "delete", POD_BRIDGE], stderr: "null" })
      .output();
  }
}

/** Whether process `pid` has ended and waits for its parent to reap it. */
function isZombie(pid: number): boolean {
  try {
    // The state follows the command name, which is in parentheses and may hold spaces.
    const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
    return stat.slice(stat.lastIndexOf(")") + 2).startsWith("Z");
  } catch {
    return false;
  }
}

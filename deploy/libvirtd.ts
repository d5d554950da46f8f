/**
 * A real libvirtd with the QEMU driver on this host, for local mode and the tests:
 * QEMU runs as root without a security driver or cgroup controllers (what a machine
 * without a distribution's libvirt set-up, and a container, can run), KVM where
 * `/dev/kvm` works and software emulation (TCG) elsewhere.
 *
 * @module
 */
import {
  close,
  pidfdExited,
  pidfdOpen,
  pidfdSendSignal,
  processStartTime,
  SIGTERM,
} from "../ffi/mod.ts";
import { removeIfPresent, sleep } from "../mod/lifecycle/mod.ts";

/** The URI of the system libvirtd that {@linkcode ensureLibvirtd} starts. */
export const QEMU_SYSTEM_URI = "qemu:///system";

const SOCKET_PATH = "/var/run/libvirt/libvirt-sock";
/** The QEMU driver's configuration file. */
export const QEMU_CONF = "/etc/libvirt/qemu.conf";
const QEMU_CONF_MARKER = "# virtnode tests: run QEMU as root without a security driver";
/** The lines virtnode adds to qemu.conf: QEMU as root, no security driver, no cgroups. */
export const QEMU_CONF_LINES: string = [
  QEMU_CONF_MARKER,
  'user = "root"',
  'group = "root"',
  'security_driver = "none"',
  "cgroup_controllers = []",
  "",
].join("\n");

async function run(cmd: string, args: string[], allowFailure = false): Promise<string> {
  const out = await new Deno.Command(cmd, { args, stdout: "piped", stderr: "piped" }).output();
  const text = new TextDecoder().decode(out.stdout);
  if (!out.success && !allowFailure) {
    const err = new TextDecoder().decode(out.stderr).trim();
    throw new Error(`Cannot run "${cmd} ${args.join(" ")}": ${err || `exit ${out.code}`}`);
  }
  return text;
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.lstat(path);
    return true;
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return false;
    throw error;
  }
}

async function processRunning(name: string): Promise<boolean> {
  const out = await new Deno.Command("pgrep", { args: ["-x", name], stdout: "null" }).output();
  return out.success;
}

async function ensureGroup(name: string): Promise<void> {
  if ((await run("getent", ["group", name], true)).trim() === "") {
    await run("groupadd", ["-r", name]);
  }
}

async function waitForSocket(path: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await exists(path))) {
    if (Date.now() > deadline) throw new Error(`Cannot start libvirtd: no socket "${path}"`);
    await sleep(50);
  }
}

/** Where {@linkcode prepareLibvirtd} mounts hugetlbfs when none is mounted (systemd's place). */
const HUGETLBFS_DIR = "/dev/hugepages";

/**
 * Mounts hugetlbfs on {@linkcode HUGETLBFS_DIR} unless one is mounted (a systemd host has
 * it; a container or chroot may not); returns whether it mounted one. A mount that fails
 * is reported and does not stop libvirtd's start.
 */
async function ensureHugetlbfs(): Promise<boolean> {
  const mounts = await Deno.readTextFile("/proc/mounts");
  if (/^\S+ \S+ hugetlbfs /m.test(mounts)) return false;
  try {
    await Deno.mkdir(HUGETLBFS_DIR, { recursive: true });
    await run("mount", ["-t", "hugetlbfs", "hugetlbfs", HUGETLBFS_DIR]);
    return true;
  } catch (error) {
    // Only VMIs with huge pages need it; libvirt names what is missing when one starts.
    console.warn(`No hugetlbfs for libvirt: ${error instanceof Error ? error.message : error}`);
    return false;
  }
}

/** What {@linkcode prepareLibvirtd} changed on the host, and how to change it back. */
export interface PreparedLibvirtd {
  /** The URI to connect to ({@linkcode QEMU_SYSTEM_URI}). */
  uri: string;
  /** Whether qemu.conf got virtnode's lines (it had none before). */
  changedQemuConf: boolean;
  /** Whether libvirtd (and virtlogd) were started here (none ran before). */
  startedDaemons: boolean;
  /**
   * Leaves the host as it was found: stops the daemons started here and gives qemu.conf
   * back its content from before. Call it once every guest is gone.
   */
  restore(): Promise<void>;
}

/**
 * Prepares and starts a real libvirtd with the QEMU driver: users and groups, the
 * qemu.conf lines (appended only once), state directories, `virtlogd -d` and
 * `libvirtd -d`. Says what it changed, so local mode can undo it.
 */
export async function prepareLibvirtd(): Promise<PreparedLibvirtd> {
  await ensureGroup("kvm");
  await ensureGroup("libvirt-qemu");
  if ((await run("getent", ["passwd", "libvirt-qemu"], true)).trim() === "") {
    await run("useradd", ["-r", "-g", "libvirt-qemu", "-G", "kvm", "libvirt-qemu"]);
  }
  const hadConf = await exists(QEMU_CONF);
  const conf = hadConf ? await Deno.readTextFile(QEMU_CONF) : "";
  const changedQemuConf = !conf.includes(QEMU_CONF_MARKER);
  if (changedQemuConf) {
    const sep = conf === "" || conf.endsWith("\n") ? "" : "\n";
    await Deno.writeTextFile(QEMU_CONF, sep + QEMU_CONF_LINES, { append: true });
  }
  for (
    const dir of [
      "/var/log/libvirt",
      "/var/lib/libvirt/qemu",
      "/var/cache/libvirt",
      "/var/run/libvirt",
    ]
  ) {
    await Deno.mkdir(dir, { recursive: true });
  }
  // libvirt finds huge page mounts when it starts: VMIs with huge pages need one then.
  const mountedHugepages = await ensureHugetlbfs();
  const startedLogd = !(await processRunning("virtlogd"));
  if (startedLogd) await run("virtlogd", ["-d"]);
  const logd = startedLogd ? await daemonOf("virtlogd") : undefined;
  const startedDaemons = !(await processRunning("libvirtd"));
  if (startedDaemons) await run("libvirtd", ["-d"]);
  await waitForSocket(SOCKET_PATH, 15_000);
  const libvirtd = startedDaemons ? await daemonOf("libvirtd") : undefined;
  return {
    uri: QEMU_SYSTEM_URI,
    changedQemuConf,
    startedDaemons,
    async restore() {
      if (libvirtd) await stopDaemon(libvirtd);
      if (logd) await stopDaemon(logd);
      if (mountedHugepages && libvirtd) await run("umount", [HUGETLBFS_DIR], true);
      if (!changedQemuConf) return;
      if (hadConf) await Deno.writeTextFile(QEMU_CONF, conf);
      else await removeIfPresent(QEMU_CONF);
    },
  };
}

/** A daemon started here: its PID and when it started, to know it again later. */
interface StartedDaemon {
  name: string;
  pid: number;
  startTime: string;
}

/** The daemon's PID (from its PID file) and start time, right after it was started. */
async function daemonOf(name: string): Promise<StartedDaemon | undefined> {
  const deadline = Date.now() + 5_000;
  while (Date.now() < deadline) {
    try {
      const pid = Number((await Deno.readTextFile(`/var/run/${name}.pid`)).trim());
      const startTime = Number.isInteger(pid) && pid > 1 ? processStartTime(pid) : undefined;
      if (startTime) return { name, pid, startTime };
    } catch { /* not written yet */ }
    await sleep(50);
  }
  return undefined;
}

/**
 * SIGTERM to the daemon started here, through a pidfd opened for a process verified to
 * be it (same start time), so another daemon that took its place is never signalled;
 * then waits (up to 10 s) for it to go.
 */
async function stopDaemon(daemon: StartedDaemon): Promise<void> {
  let pidfd: number;
  try {
    pidfd = pidfdOpen(daemon.pid);
  } catch {
    return; // gone already
  }
  try {
    if (processStartTime(daemon.pid) !== daemon.startTime || pidfdExited(pidfd)) return;
    pidfdSendSignal(pidfd, SIGTERM);
    const deadline = Date.now() + 10_000;
    while (!pidfdExited(pidfd) && Date.now() < deadline) await sleep(100);
  } finally {
    close(pidfd);
  }
}

/**
 * Prepares and starts a real libvirtd with the QEMU driver, once per machine, and leaves
 * it so (the tests share it). Returns the URI to connect to ({@linkcode QEMU_SYSTEM_URI}).
 */
export async function ensureLibvirtd(): Promise<string> {
  // A running libvirtd read qemu.conf when it started: the file is left alone then. Test
  // tiers run side by side, and local mode's test gives qemu.conf a first-run content
  // meanwhile; a tier that appended the lines again would change what that test sees.
  if (await processRunning("libvirtd") && await exists(SOCKET_PATH)) return QEMU_SYSTEM_URI;
  return (await prepareLibvirtd()).uri;
}

/**
 * Test helpers for QEMU guests under the libvirtd that `deploy/libvirtd.ts` starts.
 *
 * @module
 */
export { ensureLibvirtd, QEMU_SYSTEM_URI } from "../../deploy/libvirtd.ts";

/**
 * Runs `virsh -c qemu:///system` with `args` and returns what it printed (stdout, then
 * stderr); throws naming the command and its output when it fails.
 */
export async function virsh(...args: string[]): Promise<string> {
  const out = await new Deno.Command("virsh", {
    args: ["-c", "qemu:///system", ...args],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
  if (!out.success) throw new Error(`virsh ${args.join(" ")}: ${text}`);
  return text;
}

/** Options for {@linkcode tinyGuestXml}. */
export interface TinyGuestOptions {
  /** Guest memory in MiB; 64 unless told. */
  memoryMiB?: number;
  /** Path of a disk image to attach as virtio disk `vda` (see {@linkcode createTinyDisk}). */
  diskPath?: string;
  /** Emulator binary; `/usr/bin/qemu-system-x86_64` unless told. */
  emulator?: string;
}

let guestCounter = 0;

/** Returns a guest name unique to this process and call, e.g. `vn-test-1234-1-ab12`. */
export function uniqueGuestName(prefix = "vn-test"): string {
  guestCounter++;
  const rand = crypto.randomUUID().slice(0, 4);
  return `${prefix}-${Deno.pid}-${guestCounter}-${rand}`;
}

/**
 * Returns the XML of a tiny QEMU (TCG) guest: 64 MiB, one vCPU, no graphics, a serial
 * console on a pty, and either no disk or the given one. With no bootable disk the guest
 * sits in its firmware (told not to reboot when it finds nothing to boot), which is
 * enough to exercise the lifecycle.
 */
export function tinyGuestXml(name: string, options: TinyGuestOptions = {}): string {
  const memory = options.memoryMiB ?? 64;
  const emulator = options.emulator ?? "/usr/bin/qemu-system-x86_64";
  const disk = options.diskPath
    ? `<disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='${options.diskPath}'/>
      <target dev='vda' bus='virtio'/>
    </disk>`
    : "";
  return `<domain type='qemu'>
  <name>${name}</name>
  <memory unit='MiB'>${memory}</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type><bios rebootTimeout='-1'/></os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>${emulator}</emulator>
    ${disk}
    <serial type='pty'><target port='0'/></serial>
    <console type='pty'><target type='serial' port='0'/></console>
    <memballoon model='none'/>
  </devices>
</domain>`;
}

/** Creates an empty qcow2 image of `sizeMiB` (default 16) in `dir` with `qemu-img`. */
export async function createTinyDisk(dir: string, sizeMiB = 16): Promise<string> {
  const path = `${dir}/${uniqueGuestName("disk")}.qcow2`;
  const out = await new Deno.Command("qemu-img", {
    args: ["create", "-q", "-f", "qcow2", path, `${sizeMiB}M`],
    stdout: "null",
    stderr: "piped",
  }).output();
  if (!out.success) {
    const err = new TextDecoder().decode(out.stderr).trim();
    throw new Error(`Cannot create disk "${path}" with qemu-img: ${err || `exit ${out.code}`}`);
  }
  return path;
}

/** Ends the private virtlogd of `pidFile`, if the PID there is still that daemon. */
function stopLogd(pidFile: string): void {
  let pid: number;
  let comm: string;
  try {
    pid = Number(Deno.readTextFileSync(pidFile).trim());
    comm = Deno.readTextFileSync(`/proc/${pid}/comm`);
  } catch {
    return; // never started, or gone
  }
  if (Number.isInteger(pid) && pid > 1 && comm.startsWith("virtnode-virtlo")) {
    try {
      Deno.kill(pid, "SIGTERM");
    } catch { /* gone */ }
  }
}

/** A libvirtd of a test's own, beside the machine's (see {@linkcode startPrivateLibvirtd}). */
export interface PrivateLibvirtd {
  /** The URI to connect to: the daemon's socket, reached through its root. */
  uri: string;
  /** The daemon's PID. */
  pid: number;
  /** The host's path of the daemon's `/run/libvirt` (its socket is `libvirt-sock` there). */
  runDir: string;
  /** The host's path of the daemon's `/var/log/libvirt` (its guests' logs in `qemu/`). */
  logDir: string;
  /** Destroys and undefines every guest it has, then ends it and its virtlogd. */
  stop(): Promise<void>;
}

/**
 * Starts a libvirtd whose QEMU runs as `user`:`group` (numeric, e.g. KubeVirt's 107; with
 * `hostUuid`, as a host of that UUID, so that two of them migrate between each other), in a
 * mount namespace of its own: its `/etc/libvirt` (a copy of the machine's with its own
 * qemu.conf), `/run/libvirt`, `/var/lib/libvirt`, `/var/cache/libvirt` and
 * `/var/log/libvirt` are folders of a temporary directory, so it shares no state, socket or
 * guest with the machine's libvirtd and the rest of the file system stays the same. It and
 * its virtlogd run under names of their own (`virtnode-libvirtd`), so the test runner's
 * sweep, which spares the machine's shared daemons, catches them if a test leaves them.
 */
export async function startPrivateLibvirtd(
  options: {
    user: number;
    group: number;
    hostUuid?: string;
    /** Runs in this network namespace (a file such as `/run/netns/<name>`). */
    netns?: string;
    /** More folders of the namespace: its path -> the host folder bound there. */
    binds?: Record<string, string>;
  },
): Promise<PrivateLibvirtd> {
  const dir = await Deno.makeTempDir({ prefix: "virtnode-libvirtd-" });
  // QEMU's user walks into /var/lib/libvirt and /var/cache/libvirt (capability probes, the
  // monitor socket): the folders behind them must be open to it, as the machine's are.
  await Deno.chmod(dir, 0o755);
  const sub = (name: string) => `${dir}/${name}`;
  for (const name of ["etc", "run", "lib/qemu", "cache", "log", "bin"]) {
    await Deno.mkdir(sub(name), { recursive: true });
  }
  for (const entry of Deno.readDirSync("/etc/libvirt")) {
    if (entry.isFile && entry.name !== "qemu.conf") {
      await Deno.copyFile(`/etc/libvirt/${entry.name}`, sub(`etc/${entry.name}`));
    }
  }
  // A host of its own to libvirt: two daemons with the machine's UUID refuse to migrate
  // between them ("migrate guest to the same host").
  if (options.hostUuid) {
    await Deno.writeTextFile(sub("etc/libvirtd.conf"), `\nhost_uuid = "${options.hostUuid}"\n`, {
      append: true,
    });
  }
  await Deno.writeTextFile(
    sub("etc/qemu.conf"),
    [
      `user = "+${options.user}"`,
      `group = "+${options.group}"`,
      'security_driver = "none"',
      "cgroup_controllers = []",
      "",
    ].join("\n"),
  );
  // QEMU's own state (monitor sockets, the capability probe's) is its user's, as a
  // distribution's package leaves /var/lib/libvirt/qemu.
  await Deno.chown(sub("lib/qemu"), options.user, options.group);
  await Deno.symlink("/usr/sbin/libvirtd", sub("bin/virtnode-libvirtd"));
  await Deno.symlink("/usr/sbin/virtlogd", sub("bin/virtnode-virtlogd"));
  const script = [
    "set -e",
    "mount --make-rprivate /",
    // On a machine whose own libvirtd never ran, some of these are not there yet.
    "mkdir -p /etc/libvirt /run/libvirt /var/lib/libvirt /var/cache/libvirt /var/log/libvirt",
    `mount --bind ${sub("etc")} /etc/libvirt`,
    `mount --bind ${sub("run")} /run/libvirt`,
    `mount --bind ${sub("lib")} /var/lib/libvirt`,
    `mount --bind ${sub("cache")} /var/cache/libvirt`,
    `mount --bind ${sub("log")} /var/log/libvirt`,
    // In a network namespace of its own, /sys shows that namespace's links (as
    // `ip netns exec` arranges): the tools that look there see the node's.
    ...(options.netns ? ["mount -t sysfs sysfs /sys"] : []),
    ...Object.entries(options.binds ?? {}).map(([at, from]) =>
      `mkdir -p ${at} && mount --bind ${from} ${at}`
    ),
    `${sub("bin/virtnode-virtlogd")} -d -p ${sub("virtlogd.pid")}`,
    `exec ${sub("bin/virtnode-libvirtd")} -p ${sub("libvirtd.pid")} 2>>${sub("libvirtd.log")}`,
  ].join("\n");
  // The mount points of the extra folders are made on the host's file system: the ones
  // not there before go with the daemon.
  const madeMountPoints: string[] = [];
  for (const at of Object.keys(options.binds ?? {})) {
    const real = at.replace(/^\/var\/run\//, "/run/");
    if (!(await Deno.stat(real).then(() => true, () => false))) madeMountPoints.push(real);
  }
  const unshare = ["unshare", "--mount", "bash", "-c", script];
  const child = new Deno.Command(options.netns ? "nsenter" : "unshare", {
    args: options.netns ? [`--net=${options.netns}`, ...unshare] : unshare.slice(1),
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const output = child.output();
  const socket = `/proc/${child.pid}/root/run/libvirt/libvirt-sock`;
  const deadline = Date.now() + 15_000;
  let exited = false;
  child.status.then(() => exited = true);
  // Looked for where the daemon makes it, not through its root: until the script's mounts
  // are done, that root still shows the machine's libvirtd's socket.
  while (!(await Deno.lstat(sub("run/libvirt-sock")).then(() => true, () => false))) {
    if (exited || Date.now() > deadline) {
      try {
        child.kill("SIGKILL");
      } catch { /* gone */ }
      const out = await output.catch(() => undefined);
      const text = (out ? new TextDecoder().decode(out.stderr) : "") +
        await Deno.readTextFile(sub("libvirtd.log")).catch(() => "");
      stopLogd(sub("virtlogd.pid"));
      await Deno.remove(dir, { recursive: true }).catch(() => {});
      throw new Error(
        `Cannot start a private libvirtd: ${exited ? "it exited" : "no socket"}: ${text}`,
      );
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  const uri = `qemu+unix:///system?socket=${socket}`;
  const virsh = async (...args: string[]) => {
    const out = await new Deno.Command("virsh", {
      args: ["-c", uri, ...args],
      stdout: "piped",
      stderr: "null",
    }).output();
    return new TextDecoder().decode(out.stdout);
  };
  return {
    uri,
    pid: child.pid,
    runDir: sub("run"),
    logDir: sub("log"),
    async stop() {
      for (const name of (await virsh("list", "--all", "--name")).split("\n")) {
        if (!name.trim()) continue;
        await virsh("destroy", name.trim());
        await virsh("undefine", "--nvram", name.trim());
      }
      try {
        child.kill("SIGTERM");
      } catch { /* gone */ }
      await output.catch(() => undefined);
      stopLogd(sub("virtlogd.pid"));
      await Deno.remove(dir, { recursive: true }).catch(() => {});
      for (const at of madeMountPoints) await Deno.remove(at).catch(() => {});
    },
  };
}

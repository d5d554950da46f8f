/**
 * Test helpers for a real libvirtd running QEMU guests under software emulation (TCG),
 * prepared the way /work/shared/ENVIRONMENT.md ("libvirt and QEMU") describes.
 *
 * @module
 */

/** The URI of the system libvirtd that {@linkcode ensureLibvirtd} starts. */
export const QEMU_SYSTEM_URI = "qemu:///system";

const SOCKET_PATH = "/var/run/libvirt/libvirt-sock";
const QEMU_CONF = "/etc/libvirt/qemu.conf";
const QEMU_CONF_MARKER = "# virtnode tests: run QEMU as root without a security driver";
const QEMU_CONF_LINES = [
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
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/**
 * Prepares and starts a real libvirtd with the QEMU driver, once per machine: users and
 * groups, the qemu.conf lines (appended only once), state directories, `virtlogd -d` and
 * `libvirtd -d`. Returns the URI to connect to ({@linkcode QEMU_SYSTEM_URI}).
 */
export async function ensureLibvirtd(): Promise<string> {
  await ensureGroup("kvm");
  await ensureGroup("libvirt-qemu");
  if ((await run("getent", ["passwd", "libvirt-qemu"], true)).trim() === "") {
    await run("useradd", ["-r", "-g", "libvirt-qemu", "-G", "kvm", "libvirt-qemu"]);
  }
  const conf = (await exists(QEMU_CONF)) ? await Deno.readTextFile(QEMU_CONF) : "";
  if (!conf.includes(QEMU_CONF_MARKER)) {
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
  if (!(await processRunning("virtlogd"))) await run("virtlogd", ["-d"]);
  if (!(await processRunning("libvirtd"))) {
    await run("libvirtd", ["-d"]);
  }
  await waitForSocket(SOCKET_PATH, 15_000);
  return QEMU_SYSTEM_URI;
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
 * sits in its firmware, which is enough to exercise the lifecycle.
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
  <os><type arch='x86_64' machine='pc'>hvm</type></os>
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
  await run("qemu-img", ["create", "-q", "-f", "qcow2", path, `${sizeMiB}M`]);
  return path;
}

/**
 * Test helpers for QEMU guests under the libvirtd that `deploy/libvirtd.ts` starts.
 *
 * @module
 */
export { ensureLibvirtd, QEMU_SYSTEM_URI } from "../../deploy/libvirtd.ts";

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

/**
 * The test guest (`tests/harness/guest/build.sh`: Debian's kernel and busybox, a DHCP client and
 * an HTTP server) as the tests use it: built once and cached by key, put into a pod-less
 * handler's image directory as a containerDisk, and VMIs that boot it with a NIC on the
 * pod network.
 *
 * @module
 */
import { join } from "node:path";
import zlib from "node:zlib";
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { GUEST_CPU_FEATURES } from "../harness/guest_cpu.ts";
import { kvmUsable } from "../../mod/host/mod.ts";
import { buildImageArchive } from "../../deploy/image/oci.ts";
import { virsh } from "./libvirtd.ts";
import { waitFor } from "./handler_process.ts";

const BUILD = new URL("../harness/guest/build.sh", import.meta.url).pathname;

/** The containerDisk image name the test guest goes by in an image directory. */
export const GUEST_IMAGE = "virtnode.local/test-guest:1";

let built: Promise<string> | undefined;

/** Builds the test guest (cached) and returns the path of its disk image. */
export function testGuestImage(): Promise<string> {
  built ??= (async () => {
    const out = await new Deno.Command("bash", {
      args: [BUILD],
      stdout: "piped",
      stderr: "piped",
    }).output();
    if (!out.success) {
      throw new Error(`Cannot build the test guest:\n${new TextDecoder().decode(out.stderr)}`);
    }
    const dir = new TextDecoder().decode(out.stdout).trim().split("\n").at(-1)!;
    return join(dir, "guest.img");
  })();
  return built;
}

/**
 * The test guest as a containerDisk OCI image archive (the disk at `/disk/guest.img`, as
 * KubeVirt's containerDisk images hold it), built once next to the cached disk.
 */
export async function testGuestOciArchive(): Promise<string> {
  const dir = join(await testGuestImage(), "..");
  return await cachedArchive(dir, "guest-oci", GUEST_IMAGE, "/disk-has-no-program", {
    "disk/guest.img": join(dir, "guest.img"),
  });
}

/** The kernel boot image the test guest's kernel and initramfs go by (`/boot/vmlinuz`, `/boot/initrd`). */
export const KERNEL_IMAGE = "virtnode.local/test-kernel:1";

/**
 * KubeVirt's `firmware.kernelBoot` that boots the test guest from {@linkcode KERNEL_IMAGE}
 * (imported into the node, never pulled).
 */
export const TEST_KERNEL_BOOT = {
  kernelArgs: "console=ttyS0,115200 quiet loglevel=3 panic=-1",
  container: {
    image: KERNEL_IMAGE,
    imagePullPolicy: "Never",
    kernelPath: "/boot/vmlinuz",
    initrdPath: "/boot/initrd",
  },
} as const;

/**
 * The test guest's kernel and initramfs as a kernel boot container image archive
 * (`firmware.kernelBoot.container`), built once next to the cached guest.
 */
export async function testKernelOciArchive(): Promise<string> {
  const dir = join(await testGuestImage(), "..");
  return await cachedArchive(dir, "kernel-oci-int32", KERNEL_IMAGE, "/boot-has-no-program", {
    "boot/vmlinuz": await withInt32Crc(join(dir, "vmlinuz")),
    "boot/initrd": await withInt32Crc(join(dir, "initrd")),
  });
}

/**
 * A copy of `path` beside it whose CRC-32 is below 2^31: NUL bytes added at its end, which
 * the kernel's loader and its initramfs unpacker pass over. KubeVirt v1.7.0's virt-handler
 * writes the kernel's and initrd's CRC-32 into `status.kernelBootStatus`, an int32 field that
 * Kubernetes v1.37 enforces: with a checksum of 2^31 or more its every status update is
 * refused (the yardstick needs this; virtnode writes no kernelBootStatus yet).
 */
async function withInt32Crc(path: string): Promise<string> {
  const copy = `${path}.int32`;
  if (await Deno.stat(copy).then(() => true, () => false)) return copy;
  const data = await Deno.readFile(path);
  for (let pad = 0; pad <= 4096; pad += 4) {
    const padded = new Uint8Array(data.length + pad);
    padded.set(data);
    if (zlib.crc32(padded) < 2 ** 31) {
      const partial = `${copy}.${crypto.randomUUID().slice(0, 8)}`;
      await Deno.writeFile(partial, padded);
      await Deno.rename(partial, copy);
      return copy;
    }
  }
  throw new Error(`${path}: no padding up to 4 KiB gives a CRC-32 below 2^31`);
}

/**
 * An image archive named `name` in `dir` holding `files` (path in the image -> file here,
 * read-only), built under a temporary name and renamed, so a reader sees it whole or not at all.
 */
async function cachedArchive(
  dir: string,
  prefix: string,
  name: string,
  entrypoint: string,
  files: Record<string, string>,
): Promise<string> {
  const archive = join(dir, `${prefix}-${name.replace(/[^A-Za-z0-9._-]/g, "_")}.tar`);
  if (await Deno.stat(archive).then(() => true, () => false)) return archive;
  const root = await Deno.makeTempDir({ prefix: `virtnode-${prefix}-` });
  try {
    for (const [inImage, from] of Object.entries(files)) {
      await Deno.mkdir(join(root, inImage, ".."), { recursive: true });
      await Deno.copyFile(from, join(root, inImage));
      await Deno.chmod(join(root, inImage), 0o444);
    }
    const partial = `${archive}.${crypto.randomUUID().slice(0, 8)}`;
    await buildImageArchive({ name, root, entrypoint: [entrypoint] }, partial);
    await Deno.rename(partial, archive);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
  return archive;
}

/**
 * Puts the test guest into a pod-less handler's image directory under
 * {@linkcode GUEST_IMAGE}, as the OCI image archive a user would place there: a hard link
 * where the cache is on the same filesystem, a copy elsewhere.
 */
export async function installTestGuest(imageDir: string): Promise<void> {
  await Deno.mkdir(imageDir, { recursive: true });
  const target = join(imageDir, `${GUEST_IMAGE.replace(/[^A-Za-z0-9._-]/g, "_")}.tar`);
  await Deno.remove(target).catch(() => {});
  const archive = await testGuestOciArchive();
  await Deno.link(archive, target).catch(() => Deno.copyFile(archive, target));
}

/** What {@linkcode guestVmi} builds. */
export interface GuestVmiOptions {
  /** The namespace; `default` unless told. */
  namespace?: string;
  /**
   * The pod network binding of its one interface; `none`: no interface and no network (its
   * serial console and its agent are all the test reaches).
   */
  binding: "bridge" | "masquerade" | "none";
  /** Masquerade: the ports forwarded (all when none). */
  ports?: { port: number; protocol?: string; name?: string }[];
  /** The interface's MAC, if set. */
  macAddress?: string;
  /** Extra fields of `spec`. */
  spec?: Record<string, unknown>;
}

/**
 * A VMI that boots the test guest from its containerDisk with one interface on the pod
 * network, placed on `node` by `spec.nodeSelector` (a pod-less handler schedules it).
 */
export function guestVmi(
  name: string,
  node: string,
  options: GuestVmiOptions,
): VirtualMachineInstance {
  return {
    apiVersion: "kubevirt.io/v1",
    kind: "VirtualMachineInstance",
    metadata: { name, namespace: options.namespace ?? "default" },
    spec: {
      terminationGracePeriodSeconds: 0,
      nodeSelector: { "kubernetes.io/hostname": node },
      domain: {
        // A named model where software emulates the guest; the host's CPU under KVM.
        cpu: kvmUsable()
          ? { cores: 1, model: "host-passthrough", features: GUEST_CPU_FEATURES }
          : { cores: 1, model: "qemu64" },
        memory: { guest: "128Mi" },
        devices: {
          disks: [{ name: "boot", disk: { bus: "virtio", readonly: true } }],
          ...(options.binding === "none" ? { autoattachPodInterface: false } : {
            interfaces: [{
              name: "default",
              [options.binding]: {},
              ...(options.ports ? { ports: options.ports } : {}),
              ...(options.macAddress ? { macAddress: options.macAddress } : {}),
            }],
          }),
        },
      },
      ...(options.binding === "none" ? {} : { networks: [{ name: "default", pod: {} }] }),
      volumes: [{ name: "boot", containerDisk: { image: GUEST_IMAGE } }],
      ...(options.spec ?? {}),
    },
  } as unknown as VirtualMachineInstance;
}

/** GETs `url` with a timeout; the body, or undefined when nothing answers. */
export async function httpGet(url: string, timeoutMs = 3_000): Promise<string | undefined> {
  try {
    const response = await fetch(url, { signal: AbortSignal.timeout(timeoutMs) });
    const text = await response.text();
    return response.ok ? text : undefined;
  } catch {
    return undefined;
  }
}

/** Parses the guest's `/dhcp` page (key=value lines: what its lease said). */
export function parseLease(text: string): Record<string, string> {
  return Object.fromEntries(
    text.trim().split("\n").map((line) => {
      const i = line.indexOf("=");
      return [line.slice(0, i), line.slice(i + 1)];
    }),
  );
}

/** Runs `script` in the guest through the agent with virsh (not through virtnode). */
export async function inGuest(domain: string, script: string): Promise<string> {
  const started = JSON.parse(
    await virsh(
      "qemu-agent-command",
      domain,
      JSON.stringify({
        execute: "guest-exec",
        arguments: { path: "/bin/sh", arg: ["-c", script], "capture-output": true },
      }),
    ),
  ) as { return: { pid: number } };
  return await waitFor(
    `the guest to run ${script}`,
    async () => {
      const status = JSON.parse(
        await virsh(
          "qemu-agent-command",
          domain,
          JSON.stringify({ execute: "guest-exec-status", arguments: { pid: started.return.pid } }),
        ),
      ) as { return: { exited: boolean; "out-data"?: string } };
      if (!status.return.exited) return undefined;
      return {
        out: new TextDecoder().decode(
          Uint8Array.from(atob(status.return["out-data"] ?? ""), (c) => c.charCodeAt(0)),
        ),
      };
    },
    30_000,
    200,
  ).then((r) => r.out);
}

/**
 * KubeVirt's own virt-launcher, run the way a launcher pod runs it, for tests of the
 * handler in KubeVirt mode (until the node tier has a kubelet to do it).
 *
 * What the kubelet and the container runtime give a launcher pod, and what this gives it:
 * - **emptyDir volumes** `private`, `public`, `sockets`, `libvirt-runtime`,
 *   `ephemeral-disks` and `container-disks` (virt-controller's volume list): plain
 *   directories under `<pods dir>/<pod uid>/volumes/kubernetes.io~empty-dir/`, where the
 *   handler finds them, bind-mounted at KubeVirt's paths inside the pod.
 * - **a container's `/dev`** (the usual nodes, its own devpts and shm, no `/dev/kvm`: the
 *   pod did not ask the kvm device plugin for it, so QEMU emulates).
 * - **its own mount, PID and network namespaces**: `unshare --mount --pid --net --fork`
 *   (its loopback stays down: virt-launcher-monitor's look for an Istio proxy on
 *   localhost then fails at once instead of retrying a refused connection for 8 s), a
 *   tmpfs on `/run`
 *   (Debian's `/var/run` is a link to it), `/var/lib/libvirt` and `/var/log/libvirt`, so
 *   the pod's libvirtd and virtlogd see nothing of the host's and end with the pod.
 * - **the image's files**: `virt-launcher` and `virt-launcher-monitor` in `/usr/bin`, a
 *   `virtqemud` in `/usr/sbin` (Debian 12's libvirt 9.0 has no modular daemons; the
 *   monolithic libvirtd serves the same socket), a writable `/etc/libvirt` with KubeVirt's
 *   own `qemu.conf` and `virtqemud.conf`, and a `qemu` user — laid over the host's with
 *   read-only overlays and bind mounts.
 * - **the command line** virt-controller writes (`virt-launcher-monitor --qemu-timeout …
 *   --name … --uid … --namespace … --kubevirt-share-dir /var/run/kubevirt …`), with
 *   `--allow-emulation` (KubeVirt's `useEmulation`), as machines without /dev/kvm need.
 *
 * @module
 */
import { buildKubevirtPeers } from "../harness/kubevirt/peers.ts";
import { join } from "node:path";

/** The emptyDir volumes of a launcher pod and where the launcher sees them. */
export const POD_VOLUMES: Record<string, string> = {
  private: "/var/run/kubevirt-private",
  public: "/var/run/kubevirt",
  sockets: "/var/run/kubevirt/sockets",
  "libvirt-runtime": "/var/run/libvirt",
  "ephemeral-disks": "/var/run/kubevirt-ephemeral-disks",
  "container-disks": "/var/run/kubevirt/container-disks",
};

/**
 * The arguments virt-controller gives `virt-launcher-monitor` in a launcher pod
 * (`pkg/virt-controller/services/template.go`), with emulation allowed.
 */
export function launcherMonitorArgs(
  vmi: { name: string; namespace: string; uid: string },
  gracePeriodSeconds: number,
): string[] {
  return [
    "--qemu-timeout",
    "60s",
    "--name",
    vmi.name,
    "--uid",
    vmi.uid,
    "--namespace",
    vmi.namespace,
    "--kubevirt-share-dir",
    "/var/run/kubevirt",
    "--ephemeral-disk-dir",
    "/var/run/kubevirt-ephemeral-disks",
    "--container-disk-dir",
    "/var/run/kubevirt/container-disks",
    "--grace-period-seconds",
    String(gracePeriodSeconds),
    "--hook-sidecars",
    "0",
    "--ovmf-path",
    "/usr/share/OVMF",
    "--allow-emulation",
  ];
}

/** What {@linkcode startLauncherPod} needs. */
export interface LauncherPodOptions {
  /** The kubelet's pods directory the handler is given (`--kubelet-pods-dir`). */
  podsDir: string;
  /** The VMI the pod is for. */
  vmi: { name: string; namespace: string; uid: string };
  /** `--grace-period-seconds` (the VMI's termination grace period). */
  gracePeriodSeconds?: number;
}

/** A running launcher pod. */
export interface LauncherPod {
  /** The pod's UID (its directory under the pods directory). */
  readonly uid: string;
  /** `<pods dir>/<uid>`. */
  readonly dir: string;
  /** The host PID of the pod's first process (virt-launcher-monitor). */
  readonly pid: number;
  /** The launcher's and its libvirtd's output. */
  readonly logFile: string;
  /** Whether the pod's processes still run. */
  running(): boolean;
  /** Waits up to `timeoutMs` for the pod to end by itself; true when it did. */
  exited(timeoutMs: number): Promise<boolean>;
  /** SIGTERM as the kubelet sends it, SIGKILL after `graceMs`; removes the pod's files. */
  stop(graceMs?: number): Promise<void>;
}

function script(volumes: string, image: string, args: string[]): string {
  const q = (s: string) => `'${s.replaceAll("'", `'\\''`)}'`;
  const lines = [
    "set -eu",
    // Mounts below belong to this namespace only.
    "mount -t tmpfs -o mode=0755 tmpfs /run",
    "for d in /var/lib/libvirt /var/log/libvirt; do mkdir -p $d; mount -t tmpfs tmpfs $d; done",
    "mkdir -p /var/lib/libvirt/qemu /run/kubevirt-infra",
    // A container's /dev: the usual nodes only (no /dev/kvm: a pod gets it from the kvm
    // device plugin, which this pod did not ask for), a devpts and shm of its own.
    "mkdir -p /run/pod-dev",
    "mount -t tmpfs -o mode=0755,nosuid tmpfs /run/pod-dev",
    "for n in null zero full random urandom tty; do " +
    "touch /run/pod-dev/$n; mount --bind /dev/$n /run/pod-dev/$n; done",
    "mkdir -p /run/pod-dev/pts /run/pod-dev/shm /run/pod-dev/net",
    "mount -t devpts -o newinstance,ptmxmode=0666 devpts /run/pod-dev/pts",
    "ln -s pts/ptmx /run/pod-dev/ptmx",
    "mount -t tmpfs -o mode=1777 tmpfs /run/pod-dev/shm",
    // The host's huge page mounts (libvirtd's set-up makes /dev/hugepages) are no pod's: a
    // container sees none unless it asks for huge pages, and the pod's libvirtd, which reads
    // every hugetlbfs of the mount table, would not start on one hidden below the new /dev.
    'awk \'$3 == "hugetlbfs" { print $2 }\' /proc/mounts | while read -r m; do umount -l "$m"; done',
    "mount --move /run/pod-dev /dev",
  ];
  // Parents before children: public before sockets and container-disks.
  for (const [name, path] of Object.entries(POD_VOLUMES)) {
    lines.push(`mkdir -p ${q(path)}`, `mount --bind ${q(`${volumes}/${name}`)} ${q(path)}`);
  }
  lines.push(
    `mount --bind ${q(`${image}/etc-libvirt`)} /etc/libvirt`,
    `mount -t overlay overlay -o lowerdir=${q(`${image}/bin`)}:/usr/bin /usr/bin`,
    `mount -t overlay overlay -o lowerdir=${q(`${image}/sbin`)}:/usr/sbin /usr/sbin`,
    `mount --bind ${q(`${image}/passwd`)} /etc/passwd`,
    `mount --bind ${q(`${image}/group`)} /etc/group`,
    `exec /usr/bin/virt-launcher-monitor ${args.map(q).join(" ")}`,
  );
  return lines.join("\n");
}

async function copyDir(from: string, to: string): Promise<void> {
  const out = await new Deno.Command("cp", { args: ["-a", from, to], stderr: "piped" }).output();
  if (!out.success) {
    throw new Error(`Cannot copy ${from}: ${new TextDecoder().decode(out.stderr).trim()}`);
  }
}

/** The host PIDs of `pid`'s children. */
function childrenOf(pid: number): number[] {
  try {
    return Deno.readTextFileSync(`/proc/${pid}/task/${pid}/children`).trim().split(/\s+/)
      .filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

/** Starts KubeVirt's virt-launcher for `vmi` as a launcher pod; resolves once it runs. */
export async function startLauncherPod(options: LauncherPodOptions): Promise<LauncherPod> {
  const kubevirt = await buildKubevirtPeers();
  const uid = crypto.randomUUID();
  const dir = join(options.podsDir, uid);
  const volumes = join(dir, "volumes", "kubernetes.io~empty-dir");
  // The image's files, beside the pod's volumes as a container's root is.
  const image = join(dir, "image");
  for (const name of Object.keys(POD_VOLUMES)) {
    await Deno.mkdir(join(volumes, name), { recursive: true });
  }
  await Deno.mkdir(join(image, "bin"), { recursive: true });
  await Deno.mkdir(join(image, "sbin"), { recursive: true });
  for (const program of ["virt-launcher", "virt-launcher-monitor"]) {
    await Deno.copyFile(join(kubevirt, program), join(image, "bin", program));
    await Deno.chmod(join(image, "bin", program), 0o755);
  }
  await Deno.writeTextFile(
    join(image, "sbin", "virtqemud"),
    '#!/bin/sh\nexec /usr/sbin/libvirtd "$@"\n',
    { mode: 0o755 },
  );
  await copyDir("/etc/libvirt", join(image, "etc-libvirt"));
  // KubeVirt's image carries its own libvirt settings; the host's must not leak in.
  for (const file of ["qemu.conf", "virtqemud.conf"]) {
    await Deno.copyFile(join(kubevirt, "launcher-files", file), join(image, "etc-libvirt", file));
  }
  await Deno.writeTextFile(join(image, "etc-libvirt", "virtlogd.conf"), "");
  await Deno.writeTextFile(
    join(image, "passwd"),
    (await Deno.readTextFile("/etc/passwd")) + "qemu:x:107:107:qemu:/:/usr/sbin/nologin\n",
  );
  await Deno.writeTextFile(
    join(image, "group"),
    (await Deno.readTextFile("/etc/group")) + "qemu:x:107:\n",
  );
  const args = launcherMonitorArgs(options.vmi, options.gracePeriodSeconds ?? 0);
  const logFile = join(dir, "launcher.log");
  const log = await Deno.open(logFile, { create: true, write: true });
  const child = new Deno.Command("unshare", {
    args: [
      "--mount",
      "--pid",
      "--net",
      "--fork",
      "--mount-proc",
      "--propagation",
      "private",
      "--kill-child",
      "--",
      "bash",
      "-c",
      script(volumes, image, args),
    ],
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const logged = Promise.all([child.stdout, child.stderr].map(async (stream) => {
    for await (const chunk of stream) await log.write(chunk);
  })).catch(() => {}).finally(() => log.close());
  let status: Deno.CommandStatus | undefined;
  const ended = child.status.then((s) => (status = s));
  let pid = 0;
  const deadline = Date.now() + 10_000;
  while (pid === 0) {
    if (status) {
      throw new Error(
        `The launcher pod ended at once (${status.code}):\n${await Deno.readTextFile(logFile)}`,
      );
    }
    if (Date.now() > deadline) throw new Error("The launcher pod's first process did not start");
    pid = childrenOf(child.pid)[0] ?? 0;
    if (pid === 0) await new Promise((r) => setTimeout(r, 20));
  }
  const exited = async (timeoutMs: number) => {
    let timer: ReturnType<typeof setTimeout> | undefined;
    try {
      return await Promise.race([
        ended.then(() => true),
        new Promise<boolean>((r) => (timer = setTimeout(() => r(false), timeoutMs))),
      ]);
    } finally {
      clearTimeout(timer);
    }
  };
  return {
    uid,
    dir,
    pid,
    logFile,
    running: () => status === undefined,
    exited,
    async stop(graceMs = 10_000) {
      if (status === undefined) {
        try {
          Deno.kill(pid, "SIGTERM");
        } catch { /* gone */ }
        if (!(await exited(graceMs))) {
          // The pod's first process: the kernel ends the rest of its PID namespace.
          try {
            Deno.kill(pid, "SIGKILL");
          } catch { /* gone */ }
          try {
            child.kill("SIGKILL");
          } catch { /* gone */ }
        }
      }
      await ended;
      await logged;
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    },
  };
}

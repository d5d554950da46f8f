/**
 * The substitute guests of KubeVirt's suite (tests/harness/guest/suite_images.sh) boot under QEMU
 * alone and answer the console dialogue of KubeVirt's tests/console/login.go, with a NoCloud
 * seed whose user-data runs and whose meta-data names the host.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  buildSuiteFlavour,
  SUITE_IMAGES,
  suiteImageArchive,
} from "../harness/guest/suite_images.ts";

const HOST = "suite-vmi";
const PROMPT = /(\$ |# )/;
const enc = new TextEncoder();
const dec = new TextDecoder();

/** A QEMU of one guest, its serial console on a Unix socket. */
class Guest {
  #proc: Deno.ChildProcess;
  #conn!: Deno.UnixConn;
  #buffer = "";
  readonly started = performance.now();
  constructor(proc: Deno.ChildProcess) {
    this.#proc = proc;
  }
  static async boot(disk: string, seed: string, memory: string, dir: string): Promise<Guest> {
    const socket = join(dir, "serial.sock");
    // Software emulation, as the suite's node runs its guests here (this machine's nested
    // KVM stops these kernels after SYSLINUX).
    const accel = "tcg";
    const proc = new Deno.Command("qemu-system-x86_64", {
      args: [
        ...["-accel", accel, "-m", memory, "-nographic", "-display", "none", "-monitor", "none"],
        ...["-serial", `unix:${socket},server=on,wait=off`],
        ...["-drive", `file=${disk},format=raw,if=virtio`],
        ...["-drive", `file=${seed},format=raw,if=virtio,readonly=on`],
        ...["-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0"],
        ...["-device", "i6300esb", "-action", "watchdog=poweroff"],
      ],
      stdout: "null",
      stderr: "piped",
    }).spawn();
    const guest = new Guest(proc);
    for (let i = 0;; i++) {
      try {
        guest.#conn = await Deno.connect({ transport: "unix", path: socket });
        break;
      } catch (error) {
        if (i > 100) {
          throw new Error(`Cannot connect to the serial console "${socket}"`, { cause: error });
        }
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    return guest;
  }
  async send(text: string): Promise<void> {
    await this.#conn.write(enc.encode(text));
  }
  /** Waits for `pattern` in what the console printed since the last match. */
  async expect(pattern: RegExp, timeoutMs = 180_000): Promise<string> {
    const deadline = Date.now() + timeoutMs;
    const chunk = new Uint8Array(4096);
    while (true) {
      const match = pattern.exec(this.#buffer);
      if (match) {
        const seen = this.#buffer.slice(0, match.index + match[0].length);
        this.#buffer = this.#buffer.slice(match.index + match[0].length);
        return seen;
      }
      const left = deadline - Date.now();
      if (left <= 0) {
        throw new Error(
          `Console never printed ${pattern}; last: ${JSON.stringify(this.#buffer.slice(-300))}`,
        );
      }
      let timer: ReturnType<typeof setTimeout> | undefined;
      const n = await Promise.race([
        this.#conn.read(chunk),
        new Promise<"timeout">((r) => timer = setTimeout(() => r("timeout"), left)),
      ]);
      clearTimeout(timer);
      if (n === null) throw new Error(`Console closed before ${pattern}`);
      if (n !== "timeout") this.#buffer += dec.decode(chunk.subarray(0, n));
    }
  }
  /** Sends a line and waits for the prompt; then checks `echo $?` says 0. */
  async ok(line: string): Promise<string> {
    await this.send(`${line}\n`);
    const out = await this.expect(PROMPT, 30_000);
    await this.send("echo $?\n");
    await this.expect(/[\r\n]0\r\n.*(\$ |# )/, 30_000);
    return out;
  }
  async exited(timeoutMs: number): Promise<boolean> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const done = await Promise.race([
      this.#proc.status.then(() => true),
      new Promise<boolean>((r) => timer = setTimeout(() => r(false), timeoutMs)),
    ]);
    clearTimeout(timer);
    return done;
  }
  async stop(): Promise<void> {
    try {
      this.#conn?.close();
    } catch { /* closed already */ }
    try {
      this.#proc.kill("SIGKILL");
    } catch { /* ended already */ }
    await this.#proc.status;
    await this.#proc.stderr.cancel();
  }
}

/** A NoCloud seed (ISO 9660, label cidata) as KubeVirt writes one: JSON meta-data. */
async function noCloudSeed(dir: string): Promise<string> {
  const files = join(dir, "seed");
  await Deno.mkdir(files);
  await Deno.writeTextFile(
    join(files, "meta-data"),
    JSON.stringify({
      "instance-id": `${HOST}.default`,
      "local-hostname": HOST,
      "public-keys": { k: "ssh-ed25519 AAAA test-key" },
    }),
  );
  await Deno.writeTextFile(
    join(files, "user-data"),
    "#!/bin/sh\n\ntouch /cloud-init-userdata-executed\n",
  );
  const iso = join(dir, "seed.iso");
  const out = await new Deno.Command("xorriso", {
    args: ["-as", "mkisofs", "-output", iso, "-volid", "cidata", "-joliet", "-rock", files],
    stdout: "null",
    stderr: "piped",
  }).output();
  if (!out.success) throw new Error(`Cannot make the seed: ${dec.decode(out.stderr)}`);
  return iso;
}

async function withGuest(
  flavour: "cirros" | "alpine" | "fedora",
  memory: string,
  body: (guest: Guest) => Promise<void>,
): Promise<void> {
  const built = await buildSuiteFlavour(flavour);
  const dir = await Deno.makeTempDir({ prefix: `virtnode-suite-${flavour}-` });
  let guest: Guest | undefined;
  try {
    const disk = join(dir, "disk.img");
    await Deno.copyFile(join(built, "disk.img"), disk);
    guest = await Guest.boot(disk, await noCloudSeed(dir), memory, dir);
    await body(guest);
  } finally {
    await guest?.stop();
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("the cirros substitute logs in as LoginToCirros does, runs user-data, pings and powers off with sudo", async () => {
  await withGuest("cirros", "128M", async (guest) => {
    await guest.send("\n");
    await guest.expect(
      /login as 'cirros' user\. default password: 'gocubsgo'\. use 'sudo' for root\./,
    );
    await guest.send("\n");
    await guest.expect(new RegExp(`${HOST} login:`));
    console.log(
      `cirros: login prompt after ${((performance.now() - guest.started) / 1000).toFixed(1)} s`,
    );
    await guest.send("cirros\n");
    await guest.expect(/Password:/);
    await guest.send("gocubsgo\n");
    await guest.expect(PROMPT);
    await guest.ok("stty cols 500 rows 500");
    await guest.ok("sudo dmesg -n 1");
    await guest.ok("cat /cloud-init-userdata-executed");
    await guest.ok("ping -c 2 -w 10 10.0.2.2");
    await guest.send("last reboot | grep reboot | wc -l\n");
    await guest.expect(/[\r\n]1\r\n/);
    await guest.expect(PROMPT);
    assert.match(await guest.ok("cat /etc/os-release"), /virtnode substitute for cirros/);
    await guest.send("sudo poweroff\n");
    await guest.expect(/The system is going down NOW!/, 20_000);
    assert.ok(await guest.exited(30_000), "QEMU did not end after the guest's poweroff");
  });
});

Deno.test("the alpine substitute logs in as LoginToAlpine does, serves nc and is shut down by its watchdog", async () => {
  await withGuest("alpine", "128M", async (guest) => {
    await guest.send("\n");
    await guest.expect(new RegExp(`(localhost|${HOST}) login: `));
    console.log(
      `alpine: login prompt after ${((performance.now() - guest.started) / 1000).toFixed(1)} s`,
    );
    await guest.send("root\n");
    await guest.expect(PROMPT);
    await guest.ok("stty cols 500 rows 500");
    await guest.ok("dmesg -n 1");
    await guest.send("\n");
    await guest.expect(new RegExp(`(localhost|${HOST}):~# `));
    await guest.ok(`nc -klp 1500 -e echo -e "Hello World!"&`);
    await guest.ok("sleep 2; echo test | nc 127.0.0.1 1500 -i 1 -w 1 | grep 'Hello World!'");
    await guest.send("echo test | nc 127.0.0.1 1501 -i 1 -w 1 1> /dev/null\n");
    await guest.expect(PROMPT);
    await guest.send("echo $?\n");
    await guest.expect(/[\r\n][1-9].*\r\n/);
    await guest.ok("watchdog -t 2000ms -T 4000ms /dev/watchdog && sleep 5 && killall -9 watchdog");
    assert.ok(await guest.exited(30_000), "The watchdog did not power the guest off");
  });
});

Deno.test("the fedora substitute logs in as LoginToFedora does, with sudo su, sshd and the seed's keys", async () => {
  await withGuest("fedora", "512M", async (guest) => {
    await guest.send("\n\n");
    await guest.expect(new RegExp(`(localhost|fedora|${HOST}) login: `));
    console.log(
      `fedora: login prompt after ${((performance.now() - guest.started) / 1000).toFixed(1)} s`,
    );
    await guest.send("fedora\n");
    await guest.expect(/Password:/);
    await guest.send("fedora\n");
    await guest.expect(new RegExp(`\\[fedora@${HOST} ~\\]\\$ `));
    await guest.send("sudo su\n");
    await guest.expect(PROMPT);
    await guest.ok("stty cols 500 rows 500");
    await guest.ok("dmesg -n 1");
    await guest.send("\n");
    await guest.expect(new RegExp(`\\[root@${HOST} fedora\\]# `));
    await guest.ok("grep test-key /home/fedora/.ssh/authorized_keys");
    await guest.ok("echo test | nc 127.0.0.1 22 | grep OpenSSH");
    await guest.ok("ls /cloud-init-userdata-executed");
  });
});

Deno.test("every suite image has an OCI archive under the suite's name", async () => {
  for (const image of SUITE_IMAGES) {
    const { ref, archive } = await suiteImageArchive(image);
    assert.equal(ref, `virtnode.local/kubevirt/${image.name}:v1.7.0`);
    const list = await new Deno.Command("tar", { args: ["-tf", archive], stdout: "piped" })
      .output();
    assert.match(dec.decode(list.stdout), /index\.json/);
  }
});

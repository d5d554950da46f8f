/**
 * KubeVirt's `virtctl console` and `virtctl vnc` driven as a user drives them, through
 * virt-api and a node's handler: the console is typed into until the guest's answer comes
 * back, and the VNC proxy is connected to until QEMU's RFB greeting does; `virtctl stop`,
 * `start` and `restart` drive a VirtualMachine.
 *
 * @module
 */
import assert from "node:assert/strict";
import { kubectl } from "../../deploy/cluster/cluster.ts";
import { freePort, waitFor } from "./handler_process.ts";

/** Where virtctl is and which cluster and VMI it is pointed at. */
export interface VirtctlTarget {
  /** The virtctl binary. */
  virtctl: string;
  /** The kubeconfig it runs with. */
  kubeconfig: string;
  /** The VMI, in the kubeconfig's namespace. */
  name: string;
}

/** Ends a child that may have ended already. */
function killQuietly(child: Deno.ChildProcess): void {
  try {
    child.kill("SIGKILL");
  } catch { /* it ended already */ }
}

/** A virtctl run whose output (stdout and stderr) is read as it comes. */
interface PrintingRun {
  /** What it printed so far. */
  printed(): string;
  /** Ends it, and the reading of its output. */
  stop(): Promise<void>;
}

/** Runs virtctl with `args` against the target's cluster, its output read as it comes. */
function runVirtctl(t: VirtctlTarget, args: string[]): PrintingRun {
  const child = new Deno.Command(t.virtctl, {
    args: ["--kubeconfig", t.kubeconfig, ...args],
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let printed = "";
  const reading = Promise.all([child.stdout, child.stderr].map(async (stream) => {
    for await (const chunk of stream) printed += new TextDecoder().decode(chunk);
  }));
  return {
    printed: () => printed,
    stop: async () => {
      killQuietly(child);
      await child.status;
      await reading.catch(() => {});
    },
  };
}

/**
 * Runs `virtctl console` and types `line` (with `enter`, the guest's line end) every second
 * until the output matches `answer`; returns the milliseconds that took. Throws with what
 * virtctl printed when no answer comes within `timeoutMs`.
 */
export async function consoleAnswers(
  t: VirtctlTarget,
  o: { line: string; enter?: string; answer: RegExp; timeoutMs?: number },
): Promise<number> {
  const started = performance.now();
  const child = new Deno.Command(t.virtctl, {
    args: ["--kubeconfig", t.kubeconfig, "console", t.name],
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let seen = "";
  const reading = (async () => {
    for await (const chunk of child.stdout) seen += new TextDecoder().decode(chunk);
  })();
  const stderr = new Response(child.stderr).text();
  const writer = child.stdin.getWriter();
  try {
    await waitFor(
      `${t.name}'s answer on virtctl console`,
      async () => {
        await writer.write(new TextEncoder().encode(`${o.line}${o.enter ?? "\n"}`));
        await new Promise((r) => setTimeout(r, 1_000));
        return o.answer.test(seen);
      },
      o.timeoutMs ?? 60_000,
      200,
    );
  } catch (error) {
    killQuietly(child);
    await child.status;
    // One line: a failed run's summary shows an error's first line only.
    const printed = (await stderr).trim().replaceAll("\n", " | ");
    throw new Error(`virtctl console: ${printed}; output ${JSON.stringify(seen)}`, {
      cause: error,
    });
  }
  const ms = performance.now() - started;
  killQuietly(child);
  await child.status;
  await reading.catch(() => {});
  await writer.close().catch(() => {});
  return ms;
}

/**
 * Runs `virtctl vnc --proxy-only` and connects to the port it prints; asserts that QEMU's
 * RFB 3.8 greeting comes through.
 */
export async function vncGreets(t: VirtctlTarget): Promise<void> {
  const vnc = new Deno.Command(t.virtctl, {
    args: ["--kubeconfig", t.kubeconfig, "vnc", "--proxy-only", "--port", "0", t.name],
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const vncErr = new Response(vnc.stderr).text();
  try {
    // virtctl prints {"port": N} once it listens.
    let printed = "";
    const reader = vnc.stdout.getReader();
    const port = await waitFor(
      "virtctl vnc to print its port",
      async () => {
        const { value, done } = await reader.read();
        if (done) throw new Error(`virtctl vnc ended before it listened: ${printed}`);
        printed += new TextDecoder().decode(value);
        return Number(/"port":\s*(\d+)/.exec(printed)?.[1]) || undefined;
      },
      30_000,
      100,
    );
    reader.releaseLock();
    const conn = await Deno.connect({ hostname: "127.0.0.1", port });
    try {
      const greeting = new Uint8Array(12);
      let got = 0;
      await waitFor(
        "QEMU's RFB greeting through virtctl vnc",
        async () => {
          const n = await conn.read(greeting.subarray(got));
          if (n === null) throw new Error(`the VNC proxy closed after ${got} bytes`);
          got += n;
          return got === 12;
        },
        30_000,
        100,
      );
      assert.equal(new TextDecoder().decode(greeting), "RFB 003.008\n");
    } finally {
      conn.close();
    }
  } catch (error) {
    killQuietly(vnc);
    await vnc.status;
    throw new Error(`virtctl vnc: ${await vncErr}`, { cause: error });
  }
  killQuietly(vnc);
  await vnc.status;
  await vnc.stdout.cancel().catch(() => {});
}

/**
 * Runs `virtctl usbredir --no-launch` (a user's own usbredir client connects to the
 * address it prints) and connects to that address as such a client; asserts that the
 * hello of QEMU's redirected USB port (usbredir's packet type 0, with QEMU's version
 * string) comes through virt-api and the handler.
 */
export async function usbredirGreets(t: VirtctlTarget): Promise<void> {
  const run = runVirtctl(t, ["usbredir", "--no-launch", t.name]);
  try {
    const [, host, port] = await waitFor(
      "virtctl usbredir to print its address",
      () => /connect usbredir client at: (\S+):(\d+)/.exec(run.printed()),
      30_000,
    );
    const conn = await Deno.connect({
      hostname: host === "localhost" ? "127.0.0.1" : host,
      port: Number(port),
    });
    try {
      let got = new Uint8Array(0);
      const buffer = new Uint8Array(4096);
      const deadline = Date.now() + 30_000;
      while (!new TextDecoder().decode(got).includes("qemu usb-redir guest")) {
        if (Date.now() > deadline) throw new Error(`no usbredir hello: ${got.length} bytes`);
        const n = await conn.read(buffer);
        if (n === null) throw new Error(`the usbredir proxy closed after ${got.length} bytes`);
        got = new Uint8Array([...got, ...buffer.subarray(0, n)]);
      }
      assert.equal(new DataView(got.buffer).getUint32(0, true), 0, "a hello packet first");
    } finally {
      conn.close();
    }
  } catch (error) {
    throw new Error(`virtctl usbredir: ${run.printed()}`, { cause: error });
  } finally {
    await run.stop();
  }
}

/**
 * Runs `virtctl port-forward vmi/<name> <local>:<port>` (virt-api dials the VMI's first
 * interface itself) and fetches `path` over HTTP through the forwarded port; returns the
 * first line of the guest's answer. Throws with what virtctl printed when none comes.
 */
export async function portForwardAnswers(
  t: VirtctlTarget,
  port: number,
  path: string,
): Promise<string> {
  const local = freePort();
  const run = runVirtctl(t, [
    "port-forward",
    "--address",
    "127.0.0.1",
    `vmi/${t.name}`,
    `${local}:${port}`,
  ]);
  try {
    return await waitFor(
      `the guest's port ${port} through virtctl port-forward`,
      async () => {
        const res = await fetch(`http://127.0.0.1:${local}${path}`, {
          signal: AbortSignal.timeout(10_000),
        });
        const text = await res.text();
        return res.ok ? text.split("\n")[0] || "(empty)" : undefined;
      },
      60_000,
      1_000,
    );
  } catch (error) {
    throw new Error(`virtctl port-forward: ${run.printed()}`, { cause: error });
  } finally {
    await run.stop();
  }
}

/** Runs virtctl to its end; what it printed, or an error with it when it failed. */
async function virtctlOnce(t: VirtctlTarget, args: string[]): Promise<string> {
  const out = await new Deno.Command(t.virtctl, {
    args: ["--kubeconfig", t.kubeconfig, ...args],
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
  if (!out.success) throw new Error(`virtctl ${args.join(" ")} failed: ${text}`);
  return text;
}

/** `kubectl get <kind> <name> -o jsonpath=<path>`, or "" when there is no such object. */
async function jsonpath(t: VirtctlTarget, kind: string, path: string): Promise<string> {
  const out = await new Deno.Command("kubectl", {
    args: ["--kubeconfig", t.kubeconfig, "get", kind, t.name, "-o", `jsonpath=${path}`],
    stdin: "null",
    stdout: "piped",
    stderr: "null",
  }).output();
  return out.success ? new TextDecoder().decode(out.stdout) : "";
}

/**
 * Drives a running VirtualMachine as a user does with virtctl: `restart` (a new VMI, Running),
 * `stop` (the VMI gone, the VM Stopped), then `start` (Running again, the VM Ready).
 */
export async function vmStopsAndStarts(t: VirtctlTarget): Promise<void> {
  const vmiState = () => jsonpath(t, "vmi", "{.metadata.uid} {.status.phase}");
  const vmState = () => jsonpath(t, "vm", "{.status.printableStatus} {.status.ready}");
  const [before] = (await vmiState()).split(" ");
  assert.ok(before, `${t.name} has a VMI`);
  await virtctlOnce(t, ["restart", t.name]);
  await waitFor(
    `${t.name} restarted: a new VMI Running`,
    async () => {
      const [uid, phase] = (await vmiState()).split(" ");
      return uid && uid !== before && phase === "Running" ? true : undefined;
    },
    180_000,
    1_000,
  );
  await virtctlOnce(t, ["stop", t.name]);
  await waitFor(
    `${t.name} stopped: no VMI, the VM Stopped`,
    async () => {
      return (await vmiState()) === "" && (await vmState()).startsWith("Stopped")
        ? true
        : undefined;
    },
    120_000,
    1_000,
  );
  await virtctlOnce(t, ["start", t.name]);
  await waitFor(
    `${t.name} started: Running and Ready`,
    async () => {
      return (await vmState()) === "Running true" ? true : undefined;
    },
    180_000,
    1_000,
  );
}

/** The VM's memory dump request, as `kubectl get vm` shows it. */
interface DumpRequest {
  claimName: string;
  phase: string;
  fileName?: string;
  message?: string;
}

/**
 * `virtctl memory-dump get` of a running VM, as a user does it with a claim of their own:
 * the claim is bound to a hostPath PersistentVolume made in `root`'s folder of the
 * namespace (a pod-less node's host disk root). Waits for the request to be `Completed`,
 * checks the claim's `kubevirt.io/memory-dump` annotation names the file, and that the VM's
 * template has the memory dump volume; then `virtctl memory-dump remove` takes the volume
 * out of the template and the request goes. Returns the dump's path on this host.
 */
export async function memoryDumpCompletes(
  t: VirtctlTarget,
  o: { root: string; namespace?: string },
): Promise<string> {
  const namespace = o.namespace ?? "default";
  const claim = `${t.name}-dump`;
  const folder = `${o.root}/${namespace}/${claim}`;
  await Deno.mkdir(folder, { recursive: true });
  const pv = {
    apiVersion: "v1",
    kind: "PersistentVolume",
    metadata: { name: `${namespace}-${claim}` },
    spec: {
      capacity: { storage: "1Gi" },
      accessModes: ["ReadWriteOnce"],
      hostPath: { path: folder },
      claimRef: { namespace, name: claim },
    },
  };
  const pvc = {
    apiVersion: "v1",
    kind: "PersistentVolumeClaim",
    metadata: { name: claim, namespace },
    spec: {
      accessModes: ["ReadWriteOnce"],
      resources: { requests: { storage: "1Gi" } },
      volumeName: pv.metadata.name,
      storageClassName: "",
    },
  };
  await kubectl(
    t.kubeconfig,
    ["apply", "-f", "-"],
    JSON.stringify({ apiVersion: "v1", kind: "List", items: [pv, pvc] }),
  );
  await virtctlOnce(t, ["memory-dump", "get", t.name, `--claim-name=${claim}`]);
  const request = async () => {
    const vm = JSON.parse(
      await kubectl(t.kubeconfig, ["get", "vm", t.name, "-n", namespace, "-o", "json"]),
    );
    return vm as {
      spec: { template: { spec: { volumes?: { name: string }[] } } };
      status?: { memoryDumpRequest?: DumpRequest };
    };
  };
  const done = await waitFor(
    `${t.name}'s memory dump Completed`,
    async () => {
      const vm = await request();
      const r = vm.status?.memoryDumpRequest;
      if (r?.phase === "Failed") throw new Error(`the memory dump failed: ${r.message}`);
      return r?.phase === "Completed" ? vm : undefined;
    },
    180_000,
    1_000,
  );
  const fileName = done.status!.memoryDumpRequest!.fileName;
  assert.match(fileName ?? "", new RegExp(`^${t.name}-${claim}-\\d{8}-\\d{6}\\.memory\\.dump$`));
  assert.ok(
    done.spec.template.spec.volumes?.some((v) => v.name === claim),
    "the VM's template has the memory dump volume",
  );
  const annotation = await kubectl(t.kubeconfig, [
    "get",
    "pvc",
    claim,
    "-n",
    namespace,
    "-o",
    "jsonpath={.metadata.annotations.kubevirt\\.io/memory-dump}",
  ]);
  assert.equal(annotation, fileName, "the claim's annotation names the dump");
  await virtctlOnce(t, ["memory-dump", "remove", t.name]);
  await waitFor(
    `${t.name}'s memory dump request gone, its volume out of the template`,
    async () => {
      const vm = await request();
      return !vm.status?.memoryDumpRequest &&
          !vm.spec.template.spec.volumes?.some((v) => v.name === claim)
        ? true
        : undefined;
    },
    60_000,
    1_000,
  );
  return `${folder}/${fileName}`;
}

/**
 * KubeVirt's `virtctl console` and `virtctl vnc` driven as a user drives them, through
 * virt-api and a node's handler: the console is typed into until the guest's answer comes
 * back, and the VNC proxy is connected to until QEMU's RFB greeting does.
 *
 * @module
 */
import assert from "node:assert/strict";
import { waitFor } from "./handler_process.ts";

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
    throw new Error(`virtctl console: ${await stderr}; output ${JSON.stringify(seen)}`, {
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

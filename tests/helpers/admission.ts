/** Objects through KubeVirt's admission without storing them (server-side dry run). */
import type { Cluster } from "../../deploy/cluster/cluster.ts";

/** What KubeVirt's admission made of an object: the defaulted object, or its refusal. */
export type Admitted =
  | { ok: true; object: Record<string, unknown> }
  | { ok: false; error: string };

/** Creates `object` with `kubectl create --dry-run=server` as the cluster's admin (a user). */
export async function admit(cluster: Cluster, object: unknown): Promise<Admitted> {
  const child = new Deno.Command("kubectl", {
    args: [
      "--kubeconfig",
      cluster.kubeconfigPath,
      "create",
      "--dry-run=server",
      "-o",
      "json",
      "-f",
      "-",
    ],
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const writer = child.stdin.getWriter();
  await writer.write(new TextEncoder().encode(JSON.stringify(object)));
  await writer.close();
  const output = await child.output();
  const decode = (bytes: Uint8Array) => new TextDecoder().decode(bytes);
  return output.success
    ? { ok: true, object: JSON.parse(decode(output.stdout)) }
    : { ok: false, error: decode(output.stderr).trim() };
}

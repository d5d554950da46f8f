import assert from "node:assert/strict";
import { freePorts } from "../../deploy/cluster/processes.ts";

const [ephemeralLow] = Deno.readTextFileSync("/proc/sys/net/ipv4/ip_local_port_range")
  .trim().split(/\s+/).map(Number);

Deno.test("harness: freePorts gives distinct bindable ports below the ephemeral and NodePort ranges", () => {
  const ports = freePorts(20);
  assert.equal(new Set(ports).size, 20);
  for (const port of ports) {
    const high = Math.min(ephemeralLow, 30_000);
    assert(port >= 10_000 && port < high, `${port} is outside [10000, ${high})`);
    Deno.listen({ hostname: "127.0.0.1", port }).close();
  }
});

Deno.test("harness: freePorts never hands out a port a server holds", () => {
  const held = freePorts(1)[0];
  const listener = Deno.listen({ hostname: "0.0.0.0", port: held });
  try {
    for (let i = 0; i < 50; i++) assert(!freePorts(40).includes(held));
  } finally {
    listener.close();
  }
});

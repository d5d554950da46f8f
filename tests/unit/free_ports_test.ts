import assert from "node:assert/strict";
import { freePorts } from "../../deploy/cluster/processes.ts";

const [ephemeralLow] = Deno.readTextFileSync("/proc/sys/net/ipv4/ip_local_port_range")
  .trim().split(/\s+/).map(Number);

Deno.test("harness: freePorts gives distinct bindable ports below the kernel's ephemeral range", () => {
  const ports = freePorts(20);
  assert.equal(new Set(ports).size, 20);
  for (const port of ports) {
    assert(port >= 10_000 && port < ephemeralLow, `${port} is outside [10000, ${ephemeralLow})`);
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

/**
 * The libvirt FFI layer against libvirt's built-in test driver (`test:///default`): no
 * daemon, fresh state per connection.
 */

import assert from "node:assert/strict";
import {
  type Connection,
  type DomainEvent,
  LibvirtError,
  LibvirtLoadError,
  type LifecycleEvent,
  openLibvirt,
  VIR_CONNECT_LIST_DOMAINS_ACTIVE,
  VIR_CONNECT_LIST_DOMAINS_INACTIVE,
  VIR_DOMAIN_EVENT_STARTED,
  VIR_DOMAIN_RUNNING,
  VIR_DOMAIN_SHUTOFF,
  VIR_DOMAIN_STATS_STATE,
} from "../../ffi/mod.ts";

const TEST_URI = "test:///default";

function testDomainXml(name: string): string {
  return `<domain type='test'>
  <name>${name}</name>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64'>hvm</type></os>
</domain>`;
}

function lifecycleOf(name: string) {
  return (e: DomainEvent): e is LifecycleEvent => e.type === "lifecycle" && e.domain.name === name;
}

async function withConnection(
  fn: (conn: Connection) => Promise<void>,
  options: Parameters<typeof openLibvirt>[1] = {},
) {
  const conn = await openLibvirt(TEST_URI, options);
  try {
    await fn(conn);
  } finally {
    await conn.close();
  }
}

Deno.test("openLibvirt() reaches the test driver and lists its running domain with state", async () => {
  await withConnection(async (conn) => {
    const domains = await conn.listAllDomains();
    assert.equal(domains.length, 1);
    const [test] = domains;
    assert.equal(test.name, "test");
    assert.match(test.uuid, /^[0-9a-f-]{36}$/);
    assert.equal(test.state, VIR_DOMAIN_RUNNING);
    assert.equal(test.stateName, "Running");
    assert.ok(test.id > 0);
  });
});

Deno.test("lookups by name and by UUID find the same domain", async () => {
  await withConnection(async (conn) => {
    const byName = await conn.lookupByName("test");
    const byUuid = await conn.lookupByUUID(byName.uuid);
    assert.equal(byUuid.name, "test");
    assert.equal(byUuid.uuid, byName.uuid);
    assert.match(await byName.getXMLDesc(), /<name>test<\/name>/);
  });
});

Deno.test("the full domain lifecycle works and each step emits its named lifecycle event", async () => {
  await withConnection(async (conn) => {
    const name = `vn-lifecycle-${crypto.randomUUID().slice(0, 8)}`;
    const seen: LifecycleEvent[] = [];
    const off = conn.onEvent((e) => {
      if (lifecycleOf(name)(e)) seen.push(e);
    });
    const expectEvent = (eventName: string, detailName: string) =>
      conn.waitForEvent<LifecycleEvent>(
        (e) => lifecycleOf(name)(e) && e.eventName === eventName && e.detailName === detailName,
        { timeoutMs: 5_000 },
      );

    let next = expectEvent("Defined", "Added");
    const dom = await conn.defineXML(testDomainXml(name));
    await next;
    assert.equal((await dom.getState()).stateName, "Shutoff");

    next = expectEvent("Started", "Booted");
    await dom.start();
    const started = await next;
    assert.equal(started.event, VIR_DOMAIN_EVENT_STARTED);
    assert.equal(started.detail, 0);
    assert.deepEqual(await dom.getState(), {
      state: VIR_DOMAIN_RUNNING,
      reason: 1,
      stateName: "Running",
      reasonName: "Booted",
    });

    next = expectEvent("Suspended", "Paused");
    await dom.suspend();
    await next;
    assert.deepEqual(
      [(await dom.getState()).stateName, (await dom.getState()).reasonName],
      ["Paused", "User"],
    );

    next = expectEvent("Resumed", "Unpaused");
    await dom.resume();
    await next;

    next = expectEvent("Stopped", "Shutdown");
    await dom.shutdown();
    await next;
    assert.equal((await dom.getState()).reasonName, "Shutdown");

    await dom.start();
    next = expectEvent("Stopped", "Destroyed");
    await dom.destroy();
    await next;
    assert.deepEqual(
      [(await dom.getState()).state, (await dom.getState()).reasonName],
      [VIR_DOMAIN_SHUTOFF, "Destroyed"],
    );

    next = expectEvent("Undefined", "Removed");
    await dom.undefine();
    await next;
    await assert.rejects(conn.lookupByName(name), LibvirtError);
    off();
    assert.deepEqual(
      seen.map((e) => `${e.eventName}/${e.detailName}`),
      [
        "Defined/Added",
        "Started/Booted",
        "Suspended/Paused",
        "Resumed/Unpaused",
        "Stopped/Shutdown",
        "Started/Booted",
        "Stopped/Destroyed",
        "Undefined/Removed",
      ],
    );
  });
});

Deno.test("events() iterates domain events and ends when the connection closes", async () => {
  const conn = await openLibvirt(TEST_URI);
  const dom = await conn.lookupByName("test");
  const iterator = conn.events();
  await dom.suspend();
  await dom.resume();
  const first = await iterator.next();
  const second = await iterator.next();
  assert.equal(first.done, false);
  assert.deepEqual(
    [first.value, second.value].map((e) =>
      e.type === "lifecycle" ? `${e.eventName}/${e.detailName}` : e.type
    ),
    ["Suspended/Paused", "Resumed/Unpaused"],
  );
  const pending = iterator.next();
  await conn.close();
  assert.deepEqual(await pending, { value: undefined, done: true });
});

Deno.test("reboot() and reset() keep a running test domain running", async () => {
  await withConnection(async (conn) => {
    const dom = await conn.lookupByName("test");
    await dom.reboot();
    await dom.reset();
    assert.equal((await dom.getState()).stateName, "Running");
  });
});

Deno.test("listAllDomains() filters by flags", async () => {
  await withConnection(async (conn) => {
    const name = `vn-list-${crypto.randomUUID().slice(0, 8)}`;
    const dom = await conn.defineXML(testDomainXml(name));
    const active = await conn.listAllDomains(VIR_CONNECT_LIST_DOMAINS_ACTIVE);
    const inactive = await conn.listAllDomains(VIR_CONNECT_LIST_DOMAINS_INACTIVE);
    assert.deepEqual(active.map((d) => d.name), ["test"]);
    assert.deepEqual(inactive.map((d) => d.name), [name]);
    assert.equal(inactive[0].stateName, "Shutoff");
    await dom.undefine();
  });
});

Deno.test("getAllDomainStats() turns typed parameters into a plain object", async () => {
  await withConnection(async (conn) => {
    const stats = await conn.getAllDomainStats(VIR_DOMAIN_STATS_STATE);
    const test = stats.find((s) => s.name === "test");
    assert.ok(test);
    assert.equal(test.params["state.state"], VIR_DOMAIN_RUNNING);
    assert.equal(typeof test.params["state.reason"], "number");
  });
});

Deno.test("Domain.getStats() returns the one domain's record, as the connection-wide call has it", async () => {
  await withConnection(async (conn) => {
    const dom = await conn.lookupByName("test");
    const mine = await dom.getStats(VIR_DOMAIN_STATS_STATE);
    assert.ok(mine);
    assert.equal(mine.name, "test");
    assert.equal(mine.uuid, dom.uuid);
    const all = await conn.getAllDomainStats(VIR_DOMAIN_STATS_STATE);
    assert.deepEqual(mine.params, all.find((s) => s.name === "test")?.params);
    assert.equal(mine.params["state.state"], VIR_DOMAIN_RUNNING);
  });
});

Deno.test("host calls report versions and capabilities", async () => {
  await withConnection(async (conn) => {
    const lib = await conn.getLibVersion();
    assert.ok(lib.major >= 9, `libvirt ${lib.major}.${lib.minor}.${lib.release}`);
    assert.equal(lib.raw, lib.major * 1_000_000 + lib.minor * 1_000 + lib.release);
    assert.ok((await conn.getHypervisorVersion()).raw > 0);
    assert.match(await conn.getCapabilities(), /<capabilities>/);
  });
});

Deno.test("a custom test node from test:///abs/node.xml is served", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vn-ffi-node-" });
  try {
    const node = `${dir}/node.xml`;
    await Deno.writeTextFile(
      node,
      `<node>${testDomainXml("vn-custom-a")}${testDomainXml("vn-custom-b")}</node>`,
    );
    const conn = await openLibvirt(`test://${node}`);
    try {
      const names = (await conn.listAllDomains()).map((d) => d.name).sort();
      assert.deepEqual(names, ["vn-custom-a", "vn-custom-b"]);
    } finally {
      await conn.close();
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("invalid domain XML gives libvirt's message in a typed error", async () => {
  await withConnection(async (conn) => {
    const error = await conn.defineXML("<domain type='test'><name>broken").then(
      () => assert.fail("defineXML accepted broken XML"),
      (e: unknown) => e,
    );
    assert.ok(error instanceof LibvirtError);
    assert.equal(error.codeName, "VIR_ERR_XML_DETAIL");
    assert.equal(error.level, 2);
    assert.ok(error.message.startsWith("Cannot define domain: libvirt: "), error.message);
    assert.ok(error.libvirtMessage.length > 0);
    assert.ok(error.message.endsWith(error.libvirtMessage));
  });
});

Deno.test("a failing lookup names the domain in the action and carries VIR_ERR_NO_DOMAIN", async () => {
  await withConnection(async (conn) => {
    await assert.rejects(conn.lookupByName("vn-missing"), (e: unknown) => {
      assert.ok(e instanceof LibvirtError);
      assert.equal(e.codeName, "VIR_ERR_NO_DOMAIN");
      assert.match(e.message, /^Cannot look up domain "vn-missing": libvirt: Domain not found/);
      return true;
    });
  });
});

Deno.test("hundreds of concurrent failing calls each get their own error", async () => {
  await withConnection(async (conn) => {
    const count = 400;
    // Malformed XML: libvirt's parser message quotes the offending line, which holds the
    // unique name, so a mixed-up error would name another call's domain.
    const names = Array.from({ length: count }, (_, i) => `vn-concurrent-${i}-x`);
    const started = performance.now();
    const results = await Promise.allSettled(
      names.map((name, i) =>
        i % 4 === 3
          ? conn.lookupByName("test").then((d) => d.getState())
          : conn.defineXML(`<domain type='test'><name>${name}</name><broken></domain>`)
      ),
    );
    let failures = 0;
    results.forEach((result, i) => {
      if (i % 4 === 3) {
        assert.equal(result.status, "fulfilled", `call ${i} should succeed`);
        return;
      }
      assert.equal(result.status, "rejected");
      const error = (result as PromiseRejectedResult).reason;
      assert.ok(error instanceof LibvirtError);
      assert.ok(
        error.libvirtMessage.includes(`<name>${names[i]}</name>`),
        `error ${i} names another call: ${error.libvirtMessage}`,
      );
      failures++;
    });
    console.log(
      `concurrent calls: ${count} (${failures} failing) on 4 workers in ${
        (performance.now() - started).toFixed(0)
      } ms`,
    );
  }, { workers: 4 });
});

Deno.test("reconnect() opens the URI again and re-registers event callbacks", async () => {
  await withConnection(async (conn) => {
    await conn.reconnect();
    assert.equal(await conn.isAlive(), true);
    // The test driver starts fresh on every open: "test" is running again.
    const dom = await conn.lookupByName("test");
    const event = conn.waitForEvent((e) => lifecycleOf("test")(e) && e.eventName === "Suspended", {
      timeoutMs: 5_000,
    });
    await dom.suspend();
    await event;
  });
});

Deno.test("calls on a closed connection fail with the action named", async () => {
  const conn = await openLibvirt(TEST_URI);
  await conn.close();
  await conn.close(); // idempotent
  await assert.rejects(conn.lookupByName("test"), /Cannot look up domain "test": connection/);
});

Deno.test("a missing libvirt library gives a startup error naming the Debian package", async () => {
  await assert.rejects(
    openLibvirt(TEST_URI, { libraryPath: "/nonexistent/libvirt.so.0" }),
    (e: unknown) => {
      assert.ok(e instanceof LibvirtLoadError);
      assert.equal(e.debianPackage, "libvirt0");
      assert.match(
        e.message,
        /^Cannot load \/nonexistent\/libvirt\.so\.0: install the Debian package "libvirt0": /,
      );
      assert.ok(e.cause instanceof Error);
      return true;
    },
  );
});

Deno.test("an unknown URI scheme fails to connect with libvirt's message", async () => {
  await assert.rejects(openLibvirt("nosuchdriver:///x"), (e: unknown) => {
    assert.ok(e instanceof LibvirtError);
    assert.match(e.message, /^Cannot connect to "nosuchdriver:\/\/\/x": libvirt: /);
    return true;
  });
});

Deno.test("a missing libvirt-qemu library is reported clearly by agentPing()", async () => {
  await withConnection(async (conn) => {
    const dom = await conn.lookupByName("test");
    await assert.rejects(dom.agentPing(), (e: unknown) => {
      assert.ok(e instanceof LibvirtLoadError);
      assert.match(e.message, /^Cannot load \/nonexistent\/libvirt-qemu\.so\.0: install/);
      return true;
    });
  }, { qemuLibraryPath: "/nonexistent/libvirt-qemu.so.0" });
});

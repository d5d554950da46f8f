import assert from "node:assert/strict";
import type { LogRecord } from "@logtape/logtape";
import { formatJson, formatText, getLogger, setupLogging } from "../../mod/log/mod.ts";

function record(overrides: Partial<LogRecord> = {}): LogRecord {
  return {
    category: ["virtnode", "handler"],
    level: "info",
    message: ["Synchronized VMI ", "vm1", ""],
    rawMessage: "Synchronized VMI {name}",
    timestamp: Date.UTC(2026, 10, 29, 12, 0, 0, 123),
    properties: {},
    ...overrides,
  };
}

Deno.test("formatJson() writes one line with KubeVirt's keys", () => {
  const line = formatJson(
    record({
      properties: { namespace: "default", name: "vm1", uid: "u-1", kind: "VirtualMachineInstance" },
    }),
    "virt-handler",
  );
  assert.ok(line.endsWith("\n"));
  assert.equal(line.trim().split("\n").length, 1);
  const parsed = JSON.parse(line);
  assert.deepEqual(parsed, {
    timestamp: "2026-11-29T12:00:00.123Z",
    level: "info",
    component: "virt-handler",
    msg: "Synchronized VMI vm1",
    logger: "handler",
    namespace: "default",
    name: "vm1",
    uid: "u-1",
    kind: "VirtualMachineInstance",
  });
});

Deno.test("formatJson() keeps the key order KubeVirt uses and renders errors with their cause", () => {
  const error = new Error("Cannot start domain", { cause: new Error("libvirt: no such file") });
  const line = formatJson(
    record({ properties: { error, reason: "SyncFailed", extra: 3 } }),
    "virt-handler",
  );
  const parsed = JSON.parse(line);
  assert.deepEqual(Object.keys(parsed), [
    "timestamp",
    "level",
    "component",
    "msg",
    "logger",
    "reason",
    "error",
    "extra",
  ]);
  assert.equal(parsed.error, "Cannot start domain: libvirt: no such file");
  assert.equal(parsed.extra, 3);
});

Deno.test("formatText() writes a readable line with key=value pairs, quoting where needed", () => {
  const line = formatText(
    record({ level: "warning", properties: { name: "vm1", reason: "two words" } }),
    "virt-handler",
  );
  assert.equal(
    line,
    '12:00:00.123 WRN virt-handler/handler: Synchronized VMI vm1 name=vm1 reason="two words"\n',
  );
});

Deno.test("setupLogging() filters below the configured level and writes the chosen format", () => {
  const lines: string[] = [];
  setupLogging({
    level: "warning",
    format: "json",
    component: "virt-test",
    write: (l) => lines.push(l),
  });
  const log = getLogger("unit");
  log.info("dropped");
  log.warn("kept {name}", { name: "vm1" });
  assert.equal(lines.length, 1);
  const parsed = JSON.parse(lines[0]);
  assert.equal(parsed.level, "warning");
  assert.equal(parsed.msg, "kept vm1");
  assert.equal(parsed.component, "virt-test");
  setupLogging({
    level: "info",
    format: "text",
    component: "virt-test",
    write: (l) => lines.push(l),
  });
  log.info("now {what}", { what: "text" });
  assert.match(lines[1], / INF virt-test\/unit: now text what=text\n$/);
});

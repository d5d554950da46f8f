import assert from "node:assert/strict";
import { ConfigError, parseConfig } from "../../mod/config/mod.ts";

Deno.test("parseConfig() fills every setting from its default", () => {
  const config = parseConfig({}, {});
  assert.equal(config.nodeName, Deno.hostname().toLowerCase());
  assert.equal(config.kubeconfig, undefined);
  assert.equal(config.libvirtUri, "qemu:///system");
  assert.equal(config.stateDir, "/var/lib/virtnode");
  assert.equal(config.runDir, "/var/run/kubevirt");
  assert.equal(config.logLevel, "info");
  assert.equal(config.logFormat, "auto");
});

Deno.test("parseConfig() reads the environment and lets flags win over it", () => {
  const env = {
    NODE_NAME: "node-a",
    KUBECONFIG: "/etc/kube.conf",
    VIRTNODE_LIBVIRT_URI: "test:///default",
    VIRTNODE_LOG_LEVEL: "debug",
  };
  const fromEnv = parseConfig({}, env);
  assert.equal(fromEnv.nodeName, "node-a");
  assert.equal(fromEnv.kubeconfig, "/etc/kube.conf");
  assert.equal(fromEnv.libvirtUri, "test:///default");
  assert.equal(fromEnv.logLevel, "debug");
  const fromFlags = parseConfig({ nodeName: "node-b", logLevel: "error" }, env);
  assert.equal(fromFlags.nodeName, "node-b");
  assert.equal(fromFlags.logLevel, "error");
});

Deno.test("parseConfig() treats an empty environment variable as unset", () => {
  assert.equal(parseConfig({}, { VIRTNODE_LOG_LEVEL: "" }).logLevel, "info");
});

Deno.test("parseConfig() strips a trailing slash from directories", () => {
  const config = parseConfig({ stateDir: "/tmp/state/", runDir: "/run/x//" }, {});
  assert.equal(config.stateDir, "/tmp/state");
  assert.equal(config.runDir, "/run/x");
});

function rejected(raw: Record<string, string>, env: Record<string, string> = {}): ConfigError {
  try {
    parseConfig(raw, env);
  } catch (error) {
    assert.ok(error instanceof ConfigError, `expected ConfigError, got ${error}`);
    return error;
  }
  assert.fail(`expected ${JSON.stringify(raw)} to be rejected`);
}

Deno.test("parseConfig() rejects a log level, naming the flag, the value and the allowed levels", () => {
  const error = rejected({ logLevel: "loud" });
  assert.equal(error.flag, "--log-level");
  assert.equal(error.value, "loud");
  assert.match(error.message, /Invalid value "loud" for --log-level: allowed: trace, debug, info/);
});

Deno.test("parseConfig() names the environment variable when the bad value came from it", () => {
  const error = rejected({}, { VIRTNODE_LOG_FORMAT: "xml" });
  assert.match(
    error.message,
    /--log-format \(from VIRTNODE_LOG_FORMAT\): allowed: json, text, auto/,
  );
});

Deno.test("parseConfig() rejects node names that are not DNS-1123 subdomains", () => {
  for (const bad of ["Node_1", "-node", "node-", "a".repeat(254), "no de"]) {
    assert.equal(rejected({ nodeName: bad }).flag, "--node-name");
  }
  assert.equal(
    parseConfig({ nodeName: "worker-1.example.com" }, {}).nodeName,
    "worker-1.example.com",
  );
});

Deno.test("parseConfig() rejects libvirt URIs with unknown schemes or no scheme", () => {
  for (const bad of ["qemu", "xen:///system", "http://x", ""]) {
    assert.equal(rejected({ libvirtUri: bad }).flag, "--libvirt-uri");
  }
  for (const good of ["test:///default", "qemu+unix:///system?socket=/run/x.sock"]) {
    assert.equal(parseConfig({ libvirtUri: good }, {}).libvirtUri, good);
  }
});

Deno.test("parseConfig() rejects relative directories and '..' in them", () => {
  assert.equal(rejected({ stateDir: "state" }).flag, "--state-dir");
  assert.equal(rejected({ runDir: "/var/../etc" }).flag, "--run-dir");
});

/**
 * Validation of a VMI against the allow-list of fields the converter supports. The VMI
 * is walked field by field; a field not on the list fails with
 * {@linkcode UnsupportedFieldError} naming its JSON path, a value of the wrong type with
 * {@linkcode InvalidFieldError}. Nothing is ignored silently.
 *
 * @module
 */

import {
  KUBEVIRT_API_VERSION,
  parseQuantity,
  QuantityParseError,
  type VirtualMachineInstance,
  VMI_KIND,
  vmiKey,
} from "../api/mod.ts";
import { InvalidFieldError, UnsupportedFieldError } from "./converter_errors.ts";

/** One node of the allow-list. */
type Rule =
  | { kind: "string"; values?: readonly string[]; pattern?: RegExp; hint?: string }
  | { kind: "integer"; min?: number; max?: number }
  | { kind: "boolean"; only?: boolean; hint?: string }
  | { kind: "quantity" }
  | { kind: "empty" }
  | { kind: "any" }
  | { kind: "array"; items: Rule }
  | { kind: "map"; values: Rule }
  | {
    kind: "object";
    fields: Record<string, Rule>;
    required?: readonly string[];
    /** Why a known-but-unsupported field is not supported, keyed by field name. */
    hints?: Record<string, string>;
  };

const str = (values?: readonly string[]): Rule => ({ kind: "string", values });
const int = (min = 0, max = Number.MAX_SAFE_INTEGER): Rule => ({ kind: "integer", min, max });
const bool: Rule = { kind: "boolean" };
const quantity: Rule = { kind: "quantity" };
const empty: Rule = { kind: "empty" };
const any: Rule = { kind: "any" };
const obj = (
  fields: Record<string, Rule>,
  extra: { required?: readonly string[]; hints?: Record<string, string> } = {},
): Rule => ({ kind: "object", fields, ...extra });
const arr = (items: Rule): Rule => ({ kind: "array", items });
const map = (values: Rule): Rule => ({ kind: "map", values });

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const name: Rule = { kind: "string", pattern: DNS_LABEL };
/** A realtime vCPU mask: vCPUs and ranges, each possibly negated (`0-3,^1`), or nothing. */
const REALTIME_MASK = /^$|^\s*\^?\d+(-\d+)?\s*(,\s*\^?\d+(-\d+)?\s*)*$/;
const featureState = obj({ enabled: bool });
const timer = (tickPolicies?: readonly string[], tracks?: readonly string[]) =>
  obj({
    present: bool,
    ...(tickPolicies ? { tickPolicy: str(tickPolicies) } : {}),
    ...(tracks ? { track: str(tracks) } : {}),
  });

/** Disk buses the converter attaches. */
export const SUPPORTED_DISK_BUSES = ["virtio", "sata", "scsi"] as const;
/** NIC models KubeVirt's admission allows (and QEMU offers). */
export const SUPPORTED_NIC_MODELS = [
  "virtio",
  "e1000",
  "e1000e",
  "igb",
  "rtl8139",
  "ne2k_pci",
  "pcnet",
] as const;

// Bindings the node does not build; the network plan says why (mod/network/plan.ts).
const BINDING_HINT = "virtnode connects guests with the bridge binding (pod and secondary " +
  "networks) or masquerade (the pod network) only";

// Why a field without a hint of its own is refused rather than ignored.
const NOT_CONVERTED = "virtnode does not turn this field into the domain yet, and leaving it " +
  "out would run a different VM than the one asked for";
const STORAGE_HINT = "claims are mounted by the kubelet into a launcher pod (KubeVirt mode); " +
  "a pod-less node has none: use a hostDisk below the handler's --host-disk-root, or a " +
  "containerDisk, emptyDisk or cloud-init volume";
const HOST_DEVICE_HINT = "host devices need their device plugins and passthrough, which " +
  "virtnode does not do yet";

const cloudInit = obj({
  userData: str(),
  userDataBase64: str(),
  networkData: str(),
  networkDataBase64: str(),
}, {
  hints: {
    secretRef: "cloud-init data from Secrets is not supported yet; inline userData",
    networkDataSecretRef: "cloud-init data from Secrets is not supported yet; inline networkData",
  },
});

/**
 * A readiness or liveness probe: the kubelet runs it (pod-less, the handler's prober), so
 * it shapes no domain; its shape is checked all the same.
 */
const PROBE_RULE: Rule = obj({
  exec: obj({ command: arr(str()) }),
  httpGet: obj({
    path: str(),
    port: any,
    host: str(),
    scheme: str(["HTTP", "HTTPS"]),
    httpHeaders: arr(obj({ name: str(), value: str() }, { required: ["name", "value"] })),
  }, { required: ["port"] }),
  tcpSocket: obj({ port: any, host: str() }, { required: ["port"] }),
  guestAgentPing: obj({}),
  initialDelaySeconds: int(0),
  timeoutSeconds: int(0),
  periodSeconds: int(0),
  successThreshold: int(0),
  failureThreshold: int(0),
});

/**
 * An access credential: its Secret goes into the guest through the agent (the handler hands
 * the launcher the Secret's contents, access_credentials.ts); not through cloud-init.
 */
const CLOUD_INIT_PROPAGATION = "access credentials through cloud-init are not supported yet; " +
  "propagate them with qemuGuestAgent";
const credentialSource = obj({
  secret: obj({ secretName: { kind: "string", pattern: DNS_SUBDOMAIN } }, {
    required: ["secretName"],
  }),
}, { required: ["secret"] });
const ACCESS_CREDENTIAL_RULE: Rule = obj({
  sshPublicKey: obj({
    source: credentialSource,
    propagationMethod: obj(
      { qemuGuestAgent: obj({ users: arr(str()) }, { required: ["users"] }) },
      {
        hints: { noCloud: CLOUD_INIT_PROPAGATION, configDrive: CLOUD_INIT_PROPAGATION },
      },
    ),
  }, { required: ["source", "propagationMethod"] }),
  userPassword: obj({
    source: credentialSource,
    propagationMethod: obj({ qemuGuestAgent: obj({}) }),
  }, { required: ["source", "propagationMethod"] }),
});

/** The allow-list: every VMI field the converter turns into domain XML (or uses). */
const VMI_RULE: Rule = obj({
  apiVersion: str([KUBEVIRT_API_VERSION]),
  kind: str([VMI_KIND]),
  metadata: any,
  status: any,
  spec: obj({
    domain: obj({
      cpu: obj({
        cores: int(1),
        sockets: int(1),
        threads: int(1),
        maxSockets: int(1),
        model: str(),
        features: arr(obj({
          name: str(),
          policy: str(["force", "require", "optional", "disable", "forbid"]),
        }, { required: ["name"] })),
        dedicatedCpuPlacement: bool,
        isolateEmulatorThread: bool,
        realtime: obj({ mask: { kind: "string", pattern: REALTIME_MASK } }),
        numa: obj({ guestMappingPassthrough: empty }),
      }),
      memory: obj({
        guest: quantity,
        maxGuest: quantity,
        hugepages: obj({ pageSize: str() }),
      }),
      resources: obj({ requests: map(quantity), limits: map(quantity) }),
      machine: obj({ type: str() }),
      firmware: obj({
        uuid: str(),
        serial: str(),
        bootloader: obj({
          bios: obj({ useSerial: bool }),
          efi: obj({ secureBoot: bool }),
        }),
      }, {
        hints: {
          kernelBoot: "booting a kernel from a container image needs its image unpacked, " +
            "which virtnode does not do yet",
        },
      }),
      features: obj({
        acpi: featureState,
        apic: featureState,
        smm: featureState,
        hyperv: obj({
          relaxed: featureState,
          vapic: featureState,
          spinlocks: obj({ enabled: bool, spinlocks: int(4095) }),
          vpindex: featureState,
          runtime: featureState,
          synic: featureState,
          reset: featureState,
          frequencies: featureState,
          ipi: featureState,
          vendorid: obj({ enabled: bool, vendorid: str() }),
        }),
      }),
      clock: obj({
        utc: obj({ offsetSeconds: int(Number.MIN_SAFE_INTEGER) }),
        timezone: str(),
        timer: obj({
          hpet: timer(["delay", "catchup", "merge", "discard"]),
          kvm: timer(),
          pit: timer(["delay", "catchup", "discard"]),
          rtc: timer(["delay", "catchup"], ["guest", "wall"]),
          hyperv: timer(),
        }),
      }),
      devices: obj({
        disks: arr(obj({
          name: name,
          disk: obj({ bus: str(SUPPORTED_DISK_BUSES), readonly: bool }),
          cdrom: obj({ bus: str(SUPPORTED_DISK_BUSES), readonly: bool, tray: str(["closed"]) }),
          bootOrder: int(1),
          cache: str(["none", "writethrough", "writeback"]),
          serial: { kind: "string", pattern: /^[A-Za-z0-9_.+-]{1,20}$/ },
        }, {
          required: ["name"],
          hints: { lun: "LUN disks need a block device; not supported yet" },
        })),
        interfaces: arr(obj({
          name: name,
          bridge: empty,
          masquerade: empty,
          slirp: empty,
          model: str(SUPPORTED_NIC_MODELS),
          macAddress: { kind: "string", pattern: /^([0-9A-Fa-f]{2}[:-]){5}[0-9A-Fa-f]{2}$/ },
          bootOrder: int(1),
          ports: arr(obj({ name: str(), protocol: str(), port: any }, { required: ["port"] })),
        }, {
          required: ["name"],
          hints: {
            passt: "the passt binding was discontinued in KubeVirt v1.3; " + BINDING_HINT,
            passtBinding: BINDING_HINT,
            binding: "network binding plugins are not supported; " + BINDING_HINT,
            sriov: "SR-IOV needs a virtual function and its device plugin; " + BINDING_HINT,
            macvtap: "macvtap needs Multus and its device plugin; " + BINDING_HINT,
          },
        })),
        autoattachSerialConsole: bool,
        autoattachGraphicsDevice: bool,
        autoattachMemBalloon: bool,
        autoattachPodInterface: bool,
        disableHotplug: bool,
        clientPassthrough: empty,
        downwardMetrics: empty,
        rng: empty,
        watchdog: obj({
          name: name,
          i6300esb: obj({ action: str(["poweroff", "reset", "shutdown"]) }),
        }, { required: ["name", "i6300esb"] }),
      }, {
        hints: {
          gpus: HOST_DEVICE_HINT,
          hostDevices: HOST_DEVICE_HINT,
          tpm: "a virtual TPM needs swtpm and per-VM state, which virtnode does not keep yet",
          filesystems: "virtiofs shares need virtiofsd beside the guest; not supported yet",
          autoattachVSOCK: "vsock devices and the vsock route are not supported yet",
        },
      }),
    }, { required: ["devices"] }),
    volumes: arr(obj({
      name: name,
      containerDisk: obj({ image: str(), path: str(), imagePullPolicy: str() }, {
        required: ["image"],
      }),
      emptyDisk: obj({ capacity: quantity }, { required: ["capacity"] }),
      hostDisk: obj({ path: str(), type: str(["Disk", "DiskOrCreate"]), capacity: quantity }, {
        required: ["path", "type"],
      }),
      cloudInitNoCloud: cloudInit,
      cloudInitConfigDrive: cloudInit,
    }, {
      required: ["name"],
      hints: {
        persistentVolumeClaim: STORAGE_HINT,
        dataVolume: STORAGE_HINT,
        configMap: "ConfigMap, Secret and service account disks are not supported yet",
        secret: "ConfigMap, Secret and service account disks are not supported yet",
        serviceAccount: "ConfigMap, Secret and service account disks are not supported yet",
      },
    })),
    networks: arr(obj({
      name: name,
      pod: obj({ vmNetworkCIDR: str(), vmIPv6NetworkCIDR: str() }),
      multus: obj({ networkName: str(), default: bool }, { required: ["networkName"] }),
    }, { required: ["name"] })),
    subdomain: { kind: "string", pattern: DNS_LABEL },
    terminationGracePeriodSeconds: int(0),
    // Scheduling fields: the scheduler consumes them before the VMI reaches a node, and
    // they do not shape the domain.
    nodeSelector: map(str()),
    affinity: any,
    tolerations: arr(any),
    topologySpreadConstraints: arr(any),
    schedulerName: str(),
    priorityClassName: str(),
    evictionStrategy: str(["None", "LiveMigrate", "LiveMigrateIfPossible", "External"]),
    hostname: { kind: "string", pattern: DNS_LABEL },
    architecture: str(["amd64"]),
    readinessProbe: PROBE_RULE,
    livenessProbe: PROBE_RULE,
    accessCredentials: arr(ACCESS_CREDENTIAL_RULE),
  }, { required: ["domain"] }),
}, { required: ["metadata", "spec"] });

// Characters XML 1.0 cannot carry, so no domain XML could hold them.
// deno-lint-ignore no-control-regex
const CONTROL_CHARS = /[\u0000-\u0008\u000B\u000C\u000E-\u001F\uFFFE\uFFFF]/;

function describe(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  return `a ${typeof value}`;
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function walk(key: string, path: string, value: unknown, rule: Rule): void {
  const invalid = (detail: string) => new InvalidFieldError(key, path, detail);
  switch (rule.kind) {
    case "any":
      return;
    case "string":
      if (typeof value !== "string") throw invalid(`expected a string, got ${describe(value)}`);
      if (CONTROL_CHARS.test(value)) throw invalid("contains a control character");
      if (rule.values && !rule.values.includes(value)) {
        throw new UnsupportedFieldError(
          key,
          path,
          `value "${value}" is not supported (supported: ${rule.values.join(", ")})`,
        );
      }
      if (rule.pattern && !rule.pattern.test(value)) {
        throw invalid(`value "${value}" does not match ${rule.pattern}`);
      }
      return;
    case "integer":
      if (typeof value !== "number" || !Number.isInteger(value)) {
        throw invalid(`expected an integer, got ${describe(value)}`);
      }
      if (value < (rule.min ?? 0) || value > (rule.max ?? Number.MAX_SAFE_INTEGER)) {
        throw invalid(`value ${value} is out of range`);
      }
      return;
    case "boolean":
      if (typeof value !== "boolean") throw invalid(`expected a boolean, got ${describe(value)}`);
      if (rule.only !== undefined && value !== rule.only) {
        throw new UnsupportedFieldError(
          key,
          path,
          `value ${value} is not supported${rule.hint ? `: ${rule.hint}` : ""}`,
        );
      }
      return;
    case "quantity":
      if (typeof value !== "string" && typeof value !== "number") {
        throw invalid(`expected a quantity, got ${describe(value)}`);
      }
      try {
        parseQuantity(value);
      } catch (error) {
        if (error instanceof QuantityParseError) {
          throw new InvalidFieldError(key, path, `"${value}" is not a quantity`, { cause: error });
        }
        throw error;
      }
      return;
    case "empty":
      if (!isPlainObject(value)) throw invalid(`expected an object, got ${describe(value)}`);
      for (const field of Object.keys(value)) {
        throw new UnsupportedFieldError(key, `${path}.${field}`, NOT_CONVERTED);
      }
      return;
    case "array":
      if (!Array.isArray(value)) throw invalid(`expected an array, got ${describe(value)}`);
      value.forEach((item, i) => walk(key, `${path}[${i}]`, item, rule.items));
      return;
    case "map":
      if (!isPlainObject(value)) throw invalid(`expected an object, got ${describe(value)}`);
      for (const [field, item] of Object.entries(value)) {
        walk(key, `${path}.${field}`, item, rule.values);
      }
      return;
    case "object": {
      if (!isPlainObject(value)) throw invalid(`expected an object, got ${describe(value)}`);
      for (const field of rule.required ?? []) {
        if (value[field] === undefined || value[field] === null) {
          throw new InvalidFieldError(key, join(path, field), "is required");
        }
      }
      for (const [field, item] of Object.entries(value)) {
        const fieldPath = join(path, field);
        const fieldRule = rule.fields[field];
        if (!fieldRule) {
          throw new UnsupportedFieldError(key, fieldPath, rule.hints?.[field] ?? NOT_CONVERTED);
        }
        // JSON null means "not set" in Kubernetes objects.
        if (item === null) continue;
        walk(key, fieldPath, item, fieldRule);
      }
      return;
    }
  }
}

function join(path: string, field: string): string {
  return path === "" ? field : `${path}.${field}`;
}

/** `namespace/name` of a VMI-shaped value, for error messages, even when malformed. */
export function vmiKeyOf(vmi: unknown): string {
  const metadata = isPlainObject(vmi) && isPlainObject(vmi.metadata) ? vmi.metadata : {};
  const name = typeof metadata.name === "string" && metadata.name ? metadata.name : "<unnamed>";
  const namespace = typeof metadata.namespace === "string" && metadata.namespace
    ? metadata.namespace
    : "default";
  return vmiKey({ namespace, name });
}

/**
 * Checks that `vmi` is a VMI whose every field the converter supports and returns it
 * typed. Throws {@linkcode UnsupportedFieldError} or {@linkcode InvalidFieldError}.
 */
export function validateVmi(vmi: unknown): VirtualMachineInstance {
  const key = vmiKeyOf(vmi);
  if (!isPlainObject(vmi)) {
    throw new InvalidFieldError(key, "(root)", `expected an object, got ${describe(vmi)}`);
  }
  walk(key, "", vmi, VMI_RULE);
  const metadata = vmi.metadata;
  if (!isPlainObject(metadata)) {
    throw new InvalidFieldError(key, "metadata", `expected an object, got ${describe(metadata)}`);
  }
  for (const field of ["name", "namespace"] as const) {
    const value = metadata[field];
    if (field === "namespace" && value === undefined) continue;
    const pattern = field === "name" ? DNS_SUBDOMAIN : DNS_LABEL;
    if (typeof value !== "string" || value.length > 253 || !pattern.test(value)) {
      throw new InvalidFieldError(key, `metadata.${field}`, `expected a name matching ${pattern}`);
    }
  }
  if (metadata.uid !== undefined && typeof metadata.uid !== "string") {
    throw new InvalidFieldError(key, "metadata.uid", "expected a string");
  }
  return vmi as unknown as VirtualMachineInstance;
}

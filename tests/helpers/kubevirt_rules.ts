/**
 * KubeVirt v1.7.0's own alerts and recording rules, and virt-handler's metric families, as
 * its monitoring packages define them (`tests/harness/kubevirt/build_monitoring.sh`), held
 * against a scrape of virtnode: which handler families the rules name, and a
 * `promtool test rules` run in which every rule's selector of a handler family must find
 * series among the scrape's samples, as Prometheus would have them from the handler's pods.
 *
 * @module
 */
import { join } from "node:path";
import { runText } from "./command.ts";

/** One of virt-handler's metric families. */
export interface HandlerMetric {
  name: string;
  help: string;
  type: string;
}

/** One alert or recording rule of KubeVirt's PrometheusRule. */
export interface Rule {
  record?: string;
  alert?: string;
  expr: string;
  for?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}

/** What KubeVirt's monitoring packages define. */
export interface KubevirtMonitoring {
  handlerMetrics: HandlerMetric[];
  ruleGroups: { name: string; rules: Rule[] }[];
}

let cached: Promise<KubevirtMonitoring> | undefined;

/** Builds (cached by key) and reads KubeVirt's rules and virt-handler's families. */
export function kubevirtMonitoring(): Promise<KubevirtMonitoring> {
  cached ??= (async () => {
    const script = new URL("../harness/kubevirt/build_monitoring.sh", import.meta.url).pathname;
    const dir = (await runText("bash", script)).trim().split("\n").at(-1)!;
    return JSON.parse(await Deno.readTextFile(join(dir, "monitoring.json")));
  })();
  return cached;
}

/** A rule's name: its alert's or the series it records. */
export function ruleName(rule: Rule): string {
  return rule.alert ?? rule.record ?? "(unnamed)";
}

/** A family's name for a series name (a histogram's `_bucket`, `_sum` and `_count` too). */
function familyOf(series: string, families: ReadonlySet<string>): string | undefined {
  if (families.has(series)) return series;
  const base = series.replace(/_(bucket|sum|count)$/, "");
  return families.has(base) ? base : undefined;
}

/**
 * The instant vector selectors of `expr` that name one of `families` (a series name, with
 * its label matchers if it has them; a range `[5m]` left off), in the order they appear.
 */
export function handlerSelectors(expr: string, families: ReadonlySet<string>): string[] {
  const found: string[] = [];
  // Quoted strings (label values, label_replace arguments) name no series.
  const code = expr.replace(/"(?:[^"\\]|\\.)*"/g, (s) => " ".repeat(s.length));
  for (const m of code.matchAll(/[a-zA-Z_:][a-zA-Z0-9_:]*/g)) {
    const name = m[0];
    const before = code.slice(0, m.index).trimEnd();
    // A label name inside a matcher or a by/without list is not a series.
    if (/[{,(]$/.test(before) && /^\s*(=|!=|=~|!~)/.test(code.slice(m.index! + name.length))) {
      continue;
    }
    if (!familyOf(name, families)) continue;
    let selector = name;
    const after = m.index! + name.length;
    if (code[after] === "{") {
      const end = code.indexOf("}", after);
      selector = expr.slice(m.index, end + 1);
    }
    if (!found.includes(selector)) found.push(selector);
  }
  return found;
}

/**
 * The labels Prometheus adds to the handler's series when it scrapes them through the
 * ServiceMonitor virt-operator installs (`honorLabels`: a series' own `namespace` stays).
 */
export const TARGET_LABELS: Readonly<Record<string, string>> = {
  job: "kubevirt-prometheus-metrics",
  service: "kubevirt-prometheus-metrics",
  endpoint: "metrics",
  container: "virt-handler",
  pod: "virt-handler-virtnode",
  instance: "10.0.0.1:8443",
  namespace: "kubevirt",
};

/**
 * promtool's input series for a scrape's samples: each sample a series with the target's
 * labels added, holding its value for `minutes` minutes (`V+0xN`).
 */
export function inputSeries(scrape: string, minutes = 10): { series: string; values: string }[] {
  const out: { series: string; values: string }[] = [];
  for (const line of scrape.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)$/.exec(line);
    if (!m) throw new Error(`not a sample line: ${line}`);
    const [, name, braces, value] = m;
    const own = braces ? braces.slice(1, -1) : "";
    const ownNames = new Set([...own.matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="/g)].map((x) => x[1]));
    const added = Object.entries(TARGET_LABELS).filter(([k]) => !ownNames.has(k))
      .map(([k, v]) => `${k}="${v}"`);
    const labels = [own, ...added].filter((s) => s !== "").join(",");
    const number = Number(value);
    if (!Number.isFinite(number)) continue;
    // Plain decimals: promtool's series notation takes no exponent.
    const plain = Number.isInteger(number)
      ? number.toFixed(0)
      : number.toFixed(12).replace(/0+$/, "").replace(/\.$/, "");
    out.push({ series: `${name}{${labels}}`, values: `${plain}+0x${minutes}` });
  }
  return out;
}

/** Labels of a `name{a="b",...}` series string, by name. */
function labelsOf(series: string): Record<string, string> {
  const out: Record<string, string> = {};
  const braces = /\{(.*)\}$/.exec(series)?.[1] ?? "";
  for (const m of braces.matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) {
    out[m[1]] = m[2];
  }
  return out;
}

function seriesString(name: string, labels: Record<string, string>): string {
  const inner = Object.entries(labels).sort(([a], [b]) => a.localeCompare(b))
    .map(([k, v]) => `${k}="${v}"`).join(",");
  return `${name}{${inner}}`;
}

/**
 * The handler families KubeVirt's rules name, each with the rules that name it, and which
 * of them `scrape` has no sample of.
 */
export function familiesNamedByRules(
  monitoring: KubevirtMonitoring,
  scrape: string,
): { named: Map<string, string[]>; missing: string[] } {
  const families = new Set(monitoring.handlerMetrics.map((m) => m.name));
  const named = new Map<string, string[]>();
  for (const group of monitoring.ruleGroups) {
    for (const rule of group.rules) {
      for (const selector of handlerSelectors(rule.expr, families)) {
        const family = familyOf(/^[a-zA-Z0-9_:]+/.exec(selector)![0], families)!;
        named.set(family, [...(named.get(family) ?? []), ruleName(rule)]);
      }
    }
  }
  const present = new Set(
    inputSeries(scrape).map((s) => {
      const name = /^[a-zA-Z0-9_:]+/.exec(s.series)![0];
      return familyOf(name, families) ?? name;
    }),
  );
  return { named, missing: [...named.keys()].filter((f) => !present.has(f)).sort() };
}

/**
 * Writes KubeVirt's rules (`kubevirt-rules.json`, a Prometheus rule file) and a promtool
 * test (`kubevirt-rules-test.json`) into `dir`; returns the test's path. The test feeds the
 * scrape's samples, with the labels Prometheus adds, for 10 minutes, and expects what the
 * rules give from them: `kubevirt_vmi_vcpu_count` (one per VMI and vCPU),
 * `kubevirt_vmi_memory_used_bytes` (available less usable, per VMI),
 * `kubevirt_vmi_guest_vcpu_queue` empty where the scrape has no guest load, the
 * `VirtHandlerRESTErrorsBurst` alert's denominator over the handler's series (0: the
 * counters stand still) and the alert itself not firing.
 */
export async function writeRulesTest(
  monitoring: KubevirtMonitoring,
  scrape: string,
  dir: string,
): Promise<string> {
  await Deno.writeTextFile(
    join(dir, "kubevirt-rules.json"),
    JSON.stringify({ groups: monitoring.ruleGroups }),
  );
  const input = inputSeries(scrape);
  const of = (name: string) =>
    input.filter((s) => s.series.startsWith(`${name}{`)).map((s) => ({
      labels: labelsOf(s.series),
      value: Number(s.values.split("+")[0]),
    }));
  const vcpus = new Map<string, { labels: Record<string, string>; value: number }>();
  for (const s of of("kubevirt_vmi_vcpu_seconds_total")) {
    const labels = { namespace: s.labels.namespace, name: s.labels.name, node: s.labels.node };
    const key = JSON.stringify(labels);
    const ids = vcpus.get(key) ?? { labels, value: 0 };
    ids.value++;
    vcpus.set(key, ids);
  }
  const usable = new Map(
    of("kubevirt_vmi_memory_usable_bytes").map((s) => [JSON.stringify(s.labels), s.value]),
  );
  const used = of("kubevirt_vmi_memory_available_bytes").flatMap((s) => {
    const u = usable.get(JSON.stringify(s.labels));
    return u === undefined ? [] : [{ labels: s.labels, value: s.value - u }];
  });
  const sample = (name: string) => (s: { labels: Record<string, string>; value: number }) => ({
    labels: seriesString(name, s.labels),
    value: s.value,
  });
  const exprTests: unknown[] = [
    {
      expr: "kubevirt_vmi_vcpu_count",
      eval_time: "5m",
      exp_samples: [...vcpus.values()].map(sample("kubevirt_vmi_vcpu_count")),
    },
    {
      expr: "kubevirt_vmi_memory_used_bytes",
      eval_time: "5m",
      exp_samples: used.map(sample("kubevirt_vmi_memory_used_bytes")),
    },
    {
      expr:
        'sum(rate(kubevirt_rest_client_requests_total{namespace="kubevirt",pod=~"virt-handler-.*"}[5m]))',
      eval_time: "10m",
      exp_samples: [{ labels: "{}", value: 0 }],
    },
  ];
  if (of("kubevirt_vmi_guest_load_1m").length === 0) {
    exprTests.push({ expr: "kubevirt_vmi_guest_vcpu_queue", eval_time: "5m", exp_samples: [] });
  }
  const test = {
    rule_files: ["kubevirt-rules.json"],
    evaluation_interval: "1m",
    tests: [{
      interval: "1m",
      input_series: input,
      promql_expr_test: exprTests,
      alert_rule_test: [{
        eval_time: "10m",
        alertname: "VirtHandlerRESTErrorsBurst",
        exp_alerts: [],
      }],
    }],
  };
  const path = join(dir, "kubevirt-rules-test.json");
  await Deno.writeTextFile(path, JSON.stringify(test, null, 1));
  return path;
}

/**
 * The Prometheus text exposition format (version 0.0.4), written by hand: metric families
 * with their `# HELP` and `# TYPE` lines, samples with escaped label values, histograms as
 * cumulative `_bucket` series with `_sum` and `_count`. A family is written once however
 * many places add samples to it, and a family without samples is left out.
 *
 * @module
 */

/** The types of metric families written here. */
export type MetricType = "gauge" | "counter" | "histogram";

/** Label names to values. */
export type Labels = Record<string, string>;

/** What a family is. */
export interface FamilySpec {
  /** The metric name, e.g. `kubevirt_vmi_memory_resident_bytes`. */
  name: string;
  /** One line saying what it measures. */
  help: string;
  /** Its type. */
  type: MetricType;
}

/** The content type of the text format. */
export const TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8";

const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL = /^[a-zA-Z_][a-zA-Z0-9_]*$/;

/** A label name made of what Prometheus allows: every other character becomes `_`. */
export function sanitizeLabelName(name: string): string {
  const clean = name.replace(/[^a-zA-Z0-9_]/g, "_");
  return /^[0-9]/.test(clean) ? `_${clean}` : clean;
}

function escapeLabelValue(value: string): string {
  return value.replace(/\\/g, "\\\\").replace(/\n/g, "\\n").replace(/"/g, '\\"');
}

function escapeHelp(help: string): string {
  return help.replace(/\\/g, "\\\\").replace(/\n/g, "\\n");
}

function formatValue(value: number): string {
  if (Number.isNaN(value)) return "NaN";
  if (value === Infinity) return "+Inf";
  if (value === -Infinity) return "-Inf";
  return String(value);
}

function formatLabels(labels: Labels): string {
  const parts = Object.entries(labels).map(([k, v]) => `${k}="${escapeLabelValue(v)}"`);
  return parts.length ? `{${parts.join(",")}}` : "";
}

interface Family {
  spec: FamilySpec;
  lines: string[];
}

/** Collects the samples of one scrape and writes them out. */
export class Exposition {
  readonly #families = new Map<string, Family>();

  #family(spec: FamilySpec): Family {
    let family = this.#families.get(spec.name);
    if (!family) {
      if (!NAME.test(spec.name)) throw new Error(`Invalid metric name "${spec.name}"`);
      family = { spec, lines: [] };
      this.#families.set(spec.name, family);
    } else if (family.spec.type !== spec.type) {
      throw new Error(`Metric "${spec.name}" is both ${family.spec.type} and ${spec.type}`);
    }
    return family;
  }

  /** Adds one sample of a gauge or counter. */
  sample(spec: FamilySpec, labels: Labels, value: number): void {
    for (const name of Object.keys(labels)) {
      if (!LABEL.test(name)) throw new Error(`Invalid label name "${name}" of "${spec.name}"`);
    }
    this.#family(spec).lines.push(`${spec.name}${formatLabels(labels)} ${formatValue(value)}`);
  }

  /**
   * Adds one histogram series: `counts[i]` observations at most `bounds[i]` (not yet
   * cumulative), `overflow` above the last bound, and their `sum`.
   */
  histogram(
    spec: FamilySpec,
    labels: Labels,
    h: { bounds: readonly number[]; counts: readonly number[]; overflow: number; sum: number },
  ): void {
    const family = this.#family(spec);
    let total = 0;
    h.bounds.forEach((bound, i) => {
      total += h.counts[i];
      family.lines.push(
        `${spec.name}_bucket${formatLabels({ ...labels, le: formatValue(bound) })} ${total}`,
      );
    });
    total += h.overflow;
    family.lines.push(`${spec.name}_bucket${formatLabels({ ...labels, le: "+Inf" })} ${total}`);
    family.lines.push(`${spec.name}_sum${formatLabels(labels)} ${formatValue(h.sum)}`);
    family.lines.push(`${spec.name}_count${formatLabels(labels)} ${total}`);
  }

  /** The names of the families that have samples. */
  names(): string[] {
    return [...this.#families.values()].filter((f) => f.lines.length).map((f) => f.spec.name);
  }

  /** The whole scrape as text. */
  toString(): string {
    const out: string[] = [];
    for (const { spec, lines } of this.#families.values()) {
      if (!lines.length) continue;
      out.push(`# HELP ${spec.name} ${escapeHelp(spec.help)}`);
      out.push(`# TYPE ${spec.name} ${spec.type}`);
      out.push(...lines);
    }
    return out.length ? out.join("\n") + "\n" : "";
  }
}

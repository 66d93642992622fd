// parse-prometheus-text-format ships no types; this is the part of its output the tests read.
declare module "parse-prometheus-text-format" {
  /** One sample of a family (histogram and summary samples carry buckets/quantiles instead of value). */
  export interface PrometheusSample {
    labels?: Record<string, string>;
    value?: string;
    buckets?: Record<string, string>;
    quantiles?: Record<string, string>;
    count?: string;
    sum?: string;
    timestamp_ms?: string;
  }
  /** A metric family: its name, HELP text, TYPE (upper case, UNTYPED if none) and samples. */
  export interface PrometheusFamily {
    name: string;
    help: string;
    type: string;
    metrics: PrometheusSample[];
  }
  /** Parses the Prometheus text exposition format 0.0.4; throws on an invalid line. */
  export default function parsePrometheusTextFormat(text: string): PrometheusFamily[];
}

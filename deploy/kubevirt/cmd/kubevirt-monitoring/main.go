// Command kubevirt-monitoring prints, as one JSON object, what KubeVirt's own
// monitoring packages define for a node agent's scrape:
//
//	{"handlerMetrics": [{"name", "help", "type"}, ...],
//	 "ruleGroups": [<the rule groups of KubeVirt's PrometheusRule>, ...]}
//
// handlerMetrics are the families virt-handler registers (its SetupMetrics,
// collectors included); ruleGroups are the alerts and recording rules that
// virt-operator installs, in the groups of a Prometheus rule file (JSON is
// YAML, so promtool reads a file of {"groups": ruleGroups} as it is).
//
//	kubevirt-monitoring [--namespace kubevirt]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"

	"github.com/rhobs/operator-observability-toolkit/pkg/operatormetrics"

	virthandler "kubevirt.io/kubevirt/pkg/monitoring/metrics/virt-handler"
	"kubevirt.io/kubevirt/pkg/monitoring/rules"
)

type metric struct {
	Name string `json:"name"`
	Help string `json:"help"`
	Type string `json:"type"`
}

func main() {
	namespace := flag.String("namespace", "kubevirt", "the namespace the rules are built for")
	flag.Parse()
	if err := run(*namespace); err != nil {
		fmt.Fprintln(os.Stderr, "kubevirt-monitoring:", err)
		os.Exit(1)
	}
}

func run(namespace string) error {
	// Only virt-handler's families are registered: the list is the handler's alone.
	if err := virthandler.SetupMetrics("", 0, nil, nil); err != nil {
		return fmt.Errorf("virt-handler's metrics: %w", err)
	}
	var handler []metric
	for _, m := range operatormetrics.ListMetrics() {
		opts := m.GetOpts()
		handler = append(handler, metric{Name: opts.Name, Help: opts.Help, Type: string(m.GetType())})
	}
	sort.Slice(handler, func(i, j int) bool { return handler[i].Name < handler[j].Name })

	if err := rules.SetupRules(namespace); err != nil {
		return fmt.Errorf("KubeVirt's rules: %w", err)
	}
	rule, err := rules.BuildPrometheusRule(namespace)
	if err != nil {
		return fmt.Errorf("KubeVirt's PrometheusRule: %w", err)
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"handlerMetrics": handler,
		"ruleGroups":     rule.Spec.Groups,
	})
}

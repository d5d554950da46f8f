// Command vhostmd-read reads a vhostmd metrics disk the way KubeVirt's own code
// does (pkg/downwardmetrics/vhostmd: the header checked, the busy flag and the
// checksum verified, the XML decoded) and prints the metrics as one JSON object:
//
//	{"metrics": [{"name", "type", "context", "value", "unit"}, ...]}
//
// It exits 1 with KubeVirt's error when the disk does not read.
//
//	vhostmd-read <disk>
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"kubevirt.io/kubevirt/pkg/downwardmetrics/vhostmd"
)

type metric struct {
	Name    string `json:"name"`
	Type    string `json:"type"`
	Context string `json:"context"`
	Value   string `json:"value"`
	Unit    string `json:"unit,omitempty"`
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: vhostmd-read <disk>")
		os.Exit(2)
	}
	read, err := vhostmd.NewMetricsIODisk(os.Args[1]).Read()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out := struct {
		Metrics []metric `json:"metrics"`
	}{Metrics: []metric{}}
	for _, m := range read.Metrics {
		out.Metrics = append(out.Metrics, metric{
			Name:    m.Name,
			Type:    string(m.Type),
			Context: string(m.Context),
			Value:   m.Value,
			Unit:    m.Unit,
		})
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

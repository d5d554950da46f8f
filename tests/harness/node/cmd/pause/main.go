// Command pause is the sandbox process of every pod on the test node: it holds the
// pod's namespaces, reaps orphaned children (it is PID 1 of the pod when the pod shares
// its PID namespace) and exits on SIGINT or SIGTERM. No registry is reachable here, so
// the node's sandbox image is built from this file (tests/harness/node/images.ts).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
